"""The linear cross-entropy family (tuner/families/linear_cross_entropy): its space, variants that
call cuBLAS (the declaration's `libraries`: compiled and linked here), its op's C++ rendered from
the declaration and bound from an export (CPU kernels from the chunked float64 reference,
autograd, opcheck, clear errors). No GPU needed."""

import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner.build import compile as build
from tuner.build import libraries
from tuner.deploy import export
from tuner.errors import KernelInputError
from tuner.families import linear_cross_entropy as lce
from tuner.families.linear_cross_entropy import spec


def test_the_covering_variants_compile_and_link_cublas(tuner_home):
    builds = build.build(lce.covering_set(), "sm_90")
    assert all(b.ok for b in builds), [b.error for b in builds if not b.ok][:1]
    assert libraries.find("cublas")[2].startswith("libcublas.so.")
    assert all(v["vec"] * (4 if v["hidden"] == "float32" else 2) <= 16 for v in (b.variant.as_dict() for b in builds))


def test_a_declared_library_is_found_keyed_by_its_version_and_refused_when_unknown():
    include, folder, file = libraries.find("cublas")
    assert (include / "cublas_v2.h").exists() and (folder / file).exists()
    assert libraries.flags(("cublas",)) == ([f"-I{include}"], [f"-L{folder}", f"-l:{file}"])
    assert str(include) not in libraries.key(("cublas",)) and file in libraries.key(("cublas",))
    from tuner import declare
    from tuner.errors import ToolchainError

    with pytest.raises(declare.DeclarationError, match="libraries=.*of \\['cublas'\\]"):
        declare.Op("lib_op", inputs=(declare.Tensor("x", dtypes=("float32",)),),
                   outputs=(declare.Tensor("y", like="x"),), sizes={"n": "x.numel()"}, libraries=("mkl",))
    with pytest.raises(ToolchainError, match="no library 'mkl' is known"):
        libraries.find("mkl")


def test_the_reference_is_torch_s_loss_a_chunk_at_a_time(monkeypatch):
    """Chunked (a chunk's float64 logits at a time, recomputed in the backward) and whole agree,
    label smoothing and ignored targets included."""
    monkeypatch.setattr(spec, "REFERENCE_ROWS", 4)
    h, w, t = lce.make_inputs(11, 6, 13, "float32", ignored=0.3, device="cpu", seed=1)
    h.requires_grad_(), w.requires_grad_()
    for reduction in spec.REDUCTIONS:
        got = spec.reference(h, w, t, label_smoothing=0.1, reduction=reduction)
        want = F.cross_entropy(h.double() @ w.double().T, t, label_smoothing=0.1, reduction=reduction)
        torch.testing.assert_close(got, want)
        g = torch.rand(got.shape, dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad(got, (h, w), g), torch.autograd.grad(want, (h, w), g))
    assert torch.isnan(spec.reference(h, w, torch.full_like(t, -100)))  # a mean over no row, as torch's


@pytest.fixture(scope="module")
def op(tmp_path_factory, shared_home):
    winners = [{"variant": lce.space().variant(chunk_rows=512, threads_per_row=512, vec=8, first_read="normal",
                                               reread="in_order"),
                "problem": lce.Problem().__dict__}]
    return tuner.load(export.write(tmp_path_factory.mktemp("lce"), winners,
                                   {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}))


@pytest.mark.parametrize("reduction", spec.REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_op_on_cpu_is_linear_then_cross_entropy_with_both_gradients(op, reduction, smoothing):
    h, w, t = lce.make_inputs(37, 24, 301, "float32", ignored=0.3, device="cpu", seed=2)
    h.requires_grad_(), w.requires_grad_()
    loss = op(h, w, t, -100, smoothing, reduction)
    assert loss.dtype == torch.float32 and loss.shape == ((37,) if reduction == "none" else ())
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = F.cross_entropy(h64 @ w64.T, t, reduction=reduction, label_smoothing=smoothing)
    torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-5, atol=1e-6)
    g = torch.rand(loss.shape) + 0.5
    got = torch.autograd.grad(loss, (h, w), g)
    expected = torch.autograd.grad(want, (h64, w64), g.double())
    for a, b in zip(got, expected):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b.float().double())
    torch.library.opcheck(op, (h.detach(), w.detach(), t, -100, smoothing, reduction))


