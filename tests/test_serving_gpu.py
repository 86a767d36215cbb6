"""Torch's op as a candidate, on the GPU: where an export says the baseline serves a problem (no
variant beat it there), for untuned dtype pairs and far from every tuned shape, the tuned op
returns torch's results bit for bit, forward and backward, eager, without grad, with a frozen
weight, under torch.compile and in a CUDA graph; near a tuned problem a variant serves. Then the
whole path: captured shapes searched in one command, the baseline timed beside the finalists,
exported and served as the searches decided."""

import json
import os
import subprocess
import sys

import pytest
import references
import torch
import torch.nn.functional as F

import tuner
from tuner import gpus
from tuner.deploy import export
from tuner.families import embedding_bag as eb
from tuner.families import rms_norm

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16
EPS = rms_norm.DEFAULT_EPS


def _timed(fwd: float, bwd: float) -> dict:
    return {"fwd": {"median_us": fwd, "spread_us": 0.1}, "bwd": {"median_us": bwd, "spread_us": 0.1}}


def _entry(variant, problem: dict, served: str) -> dict:
    times = _timed(10.0, 20.0)
    return {"variant": variant, "problem": problem, "timings": times, "objective": "fwd+bwd", "objective_us": 30.0,
            "baseline_us": _timed(9.0, 19.0) if served == "torch" else _timed(11.0, 21.0), "served_by": served}


@pytest.fixture(scope="module")
def rms(shared_home, tmp_path_factory):
    v = rms_norm.space().variant(threads_per_row=256, block_size=256, vec=8, unroll=2, rstd="saved",
                                 grad_weight="partials", bwd_blocks=2, walk="resident")
    winners = [_entry(v, rms_norm.Problem(4096, 4096).__dict__, "variant"),
               _entry(v, rms_norm.Problem(65536, 768).__dict__, "torch")]
    op = tuner.load(export.write(tmp_path_factory.mktemp("rms"), winners, gpus.attached().describe()))
    return op, v


@pytest.mark.parametrize("shape,x_dtype,w_dtype", [((65536, 768), BF16, BF16), ((4, 1000, 768), BF16, BF16),
                                                   ((4096, 4096), torch.float32, torch.float32),
                                                   ((3, 5, 64), torch.float16, torch.float16),
                                                   ((7, 100), BF16, BF16)])
def test_rms_norm_served_by_torch_is_torch(rms, shape, x_dtype, w_dtype):
    op, _ = rms
    rows = 1
    for n in shape[:-1]:
        rows *= n
    assert torch.ops.tuner_rms_norm.served([rows, shape[-1]], x_dtype, w_dtype) == "torch"
    x, w = rms_norm.make_inputs(rows, shape[-1], str(x_dtype)[6:], str(w_dtype)[6:], seed=5)
    x = x.reshape(shape)
    with torch.no_grad():
        assert torch.equal(op(x, w), F.rms_norm(x, (shape[-1],), w, EPS))
    a, b = (x.clone().requires_grad_(), w.clone().requires_grad_()), (x.clone().requires_grad_(),
                                                                      w.clone().requires_grad_())
    y, want = op(*a), F.rms_norm(b[0], (shape[-1],), b[1], EPS)
    assert torch.equal(y, want)
    g = torch.randn_like(y)
    for got, ref in zip(torch.autograd.grad(y, a, g), torch.autograd.grad(want, b, g)):
        assert torch.equal(got, ref)
    frozen = x.clone().requires_grad_()  # a frozen weight (adapter fine-tuning)
    (gx,) = torch.autograd.grad(op(frozen, w), frozen, g)
    assert torch.equal(gx, torch.autograd.grad(F.rms_norm(b[0], (shape[-1],), w, EPS), b[0], g)[0])


@pytest.mark.parametrize("rows,width,x_dtype,w_dtype", [(4096, 4096, BF16, torch.float32), (15, 771, torch.float16, torch.float32),
                                                         (65536, 768, BF16, torch.float32), (512, 4096, torch.float32, BF16)])
