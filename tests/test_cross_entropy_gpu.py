"""Cross-entropy on the GPU: variants covering every dimension value and dtype checked against
float64 by the search's own check (the declaration's: the problem, a vocabulary no vector
divides, one class, every target ignored), and the exported op against F.cross_entropy in float64
at odd shapes, each reduction, with label smoothing, under torch.compile and CUDA graphs."""

import itertools
import re

import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner import gpus
from tuner.build import compile as build
from tuner.deploy import export
from tuner.families import cross_entropy as ce
from tuner.measure.declared import Evaluation

pytestmark = pytest.mark.gpu


def test_covering_variants_match_float64(shared_home):
    evaluation, failed = Evaluation("cross_entropy"), []
    for b in build.build(ce.covering_set(), gpus.attached().arch):
        assert b.ok, b.error
        for reduction, smoothing in (("mean", 0.0), ("none", 0.1), ("sum", 0.0)):
            problem = {**ce.Problem(300, 2048, b.variant.as_dict()["logits"]).__dict__, "reduction": reduction,
                       "label_smoothing": smoothing}
            verdict = evaluation.check(evaluation.load(b.so, b.variant.name, b.entry), problem)
            if not verdict["ok"]:
                failed.append((b.variant.name, reduction, verdict["message"]))
    assert not failed


def test_reduction_none_s_gradient_is_written_by_the_backward_and_a_search_s_build_has_that_one(shared_home):
    """A variant whose forward writes the gradient (for an output gradient of 1, which the backward
    scales) leaves reduction none's to the backward (each row's output gradient is its own: no second
    pass over a written gradient). A search's build for a problem of reduction none has that backward
    alone and matches float64 there; a build for one reduction refuses the other's backward (fails to
    launch) rather than run the wrong one."""
    fused = [v for v in ce.space("bfloat16") if v.as_dict()["gradient"] == "forward"]
    variants = [fused[i * len(fused) // 4] for i in range(4)]
    evaluation = Evaluation("cross_entropy")
    for reduction, other in (("none", "mean"), ("mean", "none")):
        problem = {**ce.Problem(300, 2048, "bfloat16").__dict__, "reduction": reduction}
        for b in build.build(variants, gpus.attached().arch, focus=ce.search_focus(problem)):
            assert b.ok, b.error
            kernel = evaluation.load(b.so, b.variant.name, b.entry)
            verdict = evaluation.check(kernel, problem)
            assert verdict["ok"], verdict["message"]
            with pytest.raises(RuntimeError, match="failed to launch"):
                evaluation.check(kernel, {**problem, "reduction": other})
            torch.cuda.synchronize()  # the context is fine


@pytest.fixture(scope="module")
def op(shared_home, tmp_path_factory):
    """Two variants a dtype (a warp a row, the gradient by the backward; a block a row, the gradient
    by the forward, its first read kept in L2 and its second from the row's end), loaded with
    baseline=False: the variants serve every call of those dtypes."""
    winners = []
    for dtype in ce.DTYPES:
        space = ce.space(dtype)
        winners += [{"variant": space.nearest(dict(threads_per_row=32, block_size=256, vec=8, gradient="backward")),
                     "problem": ce.Problem(4096, 512, dtype).__dict__},
                    {"variant": space.nearest(dict(threads_per_row=1024, block_size=1024, vec=8, gradient="forward",
                                                   first_read="evict_last", reread="reverse")),
                     "problem": ce.Problem(4096, 128256, dtype).__dict__}]
    return tuner.load(export.write(tmp_path_factory.mktemp("ce"), winners, gpus.attached().describe()),
                      baseline=False)


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,vocab", [(64, 512), (33, 1001), (5, 1), (7, 128256)])
@pytest.mark.parametrize("reduction,smoothing", [("mean", 0.0), ("sum", 0.1), ("none", 0.0), ("mean", 0.1)])
def test_op_matches_float64(op, dtype, rows, vocab, reduction, smoothing):
    x, t = ce.make_inputs(rows, vocab, str(dtype).removeprefix("torch."), ignored=0.25, seed=rows + vocab)
    x.requires_grad_()
    loss = op(x, t, -100, smoothing, reduction)
    x64 = x.detach().double().requires_grad_()
    want = F.cross_entropy(x64, t, reduction=reduction, label_smoothing=smoothing)
    assert loss.dtype == torch.float32 and loss.shape == want.shape
    torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-4, atol=1e-4)
    g = torch.rand(loss.shape, device="cuda") + 0.5
    (gx,) = torch.autograd.grad(loss, x, g)
    (want_x,) = torch.autograd.grad(want, x64, g.double())
    assert gx.dtype == dtype
    err = (gx.double() - want_x).norm() / want_x.norm().clamp_min(1e-30)
    assert err < TOL[dtype], f"gradient's relative error {err:.3g}"


def test_every_target_ignored_gives_torch_s_nan_mean_and_zero_gradient(op):
    x, t = ce.make_inputs(8, 100, "bfloat16", ignored=1.0)
    x.requires_grad_()
    loss = op(x, t)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(x.float(), t))
    (gx,) = torch.autograd.grad(op(x, t, reduction="sum"), x)
    assert bool((gx == 0).all())


