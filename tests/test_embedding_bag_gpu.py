"""EmbeddingBag variants on the GPU: forward and backward in every mode, weight and index dtype
against the float64 reference and torch, the PR's distributions, padding_idx, per_sample_weights,
empty bags, and bad indices and offsets reported (never read out of bounds)."""

import pytest

import oploader

from tuner.families import embedding_bag as eb

pytestmark = pytest.mark.gpu

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.fixture(scope="module")
def kernels(shared_home):
    from tuner import build, gpus
    from tuner.families.embedding_bag.kernel import EmbeddingBagKernel

    import random

    spread = [v for s in eb.all_spaces() for v in s]
    # and a block per bag split over the entries (dims 40/48 need fewer lanes than the block has)
    split = [eb.space(w, "int64").variant(validation="inline", mapping="block", vec=vec, unroll=4, block_size=256,
                                          staging=staging, backward="sorted")
             for w in ("float32", "bfloat16") for vec in (1, 4) for staging in ("direct", "shared")]
    variants = list(dict.fromkeys(eb.covering_set() + random.Random(0).sample(spread, 18) + split))
    built = build.build(variants, gpus.attached().arch)
    assert all(b.ok for b in built), [b.error for b in built if not b.ok][:1]
    return [(b.variant, EmbeddingBagKernel(b.so, b.variant.name, b.entry)) for b in built]


def _close(got, want, dtype):
    import torch

    err = float((got.double() - want).abs().max()) if got.numel() else 0.0
    scale = float(want.abs().max()) if want.numel() else 1.0
    return err <= TOL[dtype] * max(scale, 1.0), err


@pytest.mark.parametrize("mode", eb.MODES)
def test_every_variant_matches_the_reference_forward_and_backward(kernels, mode):
    from tuner.families.embedding_bag.evaluate import TOL, check_case

    for v, k in kernels:
        for dist in eb.DISTRIBUTIONS:
            p = eb.Problem(rows=3000, dim=40 if v["vec"] != 8 else 48, bags=67, bag_size=9, mode=mode,
                           weight=v["weight"], index=v["index"], distribution=dist)
            err, failed = check_case(k, p, mode, seed=11, padding=dist == "multi_hot")
            assert not failed, f"{v.name} {mode} {dist}: {failed} error {err} (tolerance {TOL[v['weight']]})"
            assert k.take_errors() == 0, v.name


@pytest.mark.parametrize("weight", eb.WEIGHT_DTYPES)
def test_reference_on_the_gpu_equals_the_reference_on_the_cpu(weight):
    """The search's checks compute the reference on the GPU: same answers as on the CPU, and they
    stay on the GPU."""
    import torch

    p = eb.Problem(rows=300, dim=24, bags=40, bag_size=6, weight=weight, distribution="one_hot")
    for mode in eb.MODES:
        w, idx, offs, psw = eb.make_inputs(p, seed=3, per_sample_weights=mode == "sum")
        g = torch.randn(p.bags, p.dim, generator=torch.Generator().manual_seed(3)).to(w.dtype)
        for pad in (None, int(idx[0])):
            cpu = (*eb.reference(w, idx, offs, mode, psw, padding_idx=pad),
                   *eb.reference_backward(w, idx, offs, mode, psw, g, padding_idx=pad))
            cw, ci, co, cp, cg = (t.cuda() if t is not None else None for t in (w, idx, offs, psw, g))
            gpu = (*eb.reference(cw, ci, co, mode, cp, padding_idx=pad),
                   *eb.reference_backward(cw, ci, co, mode, cp, cg, padding_idx=pad))
            for want, got in zip(cpu, gpu):
                assert (want is None) == (got is None)
                if want is not None:
                    assert got.device.type == "cuda"
                    torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12)


def test_sorted_backward_is_deterministic(kernels):
    import torch

    for v, k in kernels:
        if v["backward"] != "sorted":
            continue
        p = eb.Problem(rows=2000, dim=64, bags=64, bag_size=40, weight=v["weight"], index=v["index"],
                       distribution="one_hot")
        w, idx, offs, _ = eb.make_inputs(p, seed=5, device="cuda")
        g = torch.randn(p.bags, p.dim, device="cuda").to(w.dtype)
        call, saved = k.prepare(w, idx, offs, "mean")
        call()
        first, _ = k.backward(saved, g)
        for _ in range(3):
            again, _ = k.backward(saved, g)
            assert torch.equal(first, again), v.name


def test_padding_idx_2d_indices_and_a_dim_not_a_multiple_of_vec(kernels):
    import torch
    import torch.nn.functional as F

    for v, k in kernels[:12]:
        p = eb.Problem(rows=500, dim=37, bags=20, bag_size=5, weight=v["weight"], index=v["index"],
                       distribution="one_hot")
        w, idx, offs, _ = eb.make_inputs(p, seed=2, device="cuda")
        pad = int(idx[0])
        for mode in eb.MODES:
            got, _, _ = k.forward(w, idx, offs, mode, padding_idx=pad)
            want = F.embedding_bag(idx.cpu().long(), w.cpu().double(), offs.cpu().long(), mode=mode, padding_idx=pad)
            assert _close(got.cpu(), want, v["weight"])[0], (v.name, mode)
        grid = idx[:36].reshape(6, 6)
        got, _, _ = k.forward(w, grid, None, "sum")
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


