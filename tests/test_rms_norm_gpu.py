"""RMSNorm on the GPU: variants covering every dimension value and dtype pair checked against
float64 (the search's own check: the problem's shape, one odd-width row, rows that do not fill
a block), and the exported op in every dtype pair and odd shapes, forward and backward, under
opcheck, torch.compile and CUDA graphs."""

import itertools

import pytest
import torch

import tuner
from tuner import gpus, opspec
from tuner.build import compile as build
from tuner.deploy import export
from tuner.families import rms_norm
from tuner.measure.accuracy import check
from tuner.measure.declared import TOLERANCE as TOL, Evaluation

pytestmark = pytest.mark.gpu
DTYPES = list(itertools.product(rms_norm.DTYPES, rms_norm.DTYPES))


def test_covering_variants_match_float64(shared_home):
    variants = rms_norm.covering_set()
    evaluation = Evaluation("rms_norm")
    failed = []
    for b in build.build(variants, gpus.attached().arch):
        assert b.ok, b.error
        p = b.variant.as_dict()
        verdict = evaluation.check(evaluation.load(b.so, b.variant.name, b.entry),
                                   {"rows": 300, "width": 2048, "x": p["x"], "weight": p["weight"]})
        if not verdict["ok"]:
            failed.append((b.variant.name, verdict["message"]))
    assert not failed


@pytest.fixture(scope="module")
def op(shared_home, tmp_path_factory):
    """An export with variants for every dtype pair (each pair's nearest valid point to two sets of
    parameters), loaded with baseline=False: its variants, not torch's op, serve every call."""
    resident = dict(threads_per_row=256, block_size=256, vec=8, unroll=2, rstd="saved", grad_weight="partials",
                    bwd_blocks=2, walk="resident")
    warp = dict(threads_per_row=32, block_size=128, vec=4, unroll=1, rstd="recompute", grad_weight="atomic",
                bwd_blocks=8, walk="blocks")
    winners = []
    for x, w in DTYPES:
        space = rms_norm.space(x, w)
        winners += [{"variant": space.nearest(resident), "problem": rms_norm.Problem(4096, 4096, x, w).__dict__},
                    {"variant": space.nearest(warp), "problem": rms_norm.Problem(64, 512, x, w).__dict__}]
    return tuner.load(export.write(tmp_path_factory.mktemp("rms"), winners, gpus.attached().describe()),
                      baseline=False)


def _check(op, x, w):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = op(x, w)
    g = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    want_x, want_w = opspec.reference_gradients(rms_norm.OP_DECLARATION, rms_norm.reference, (x.detach(), w.detach()), g)
    for got, want, dtype in ((y, rms_norm.reference(x.detach(), w.detach()), x.dtype), (gx, want_x, x.dtype),
                             (gw, want_w, w.dtype)):
        assert got.dtype == dtype and got.shape == want.shape
        ok, _, message = check("output", got, want, TOL[str(dtype).removeprefix("torch.")], dtype)
        assert ok, message


@pytest.mark.parametrize("x_dtype,w_dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4096, 4096), (1, 1027), (37, 771), (3, 5, 64), (2, 3)])
def test_op_matches_float64(op, x_dtype, w_dtype, shape):
    rows = 1
    for n in shape[:-1]:
        rows *= n
    x, w = rms_norm.make_inputs(rows, shape[-1], x_dtype, w_dtype, seed=7)
    _check(op, x.reshape(shape), w)


def test_no_rows_gives_a_zero_weight_gradient(op):
    x, w = rms_norm.make_inputs(1, 128, "bfloat16", "bfloat16")
    x, w = x[:0].requires_grad_(), w.requires_grad_()
    y = op(x, w)
    assert y.shape == (0, 128)
    (gw,) = torch.autograd.grad(y.sum(), (w,))
    assert bool((gw == 0).all())


def test_non_contiguous_and_unaligned_inputs(op):
    x, w = rms_norm.make_inputs(64, 4097, "bfloat16", "bfloat16", seed=2)
    _check(op, x[:, 1:], w[1:])  # rows start off any vector boundary
    _check(op, x[:, :4096].t().contiguous().t(), w[:4096])


def test_opcheck_on_cuda(op):
    x, w = rms_norm.make_inputs(33, 1000, "bfloat16", "bfloat16", seed=3)
    torch.library.opcheck(op, (x, w, 1e-6))
    torch.library.opcheck(op, (x.requires_grad_(), w.requires_grad_(), 1e-6))


def test_torch_compile_and_cuda_graphs(op):
    x, w = rms_norm.make_inputs(512, 2048, "bfloat16", "bfloat16", seed=4)
    eager = op(x, w)

    @torch.compile(fullgraph=True)
    def f(x, w):
        return op(x * 2, w) + 1

    torch.testing.assert_close(f(x, w), op(x * 2, w) + 1)
    x.requires_grad_(), w.requires_grad_()
    g = torch.randn_like(eager)
    want = torch.autograd.grad(op(x, w), (x, w), g)
    static = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.autograd.grad(op(x, w), (x, w), g)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static["y"] = op(x, w)
        static["grads"] = torch.autograd.grad(static["y"], (x, w), g)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static["y"], eager)
    for got, ref in zip(static["grads"], want):
        torch.testing.assert_close(got, ref)


