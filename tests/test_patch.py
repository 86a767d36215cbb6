"""tuner.patch on a machine without a GPU: which modules it hands to a loaded export's op, what it
leaves alone, undo, deep copies; and the F signatures that take every call torch takes (on the
CPU, torch's function serves them all)."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner import entries, runtime
from tuner.deploy import patching
from tuner.errors import TunerError
import tuner.functional as TF

@pytest.fixture(scope="module")
def loaded(rms_norm_op):
    return rms_norm_op


class OwnNorm(torch.nn.RMSNorm):
    """A subclass with a forward of its own: not the class the family knows."""

    def forward(self, x):
        return super().forward(x) * 2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(8)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.RMSNorm([2, 4])])
        self.own = OwnNorm(8)
        self.bag = torch.nn.EmbeddingBag(10, 8, mode="sum")

    def forward(self, x):
        return self.own(self.layers[1](self.layers[0](self.norm(x)).view(-1, 2, 4)).view(-1, 8))


def test_patch_serves_known_modules_and_undoes(loaded, monkeypatch):
    monkeypatch.setattr(runtime, "loaded_families", lambda: ["rms_norm"])
    model = Model()
    x = torch.randn(3, 8)
    want = model(x)
    patched = tuner.patch(model)
    assert patched.modules == [("norm", "rms_norm"), ("layers.1", "rms_norm")]
    assert patched.skipped == [("bag", "embedding_bag")]
    assert str(patched) == "tuned ops serve 2 rms_norm; 1 left alone (no embedding_bag export loaded)"
    assert model.norm.forward.func is patching.forwards()["torch.nn.modules.normalization.RMSNorm"][1]
    torch.testing.assert_close(model(x), want)  # on the CPU, F.rms_norm serves
    assert tuner.patch(model).modules == []  # patched once
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # bound to the copy
        assert twin.norm.forward.args == (twin.norm,)
        assert set(twin.state_dict()) == set(model.state_dict())
        torch.testing.assert_close(twin(x), want)
    patched.undo()
    assert all("forward" not in m.__dict__ for m in model.modules())
    torch.testing.assert_close(model(x), want)
    with tuner.patch(model) as again:
        assert len(again.modules) == 2
    assert "forward" not in model.norm.__dict__


def test_undo_finds_modules_moved_and_leaves_other_forwards(loaded, monkeypatch):
    monkeypatch.setattr(runtime, "loaded_families", lambda: ["rms_norm"])
    model = Model()
    patched = tuner.patch(model)
    norm = model.layers[1]
    del model.layers[1]  # the model changed after the patch
    model.norm.forward = model.norm.forward.func.__get__(model.norm)  # someone else's forward since
    patched.undo()
    assert "forward" not in norm.__dict__ and "forward" in model.norm.__dict__


def test_patch_needs_a_loaded_export_and_a_module(monkeypatch):
    monkeypatch.setattr(runtime, "loaded_families", lambda: [])
    with pytest.raises(TunerError, match=r"no tuned op is loaded: tuner.load\(EXPORT\) first"):
        tuner.patch(Model())
    with pytest.raises(TunerError, match="takes a torch.nn.Module, got function"):
        tuner.patch(lambda x: x)


def test_patch_loads_the_exports_it_is_given(tmp_path, shared_home):
    with pytest.raises(Exception, match="no-such-export"):
        tuner.patch(Model(), tmp_path / "no-such-export")


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")  # torch's, for a form it takes
def test_functional_forms_take_every_call_torch_takes():
    x = torch.randn(2, 3, 8, requires_grad=True)
    w = torch.randn(8)
    for args in (((8,), w, 1e-5), ((8,), None), ([3, 8], torch.randn(3, 8)), ((8,), w.double())):
        torch.testing.assert_close(TF.rms_norm(x, *args), F.rms_norm(x, *args))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        TF.rms_norm(x, (7,), None)  # torch's own refusals
    with pytest.raises(TypeError, match="normalized_shape"):
        TF.rms_norm(x, 8, w)
    weight = torch.randn(10, 4)
    ids, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4])
    for kwargs in ({"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True}, {"mode": "max"},
                   {"per_sample_weights": torch.rand(8), "mode": "sum"}):
        torch.testing.assert_close(TF.embedding_bag(ids, weight.clone(), offsets, **kwargs),
                                   F.embedding_bag(ids, weight.clone(), offsets, **kwargs))
    a, b = torch.rand(6, 4) * 10, torch.rand(6, 4) * 10
    a[:, 2:] += a[:, :2] + 1
    b[:, 2:] += b[:, :2] + 1
    tv = pytest.importorskip("torchvision.ops")
    for reduction in ("none", "mean", "sum"):
        torch.testing.assert_close(TF.generalized_box_iou_loss(a, b, reduction),
                                   tv.generalized_box_iou_loss(a, b, reduction))
    torch.testing.assert_close(TF.generalized_box_iou_loss(a[0], b[0], eps=1e-3),
                               tv.generalized_box_iou_loss(a[0], b[0], eps=1e-3))
    assert set(dir(TF)) >= {"rms_norm", "embedding_bag", "generalized_box_iou_loss"}
    for dtype in (torch.float16, torch.bfloat16):  # torchvision computes these in float32
        got = TF.generalized_box_iou_loss(a.to(dtype), b.to(dtype), "mean")
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, tv.generalized_box_iou_loss(a.to(dtype), b.to(dtype), "mean"))
    assert float(TF.generalized_box_iou_loss(a[:0], b[:0], "mean")) == 0.0  # no boxes: 0, as torchvision
    with pytest.raises(IndexError, match="shape of the mask"):  # torchvision's refusal: it broadcasts boxes2 alone
        TF.generalized_box_iou_loss(a[:1], b, "none")
    torch.testing.assert_close(TF.generalized_box_iou_loss(a, b[:1]), tv.generalized_box_iou_loss(a, b[:1]))
    far = torch.tensor([[0.0, 0.0, 1e20, 1e20], [0.0, 0.0, 1.0, 1.0]], requires_grad=True)  # overflows float32
    apart = torch.tensor([[3e20, 3e20, 4e20, 4e20], [0.5, 0.5, 2.0, 2.0]])
    got = torch.autograd.grad(TF.generalized_box_iou_loss(far, apart, "sum"), far)[0]
    want = torch.autograd.grad(tv.generalized_box_iou_loss(far, apart, "sum"), far)[0]
    torch.testing.assert_close(got, want, equal_nan=True)


def test_functional_forms_refuse_what_is_not_a_tensor_as_torch_does():
    """A list or None where torch's function wants a tensor: torch's own error, word for word (not an
    AttributeError of the form's choice)."""
    t, w = torch.tensor([0, 1]), torch.randn(5, 2)
    calls = [(TF.cross_entropy, F.cross_entropy, ([[1.0, 2.0], [0.5, 0.1]], t)),
             (TF.cross_entropy, F.cross_entropy, (torch.randn(2, 5), [0, 1])),
             (TF.rms_norm, F.rms_norm, ([[1.0]], (1,))),
             (TF.linear_cross_entropy, lambda x, w, t: F.cross_entropy(F.linear(x, w), t), ([[1.0, 2.0]], w, t[:1])),
             (TF.linear_cross_entropy, lambda x, w, t: F.cross_entropy(F.linear(x, w), t), (torch.randn(1, 2), w, None))]
    for mine, torch_s, args in calls:
        with pytest.raises(TypeError) as want:
            torch_s(*args)
        with pytest.raises(TypeError) as got:
            mine(*args)
        assert str(got.value) == str(want.value), mine.__name__


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
def test_a_loaded_export_s_functional_forms_are_its_binding_s(loaded):
    """Once an export is bound, TF.rms_norm's calls go to the binding's C++ form of it (torch's
    argument parser, the Python form's decision); a call it does not send to the op (here every
    call: a CPU tensor) reaches the Python form, with torch's answers and refusals, keywords, a
    TorchFunctionMode, and torch.compile tracing the Python form."""
    from modes import Recording

    fast = entries._functionals["rms_norm"]
    assert type(fast).__name__ == "builtin_function_or_method" and fast.__name__ == "rms_norm"
    x, w = torch.randn(2, 3, 8), torch.randn(8)
    for args, kwargs in ((((8,), w, 1e-5), {}), (((8,),), {"weight": w}), ((), {"normalized_shape": [3, 8]}),
                         ((torch.Size([8]), w.double()), {"eps": None})):
        torch.testing.assert_close(fast(x, *args, **kwargs), F.rms_norm(x, *args, **kwargs))
        torch.testing.assert_close(TF.rms_norm(x, *args, **kwargs), F.rms_norm(x, *args, **kwargs))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        fast(x, (7,), None)
    with pytest.raises(TypeError, match="normalized_shape"):
        fast(x, 8, w)

    with Recording() as seen:
        fast(x, (8,), w)
    assert seen.calls
    compiled = torch.compile(lambda x, w: TF.rms_norm(x, (8,), w, 1e-6), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, w), F.rms_norm(x, (8,), w, 1e-6))


def test_rms_norm_default_eps_is_torch_s():
    """eps=None (nn.RMSNorm's default): torch's is float32's epsilon for 16-bit x, not the dtype's."""
    x = torch.randn(4, 8, dtype=torch.float16) * 0.01
    norm = torch.nn.RMSNorm(8, dtype=torch.float16)
    torch.testing.assert_close(TF.rms_norm(x, (8,), norm.weight), F.rms_norm(x, (8,), norm.weight))
    assert TF.rms_norm.__module__ == "tuner.families.rms_norm.op"
    from tuner.families.rms_norm import op
    assert op.FLOAT32_EPS == torch.finfo(torch.float32).eps


def test_a_folder_that_is_no_export_is_one_error_without_its_causes(tmp_path):
    """`tuner.patch(model, "<missing>")`: the project's error alone, not the missing manifest's
    FileNotFoundError and the runtime's RuntimeError chained before it."""
    with pytest.raises(TunerError, match="is not a tuned export: no manifest.json") as raised:
        tuner.patch(torch.nn.Linear(2, 2), tmp_path / "missing")
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
