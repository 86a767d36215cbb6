"""The EmbeddingBag family on CPU: its space and constraints, and its float64 reference against
torch.nn.functional.embedding_bag over every mode and argument the op takes."""

import pytest
import torch
import torch.nn.functional as F

from tuner.families import embedding_bag as eb


def test_space_constraints_hold():
    for s in eb.all_spaces():
        assert len(s) > 0
        for v in s:
            assert v["vec"] * {"float32": 4, "float16": 2, "bfloat16": 2}[v["weight"]] <= 16
            assert v["backward"] == "sorted" or v["weight"] == "float32"
    assert {v["vec"] for v in eb.space("bfloat16", "int32")} == {1, 2, 4, 8}
    assert {v["vec"] for v in eb.space("float32", "int64")} == {1, 2, 4}
    assert {v["backward"] for v in eb.space("float32", "int64")} == {"atomic", "sorted"}


def _small(mode, distribution="random", weight="float32", index="int64"):
    return eb.Problem(rows=500, dim=24, bags=40, bag_size=6, mode=mode, weight=weight, index=index,
                      distribution=distribution)


@pytest.mark.parametrize("mode", eb.MODES)
@pytest.mark.parametrize("distribution", eb.DISTRIBUTIONS)
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_reference_matches_torch(mode, distribution, include_last_offset):
    w, idx, offs, _ = eb.make_inputs(_small(mode, distribution), seed=3)
    assert (offs[1:] == offs[:-1]).any()  # empty bags are in the inputs
    if include_last_offset:
        offs = torch.cat([offs, torch.tensor([idx.numel()])])
    got, _ = eb.reference(w, idx, offs, mode, include_last_offset=include_last_offset)
    want = F.embedding_bag(idx, w.double(), offs, mode=mode, include_last_offset=include_last_offset)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", eb.MODES)
def test_reference_padding_idx_and_2d_indices(mode):
    w, idx, offs, _ = eb.make_inputs(_small(mode, "one_hot"), seed=5)
    pad = int(idx[0])
    got, _ = eb.reference(w, idx, offs, mode, padding_idx=pad)
    torch.testing.assert_close(got, F.embedding_bag(idx, w.double(), offs, mode=mode, padding_idx=pad))
    grid = idx[: 7 * 5].reshape(7, 5)
    got, _ = eb.reference(w, grid, None, mode)
    torch.testing.assert_close(got, F.embedding_bag(grid, w.double(), mode=mode))


@pytest.mark.parametrize("index", eb.INDEX_DTYPES)
def test_reference_per_sample_weights(index):
    w, idx, offs, psw = eb.make_inputs(_small("sum", index=index), seed=7, per_sample_weights=True)
    got, _ = eb.reference(w, idx, offs, "sum", per_sample_weights=psw)
    want = F.embedding_bag(idx, w.double(), offs, mode="sum", per_sample_weights=psw.double())
    torch.testing.assert_close(got, want)


def test_distributions_differ_as_the_pr_describes():
    counts = {}
    for d in eb.DISTRIBUTIONS:
        _, idx, _, _ = eb.make_inputs(eb.Problem(rows=100_000, dim=4, bags=64, bag_size=50, distribution=d), seed=1)
        counts[d] = torch.bincount(idx).topk(8).values
    assert counts["random"][0] < 10
    assert counts["one_hot"][0] > 0.4 * counts["one_hot"].sum() and counts["one_hot"][1] < 10
    assert (counts["multi_hot"] > 50).all()