def test_rms_norm_pairs_torch_does_not_fuse_run_a_variant_at_every_shape(rms, rows, width, x_dtype, w_dtype):
    """A weight of another dtype than x: torch's path is unfused, so the tuned parameters, rendered for
    the pair, serve it anywhere (even where torch's fused op won the tuned pair), forward and backward."""
    op, v = rms
    assert torch.ops.tuner_rms_norm.served([rows, width], x_dtype, w_dtype) not in ("torch", v.name)
    x, w = rms_norm.make_inputs(rows, width, str(x_dtype)[6:], str(w_dtype)[6:], seed=7)
    x, w = x.requires_grad_(), w.requires_grad_()
    y = op(x, w, EPS)
    assert y.dtype == x.dtype
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = F.rms_norm(x64, (width,), w64, EPS)
    torch.testing.assert_close(y.double(), want, rtol=2e-2, atol=2e-2)
    g = torch.randn_like(y)
    for got, ref in zip(torch.autograd.grad(y, (x, w), g), torch.autograd.grad(want, (x64, w64), g.double())):
        scale = ref.abs().max().item() + 1e-6
        assert (got.double() - ref).abs().max().item() <= 2e-2 * scale


def test_rms_norm_near_a_tuned_problem_runs_its_variant(rms):
    op, v = rms
    assert torch.ops.tuner_rms_norm.served([4096, 4096], BF16, BF16) == v.name
    assert torch.ops.tuner_rms_norm.served([2048, 8192], BF16, BF16) == v.name
    x, w = rms_norm.make_inputs(2048, 8192, seed=6)
    with torch.no_grad():
        assert not torch.equal(op(x, w), F.rms_norm(x, (8192,), w, EPS))  # a kernel of its own...
        torch.testing.assert_close(op(x, w), F.rms_norm(x, (8192,), w, EPS), atol=2e-2, rtol=2e-2)  # ...that agrees


def test_rms_norm_serves_each_kind_of_call_as_the_check_measured_it(shared_home, tmp_path):
    """Where the export's check gave torch's op the calls without a gradient and a variant the
    training calls (or the other way round), a forward under no_grad or inference_mode, and a
    training call (eager and compiled), each run what won them: torch's results bit for bit, or
    the variant's kernels."""
    from tuner.deploy import regions

    v = rms_norm.space().variant(threads_per_row=256, block_size=256, vec=8, unroll=2, rstd="saved",
                                 grad_weight="partials", bwd_blocks=2, walk="resident")
    tuned = rms_norm.Problem(4096, 4096).__dict__
    shapes = {"inference": rms_norm.Problem(1024, 4096).__dict__, "training": rms_norm.Problem(4096, 1024).__dict__}
    lost = {"inference": {"fwd GPU": 1.2, "fwd wall": 0.9, "fwd+bwd GPU": 0.7, "fwd+bwd wall": 0.8},
            "training": {"fwd GPU": 0.8, "fwd wall": 0.9, "fwd+bwd GPU": 1.1, "fwd+bwd wall": 0.8}}
    decided = regions.decide([{"problem": p, "near": export.problem_key(tuned)} for p in shapes.values()],
                             {export.problem_key(shapes[k]): lost[k] for k in shapes}, export.SLOWER)
    assert [r["torch_serves"] for r in decided] == ["inference", "training"]
    op = tuner.load(export.write(tmp_path / "kinds", [_entry(v, tuned, "variant")], gpus.attached().describe(),
                                 regions=decided))
    for kind, p in shapes.items():
        rows, width = p["rows"], p["width"]
        assert torch.ops.tuner_rms_norm.served([rows, width], BF16, BF16, False) == ("torch" if kind == "inference"
                                                                                    else v.name)
        assert torch.ops.tuner_rms_norm.served([rows, width], BF16, BF16, True) == ("torch" if kind == "training"
                                                                                   else v.name)
        x, w = rms_norm.make_inputs(rows, width, seed=11)
        want = F.rms_norm(x, (width,), w, EPS)
        x.requires_grad_(), w.requires_grad_()  # an inference call of tensors that would take a gradient
        # chosen as the graph is traced, of these sizes (a shape traced symbolically runs the variant)
        compiled = torch.compile(lambda x, w: op(x, w), fullgraph=True, dynamic=False)
        for context in (torch.no_grad, torch.inference_mode):
            with context():
                assert _ran_a_variant(lambda: op(x, w)) == (kind == "training"), (kind, context)
                if context is torch.no_grad:
                    assert _ran_a_variant(lambda: compiled(x, w)) == (kind == "training"), kind
                if kind == "inference":
                    assert torch.equal(op(x, w), want)
        g = torch.randn(rows, width, device="cuda", dtype=BF16)
        want_grads = torch.autograd.grad(F.rms_norm(x, (width,), w, EPS), (x, w), g)
        assert _ran_a_variant(lambda: torch.autograd.grad(op(x, w), (x, w), g)) == (kind == "inference"), kind
        got = torch.autograd.grad(op(x, w), (x, w), g)
        if kind == "training":  # torch's op: its own gradients
            assert all(torch.equal(a, b) for a, b in zip(got, want_grads))
        assert _ran_a_variant(lambda: torch.autograd.grad(compiled(x, w), (x, w), g)) == (kind == "inference"), kind
        for grads in (got, torch.autograd.grad(compiled(x, w), (x, w), g)):
            for a, b in zip(grads, want_grads):
                torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)


