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


def test_split_goes_with_warps_and_subwarps_and_keeps_the_names_of_whole_bags():
    s = eb.space("float32", "int64")
    assert {v["split"] for v in s} == {None, 32, 64}
    assert all(v["split"] is None for v in s if v["mapping"] == "block")
    tuned = dict(validation="inline", mapping="warp", vec=4, unroll=8, block_size=256, staging="shared",
                 backward="atomic")
    # a whole bag per group keeps the names recorded before the dimension existed
    assert s.variant(split=None, **tuned).name == "embedding_bag.float32.int64.inline.warp.4.8.b256.shared.atomic"
    assert s.variant(split=32, **tuned).name == "embedding_bag.float32.int64.inline.warp.split32.4.8.b256.shared.atomic"
    with pytest.raises(Exception, match="chunks of a bag"):
        s.variant(split=64, **{**tuned, "mapping": "block"})


def test_longest_first_orders_whole_bags_and_keeps_the_names_of_bags_in_order():
    from tuner.deploy import binaries
    from tuner.build.compile import render
    from tuner.variant import Variant

    s = eb.space("float32", "int64")
    assert {v["order"] for v in s} == {None, "longest"}
    assert all(v["split"] is None for v in s if v["order"] == "longest")
    base = dict(validation="none", mapping="block", split=None, vec=4, unroll=4, block_size=64, staging="shared",
                backward="atomic")
    given, longest = s.variant(**base), s.variant(order="longest", **base)
    assert given.name == "embedding_bag.float32.int64.none.block.4.4.b64.shared.atomic"
    assert longest.name == "embedding_bag.float32.int64.none.block.longest.4.4.b64.shared.atomic"
    with pytest.raises(Exception, match="longest first orders whole bags"):
        s.variant(order="longest", **{**base, "mapping": "warp", "split": 32})
    assert "length_passes" not in render(given)
    assert "constexpr int LENGTH_CLASSES = 4;" in render(longest)
    # parameters recorded before the dimension existed: bags in order, rendered and bound as such
    old = Variant.of(eb.FAMILY, {k: v for k, v in given.as_dict().items() if k != "order"})
    assert render(old) == render(given)
    assert binaries._nearest(eb.space("float16", "int64"), old)["order"] is None


def test_split_variants_render_their_chunks():
    from tuner.build.compile import render

    s = eb.space("bfloat16", "int32")
    base = dict(validation="hoisted", mapping="subwarp", vec=8, unroll=4, block_size=128, staging="direct",
                backward="sorted")
    whole, chunked = render(s.variant(split=None, **base)), render(s.variant(split=64, **base))
    assert "constexpr int CHUNK = 0;" in whole and "combine<MODE>" not in whole
    assert "constexpr int CHUNK = 64;" in chunked and "combine<MODE>" in chunked
    assert {v["split"] for v in eb.covering_set()} == {None, 32, 64}


def _small(mode, distribution="random", weight="float32", index="int64"):
    return eb.Problem(rows=500, dim=24, bags=40, bag_size=6, mode=mode, weight=weight, index=index,
                      distribution=distribution)


@pytest.mark.parametrize("mode", eb.MODES)
@pytest.mark.parametrize("distribution", eb.DISTRIBUTIONS)
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_reference_matches_torch(mode, distribution, include_last_offset):
    w, idx, offs, _ = eb.make_inputs(**vars(_small(mode, distribution)), seed=3)
    assert (offs[1:] == offs[:-1]).any()  # empty bags are in the inputs
    if include_last_offset:
        offs = torch.cat([offs, torch.tensor([idx.numel()])])
    got, _ = eb.reference(w, idx, offs, mode, include_last_offset=include_last_offset)
    want = F.embedding_bag(idx, w.double(), offs, mode=mode, include_last_offset=include_last_offset)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", eb.MODES)
def test_reference_padding_idx_and_2d_indices(mode):
    w, idx, offs, _ = eb.make_inputs(**vars(_small(mode, "one_hot")), seed=5)
    pad = int(idx[0])
    got, _ = eb.reference(w, idx, offs, mode, padding_idx=pad)
    torch.testing.assert_close(got, F.embedding_bag(idx, w.double(), offs, mode=mode, padding_idx=pad))
    grid = idx[: 7 * 5].reshape(7, 5)
    got, _ = eb.reference(w, grid, None, mode)
    torch.testing.assert_close(got, F.embedding_bag(grid, w.double(), mode=mode))


