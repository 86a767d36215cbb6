"""RMSNorm, the third family, on a machine without a GPU: its space, its reference against
torch's F.rms_norm in every dtype, every dtype pair's variants compiling, and its C++ op
bound from an export (CPU kernels, autograd, opcheck, clear errors)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner import opspec, runtime
from tuner.build import binding
from tuner.build import compile as build
from tuner.deploy import export, regions
from tuner.families import rms_norm
from tuner.families.rms_norm import op as rms_op
from tuner.store.records import served_by

GPU = {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}



def reference_backward(x, w, g, eps=rms_norm.DEFAULT_EPS):
    """The float64 gradients of x and weight (the declared op's reference, by autograd)."""
    return opspec.reference_gradients(rms_norm.OP_DECLARATION, rms_norm.reference, (x, w, eps), g)

def test_space_keeps_invalid_points_out():
    s = rms_norm.space("bfloat16", "bfloat16")
    assert 3000 < len(s) < 6000
    for v in s:
        p = v.as_dict()
        assert p["threads_per_row"] <= p["block_size"] and p["vec"] * p["unroll"] <= 16
        assert p["bwd_blocks"] * p["block_size"] <= 2048
    assert all(v.as_dict()["vec"] <= 4 for v in rms_norm.space("bfloat16", "float32"))  # 16-byte loads of fp32
    with pytest.raises(tuner.errors.SpaceError, match="not one of"):
        rms_norm.space("int8", "float32")


@pytest.mark.parametrize("x_dtype,w_dtype", list(itertools.product(DT, DT)))
def test_reference_matches_torch(x_dtype, w_dtype):
    x, w = rms_norm.make_inputs(33, 257, x_dtype, w_dtype, device="cpu", seed=3)
    want = F.rms_norm(x.double(), (257,), w.double(), rms_norm.DEFAULT_EPS)
    torch.testing.assert_close(rms_norm.reference(x, w), want)
    # torch in the storage dtype (math in float32) agrees within that dtype's rounding
    got = F.rms_norm(x.float(), (257,), w.float(), rms_norm.DEFAULT_EPS).to(DT[x_dtype])
    torch.testing.assert_close(rms_norm.reference(x, w).to(DT[x_dtype]), got, rtol=2e-2, atol=2e-2)
    g = torch.randn(33, 257, dtype=torch.float64)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want_x, want_w = torch.autograd.grad(F.rms_norm(x64, (257,), w64, rms_norm.DEFAULT_EPS), (x64, w64), g)
    got_x, got_w = reference_backward(x, w, g)
    torch.testing.assert_close(got_x, want_x)
    torch.testing.assert_close(got_w, want_w)


@pytest.mark.slow
def test_every_dtype_pair_compiles(tuner_home):
    variants = rms_norm.covering_set()
    assert {(v.as_dict()["x"], v.as_dict()["weight"]) for v in variants} == set(itertools.product(DT, DT))
    builds = build.build(variants, "sm_90")
    assert all(b.ok for b in builds), [b.error for b in builds if not b.ok][:1]


@pytest.fixture(scope="module")
def op(rms_norm_op):
    return rms_norm_op


def test_the_op_is_native(op):
    assert isinstance(op, torch._ops.OpOverloadPacket) and str(op) == "tuner.rms_norm"
    kernels = {line.split(":")[0].strip(): line for line in torch._C._dispatch_dump("tuner::rms_norm").splitlines()
               if "registered at" in line}
    assert "rms_norm_op.cpp" in kernels["CUDA"] and "rms_norm_op.cpp" in kernels["Autograd[alias]"]
    assert "runtime.py" in kernels["CPU"] and "runtime.py" in kernels["Meta"]


@pytest.mark.parametrize("x_dtype,w_dtype", [("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float32")])
def test_the_op_on_cpu_is_the_reference_with_its_gradients(op, x_dtype, w_dtype):
    x, w = rms_norm.make_inputs(4 * 7, 129, x_dtype, w_dtype, device="cpu", seed=1)
    x = x.reshape(4, 7, 129).requires_grad_()
    w.requires_grad_()
    y = op(x, w)
    assert y.dtype == x.dtype and y.shape == x.shape
    torch.testing.assert_close(y, rms_norm.reference(x.detach(), w.detach()).to(x.dtype))
    g = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    want_x, want_w = reference_backward(x.detach(), w.detach(), g)
    torch.testing.assert_close(gx, want_x.to(x.dtype))
    torch.testing.assert_close(gw, want_w.to(w.dtype))
    torch.library.opcheck(op, (x.detach(), w.detach(), 1e-5))


def test_bad_input_is_refused_clearly(op):
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \[8\]"):
        op(x, torch.ones(7))
    with pytest.raises(ValueError, match="x is on cpu but weight is on meta"):
        op(x, torch.ones(8, device="meta"))
    with pytest.raises(ValueError, match="at least one dimension"):
        op(torch.tensor(1.0), None)


def test_the_bindings_python_entry_is_the_op(op):
    """runtime.entry: the op through torch's argument parser, as ATen's functions are called (no
    torch.ops packet): the packet's answers, gradients, defaults, keywords and errors; a call that
    torch function handling must see goes through the packet."""
    from modes import Recording

    entry = runtime.entry("rms_norm")
    assert entry is not op and entry.__name__ == "rms_norm"
    x, w = rms_norm.make_inputs(6, 40, "float32", "float32", device="cpu", seed=2)
    torch.testing.assert_close(entry(x, w, 1e-5), op(x, w, 1e-5))
    torch.testing.assert_close(entry(x), op(x))  # the defaults: no weight, eps 1e-6
    torch.testing.assert_close(entry(x, eps=1e-3, weight=w), op(x, w, 1e-3))
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    g = torch.randn_like(x)
    got = torch.autograd.grad(entry(xg, wg), (xg, wg), g)
    want = torch.autograd.grad(op(xg, wg), (xg, wg), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match=r"weight must have shape \[40\]"):
        entry(x, torch.ones(7))
    with pytest.raises(TypeError, match="eps"):
        entry(x, w, "small")

    with Recording() as seen:
        torch.testing.assert_close(entry(x, w), op(x, w))
    assert torch.ops.tuner.rms_norm in seen.calls  # the op by its one name (tuner.load's calls its entry)


def test_calls_no_variant_takes_are_torch_s(op):
    """No weight, a frozen weight, float64: every form F.rms_norm accepts works, with its results."""
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64)
    for weight in (None, w, w.float()):
        y = op(x, weight, 1e-5)
        torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (8,), weight, 1e-5))
        assert y.dtype == x.dtype
        (gx,) = torch.autograd.grad(y.sum(), x)
        assert gx.shape == x.shape
    xf = x.detach().float().requires_grad_()
    (gx,) = torch.autograd.grad(op(xf, w.float(), 1e-5).sum(), xf)  # a frozen weight: x's gradient alone
    want = reference_backward(xf.detach(), w.float(), torch.ones_like(xf), 1e-5)[0]
    torch.testing.assert_close(gx, want.float())
    torch.testing.assert_close(op(xf, None), torch.nn.functional.rms_norm(xf, (8,), None, 1e-6))


