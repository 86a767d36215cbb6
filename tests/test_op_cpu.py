"""The op's C++ call path, checked on a machine without a GPU: where its kernels are
registered, which winner a call binds to, and that CPU and CUDA agree on bad input."""

import math
import random

import pytest
import torch

import tuner
from tuner import runtime
from tuner.build import binding
from tuner.deploy import export
from tuner.errors import KernelInputError
from tuner.families import giou
from tuner.families.giou import op as giou_op
import references

GPU = {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}


def _variant(pred, target, **params):
    base = {"boxes_per_thread": 2, "padding": "branch", "validation": "hoisted", "block_size": 256,
            "loads": "vector", "reduction": "atomic", "backward": "recompute", **params}
    return giou.space(pred, target).variant(**base)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    winners = [
        {"variant": _variant("bfloat16", "uint8", block_size=512), "problem": giou.Problem(1024, 256).__dict__},
        {"variant": _variant("bfloat16", "uint8", block_size=128, backward="fused"),
         "problem": giou.Problem(64, 256).__dict__},
        {"variant": _variant("bfloat16", "uint8", block_size=64), "problem": giou.Problem(4096, 32).__dict__},
    ]
    return export.write(tmp_path_factory.mktemp("artifact"), winners, GPU)


@pytest.fixture(scope="module")
def op(artifact, shared_home):
    return tuner.load(artifact)


def _kernels(name: str) -> dict[str, str]:
    """Dispatch key -> where its kernel was registered, from the dispatcher's own dump."""
    out = {}
    for line in torch._C._dispatch_dump(name).splitlines():
        key, sep, rest = line.partition(": registered at ")
        if sep:
            out[key.strip()] = rest
    return out


def test_cuda_and_autograd_kernels_are_registered_from_cpp(op):
    """From the op's C++, rendered from its declaration into the binding's giou_op.cpp."""
    assert isinstance(op, torch._ops.OpOverloadPacket) and str(op) == "tuner.giou_loss"
    loss = _kernels("tuner::giou_loss")
    assert "giou_op.cpp" in loss["CUDA"] and "giou_op.cpp" in loss["Autograd[alias]"]
    assert "runtime.py" in loss["CPU"] and "runtime.py" in loss["Meta"]  # the reference and the fake, by the runtime
    for name in ("tuner::giou_loss_forward", "tuner::giou_loss_backward"):
        assert "giou_op.cpp" in _kernels(name)["CUDA"]
    # The schema itself is defined in C++ too.
    assert "giou_op.cpp" in torch._C._dispatch_dump("tuner::giou_loss").split("debug:")[1].splitlines()[0]


def test_cpu_and_cuda_agree_on_what_is_an_error(op):
    p, t, n = giou.make_inputs(4, 6, "float32", "float16", "uniform")
    for value in (7, -1):  # a validating kernel reports these; the CPU reference raises at once
        bad = n.clone()
        bad[1] = value
        with pytest.raises(KernelInputError, match=r"num_boxes has a value outside \[0, S\]"):
            op(p, t, bad)
    t2 = t.clone()
    t2[0, 0, 1] = float("inf")
    with pytest.raises(KernelInputError, match="non-finite"):
        op(p, t2, torch.full_like(n, 6))
    t2[0, 0, 1] = 0  # a non-finite value in a padding slot is not an error
    t2[0, 5, 1] = float("nan")
    assert torch.isfinite(op(p, t2, torch.full((4,), 5)))


def test_num_boxes_may_be_left_out(op):
    """The padded-target convention: a call without num_boxes (valid where a target's y2 > 0)."""
    p, t, n = giou.make_inputs(4, 6, "float32", "uint8")
    assert "Tensor? num_boxes=None" in str(torch.ops.tuner.giou_loss.default._schema)
    torch.testing.assert_close(op(p, t), giou.reference(p, t, None).float())