@pytest.mark.parametrize("index", eb.INDEX_DTYPES)
def test_reference_per_sample_weights(index):
    w, idx, offs, psw = eb.make_inputs(**vars(_small("sum", index=index)), seed=7, per_sample_weights=True)
    got, _ = eb.reference(w, idx, offs, "sum", per_sample_weights=psw)
    want = F.embedding_bag(idx, w.double(), offs, mode="sum", per_sample_weights=psw.double())
    torch.testing.assert_close(got, want)


def _max_by_loop(w, idx, offs, padding_idx):
    """max mode one bag at a time: torch.max over the bag's kept rows (its first maximum per column)."""
    bags, dim = offs.numel() - 1, w.shape[1]
    out = torch.zeros(bags, dim, dtype=torch.float64)
    chosen = torch.full((bags, dim), -1, dtype=torch.long)
    for b in range(bags):
        ids = idx[offs[b]:offs[b + 1]].long()
        if padding_idx is not None:
            ids = ids[ids != padding_idx]
        if ids.numel():
            out[b], at = w.double()[ids].max(0)
            chosen[b] = ids[at]
    return out, chosen


@pytest.mark.parametrize("weight", eb.WEIGHT_DTYPES)
def test_vectorised_max_equals_a_loop_over_bags(weight):
    """Ties (weights of a few values), empty bags, a bag of padding only, and padding_idx."""
    g = torch.Generator().manual_seed(17)
    w = torch.randint(-2, 3, (30, 7), generator=g).to(getattr(torch, weight))
    sizes = torch.randint(0, 9, (25,), generator=g)
    sizes[[0, 11, 24]] = 0  # empty bags, the first and the last among them
    idx = torch.randint(0, 30, (int(sizes.sum()),), generator=g)
    offs = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    pad = int(idx[0])
    idx[offs[5]:offs[6]] = pad  # a bag of padding only
    for padding_idx in (None, pad):
        got, got_chosen = eb.reference(w, idx, offs, "max", include_last_offset=True, padding_idx=padding_idx)
        want, want_chosen = _max_by_loop(w, idx, offs, padding_idx)
        assert torch.equal(got, want) and torch.equal(got_chosen, want_chosen)
        assert (got_chosen[[0, 11, 24]] == -1).all()
        if padding_idx is not None:
            assert (got_chosen[5] == -1).all() and (got[5] == 0).all()


def test_distributions_differ_as_the_pr_describes():
    counts = {}
    for d in eb.DISTRIBUTIONS:
        _, idx, _, _ = eb.make_inputs(**vars(eb.Problem(rows=100_000, dim=4, bags=64, bag_size=50, distribution=d)), seed=1)
        counts[d] = torch.bincount(idx).topk(8).values
    assert counts["random"][0] < 10
    assert counts["one_hot"][0] > 0.4 * counts["one_hot"].sum() and counts["one_hot"][1] < 10
    assert (counts["multi_hot"] > 50).all()
    with pytest.raises(ValueError, match="distribution must be one of"):  # not multi-hot ids under another name
        eb.make_inputs(**vars(eb.Problem(rows=100, dim=4, bags=8, bag_size=5)) | {"distribution": "bogus"})


# ------------------------------------------------------------------ the op on CPU

@pytest.fixture(scope="module")
def op(shared_home, tmp_path_factory):
    """The op with no winners bound: on CPU it runs the float64 reference, through the same C++
    schema and autograd as on CUDA."""
    from tuner import runtime
    from tuner.build import binding
    from tuner.families.embedding_bag import op as eb_op

    return runtime.bind(eb_op.OP, binding.library("embedding_bag"), [], {})


@pytest.mark.parametrize("mode", eb.MODES)
@pytest.mark.parametrize("form", ["offsets", "include_last_offset", "2d", "padding_idx"])
def test_op_forward_and_backward_match_torch_on_cpu(op, mode, form):
    w, idx, offs, psw = eb.make_inputs(**vars(_small(mode, "multi_hot")), seed=13, per_sample_weights=mode == "sum")
    kwargs, offsets = {}, offs
    if form == "include_last_offset":
        kwargs, offsets = {"include_last_offset": True}, torch.cat([offs, torch.tensor([idx.numel()])])
    elif form == "2d":
        idx, offsets, psw = idx[:36].reshape(6, 6), None, None if psw is None else psw[:36].reshape(6, 6)
    elif form == "padding_idx":
        kwargs = {"padding_idx": int(idx[0]) - w.shape[0]}  # negative, as torch allows
    a, b = w.clone().requires_grad_(), w.clone().requires_grad_()
    s = None if psw is None else psw.clone().requires_grad_()
    s2 = None if psw is None else psw.clone().requires_grad_()
    got = op(a, idx, offsets, mode, s, **kwargs)
    want = F.embedding_bag(idx, b, offsets, mode=mode, per_sample_weights=s2, **kwargs)
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(a.grad, b.grad)
    if s is not None:
        torch.testing.assert_close(s.grad, s2.grad)


