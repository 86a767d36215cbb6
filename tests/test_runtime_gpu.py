"""The exported op on the GPU: opcheck, gradients, torch.compile, CUDA graphs, hostile inputs."""

import os
import subprocess
import sys

import pytest

from tuner.families import giou
import oploader
import references

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def op(shared_home, tmp_path_factory):
    import tuner
    from tuner import gpus
    from tuner.deploy import export

    winners = [{"variant": v, "problem": giou.Problem(1024, 256, v["pred"], v["target"]).__dict__}
               for v in giou.covering_set()]
    out = export.write(tmp_path_factory.mktemp("artifact"), winners, gpus.attached().describe())
    return oploader.load(out), out


@pytest.fixture
def validating(op, tmp_path):
    """The op loaded from an artifact whose bfloat16/uint8 winner validates its input (hoisted);
    the module's artifact is loaded again afterwards."""
    import tuner
    from tuner import gpus
    from tuner.deploy import export

    _, covering = op
    v = giou.space("bfloat16", "uint8").variant(
        boxes_per_thread=2, padding="branch", validation="hoisted", block_size=256, loads="vector",
        reduction="atomic", backward="fused")
    out = export.write(tmp_path, [{"variant": v, "problem": giou.Problem().__dict__}],
                       gpus.attached().describe())
    try:
        yield oploader.load(out), out
    finally:
        oploader.load(covering)


@pytest.fixture(params=["covering set", "validating winner"])
def either(request):
    """Each of the two artifacts in turn: a winner that does not validate, and one that does."""
    return request.getfixturevalue("op" if request.param == "covering set" else "validating")


PAIRS = [(p, t) for p in giou.PRED_DTYPES for t in giou.TARGET_DTYPES]


def _inputs(pred, target, B=64, S=256, dist="uniform"):
    return giou.make_inputs(B, S, pred, target, dist, device="cuda")


@pytest.mark.parametrize("pred,target", [("bfloat16", "uint8"), ("float32", "float32"), ("float16", "bfloat16")])
def test_opcheck(op, pred, target):
    import torch

    p, t, n = _inputs(pred, target, B=8, S=16)
    for reduction in ("mean", "none"):
        torch.library.opcheck(torch.ops.tuner.giou_loss, (p.clone().requires_grad_(True), t, n, reduction))
    torch.library.opcheck(torch.ops.tuner.giou_loss, (p, t, None, "sum"))
    torch.library.opcheck(torch.ops.tuner.giou_loss_forward, (p, t, None, "none", 1e-7))


