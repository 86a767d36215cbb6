"""EmbeddingBag variants on the GPU: every mode, weight and index dtype against the float64
reference and torch, the PR's distributions, padding_idx, per_sample_weights, empty bags, and
bad indices and offsets reported (never read out of bounds)."""

import pytest

from tuner.families import embedding_bag as eb

pytestmark = pytest.mark.gpu

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.fixture(scope="module")
def kernels(shared_home):
    from tuner import build, gpus
    from tuner.families.embedding_bag.kernel import EmbeddingBagKernel

    import random

    spread = [v for s in eb.all_spaces() for v in s]
    variants = list(dict.fromkeys(eb.covering_set() + random.Random(0).sample(spread, 18)))
    built = build.build(variants, gpus.attached().arch)
    assert all(b.ok for b in built), [b.error for b in built if not b.ok][:1]
    return [(b.variant, EmbeddingBagKernel(b.so, b.variant.name)) for b in built]


def _close(got, want, dtype):
    import torch

    err = float((got.double() - want).abs().max()) if got.numel() else 0.0
    scale = float(want.abs().max()) if want.numel() else 1.0
    return err <= TOL[dtype] * max(scale, 1.0), err


@pytest.mark.parametrize("mode", eb.MODES)
def test_every_variant_matches_the_reference(kernels, mode):
    for v, k in kernels:
        for dist in eb.DISTRIBUTIONS:
            p = eb.Problem(rows=3000, dim=40 if v["vec"] != 8 else 48, bags=67, bag_size=9, mode=mode,
                           weight=v["weight"], index=v["index"], distribution=dist)
            w, idx, offs, psw = eb.make_inputs(p, seed=11, device="cuda", per_sample_weights=mode == "sum")
            got, _ = k.forward(w, idx, offs, mode, psw)
            want, _ = eb.reference(w.cpu(), idx.cpu(), offs.cpu(), mode, None if psw is None else psw.cpu())
            ok, err = _close(got.cpu(), want, v["weight"])
            assert ok, f"{v.name} {mode} {dist}: error {err}"
            assert k.take_errors() == 0, v.name


def test_padding_idx_2d_indices_and_a_dim_not_a_multiple_of_vec(kernels):
    import torch
    import torch.nn.functional as F

    for v, k in kernels[:12]:
        p = eb.Problem(rows=500, dim=37, bags=20, bag_size=5, weight=v["weight"], index=v["index"],
                       distribution="one_hot")
        w, idx, offs, _ = eb.make_inputs(p, seed=2, device="cuda")
        pad = int(idx[0])
        for mode in eb.MODES:
            got, _ = k.forward(w, idx, offs, mode, padding_idx=pad)
            want = F.embedding_bag(idx.cpu().long(), w.cpu().double(), offs.cpu().long(), mode=mode, padding_idx=pad)
            assert _close(got.cpu(), want, v["weight"])[0], (v.name, mode)
        grid = idx[:36].reshape(6, 6)
        got, _ = k.forward(w, grid, None, "sum")
        assert _close(got.cpu(), F.embedding_bag(grid.cpu().long(), w.cpu().double(), mode="sum"), v["weight"])[0]
        torch.cuda.synchronize()


def test_bad_indices_and_offsets_are_reported_not_read(kernels):
    import torch

    for v, k in kernels:
        p = eb.Problem(rows=100, dim=16, bags=8, bag_size=4, weight=v["weight"], index=v["index"])
        w, idx, offs, _ = eb.make_inputs(p, seed=4, device="cuda")
        bad = idx.clone()
        bad[len(bad) // 2] = 10**6
        k.forward(w, bad, offs, "sum")
        torch.cuda.synchronize()
        bits = k.take_errors()
        if v["validation"] == "none":
            assert bits == 0
        else:
            assert bits & 1, v.name
        wrong = offs.clone()
        wrong[3] = 10**6
        k.forward(w, idx, wrong, "mean")
        torch.cuda.synchronize()
        bits = k.take_errors()
        assert (bits & 2) if v["validation"] != "none" else bits == 0, v.name
    k.forward(w, idx, offs, "sum")  # the context is alive
    torch.cuda.synchronize()