def _timed(fwd: float, bwd: float) -> dict:
    return {"fwd": {"median_us": fwd, "spread_us": 0.1}, "bwd": {"median_us": bwd, "spread_us": 0.1}}


def test_served_by_the_winner_only_where_it_beats_torch_in_forward_and_in_sum():
    torch_op = _timed(10.0, 20.0)
    assert served_by(_timed(9.0, 19.0), torch_op, "fwd+bwd") == "variant"
    assert served_by(_timed(11.0, 10.0), torch_op, "fwd+bwd") == "torch"  # faster step, slower inference
    assert served_by(_timed(9.0, 22.0), torch_op, "fwd+bwd") == "torch"  # faster inference, slower step
    assert served_by(_timed(9.0, 22.0), torch_op, "fwd") == "variant"
    assert served_by(_timed(10.0, 19.0), torch_op, "bwd") == "variant"
    assert served_by(_timed(10.0, 19.0), None, "fwd+bwd") == "variant"  # no baseline timed (a simulation)
    # what the op pays beside a variant's timed backward (EmbeddingBag's zeroing) counts against it
    assert served_by(_timed(9.0, 19.0), {**torch_op, "variant_extra": {"median_us": 2.0}}, "fwd+bwd") == "torch"


def test_export_binds_torch_where_no_variant_beat_it_and_for_untuned_pairs(tmp_path, shared_home):
    """An export of three bfloat16 problems, one where torch's op won: the binding (C++, its
    variants built for sm_90 and staged, never run here) serves each call as the export says,
    torch beyond a tuned problem's reach and for every same-dtype pair nobody tuned; a pair torch does
    not fuse (a weight of another dtype than x) runs the tuned parameters, rendered for it, at every shape."""
    space = rms_norm.space()
    fast = space.variant(threads_per_row=256, block_size=256, vec=8, unroll=2, rstd="saved",
                         grad_weight="partials", bwd_blocks=2, walk="resident")
    wide = space.variant(threads_per_row=1024, block_size=1024, vec=8, unroll=1, rstd="saved",
                         grad_weight="atomic", bwd_blocks=1, walk="blocks")
    torch_op = _timed(30.0, 60.0)

    def won(variant, rows, width, timings):
        return {"variant": variant, "problem": rms_norm.Problem(rows, width).__dict__, "timings": timings,
                "objective": "fwd+bwd", "objective_us": timings["fwd"]["median_us"] + timings["bwd"]["median_us"],
                "baseline_us": torch_op, "served_by": served_by(timings, torch_op, "fwd+bwd")}

    # a shape the check measured, where torch's op won the calls without a gradient and the variant
    # the training calls
    one_kind = regions.decide([{"problem": rms_norm.Problem(1024, 4096).__dict__,
                                "near": export.problem_key(rms_norm.Problem(4096, 4096).__dict__)}],
                              {export.problem_key(rms_norm.Problem(1024, 4096).__dict__): {
                                  "fwd GPU": 1.2, "fwd+bwd GPU": 0.6, "fwd wall": 0.9, "fwd+bwd wall": 0.7}}, 1.0)
    assert one_kind[0]["served_by"] == "variant" and one_kind[0]["torch_serves"] == "inference"
    out = export.write(tmp_path / "rms", [won(fast, 4096, 4096, _timed(20.0, 50.0)),
                                          won(wide, 16384, 8192, _timed(25.0, 55.0)),
                                          won(fast, 65536, 768, _timed(31.0, 40.0))], GPU, regions=one_kind)
    manifest = export.read(out)
    assert "1024 x 4096 (inference)" in manifest["serving"]["bfloat16/bfloat16"]
    assert [e["served_by"] for e in manifest["entries"]] == ["variant", "variant", "torch"]
    assert manifest["serving"]["float16/float32"].startswith("variants at every shape")
    bound = manifest["binaries"]["bound"]
    tuned = [b for b in bound if not b.get("tuned_for")]
    assert [b.get("variant") for b in tuned] == [fast.name, wide.name, None, fast.name]  # bfloat16/bfloat16's own
    assert tuned[3]["torch_serves"] == "inference"
    assert "library" not in tuned[2]  # torch's row needs none
    mixed = {(b["problem"]["x"], b["problem"]["weight"]) for b in bound if b.get("tuned_for")}
    assert mixed == {(x, w) for x in rms_norm.DTYPES for w in rms_norm.DTYPES if x != w}
    assert all(b["tuned_for"] == "bfloat16/bfloat16" and "library" in b for b in bound if b.get("tuned_for"))
    ops = binding.load("rms_norm")
    keep = runtime.stage(rms_op.OP, ops, bound, {n: out / n for n in manifest["binaries"]["libraries"]})
    ops.publish(False, rms_op.OP.reach)
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    assert ops.served([4096, 4096], bf16, bf16) == fast.name
    assert ops.served([2048, 8192], bf16, bf16) == fast.name  # 2x both ways: within reach
    assert ops.served([16384, 8192], bf16, bf16) == wide.name
    assert ops.served([65536, 768], bf16, bf16) == "torch"  # the variant did not beat torch here
    assert ops.served([65536, 1024], bf16, bf16) == "torch"  # nearest to that problem
    assert ops.served([64, 128], bf16, bf16) == "torch"  # beyond every tuned problem's reach
    for grad in (False, True):  # nothing but the measured shape gives torch's op one kind of call
        assert ops.served([4096, 4096], bf16, bf16, grad) == fast.name
        assert ops.served([65536, 768], bf16, bf16, grad) == "torch"
    assert ops.served([1024, 4096], bf16, bf16) == "torch"  # a call without a gradient there: torch's op won it
    assert ops.served([1024, 4096], bf16, bf16, True) == fast.name  # a training call: the variant won it
    assert ops.served([1024, 4096], bf16, bf16, grad=True) == fast.name
    for x, w in ((fp32, fp32), (fp16, fp16)):
        assert ops.served([4096, 4096], x, w) == "torch"  # untuned pairs torch fuses
    for x, w in ((fp16, fp32), (bf16, fp32), (fp32, bf16)):  # unfused by torch: the tuned parameters, anywhere
        assert ops.served([4096, 4096], x, w).startswith("rms_norm.")
        assert ops.served([64, 128], x, w) == ops.served([4096, 4096], x, w)
        assert ops.served([65536, 768], x, w) != "torch"  # where torch's fused op won, its unfused one does not
    del keep