@pytest.mark.parametrize("pred,target", PAIRS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_gradients_match_the_reference(op, pred, target, reduction):
    import torch

    fn, _ = op
    p, t, n = _inputs(pred, target)
    leaf = p.clone().requires_grad_(True)
    loss = fn(leaf, t, n, reduction)
    g = torch.rand_like(loss) + 0.5
    loss.backward(g)
    want, want_grad = references.with_grad(giou, p, t, n, reduction, grad_out=g)
    assert giou.check("loss", loss, want, giou.LOSS_TOL)[0]
    ok, _, msg = giou.check("grad", leaf.grad, want_grad, giou.GRAD_TOL[pred], getattr(torch, pred))
    assert ok, msg
    assert leaf.grad.dtype == p.dtype


def test_torch_compile_fullgraph(op):
    import torch

    fn, _ = op
    compiled = torch.compile(lambda p, t, n: fn(p, t, n) * 2.0, fullgraph=True)
    p, t, n = _inputs("bfloat16", "uint8", B=1024)
    a = p.clone().requires_grad_(True)
    b = p.clone().requires_grad_(True)
    out_c, out_e = compiled(a, t, n), fn(b, t, n) * 2.0
    out_c.backward()
    out_e.backward()
    assert torch.allclose(out_c, out_e, rtol=1e-5) and torch.allclose(a.grad, b.grad, rtol=1e-2, atol=1e-6)


def test_cuda_graph_capture(op):
    import torch

    fn, _ = op
    p, t, n = _inputs("bfloat16", "uint8", B=1024)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(p, t, n)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(p, t, n)
    p2, t2, n2 = _inputs("bfloat16", "uint8", B=1024)
    p.copy_(p2), t.copy_(t2), n.copy_(n2)
    graph.replay()
    torch.cuda.synchronize()
    assert giou.check("graph", out, giou.reference(p, t, n), giou.LOSS_TOL)[0]


def _usable(fn):
    p, t, n = _inputs("bfloat16", "uint8", B=4, S=8)
    assert giou.check("after", fn(p, t, n), giou.reference(p, t, n), giou.LOSS_TOL)[0]


def test_hostile_inputs_error_or_match_the_reference(op):
    import torch

    fn, _ = op
    p, t, n = _inputs("bfloat16", "uint8", B=16, S=32)
    with pytest.raises(ValueError, match="target is on cpu"):
        fn(p, t.cpu(), n)
    with pytest.raises(ValueError, match="num_boxes is on cpu"):
        fn(p, t, n.cpu())
    from tuner.families.giou.spec import eager

    torch.testing.assert_close(fn(p.double(), t, n), eager(p.double(), t, n))  # no variant's dtype: torch's formula
    with pytest.raises(TypeError, match="num_boxes must be an integer tensor"):
        fn(p, t, n.float())
    with pytest.raises(ValueError, match="shape"):
        fn(p, t[:8], n)
    _usable(fn)
    # Empty batch: mean and sum are 0, none is empty.
    e = p[:0]
    assert fn(e, t[:0], n[:0]).item() == 0.0 and fn(e, t[:0], n[:0], "none").shape == (0, 32)
    # Non-contiguous views are accepted.
    pt, tt = p.transpose(0, 1).contiguous().transpose(0, 1), t.transpose(0, 1).contiguous().transpose(0, 1)
    assert not pt.is_contiguous()
    assert giou.check("view", fn(pt, tt, n), giou.reference(p, t, n), giou.LOSS_TOL)[0]
    # Degenerate boxes (x2 < x1) and huge or negative coordinates: the reference's value.
    q = p.clone()
    q[..., 0], q[..., 2] = p[..., 2], p[..., 0]
    q[0, 0] = torch.tensor([-1e4, -1e4, 3e4, 3e4])
    assert giou.check("degenerate", fn(q, t, n, "none"), giou.reference(q, t, n, "none"), 1e-4)[0]
    # NaN in pred gives NaN for that box, as the reference does; the rest is untouched.
    q = p.clone()
    q[0, 0, 0] = float("nan")
    nb = torch.full_like(n, 32)
    got, want = fn(q, t.clamp(min=1), nb, "none"), giou.reference(q, t.clamp(min=1), nb, "none")
    assert torch.isnan(got[0, 0]) and torch.isnan(want[0, 0])
    assert giou.check("rest", got[1:], want[1:], giou.LOSS_TOL)[0]
    _usable(fn)


def test_num_boxes_out_of_range(either):
    import torch

    runtime = oploader.runtime()
    KernelInputError = oploader.kernel_input_error()

    fn, _ = either
    p, t, n = _inputs("bfloat16", "uint8", B=16, S=32)
    variant = oploader.chosen("bfloat16", "uint8", 16, 32)["params"]
    for value in (99, -5):
        bad = n.clone()
        bad[3] = value
        if variant["validation"] == "none":  # documented: clamped, as the reference does
            assert giou.check("clamped", fn(p, t, bad), giou.reference(p, t, bad), giou.LOSS_TOL)[0]
            continue
        fn(p, t, bad)  # async (default): reported by a later call, no sync here
        torch.cuda.synchronize()
        with pytest.raises(KernelInputError, match="earlier call.*num_boxes"):
            fn(p, t, n)
        _usable(fn)
        runtime.set_validate("sync")
        try:
            with pytest.raises(KernelInputError, match="num_boxes"):
                fn(p, t, bad)
            _usable(fn)
            runtime.set_validate("deferred")
            fn(p, t, bad)  # nothing raised until asked
            _usable(fn)
            with pytest.raises(KernelInputError, match="earlier call.*num_boxes"):
                runtime.check_errors()
            runtime.check_errors()  # reported once
        finally:
            runtime.set_validate("async")
        _usable(fn)


def test_second_process_loads_without_compiling(op):
    fn, out = op
    _usable(fn)  # built here first
    code = ("import time, torch; t0 = time.time(); import tuner; op = tuner.load(%r); "
            "from tuner.families import giou; p, t, n = giou.make_inputs(8, 8, 'bfloat16', 'uint8', device='cuda'); "
            "op(p, t, n); torch.cuda.synchronize(); print('load+first call s', round(time.time() - t0, 2))" % str(out))
    env = {**os.environ}
    built = os.path.join(env["TUNER_CACHE"], "variants", "sm_90")
    before = sorted(os.listdir(built)) if os.path.isdir(built) else None
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    if before is not None:
        assert sorted(os.listdir(built)) == before


def test_reduce_overhead_model(op):
    """A small model calling the op under torch.compile(mode="reduce-overhead") (CUDA graphs):
    replays give the loss and weight gradients of the same graph compiled without CUDA graphs, and
    eager's loss. Eager's gradients differ beyond any tight tolerance: inductor rounds p + model(x)
    to bfloat16 once, eager twice, and GIoU's gradient jumps where box edges cross."""
    import torch

    fn, _ = op
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 256 * 4, device="cuda")
    p, t, n = _inputs("bfloat16", "uint8", B=64)

    def step(x):
        return fn(p + model(x).view(64, 256, 4).to(torch.bfloat16), t, n)

    def run(f, x):
        model.zero_grad()
        out = f(x)
        out.backward()
        return out.detach().clone(), model.weight.grad.clone()

    graphed = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    plain = torch.compile(step, fullgraph=True)
    for i in range(4):  # warm-up, record, then replays, each on new data
        x = torch.randn(64, 8, device="cuda")
        out_g, grad_g = run(graphed, x)
        out_p, grad_p = run(plain, x)
        out_e, _ = run(step, x)
        scale = float(grad_p.abs().max())
        assert torch.allclose(out_g, out_p, rtol=1e-5), i
        assert torch.allclose(grad_g, grad_p, rtol=1e-4, atol=1e-5 * scale), i
        assert torch.allclose(out_g, out_e, rtol=1e-3), i


