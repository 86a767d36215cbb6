"""The cross-entropy family, declared (tuner/families/cross_entropy): its space, its op's C++
rendered from the declaration and bound from an export (CPU kernels from the float64 reference,
autograd, opcheck, clear errors, torch's op for what no variant takes). No GPU needed."""

import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner.build import compile as build
from tuner.deploy import export
from tuner.errors import KernelInputError
from tuner.families import cross_entropy as ce


def test_the_space_keeps_loads_within_16_bytes():
    assert all(p["vec"] * (4 if p["logits"] == "float32" else 2) <= 16 for p in (v.as_dict() for v in ce.space("float32")))
    assert {v.as_dict()["logits"] for v in ce.covering_set()} == set(ce.DTYPES)


def test_the_covering_variants_compile(tuner_home):
    builds = build.build(ce.covering_set(), "sm_90")
    assert all(b.ok for b in builds), [b.error for b in builds if not b.ok][:1]


@pytest.fixture(scope="module")
def op(tmp_path_factory, shared_home):
    winners = [{"variant": ce.space().variant(threads_per_row=256, block_size=256, vec=8, gradient="forward",
                                              first_read="evict_last", reread="reverse"),
                "problem": ce.Problem().__dict__}]
    return tuner.load(export.write(tmp_path_factory.mktemp("ce"), winners,
                                   {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}))


@pytest.mark.parametrize("reduction", ce.REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_op_on_cpu_is_f_cross_entropy_with_its_gradient(op, reduction, smoothing, dtype):
    x, t = ce.make_inputs(37, 301, dtype, ignored=0.3, device="cpu", seed=2)
    x.requires_grad_()
    loss = op(x, t, -100, smoothing, reduction)
    assert loss.dtype == torch.float32 and loss.shape == ((37,) if reduction == "none" else ())
    x64 = x.detach().double().requires_grad_()
    want = F.cross_entropy(x64, t, reduction=reduction, label_smoothing=smoothing)
    torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-5, atol=1e-6)
    g = torch.rand(loss.shape) + 0.5
    (gx,) = torch.autograd.grad(loss, x, g)
    (want_x,) = torch.autograd.grad(want, x64, g.double())
    assert gx.dtype == x.dtype
    torch.testing.assert_close(gx.double(), want_x.to(x.dtype).double())
    torch.library.opcheck(op, (x.detach(), t, -100, smoothing, reduction))


def test_calls_no_variant_takes_and_bad_input(op):
    x, t = ce.make_inputs(6, 11, "float32", device="cpu", seed=3)
    torch.testing.assert_close(op(x.double(), t), F.cross_entropy(x.double(), t).float())  # float64: torch's
    with pytest.raises(ValueError, match="cross_entropy: reduction must be one of none, mean, sum, got avg"):
        op(x, t, reduction="avg")
    with pytest.raises(ValueError, match=r"cross_entropy: target must have shape \[6\] \(rows\), got \[5\]"):
        op(x, t[:5])
    with pytest.raises(ValueError, match=r"cross_entropy: logits must be \[rows, vocab\]"):
        op(x.reshape(2, 3, 11), t)
    with pytest.raises(ValueError, match="cross_entropy: logits must have at least one class"):
        op(x[:, :0], t)
    with pytest.raises(RuntimeError, match="target dtype to be Long"):  # no variant takes it: torch's op and words
        op(x, t.int())
    bad = t.clone()
    bad[2] = 11  # the vocabulary is 11 words
    with pytest.raises(KernelInputError, match=r"cross_entropy: invalid input: a target is outside \[0, vocab\)"):
        op(x, bad)
    bad[2] = -100  # ignored, not refused
    op(x, bad)


def test_a_captured_run_records_its_cross_entropy_calls(tmp_path):
    """tuner.capture of a step's F.cross_entropy (logits flattened to [tokens, vocab], as
    language-model code calls it); calls with class weights or 3-D logits are not this family's."""
    x, t = ce.make_inputs(24, 64, "float32", device="cpu", seed=4)
    with tuner.capture(tmp_path / "shapes.json") as cap:
        for _ in range(3):
            F.cross_entropy(x, t, label_smoothing=0.1)
        F.cross_entropy(x, t, weight=torch.ones(64))
        F.cross_entropy(x.reshape(2, 12, 64).transpose(1, 2), t.reshape(2, 12))
    got = [(p["family"], p["problem"], p["calls"]) for p in cap.problems if p["family"] == "cross_entropy"]
    assert got == [("cross_entropy", {"rows": 24, "vocab": 64, "logits": "float32", "label_smoothing": 0.1,
                                      "reduction": "mean"}, 3)]


def test_the_binding_s_functional_form_hands_cpu_calls_to_torch(op):
    """Once bound, TF.cross_entropy's C++ form parses F.cross_entropy's signature and hands every call
    it does not send to the op (a CPU tensor, class weights, a legacy keyword, probabilities) to the
    Python form: F.cross_entropy's answers and refusals."""
    from tuner import entries

    fast = entries._functionals["cross_entropy"]
    x, t = ce.make_inputs(6, 10, "float32", device="cpu", seed=5)
    for kwargs in ({}, {"reduction": "sum", "label_smoothing": 0.1}, {"weight": torch.rand(10)},
                   {"size_average": False}, {"reduce": False}):
        torch.testing.assert_close(fast(x, t, **kwargs), F.cross_entropy(x, t, **kwargs))
    probabilities = torch.softmax(torch.randn(6, 10), -1)
    torch.testing.assert_close(fast(x, probabilities, None, None, -100, None, "none"),
                               F.cross_entropy(x, probabilities, reduction="none"))
    with pytest.raises(ValueError, match="is not a valid value for reduction"):
        fast(x, t, reduction="max")


def test_calls_torch_answers_otherwise_are_not_the_op_s():
    """`served` (the Python form's choice, and what a capture records) leaves to torch every call
    whose answer the op would change: a uint8 or int32 target (the guard reads 8- or 4-byte
    entries), float64 logits (the op's loss is float32), a reduction or label smoothing torch
    refuses or renames."""
    from tuner.families.cross_entropy.op import served

    x, t = ce.make_inputs(6, 10, "float32", device="cpu", seed=5)
    assert served(x, t) == (x, t, -100, 0.0, "mean")
    assert served(x.bfloat16(), t, reduction="none", label_smoothing=1.0) is not None
    for args, kwargs in (((x, t.to(torch.uint8)), {}), ((x, t.int()), {}), ((x.double(), t), {}),
                         ((x, t), {"reduction": "elementwise_mean"}), ((x, t), {"reduction": None}),
                         ((x, t), {"label_smoothing": 1.5}), ((x, t), {"label_smoothing": -0.1}),
                         ((x, t), {"label_smoothing": float("nan")})):
        assert served(*args, **kwargs) is None, (args[0].dtype, args[1].dtype, kwargs)


def test_the_functional_form_hands_other_calls_to_torch():
    import tuner.functional as TF

    x, t = ce.make_inputs(6, 10, "float32", device="cpu", seed=5)
    torch.testing.assert_close(TF.cross_entropy(x, t, reduction="sum"), F.cross_entropy(x, t, reduction="sum"))
    w = torch.rand(10)
    torch.testing.assert_close(TF.cross_entropy(x, t, weight=w), F.cross_entropy(x, t, weight=w))
