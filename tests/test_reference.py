"""The float64 reference against torchvision, and the op's meaning at the edges."""

import subprocess
import sys

import pytest
import torch

from tuner.families import giou
import references


def _torchvision_giou(*args, **kwargs):
    """torchvision's loss, imported when a test calls it (3 s of every test process's collection otherwise)."""
    from torchvision.ops import generalized_box_iou_loss

    return generalized_box_iou_loss(*args, **kwargs)


@pytest.mark.parametrize("pred", giou.PRED_DTYPES)
@pytest.mark.parametrize("target", giou.TARGET_DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reference_matches_torchvision(pred, target, reduction):
    p, t, n = giou.make_inputs(7, 13, pred, target, "uniform", seed=hash((pred, target, reduction)) % 1000)
    valid = giou.valid_mask(t, n)
    assert valid.any() and not valid.all()
    ours = giou.reference(p, t, n, reduction)
    theirs = _torchvision_giou(p.double()[valid], t.double()[valid], reduction=reduction)
    if reduction == "none":
        assert torch.allclose(ours[valid], theirs, rtol=1e-12, atol=1e-12)
        assert (ours[~valid] == 0).all()
    else:
        assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reference_gradient_matches_torchvision(reduction):
    p, t, n = giou.make_inputs(5, 11, "float32", "float32", "uniform", seed=3)
    valid = giou.valid_mask(t, n)
    loss, grad = references.with_grad(giou, p, t, n, reduction)
    leaf = p.double().requires_grad_(True)
    theirs = _torchvision_giou(leaf[valid], t.double()[valid], reduction=reduction)
    theirs.backward(torch.ones_like(theirs))
    assert torch.allclose(grad, leaf.grad, rtol=1e-10, atol=1e-12)
    assert (grad[~valid] == 0).all()


def test_counts_and_target_convention_agree_on_generated_data():
    p, t, n = giou.make_inputs(64, 32, "float32", "uint8", "article", seed=1)
    assert torch.equal(giou.valid_mask(t, n), giou.valid_mask(t, None))
    assert torch.allclose(giou.reference(p, t, n), giou.reference(p, t, None))


def test_mean_without_valid_boxes_is_zero_with_zero_gradient():
    p, t, n = giou.make_inputs(3, 4, "float32", "uint8", "article", seed=2, counts=torch.zeros(3))
    loss, grad = references.with_grad(giou, p, t, n, "mean")
    assert loss.item() == 0.0
    assert (grad == 0).all()


def test_padding_garbage_never_reaches_loss_or_gradient():
    p, t, n = giou.make_inputs(4, 6, "float32", "float32", "uniform", seed=5)
    valid = giou.valid_mask(t, n)
    p = p.clone()
    p[~valid] = float("nan")
    loss, grad = references.with_grad(giou, p, t, n, "sum")
    assert torch.isfinite(loss) and torch.isfinite(grad).all()


def test_num_boxes_is_clamped_to_the_slots():
    p, t, _ = giou.make_inputs(2, 5, "float32", "float32", "full", seed=6)
    big = giou.reference(p, t, torch.tensor([-3, 99]), "none")
    clamped = giou.reference(p, t, torch.tensor([0, 5]), "none")
    assert torch.equal(big, clamped)


def test_uint8_targets_do_not_overflow():
    # Areas of uint8 boxes exceed 255: the math must be done after the upcast.
    p = torch.tensor([[[0.0, 0.0, 200.0, 200.0]]])
    t = torch.tensor([[[0, 0, 250, 250]]], dtype=torch.uint8)
    want = _torchvision_giou(p.double()[0], t.double()[0], reduction="sum")
    assert torch.allclose(giou.reference(p, t, None, "sum"), want)


@pytest.mark.parametrize("dist", giou.DISTRIBUTIONS)
def test_box_count_distributions(dist):
    counts = giou.box_counts(4096, 256, dist, torch.Generator().manual_seed(0))
    assert counts.min() >= 0 and counts.max() <= 256
    if dist == "article":  # floor(|N(0, 3)|): most images hold fewer than 5 boxes
        assert (counts < 5).float().mean() > 0.8
    if dist == "full":
        assert (counts == 256).all()


def test_inputs_are_fresh_and_not_zero():
    a = giou.make_inputs(8, 16, "bfloat16", "uint8")
    b = giou.make_inputs(8, 16, "bfloat16", "uint8")
    assert not torch.equal(a[0], b[0])
    assert a[0].abs().sum() > 0 and a[1].float().abs().sum() > 0


def test_the_references_backward_imports_no_sympy():
    """A search worker's first check case waits on the reference's backward: autograd's check of a
    grad_outputs tensor would import sympy (0.3 s with bytecode cached, 2.4 s without)."""
    script = (
        "import sys, torch\n"
        "from tuner import opspec\n"
        "from tuner.families import giou\n"
        "from tuner.families.giou import op as box\n"
        "from tuner.families.rms_norm import op as rms\n"
        "from tuner.families.embedding_bag import op as bag\n"
        "p, t, n = giou.make_inputs(8, 16, 'bfloat16', 'uint8', device='cpu', seed=0)\n"
        "opspec.reference_gradients(box.OP_DECLARATION, box.OP.reference, (p, t, n, 'none'), torch.randn(8, 16))\n"
        "x, w = torch.randn(4, 32), torch.randn(32)\n"
        "opspec.reference_gradients(rms.OP_DECLARATION, rms.OP.reference, (x, w), torch.randn(4, 32))\n"
        "weight, idx, offs = torch.randn(10, 8), torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2])\n"
        "opspec.reference_gradients(bag.OP_DECLARATION, bag.OP.reference, (weight, idx, offs, 'sum'), torch.randn(2, 8))\n"
        "print('sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