def test_forward_is_one_launch_without_copies(either):
    """The eager forward issues the variant's kernel(s) and nothing else: no error-word copy,
    no memset, whatever the validation mode."""
    import torch
    from torch.profiler import DeviceType, ProfilerActivity, profile

    runtime = oploader.runtime()

    fn, _ = either
    p, t, n = _inputs("bfloat16", "uint8", B=1024)
    launches = 2 if oploader.chosen("bfloat16", "uint8", 1024, 256)["params"]["validation"] == "kernel" else 1
    for mode in ("async", "deferred"):
        runtime.set_validate(mode)
        fn(p, t, n)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(p, t, n)
            torch.cuda.synchronize()
        gpu = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
        assert len(gpu) == launches and not any("Memcpy" in g or "Memset" in g for g in gpu), (mode, gpu)
    runtime.set_validate("async")


def test_bad_input_in_a_graph_replay_is_reported(validating):
    import torch

    runtime = oploader.runtime()
    KernelInputError = oploader.kernel_input_error()

    fn, _ = validating
    p, t, n = _inputs("bfloat16", "uint8", B=256)
    assert oploader.chosen("bfloat16", "uint8", 256, 256)["params"]["validation"] == "hoisted"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(p, t, n)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(p, t, n)
    graph.replay()
    runtime.check_errors()  # a good replay reports nothing
    n[5] = 10_000
    graph.replay()
    with pytest.raises(KernelInputError, match="num_boxes"):
        runtime.check_errors()
    n[5] = 1
    graph.replay()
    runtime.check_errors()


def test_load_gpu_auto_and_an_untuned_pair(shared_home, op):
    """tuner.load(gpu="auto") finds the attached GPU's default export; a dtype pair it was not
    tuned for runs the nearest problem's parameters and warns once, from C++."""
    import warnings

    import torch

    import tuner
    from tuner import gpus
    from tuner.deploy import export

    _, covering = op
    v = giou.space("bfloat16", "uint8").variant(
        boxes_per_thread=2, padding="branch", validation="hoisted", block_size=256, loads="vector",
        reduction="atomic", backward="fused")
    attached = gpus.attached()
    export.write(export.default_dir(gpus.short_name(attached), "giou"), [{"variant": v, "problem": giou.Problem().__dict__}],
                 attached.describe())
    try:
        fn = tuner.load(gpu="auto", family="giou")  # other families may be exported for this GPU too
        _usable(fn)
        p, t, n = _inputs("float32", "float32")
        with pytest.warns(UserWarning, match="no variant was tuned for pred torch.float32 and target torch.float32"):
            loss = fn(p, t, n)
        assert giou.check("untuned", loss, giou.reference(p, t, n), giou.LOSS_TOL)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fn(p, t, n)  # warned once
        leaf = p.clone().requires_grad_(True)
        fn(leaf, t, n).backward()
        _, want = references.with_grad(giou, p, t, n)
        assert giou.check("grad", leaf.grad, want, giou.GRAD_TOL["float32"], torch.float32)[0]
    finally:
        oploader.load(covering)  # the module's artifact again