def test_rms_norm_baseline_under_compile_and_cuda_graphs(rms):
    op, _ = rms
    x, w = rms_norm.make_inputs(65536, 768, seed=7)

    @torch.compile(fullgraph=True)
    def f(x, w):
        return op(x * 2, w) + 1

    # the compiled graph fuses torch's op with its neighbours (no bfloat16 rounding between them)
    torch.testing.assert_close(f(x, w), F.rms_norm(x * 2, (768,), w, EPS) + 1, atol=2e-2, rtol=2e-2)
    x.requires_grad_(), w.requires_grad_()
    g = torch.randn(65536, 768, device="cuda", dtype=BF16)
    want = torch.autograd.grad(F.rms_norm(x, (768,), w, EPS), (x, w), g)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.autograd.grad(op(x, w), (x, w), g)
    torch.cuda.current_stream().wait_stream(stream)
    graph, static = torch.cuda.CUDAGraph(), {}
    with torch.cuda.graph(graph):
        static["grads"] = torch.autograd.grad(op(x, w), (x, w), g)
    graph.replay()
    torch.cuda.synchronize()
    for got, ref in zip(static["grads"], want):
        torch.testing.assert_close(got, ref)


def test_embedding_bag_served_by_torch_is_torch(shared_home, tmp_path):
    v = eb.space("float32").variant(validation="hoisted", mapping="warp", split=None, vec=4, unroll=4,
                                    block_size=128, staging="shared", backward="atomic")
    op = tuner.load(export.write(tmp_path / "eb", [_entry(v, eb.Problem(rows=4000, dim=128, bag_size=150).__dict__,
                                                          "variant"),
                                                   _entry(v, eb.Problem(rows=4000, dim=32, bag_size=20).__dict__,
                                                          "torch")],
                                 gpus.attached().describe()))
    for weight, dim, bag, mode in (("float32", 32, 20, "sum"), ("float32", 32, 20, "mean"),
                                   ("float32", 16, 3, "sum"), ("bfloat16", 64, 40, "max"), ("float16", 64, 40, "sum")):
        p = eb.Problem(rows=5000, dim=dim, bags=64, bag_size=bag, mode=mode, weight=weight)
        w, idx, offs, _ = eb.make_inputs(**vars(p), seed=8, device="cuda")
        with torch.no_grad():
            assert torch.equal(op(w, idx, offs, mode), F.embedding_bag(idx, w, offs, mode=mode)), (weight, mode)
        a = w.clone().requires_grad_()
        out = op(a, idx, offs, mode)
        g = torch.randn_like(out)
        out.backward(g)
        if weight == "bfloat16":  # torch has no bfloat16 max backward: the op runs torch's in float32
            want, _ = references.embedding_bag_backward(w, idx, offs, mode, None, g)
            torch.testing.assert_close(a.grad.double(), want, atol=3e-2, rtol=3e-2)
            continue
        b = w.clone().requires_grad_()
        F.embedding_bag(idx, b, offs, mode=mode).backward(g)
        assert torch.equal(a.grad, b.grad), (weight, mode)
    # near the tuned problem: the variant, in its mode and in the modes no search tuned (bound as
    # sum: a torch-won sum problem's mean above is torch's too)
    p = eb.Problem(rows=5000, dim=128, bags=64, bag_size=150)
    w, idx, offs, _ = eb.make_inputs(**vars(p), seed=9, device="cuda")
    for mode in eb.MODES:
        with torch.no_grad():
            torch.testing.assert_close(op(w, idx, offs, mode), F.embedding_bag(idx, w, offs, mode=mode))
            assert _ran_a_variant(lambda: op(w, idx, offs, mode)), mode