def test_calls_no_variant_takes_and_bad_input(op):
    h, w, t = lce.make_inputs(6, 8, 11, "float32", device="cpu", seed=3)
    torch.testing.assert_close(op(h.double(), w.double(), t), F.cross_entropy(h.double() @ w.double().T, t).float())
    with pytest.raises(ValueError, match="linear_cross_entropy: reduction must be one of none, mean, sum, got avg"):
        op(h, w, t, reduction="avg")
    with pytest.raises(ValueError, match=r"linear_cross_entropy: target must have shape \[6\] \(tokens\), got \[5\]"):
        op(h, w, t[:5])
    with pytest.raises(ValueError, match=r"weight must be \[vocab, H\]"):
        op(h, w[:, :7], t)
    bad = t.clone()
    bad[2] = 11  # the vocabulary is 11 words
    with pytest.raises(KernelInputError, match=r"linear_cross_entropy: invalid input: a target is outside"):
        op(h, w, bad)
    bad[2] = -100  # ignored, not refused
    op(h, w, bad)


def test_the_function_takes_model_shaped_calls_and_gives_torch_s_answers(op):
    """tuner.functional.linear_cross_entropy: hidden [batch, seq, H] and target [batch, seq] as a model
    has them; a bias (which the op does not take) goes to torch's two functions."""
    import tuner.functional as TF

    h, w, t = lce.make_inputs(12, 8, 19, "float32", device="cpu", seed=4)
    bias = torch.randn(19)
    for b in (None, bias):
        for reduction in spec.REDUCTIONS:
            got = TF.linear_cross_entropy(h.reshape(3, 4, 8), w, t.reshape(3, 4), b, reduction=reduction)
            want = F.cross_entropy(F.linear(h, w, b), t, reduction=reduction)
            torch.testing.assert_close(got, want.reshape(3, 4) if reduction == "none" else want)


def test_the_function_gives_torch_s_answers_and_errors_to_every_other_call():
    """Where the target is not one class index a row of the input (class probabilities, an unbatched
    row, a target of another shape with as many entries), tuner.functional.linear_cross_entropy is
    torch's two functions as given: their answers, their errors; none is read as rows silently."""
    import tuner.functional as TF

    w = torch.randn(5, 8)

    def outcome(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError) as exc:
            return type(exc), str(exc).splitlines()[0]

    def torch_s(x, w, t, **kwargs):
        return F.cross_entropy(F.linear(x, w), t, **kwargs)

    calls = [(torch.randn(2, 3, 8), torch.randint(0, 5, (3, 2)), "none"),  # as many entries, another shape
             (torch.randn(4, 8), torch.randint(0, 5, (4, 1)), "none"),
             (torch.randn(8), torch.tensor(2), "mean"), (torch.randn(8), torch.tensor(2), "none"),  # one row
             (torch.randn(4, 8), torch.softmax(torch.randn(4, 5), 1), "mean"),  # class probabilities
             (torch.randn(4, 8), None, "mean"), ([[1.0] * 8], torch.tensor([0]), "mean")]
    for x, t, reduction in calls:
        got, want = outcome(TF.linear_cross_entropy, x, w, t, reduction=reduction), outcome(
            torch_s, x, w, t, reduction=reduction)
        if isinstance(want, tuple):
            assert got == want, (x if isinstance(x, list) else x.shape, t)
        else:
            torch.testing.assert_close(got, want)


def test_a_captured_step_records_its_lm_head_and_loss(tmp_path):
    """tuner.capture of a Llama-style step: hidden [batch, seq, H] through F.linear (no bias), the
    logits upcast and flattened, F.cross_entropy: recorded as this family's problem (the hidden
    states' dtype) beside cross-entropy's; a head with a bias, or logits made without autograd,
    are not this family's."""
    weight = torch.randn(50, 8, dtype=torch.bfloat16, requires_grad=True)
    hidden = torch.randn(2, 6, 8, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 50, (2, 6))
    with tuner.capture(tmp_path / "shapes.json") as cap:
        logits = F.linear(hidden, weight).float()
        F.cross_entropy(logits.view(-1, 50), labels.view(-1), ignore_index=-100, reduction="sum").backward()
        F.cross_entropy(F.linear(hidden, weight, torch.zeros(50, dtype=torch.bfloat16)).view(-1, 50), labels.view(-1))
        with torch.no_grad():
            F.cross_entropy(F.linear(hidden, weight).view(-1, 50), labels.view(-1))
    found = [p for p in cap.problems if p["family"] == "linear_cross_entropy"]
    assert [p["problem"] for p in found] == [{"tokens": 12, "width": 8, "vocab": 50, "hidden": "bfloat16",
                                              "reduction": "sum", "label_smoothing": 0.0}]
    assert found[0]["calls"] == 1 and lce.Problem(**found[0]["problem"]).key() == found[0]["key"]