def test_bench_from_the_declaration_checks_then_times_every_row(shared_home, tmp_path):
    """`tuner bench --family rms_norm` (tuner/report/declared.py): the floor, then the tuned op,
    torch's op, torch.compile of it and Liger where installed, each checked against float64 first;
    and `--problems` at captured shapes, the op against torch's alone."""
    import json

    from tuner.cli import main as cli

    artifact = _export_of(tmp_path)
    assert cli.main(["bench", "--family", "rms_norm", "--artifact", str(artifact), "--shapes", "300x2048",
                     "--out", str(tmp_path / "b")]) == 0
    md = (tmp_path / "b" / "bench.md").read_text()
    for impl in ("floor: HBM at 3.0 TB/s", "tuned op", "anchor: torch rms_norm", "anchor: torch.compile"):
        assert impl in md, md
    captured = tmp_path / "shapes.json"
    captured.write_text(json.dumps({"format": 1, "problems": [
        {"family": "rms_norm", "problem": {"rows": 37, "width": 771, "x": "bfloat16", "weight": "float32"},
         "calls": 3, "time_us": 40.0}]}))
    assert cli.main(["bench", "--family", "rms_norm", "--artifact", str(artifact), "--problems", str(captured),
                     "--out", str(tmp_path / "p")]) == 0
    assert "slower than torch at" in (tmp_path / "p" / "bench.md").read_text()


def _export_of(tmp_path):
    warp = dict(threads_per_row=32, block_size=128, vec=4, unroll=1, rstd="saved", grad_weight="atomic",
                bwd_blocks=8, walk="blocks")
    winners = [{"variant": rms_norm.space(x, w).nearest(warp), "problem": rms_norm.Problem(300, 2048, x, w).__dict__}
               for x, w in (("bfloat16", "bfloat16"), ("bfloat16", "float32"))]
    return export.write(tmp_path / "artifact", winners, gpus.attached().describe())


@pytest.mark.parametrize("family, size, other", [("rms_norm", "width", 4097), ("cross_entropy", "vocab", 1001)])
def test_a_search_s_build_matches_float64_at_its_size_and_refuses_another(family, size, other, shared_home):
    """A search builds the kernels its problem's size runs alone (`search_focus`): checked against
    float64 there (forward and backward, the search's check); at another size, a call that needs a
    kernel it lacks fails to launch (never runs nothing or the wrong code), one that does not is right."""
    from tuner import families

    module = families.get(family)
    problem = module.Problem().__dict__
    space = list(module.space_for(problem))
    variants = [space[i * len(space) // 8] for i in range(8)]
    evaluation = Evaluation(family)
    refused = 0
    for b in build.build(variants, gpus.attached().arch, focus=module.search_focus(problem)):
        assert b.ok and len(b.registers) == 3, (b.error, b.registers)
        kernel = evaluation.load(b.so, b.variant.name, b.entry)
        verdict = evaluation.check(kernel, problem)
        assert verdict["ok"], verdict["message"]
        try:
            verdict = evaluation.check(kernel, {**problem, "rows": 8, size: other})
            assert verdict["ok"], verdict["message"]
        except RuntimeError as exc:
            assert "failed to launch" in str(exc)
            refused += 1
        torch.cuda.synchronize()  # the context is fine
    assert refused >= 4  # those with vectors wider than one element
