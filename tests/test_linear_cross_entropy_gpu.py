"""Linear cross-entropy on the GPU: variants covering every dimension value and dtype checked
against the chunked float64 reference by the search's own check (the problem, a vocabulary no
vector divides over several chunks, one class, every target ignored), and the exported op against
F.linear + F.cross_entropy in float64 at odd shapes, each reduction, with label smoothing; its
memory beyond the inputs and their gradients; opcheck, torch.compile and CUDA graphs."""

import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner import gpus
from tuner.build import compile as build
from tuner.deploy import export
from tuner.families import linear_cross_entropy as lce
from tuner.measure.declared import Evaluation

pytestmark = pytest.mark.gpu


def test_covering_variants_match_float64(shared_home):
    evaluation, failed = Evaluation("linear_cross_entropy"), []
    for b in build.build(lce.covering_set(), gpus.attached().arch):
        assert b.ok, b.error
        for reduction, smoothing in (("mean", 0.0), ("none", 0.1), ("sum", 0.0)):
            problem = {**lce.Problem(1100, 96, 2050, b.variant.as_dict()["hidden"]).__dict__, "reduction": reduction,
                       "label_smoothing": smoothing}
            verdict = evaluation.check(evaluation.load(b.so, b.variant.name, b.entry), problem)
            if not verdict["ok"]:
                failed.append((b.variant.name, reduction, verdict["message"]))
    assert not failed


@pytest.fixture(scope="module")
def op(shared_home, tmp_path_factory):
    """A variant a dtype, loaded with baseline=False: the variants serve every call of those dtypes."""
    winners = [{"variant": lce.space(dtype).nearest(dict(chunk_rows=256, threads_per_row=512, vec=8)),
                "problem": lce.Problem(4096, 1024, 32000, dtype).__dict__} for dtype in lce.DTYPES]
    return tuner.load(export.write(tmp_path_factory.mktemp("lce"), winners, gpus.attached().describe()),
                      baseline=False)


TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1.5e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens,width,vocab", [(300, 72, 1001), (5, 16, 1), (1030, 64, 32000), (7, 128, 128256)])
@pytest.mark.parametrize("reduction,smoothing", [("mean", 0.0), ("sum", 0.1), ("none", 0.0), ("mean", 0.1)])
def test_op_matches_float64(op, dtype, tokens, width, vocab, reduction, smoothing):
    h, w, t = lce.make_inputs(tokens, width, vocab, str(dtype).removeprefix("torch."), ignored=0.25, seed=tokens + vocab)
    h.requires_grad_(), w.requires_grad_()
    loss = op(h, w, t, -100, smoothing, reduction)
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = F.cross_entropy(h64 @ w64.T, t, reduction=reduction, label_smoothing=smoothing)
    assert loss.dtype == torch.float32 and loss.shape == want.shape
    # the loss of logits rounded to hidden's dtype (each row's, for reduction none), as the search checks
    # it; relative to at least 1 (one class's loss is 0: its rounding is then the error itself)
    err = (loss.double() - want.detach()).norm() / want.detach().norm().clamp_min(1.0)
    assert err < TOL[dtype], f"loss's relative error {err:.3g}"
    g = torch.rand(loss.shape, device="cuda") + 0.5
    for got, expected in zip(torch.autograd.grad(loss, (h, w), g), torch.autograd.grad(want, (h64, w64), g.double())):
        assert got.dtype == dtype
        err = (got.double() - expected).norm() / expected.norm().clamp_min(1e-30)
        assert err < TOL[dtype], f"gradient's relative error {err:.3g}"


def test_every_target_ignored_and_no_token(op):
    h, w, t = lce.make_inputs(8, 32, 100, "bfloat16", ignored=1.0)
    h.requires_grad_(), w.requires_grad_()
    assert torch.isnan(op(h, w, t))
    for g in torch.autograd.grad(op(h, w, t, reduction="sum"), (h, w)):
        assert bool((g == 0).all())
    (gw,) = torch.autograd.grad(op(h[:0], w, t[:0], reduction="sum"), w)
    assert bool((gw == 0).all())