def test_opcheck_compile_and_cuda_graphs(op):
    x, t = ce.make_inputs(256, 4096, "bfloat16", seed=5)
    torch.library.opcheck(op, (x.requires_grad_(), t, -100, 0.1, "mean"))
    compiled = torch.compile(lambda x, t: op(x * 2, t, -100, 0.0, "sum") + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x.detach(), t), op(x.detach() * 2, t, -100, 0.0, "sum") + 1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.autograd.grad(op(x, t), x)
    torch.cuda.current_stream().wait_stream(stream)
    graph, static = torch.cuda.CUDAGraph(), {}
    with torch.cuda.graph(graph):
        static["loss"] = op(x, t)
        static["grad"] = torch.autograd.grad(static["loss"], x)[0]
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static["loss"], op(x, t))
    torch.testing.assert_close(static["grad"], torch.autograd.grad(op(x, t), x)[0])


def test_the_functional_form_runs_the_op_on_cuda(op):
    import tuner.functional as TF

    x, t = ce.make_inputs(64, 512, "bfloat16", seed=6)
    got = TF.cross_entropy(x, t, label_smoothing=0.1)
    assert got.dtype == torch.float32  # the op's float32 loss, not F.cross_entropy's bfloat16
    torch.testing.assert_close(got.double(), F.cross_entropy(x.double(), t, label_smoothing=0.1), rtol=1e-4, atol=1e-4)