def test_a_double_backward_fails_rather_than_giving_no_gradient(op):
    """create_graph=True: the first gradients are the op's; differentiating them again raises, as torch's
    ops without a double backward do (it gave no gradient, silently, behind autograd's warning)."""
    p, t, n = giou.make_inputs(2, 3, "float32", "uint8", "full", seed=1)
    leaf = p.clone().requires_grad_()
    (g,) = torch.autograd.grad(op(leaf, t, n, "sum"), leaf, create_graph=True)
    want = references.with_grad(giou, p, t, n, "sum")[1]
    torch.testing.assert_close(g.detach().double(), want, rtol=1e-5, atol=1e-6)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="giou_loss: its backward is not differentiable"):
        (g ** 2).sum().backward()
    with pytest.raises(RuntimeError, match="not differentiable"):
        torch.autograd.grad((g ** 2).sum(), leaf)
    (again,) = torch.autograd.grad(op(leaf, t, n, "sum"), leaf)  # first order as before
    assert not again.requires_grad and torch.equal(again, g.detach())


def test_num_boxes_of_any_integer_dtype(op):
    p, t, n = giou.make_inputs(4, 6, "float32", "uint8")
    want = op(p, t, n)
    for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32):
        assert torch.equal(op(p, t, n.to(dtype)), want)
    with pytest.raises(TypeError, match="integer tensor"):
        op(p, t, n.bool())


def _nearest(winners, B, S):
    """The rule the C++ applies per call (tuner_op.h's nearest): nearest tuned shape in log distance,
    the logs' differences summed, first of equals (within 1e-12)."""
    def distance(w):
        p = w["problem"]
        return (abs(math.log(max(B, 1)) - math.log(p["batch"]))
                + abs(math.log(max(S, 1)) - math.log(p["slots"])))

    best = 0
    for i, w in enumerate(winners):
        if distance(w) < distance(winners[best]) - 1e-12:
            best = i
    return best


@pytest.mark.filterwarnings("ignore:giou_loss. no variant was tuned:UserWarning")  # untuned pairs, on purpose
def test_cpp_picks_the_same_winner_as_python(artifact, op, shared_home):
    """Stages the artifact's prebuilt variants (built for sm_90, never run here) and asks the
    C++ table which winner each shape gets."""
    manifest = export.read(artifact)
    bound = manifest["binaries"]["bound"]
    libraries = {name: artifact / name for name in manifest["binaries"]["libraries"]}
    ops = binding.load("giou")
    keep = runtime.stage(giou_op.OP, ops, bound, libraries)
    ops.publish(False, 0.0)
    rng = random.Random(0)
    for _ in range(200):
        pred, target = rng.choice(giou.PRED_DTYPES), rng.choice(giou.TARGET_DTYPES)
        B, S = rng.choice([0, 1, 63, 64, 100, 256, 1023, 2048, 4096, 10**6]), rng.choice([1, 7, 32, 64, 256, 300])
        winners = [b for b in bound if (b["params"]["pred"], b["params"]["target"]) == (pred, target)]
        got = ops.served([B, S], getattr(torch, pred), getattr(torch, target))
        assert got == winners[_nearest(winners, B, S)]["variant"], (pred, target, B, S)
    # 256 x 256 is ln 4 from 1024 x 256 and from 64 x 256: the first of equals, in the order bound
    tied = [b for b in bound if (b["params"]["pred"], b["params"]["target"]) == ("bfloat16", "uint8")]
    assert [b["problem"]["batch"] for b in tied[:2]] == [1024, 64]
    assert ops.served([256, 256], torch.bfloat16, torch.uint8) == tied[0]["variant"] != tied[1]["variant"]
    # One fused winner: every pair binds its parameters, so every forward keeps room for a saved gradient.
    assert all(ops.keeps_saved_grad(getattr(torch, p), getattr(torch, t))
               for p in giou.PRED_DTYPES for t in giou.TARGET_DTYPES)
    f = torch.ops.tuner.giou_loss_forward(*giou.make_inputs(3, 5, "float32", "uint8"), "mean", 1e-7)
    assert f[2].shape == (3, 5, 4)
    del keep


@pytest.mark.parametrize("bad", [
    lambda p, t, n: (p[0], t[0], n),
    lambda p, t, n: (p, t[:, :3], n),
    lambda p, t, n: (p[..., :3], t[..., :3], n),
    lambda p, t, n: (p, t, n.float()),
    lambda p, t, n: (p, t, n[:2]),
])
def test_cpp_checks_raise_what_the_cpu_path_raises(op, bad):
    """The CUDA kernel's input checks (C++) run here by sending CPU tensors straight to it:
    same exception type and message as the Python CPU implementation."""
    p, t, n = giou.make_inputs(4, 5, "float32", "uint8")
    args = bad(p, t, n)
    with pytest.raises((ValueError, TypeError)) as want:
        op(*args)
    cuda_kernel = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    with pytest.raises(type(want.value)) as got:
        torch.ops.tuner.giou_loss.default.redispatch(cuda_kernel, *args, "mean", 1e-7)
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]