def test_memory_beyond_the_inputs_and_gradients_is_an_eighth_of_the_logits(op):
    """Forward+backward at 8192 tokens of a 128256-word vocabulary (2.1 GB of bf16 logits): the
    peak beyond the inputs and their gradients is a chunk's logits, 1/8 of them, and no more
    (torch's path holds the logits and their gradient: 4.2 GB)."""
    h, w, t = lce.make_inputs(8192, 512, 128256, "bfloat16")
    h.requires_grad_(), w.requires_grad_()
    torch.autograd.grad(op(h, w, t), (h, w))  # cuBLAS's workspace, the allocator's blocks
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grads = torch.autograd.grad(op(h, w, t), (h, w))
    torch.cuda.synchronize()
    beyond = torch.cuda.max_memory_allocated() - before - sum(g.numel() * g.element_size() for g in grads)
    logits = 8192 * 128256 * 2
    assert beyond <= logits // 8 + (4 << 20), f"{beyond / 2**20:.1f} MiB beyond, 1/8 of the logits is {logits / 2**23:.1f}"


def test_opcheck_compile_and_cuda_graphs(op):
    h, w, t = lce.make_inputs(512, 64, 4096, "bfloat16", seed=5)
    torch.library.opcheck(op, (h.requires_grad_(), w.requires_grad_(), t, -100, 0.1, "mean"))
    compiled = torch.compile(lambda h, w, t: op(h * 2, w, t, -100, 0.0, "sum") + 1, fullgraph=True)
    torch.testing.assert_close(compiled(h.detach(), w.detach(), t), op(h.detach() * 2, w.detach(), t, -100, 0.0, "sum") + 1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.autograd.grad(op(h, w, t), (h, w))
    torch.cuda.current_stream().wait_stream(stream)
    graph, static = torch.cuda.CUDAGraph(), {}
    with torch.cuda.graph(graph):
        static["loss"] = op(h, w, t)
        static["grads"] = torch.autograd.grad(static["loss"], (h, w))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static["loss"], op(h, w, t))
    for got, want in zip(static["grads"], torch.autograd.grad(op(h, w, t), (h, w))):
        torch.testing.assert_close(got, want)


def test_calls_torch_answers_otherwise_go_to_torch(op):
    """A uint8 target, float64 hidden states, a weight of another dtype, a label smoothing outside
    [0, 1] and "elementwise_mean" get torch's two functions' answers and errors."""
    import tuner.functional as TF

    h, w, t = lce.make_inputs(64, 32, 300, "float32", seed=9)

    def torch_s(h, w, t, **kw):
        return F.cross_entropy(F.linear(h, w), t, **kw)

    torch.testing.assert_close(TF.linear_cross_entropy(h, w, t.clamp(max=255).to(torch.uint8)),
                               torch_s(h, w, t.clamp(max=255).to(torch.uint8)))
    got = TF.linear_cross_entropy(h.double(), w.double(), t)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch_s(h.double(), w.double(), t))
    with pytest.raises(RuntimeError):  # torch's F.linear refuses two dtypes
        TF.linear_cross_entropy(h, w.bfloat16(), t)
    with pytest.raises(RuntimeError, match="label_smoothing must be between 0.0 and 1.0"):
        TF.linear_cross_entropy(h, w, t, label_smoothing=1.5)
    with pytest.warns(UserWarning, match="elementwise_mean"):
        torch.testing.assert_close(TF.linear_cross_entropy(h, w, t, reduction="elementwise_mean"), torch_s(h, w, t))


def test_a_bad_target_is_refused_and_the_function_serves_model_shapes(op):
    import tuner.functional as TF
    from tuner.errors import KernelInputError

    h, w, t = lce.make_inputs(64, 32, 500, "bfloat16", seed=6)
    bad = t.clone()
    bad[3] = 500
    tuner.set_validate("sync")
    try:
        with pytest.raises(KernelInputError, match="a target is outside"):
            op(h, w, bad)
    finally:
        tuner.set_validate("async")
    got = TF.linear_cross_entropy(h.reshape(4, 16, 32), w, t.reshape(4, 16), label_smoothing=0.1)
    torch.testing.assert_close(got.double(), F.cross_entropy(h.double() @ w.double().T, t, label_smoothing=0.1),
                               rtol=1e-3, atol=1e-3)