def test_the_functional_form_decides_in_the_binding(op, monkeypatch):
    """TF.cross_entropy's calls the op takes are decided and sent in the binding's C++ (with the
    Python form's way to the op gone, they still run the op: its very answer, in_place included);
    class weights go to F.cross_entropy."""
    import tuner.functional as TF
    from tuner import runtime

    x, t = ce.make_inputs(64, 512, "bfloat16", seed=6)
    want = op(x, t, -100, 0.1, "sum")
    monkeypatch.setattr(runtime, "entry", lambda name: pytest.fail("the Python form decided a call the op takes"))
    torch.testing.assert_close(TF.cross_entropy(x, t, label_smoothing=0.1, reduction="sum"), want)  # a sum's order
    leaf = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(TF.cross_entropy(leaf, t, in_place=False), leaf)
    (g_op,) = torch.autograd.grad(op(leaf, t), leaf)
    torch.testing.assert_close(g, g_op)
    w = torch.rand(512, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(TF.cross_entropy(x, t, weight=w), F.cross_entropy(x, t, weight=w))


def test_calls_torch_answers_otherwise_go_to_torch_in_both_forms(op):
    """A uint8 target (which torch takes and the op's guard cannot read), float64 logits, a
    label smoothing outside [0, 1] and the old "elementwise_mean" get F.cross_entropy's answers,
    warnings and errors from the binding's C++ form and from the Python form alike; the op itself
    refuses a uint8 target with a clear error instead of reading past it."""
    import tuner.functional as TF
    from tuner import entries

    x, t = ce.make_inputs(256, 512, "float32", seed=8)
    for form in (TF.cross_entropy, entries._functionals["cross_entropy"], entries._python_forms["cross_entropy"]):
        torch.testing.assert_close(form(x, t.clamp(max=255).to(torch.uint8)),
                                   F.cross_entropy(x, t.clamp(max=255).to(torch.uint8)))
        loss = form(x.double(), t)
        assert loss.dtype == torch.float64
        torch.testing.assert_close(loss, F.cross_entropy(x.double(), t))
        for smoothing in (1.5, -0.1):  # torch refuses what it refuses (its check differs by version)
            try:
                want = F.cross_entropy(x, t, label_smoothing=smoothing)
            except RuntimeError as exc:
                with pytest.raises(RuntimeError, match=re.escape(str(exc).splitlines()[0])):
                    form(x, t, label_smoothing=smoothing)
            else:
                torch.testing.assert_close(form(x, t, label_smoothing=smoothing), want)
        with pytest.warns(UserWarning, match="elementwise_mean"):
            torch.testing.assert_close(form(x, t, reduction="elementwise_mean"), F.cross_entropy(x, t))
    with pytest.raises((RuntimeError, TypeError), match="int64"):  # refused, not read past its end
        op(x, t.clamp(max=255).to(torch.uint8))


def test_a_gradient_from_the_forward_is_given_once_and_nothing_is_saved_without_autograd(op):
    x, t = ce.make_inputs(16, 128256, "bfloat16", seed=7)  # the block-a-row variant: the forward's gradient
    x.requires_grad_()
    loss = op(x, t)
    (g1,) = torch.autograd.grad(loss, x, retain_graph=True)
    with pytest.raises(RuntimeError, match="its backward runs once for a forward"):
        torch.autograd.grad(loss, x)
    (g2,) = torch.autograd.grad(op(x, t) * 3, x)  # an output gradient of 3: scaled in place
    torch.testing.assert_close(g2.float(), 3 * g1.float(), rtol=1e-2, atol=1e-6)
    with torch.no_grad():
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        op(x, t)
        assert torch.cuda.max_memory_allocated() - before < 1 << 20  # no gradient buffer (4 MB) where none is asked for


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [512, 128256])  # the gradient by the backward, and by the forward
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_in_place_writes_the_gradient_over_the_logits_and_allocates_none(op, dtype, vocab, reduction):
    x, t = ce.make_inputs(33, vocab, str(dtype).removeprefix("torch."), ignored=0.25, seed=vocab)
    x64 = x.double().requires_grad_()
    want = F.cross_entropy(x64, t, reduction=reduction, label_smoothing=0.1)
    g = torch.rand(want.shape, device="cuda") + 0.5
    (want_x,) = torch.autograd.grad(want, x64, g.double())
    logits = x.clone().requires_grad_()
    storage, size = logits.data_ptr(), logits.numel() * logits.element_size()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = op(logits, t, -100, 0.1, reduction, True)
    (gx,) = torch.autograd.grad(loss, logits, g)
    assert torch.cuda.max_memory_allocated() - before < size // 4  # the loss and a row's numbers, no gradient
    assert gx.data_ptr() == storage  # the gradient is the logits' storage
    torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-4, atol=1e-4)
    err = (gx.double() - want_x).norm() / want_x.norm()
    assert err < TOL[dtype], f"gradient's relative error {err:.3g}"