@pytest.mark.parametrize("outside", [lambda p, t: (p.double(), t), lambda p, t: (p, t.to(torch.int32))])
def test_a_call_outside_the_variants_dtypes_is_the_eager_losss(op, outside):
    """Dtypes no variant takes are handed to torch's formula (the baseline), by the C++ kernel and
    the CPU path alike, in float32 as the eager loss computes."""
    from tuner.families.giou.spec import eager

    p, t, n = giou.make_inputs(4, 5, "float32", "uint8")
    p, t = outside(p, t)
    want = eager(p, t, n, "sum")
    torch.testing.assert_close(op(p, t, n, "sum"), want)
    cuda_kernel = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    torch.testing.assert_close(torch.ops.tuner.giou_loss.default.redispatch(cuda_kernel, p, t, n, "sum", 1e-7), want)


def test_fake_impls_are_registered_by_the_runtime(op):
    """torch.compile traces the op with fake tensors: the runtime registers the family's fake
    implementations when it binds an export (a wheel's copy of it too, so the C++ names no
    Python module to import)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        p, t = torch.empty(8, 16, 4, dtype=torch.bfloat16), torch.empty(8, 16, 4, dtype=torch.uint8)
        n = torch.empty(8, dtype=torch.int64)
        loss = torch.ops.tuner.giou_loss(p, t, n, "none")
        fwd = torch.ops.tuner.giou_loss_forward(p, t, n, "mean", 1e-7)
    assert loss.shape == (8, 16) and fwd[0].shape == ()


@pytest.mark.filterwarnings("ignore:giou_loss. no variant was tuned:UserWarning")  # an untuned pair, on purpose
def test_the_eager_loss_serves_where_no_variant_beat_it(tmp_path, shared_home):
    """GIoU's baseline, the eager loss, serves the problems where the search timed it ahead of the
    winner; every other shape and dtype pair runs the nearest tuned parameters (the binding staged
    here, its variants built for sm_90 and never run)."""
    from tuner.store.records import served_by

    times = {"fwd": {"median_us": 10.0, "spread_us": 0.1}, "bwd": {"median_us": 20.0, "spread_us": 0.1}}
    faster = {"fwd": {"median_us": 5.0, "spread_us": 0.1}, "bwd": {"median_us": 9.0, "spread_us": 0.1}}
    winners = [{"variant": _variant("bfloat16", "uint8"), "problem": giou.Problem(1024, 256).__dict__,
                "timings": times, "baseline_us": {"fwd": {"median_us": 30.0}, "bwd": {"median_us": 60.0}},
                "served_by": served_by(times, {"fwd": {"median_us": 30.0}, "bwd": {"median_us": 60.0}}, "fwd+bwd")},
               {"variant": _variant("bfloat16", "uint8"), "problem": giou.Problem(16, 8).__dict__,
                "timings": times, "baseline_us": faster, "served_by": served_by(times, faster, "fwd+bwd")}]
    out = export.write(tmp_path / "giou", winners, GPU)
    manifest = export.read(out)
    assert [e["served_by"] for e in manifest["entries"]] == ["variant", "torch"]
    ops = binding.load("giou")
    keep = runtime.stage(giou_op.OP, ops, manifest["binaries"]["bound"],
                         {n: out / n for n in manifest["binaries"]["libraries"]})
    ops.publish(False, giou_op.OP.reach)
    bf16, u8, f32 = torch.bfloat16, torch.uint8, torch.float32
    assert ops.served([1024, 256], bf16, u8) != "torch"
    assert ops.served([16, 8], bf16, u8) == "torch" and ops.served([20, 6], bf16, u8) == "torch"
    assert ops.served([10**6, 4096], bf16, u8) != "torch"  # far away: still the nearest variant
    assert ops.served([1024, 256], f32, f32) != "torch"  # an untuned pair runs the tuned parameters
    assert ops.served([16, 8], f32, f32) == "torch"  # but where torch won, torch
    del keep