def test_op_errors_on_cpu(op):
    from tuner.errors import KernelInputError
    from tuner.families.embedding_bag.op import embedding_bag

    w, idx, offs, _ = eb.make_inputs(**vars(_small("sum")), seed=1)
    with pytest.raises(KernelInputError, match="outside"):
        op(w, idx + 500, offs, "sum")
    with pytest.raises(KernelInputError, match="offsets"):
        op(w, idx, offs.flip(0), "sum")
    past = offs.clone()
    past[-1] = idx.numel() + 1  # the declaration's guard: offsets within [0, len(indices)]
    with pytest.raises(KernelInputError, match="offsets"):
        op(w, idx, past, "sum")
    past[-1] = idx.numel()  # the last bag empty: allowed
    op(w, idx, past, "sum")
    with pytest.raises(ValueError, match="mode must be one of"):
        op(w, idx, offs, "prod")
    with pytest.raises(ValueError, match="offsets are required"):
        op(w, idx, None, "sum")
    with pytest.raises(ValueError, match="only supported for mode='sum'"):
        op(w, idx, offs, "max", torch.ones(idx.shape))
    with pytest.raises(RuntimeError, match="'indices' to have one of the following scalar types: Long, Int"):
        op(w, idx.float(), offs, "sum")  # outside the op's dtypes: torch's op, and its words
    with pytest.raises(ValueError, match="padding_idx must be within"):
        op(w, idx, offs, "sum", padding_idx=10**6)
    with pytest.raises(ValueError, match="weight has no rows for the indices to name"):
        op(w[:0], idx, offs, "sum")
    torch.testing.assert_close(op(w[:0], idx[:0], offs[:1], "sum"), torch.zeros(1, w.shape[1]))  # nothing named
    for other in ({"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True}):  # torch's function serves
        torch.testing.assert_close(embedding_bag(idx, w.clone(), offs, **other),
                                   torch.nn.functional.embedding_bag(idx, w.clone(), offs, **other))


def test_op_opcheck_compile_and_cpp_kernels(op):
    w, idx, offs, psw = eb.make_inputs(**vars(_small("sum")), seed=2, per_sample_weights=True)
    w.requires_grad_()
    for mode in eb.MODES:
        torch.library.opcheck(torch.ops.tuner.embedding_bag.default,
                              (w, idx, offs, mode, psw if mode == "sum" else None, False, None))
    compiled = torch.compile(lambda a: op(a, idx, offs, "mean").square().sum(), fullgraph=True)
    a, b = w.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    compiled(a).backward()
    F.embedding_bag(idx, b, offs, mode="mean").square().sum().backward()
    torch.testing.assert_close(a.grad, b.grad)
    kernels = {}
    for line in torch._C._dispatch_dump("tuner::embedding_bag").splitlines():
        key, sep, rest = line.partition(": registered at ")
        if sep:
            kernels[key.strip()] = rest
    assert "embedding_bag_op.cpp" in kernels["CUDA"] and "embedding_bag_op.cpp" in kernels["Autograd[alias]"]
    assert "runtime.py" in kernels["CPU"] and "runtime.py" in kernels["Meta"]


def test_the_gather_ceiling_tool_compiles(tmp_path):
    """tools/gather_ceiling.cu measures what docs/benchmarks.md holds the forward to: it must build."""
    import subprocess
    from pathlib import Path

    from tuner.build import toolkit

    src = Path(__file__).resolve().parent.parent / "tools" / "gather_ceiling.cu"
    done = subprocess.run([str(toolkit.nvcc()), "-O3", "-arch=sm_90", "-std=c++17", "-o", str(tmp_path / "g"), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "g").stat().st_size > 0


def test_the_binding_s_functional_form_hands_cpu_calls_to_torch(op):
    """Once bound, TF.embedding_bag's C++ form parses F.embedding_bag's signature and hands every
    call it does not send to the op (here each: a CPU table) to the Python form: torch's answers."""
    from tuner import entries

    fast = entries._functionals["embedding_bag"]
    weight = torch.randn(10, 4)
    ids, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4])
    for kwargs in ({}, {"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"mode": "max", "padding_idx": 2},
                   {"per_sample_weights": torch.rand(8), "mode": "sum", "include_last_offset": True}):
        torch.testing.assert_close(fast(ids, weight.clone(), offsets, **kwargs),
                                   F.embedding_bag(ids, weight.clone(), offsets, **kwargs))
    torch.testing.assert_close(fast(ids.view(2, 4), weight), F.embedding_bag(ids.view(2, 4), weight))


def test_calls_torch_refuses_are_not_the_op_s():
    """`served` leaves a padding_idx outside the table and a mode torch does not know to torch's
    function (its errors), and takes the ones inside, negative ones too."""
    from tuner.families.embedding_bag.op import served

    w, i, o, _ = eb.make_inputs(10, 4, 3, 2, seed=2)
    for pad in (-10, 0, 9, None):
        assert served(i, w, o, padding_idx=pad) is not None
    for kwargs in ({"padding_idx": 10}, {"padding_idx": -11}, {"mode": "avg"}):
        assert served(i, w, o, **kwargs) is None, kwargs


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_the_gpu_tests_hand_written_backward_agrees_with_autograd_of_the_reference(mode):
    """tests/references.py's backward from segment sums (the GPU tests' second opinion) against the
    float64 autograd of the op's reference that the search checks variants by: padding, empty bags,
    per-sample weights in sum mode."""
    import references
    from tuner import opspec
    from tuner.families.embedding_bag import op as eb_op

    w, idx, offs, psw = eb.make_inputs(50, 12, 9, 4, mode, "float32", seed=5,
                                       per_sample_weights=mode == "sum", padding_idx=-1)
    g = torch.randn(9, 12, dtype=torch.float64)
    args = (w, idx, offs, mode, psw, False, -1)
    _, (want_w, want_psw) = opspec.reference_answers(eb.OP_DECLARATION, eb_op.reference, args, [g])
    got_w, got_psw = references.embedding_bag_backward(w, idx, offs, mode, psw, g, padding_idx=49)  # -1, from the end
    assert torch.allclose(got_w, want_w, atol=1e-12) and (want_w != 0).any()
    assert (got_psw is None) == (psw is None)
    if psw is not None:
        assert torch.allclose(got_psw, want_psw, atol=1e-12)


def test_a_count_of_bags_never_puts_a_call_beyond_reach_and_the_counts_measured_decide(op):
    """The key is (dim, mean bag, bags), the count of bags loose: a tuned problem serves every count
    of bags at its dim and bag length, the shapes the export measured at other counts decide there
    (each kind of call by its own verdict), and dim or bag length 16x off is beyond reach."""
    from tuner import runtime
    from tuner.build import binding
    from tuner.deploy import binaries
    from tuner.families.embedding_bag import op as eb_op

    v = next(iter(eb.space()))
    tuned = eb.Problem(mode="sum").__dict__
    mine = {"variant": v.name, "params": v.as_dict()}
    winners = [{"problem": tuned, **mine}, {"problem": {**tuned, "bags": 8192}, **mine, "torch_serves": "inference"},
               {"problem": {**tuned, "dim": 32, "bag_size": 38, "bags": 32768}, "served_by": "torch"}]
    placed, libraries = binaries.build_variants(eb, winners, "sm_90", jobs=1)
    ops = binding.load("embedding_bag")
    keep = runtime.stage(eb_op.OP, ops, placed, libraries)
    ops.publish(False, eb_op.OP.reach)

    def served(dim, bag, bags, grad=False):  # sizes: rows, dim, bags, bag_size, n, bag_length
        return ops.served([5_000_000, dim, bags, bag, bags * bag, -1], torch.float32, torch.int64, 0, grad)

    for grad in (False, True):
        assert served(128, 150, 2048, grad) == v.name
        assert served(128, 150, 16, grad) == v.name  # 128x fewer bags: still within reach
        assert served(32, 38, 16384, grad) == "torch"  # nearest the shape torch's op won
        assert served(8, 150, 2048, grad) == "torch"  # 16x narrower: beyond reach
        assert served(128, 9, 2048, grad) == "torch"  # 16x shorter bags: beyond reach
        # nearer the tuned problem in all (its count of bags) than the shape torch's op won, but 16x
        # off in dim x bag: only the winners within reach are chosen from
        assert served(32, 38, 2048, grad) == "torch"
    assert served(128, 150, 65536) == "torch"  # nearest 8,192 bags: torch's op won the calls without a gradient
    assert served(128, 150, 65536, True) == v.name  # and a variant the training calls
    del keep