# ------------------------------------------------------------------ the op

@pytest.fixture(scope="module")
def op(shared_home, tmp_path_factory):
    """tuner.load of an artifact with two winners per problem kind: an atomic one for float32 and
    a sorted one (bound for every dtype pair); the other pairs get their parameters."""
    import tuner
    from tuner import export, gpus
    from tuner.variant import Variant

    winners = []
    for weight, backward, validation in (("float32", "atomic", "hoisted"), ("bfloat16", "sorted", "inline")):
        params = {"weight": weight, "index": "int64", "validation": validation, "mapping": "warp", "vec": 4,
                  "unroll": 4, "block_size": 128, "staging": "shared", "backward": backward}
        problem = eb.Problem(weight=weight, mode="mean").__dict__
        winners.append({"variant": Variant.of(eb.FAMILY, params), "problem": problem})
    out = export.write(tmp_path_factory.mktemp("eb-artifact"), winners, gpus.attached().describe())
    return oploader.load(out, validate="sync")


@pytest.mark.parametrize("weight", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("index", ["int64", "int32"])
def test_op_forward_and_backward_match_torch(op, weight, index):
    import warnings

    import torch
    import torch.nn.functional as F

    p = eb.Problem(rows=4000, dim=64, bags=50, bag_size=12, weight=weight, index=index, distribution="multi_hot")
    w, idx, offs, psw = eb.make_inputs(p, seed=9, device="cuda", per_sample_weights=True)
    tol = dict(atol=TOL[weight] * 4, rtol=TOL[weight] * 4)
    for mode in eb.MODES:
        for kwargs in ({}, {"include_last_offset": True}, {"padding_idx": int(idx[1])}):
            offsets = torch.cat([offs, offs.new_tensor([idx.numel()])]) if kwargs.get("include_last_offset") else offs
            s = psw.clone().requires_grad_() if mode == "sum" else None
            s2 = psw.clone().requires_grad_() if mode == "sum" else None
            a, b = w.clone().requires_grad_(), w.clone().requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # untuned pairs warn once
                got = op(a, idx, offsets, mode, s, **kwargs)
            want = F.embedding_bag(idx, b, offsets, mode=mode, per_sample_weights=s2, **kwargs)
            torch.testing.assert_close(got, want, **tol)
            g = torch.randn_like(want)
            got.backward(g)
            if weight == "bfloat16":  # torch has no CUDA bfloat16 backward for max or per_sample_weights
                want_w, want_psw = eb.reference_backward(w, idx, offsets, mode, psw if s is not None else None, g,
                                                         **kwargs)
                torch.testing.assert_close(a.grad.double(), want_w, **tol)  # the reference stays on the GPU
                if s is not None:
                    torch.testing.assert_close(s.grad.double(), want_psw, **tol)
                continue
            want.backward(g)
            torch.testing.assert_close(a.grad, b.grad, **tol)
            if s is not None:
                torch.testing.assert_close(s.grad, s2.grad, **tol)


def test_op_2d_indices_empty_bags_and_errors(op):
    import torch
    import torch.nn.functional as F

    KernelInputError = oploader.kernel_input_error("embedding_bag")

    w = torch.randn(100, 16, device="cuda")
    grid = torch.randint(0, 100, (7, 5), device="cuda")
    torch.testing.assert_close(op(w, grid, None, "max"), F.embedding_bag(grid, w, mode="max"))
    idx = torch.randint(0, 100, (10,), device="cuda")
    offs = torch.tensor([0, 0, 4, 4, 10], device="cuda")  # empty bags, and the last one
    for mode in eb.MODES:
        torch.testing.assert_close(op(w, idx, offs, mode), F.embedding_bag(idx, w, offs, mode=mode))
    with pytest.raises(KernelInputError, match="outside"):
        op(w, idx.clone().fill_(100), offs, "sum")
    with pytest.raises(KernelInputError, match="offsets"):
        op(w, idx, torch.tensor([0, 5, 3], device="cuda"), "sum")
    with pytest.raises(ValueError, match="per_sample_weights"):
        op(w, idx, offs, "mean", torch.ones(10, device="cuda"))
    from tuner.families.embedding_bag.op import embedding_bag

    for bad in ({"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True}):
        with pytest.raises(NotImplementedError, match=next(iter(bad))):
            embedding_bag(idx, w, offs, **bad)
    torch.testing.assert_close(op(w, idx, offs, "sum"), F.embedding_bag(idx, w, offs, mode="sum"))  # alive


def test_op_opcheck_and_compile(op):
    import torch
    import torch.nn.functional as F

    w = torch.randn(300, 32, device="cuda", requires_grad=True)
    idx = torch.randint(0, 300, (90,), device="cuda")
    offs = torch.arange(0, 90, 9, device="cuda")
    for mode in eb.MODES:
        torch.library.opcheck(torch.ops.tuner.embedding_bag.default, (w, idx, offs, mode, None, False, None))

    def step(weight, i, o):
        return op(weight, i, o, "mean").square().sum()

    compiled = torch.compile(step, fullgraph=True)
    a = w.detach().clone().requires_grad_()
    compiled(a, idx, offs).backward()
    b = w.detach().clone().requires_grad_()
    F.embedding_bag(idx, b, offs, mode="mean").square().sum().backward()
    torch.testing.assert_close(a.grad, b.grad)