def _ran_a_variant(fn) -> bool:
    """Whether `fn()` ran a tuned variant's kernels (the profiler's names of its CUDA kernels)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return any("tuner_variant" in n or "_kernel<" in n and "at::" not in n and "tuner_guard" not in n for n in names)


@pytest.mark.slow
def test_captured_shapes_searched_exported_and_served(tmp_path):
    """A capture of two RMSNorm shapes, `tuner search --problems`, `tuner export-best`: each
    study has the baseline's timings beside its winner, and the export serves each problem as
    its study decided."""
    shapes = tmp_path / "shapes.json"
    script = (f"import torch, tuner\nnorms = [torch.nn.RMSNorm(n, eps={EPS}, device='cuda', dtype=torch.bfloat16) "
              "for n in (1024, 4096)]\n"
              f"with tuner.capture({str(shapes)!r}):\n"
              "    for rows, norm in ((8192, norms[0]), (2048, norms[1])):\n"
              "        norm(torch.randn(rows, norm.weight.shape[0], device='cuda', dtype=torch.bfloat16))\n")
    env = {**os.environ, "TUNER_HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)
    assert len(json.loads(shapes.read_text())["problems"]) == 2
    run = subprocess.run([sys.executable, "-m", "tuner.cli", "search", "--gpu", "auto", "--problems", str(shapes),
                          "--trials", "64", "--quiet"], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[2/2] rms_norm" in run.stdout and "torch" in run.stdout
    run = subprocess.run([sys.executable, "-m", "tuner.cli", "export-best", "--family", "rms_norm", "--gpu", "auto"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "exports" / f"rms_norm-{gpus.short_name(gpus.attached())}"
    manifest = export.read(out)
    assert len(manifest["entries"]) == 2
    for e in manifest["entries"]:
        assert e["baseline_us"]["fwd"]["median_us"] > 0 and e["served_by"] in ("variant", "torch")
    check = (f"import torch, tuner\ntuner.load({str(out)!r})\n"
             f"entries = {json.dumps([(e['problem']['rows'], e['problem']['width'], e['served_by'], e['variant']) for e in manifest['entries']])}\n"
             "for rows, width, who, name in entries:\n"
             "    got = torch.ops.tuner_rms_norm.served([rows, width], torch.bfloat16, torch.bfloat16)\n"
             "    assert got == ('torch' if who == 'torch' else name), (rows, width, got)\n")
    subprocess.run([sys.executable, "-c", check], check=True, env=env, timeout=300)