def test_a_target_outside_the_vocabulary_is_refused_as_the_validate_mode_says(op):
    """The forward's kernel reports a target outside [0, vocab) (its loss is NaN): "sync" raises in
    the call, "async" (the default) in a later call, "deferred" at tuner.check_errors(); an ignored
    target is no error, and the search's kernel reports the same bit."""
    from tuner.errors import KernelInputError

    x, t = ce.make_inputs(64, 512, "bfloat16", seed=5)
    bad = t.clone()
    bad[3] = 512
    words = r"cross_entropy: invalid input: a target is outside \[0, vocab\)"
    try:
        tuner.set_validate("sync")
        with pytest.raises(KernelInputError, match=words):
            op(x, bad)
        op(x, t)  # the word was cleared
        tuner.set_validate("async")
        op(x, bad)
        torch.cuda.synchronize()
        with pytest.raises(KernelInputError, match="invalid input in an earlier call: a target is outside"):
            op(x, t)
        tuner.set_validate("deferred")
        assert torch.isnan(op(x, bad, reduction="none")[3])
        with pytest.raises(KernelInputError, match="a target is outside"):
            tuner.check_errors()
        bad[3] = -100
        op(x, bad)
        tuner.check_errors()  # ignored: nothing reported
    finally:
        tuner.set_validate("async")
    evaluation = Evaluation("cross_entropy")
    b = build.build([ce.space("bfloat16").nearest(dict(threads_per_row=256, block_size=256, vec=8))],
                    gpus.attached().arch)[0]
    kernel = evaluation.load(b.so, b.variant.name, b.entry)
    problem = ce.Problem(64, 512, "bfloat16").__dict__
    assert evaluation.check(kernel, problem)["ok"] and evaluation.errors(kernel) == 0
    bad[3] = 700
    call, _ = kernel.prepare({"logits": x, "target": bad, "ignore_index": -100, "label_smoothing": 0.0,
                              "reduction": "mean", "in_place": False})
    call()
    assert evaluation.errors(kernel) == 1 and evaluation.errors(kernel) == 0


def test_a_bad_target_where_torch_serves_is_refused_and_the_process_goes_on(tmp_path):
    """Where torch's op serves (a problem whose check it won), a target outside the vocabulary is
    refused as a variant refuses it, in each validate mode, and never reaches torch's device-side
    assert, which would end the process's CUDA context; ignored targets pass, and good calls give
    torch's loss and gradient."""
    from tuner.errors import KernelInputError

    space = ce.space("bfloat16")
    winner = {"variant": space.nearest(dict(threads_per_row=32, block_size=256, vec=8, gradient="backward")),
              "problem": ce.Problem(64, 512, "bfloat16").__dict__, "served_by": "torch"}
    op = tuner.load(export.write(tmp_path / "ce-torch", [winner], gpus.attached().describe()))
    assert torch.ops.tuner_cross_entropy.served([64, 512], torch.bfloat16) == "torch"
    x, t = ce.make_inputs(64, 512, "bfloat16", seed=5)
    t[::7] = -100
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = op(a, t), F.cross_entropy(b, t).float()
    torch.testing.assert_close(got, want)
    got.backward()
    want.backward()
    torch.testing.assert_close(a.grad, b.grad)
    bad = t.clone()
    bad[3] = 512
    try:
        tuner.set_validate("sync")
        for wrong in (512, -1, 100000):
            bad[3] = wrong
            with pytest.raises(KernelInputError, match="a target is outside"):
                op(x, bad)
        tuner.set_validate("async")
        op(x, bad)
        torch.cuda.synchronize()
        with pytest.raises(KernelInputError, match="in an earlier call"):
            op(x, t)
        tuner.set_validate("deferred")
        op(x, bad, reduction="none")
        with pytest.raises(KernelInputError, match="a target is outside"):
            tuner.check_errors()
    finally:
        tuner.set_validate("async")
    torch.cuda.synchronize()  # the context is alive
    torch.testing.assert_close(op(x, t), F.cross_entropy(x, t).float())
