"""Hostile inputs to the exported op (property-based): each call matches the reference or raises
a clear error, and the process stays usable afterwards."""

import os

import pytest

from tuner.families import giou
import oploader

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = pytest.mark.gpu

PAIRS = [(p, t) for p in giou.PRED_DTYPES for t in giou.TARGET_DTYPES]


@pytest.fixture(scope="module")
def op(shared_home, tmp_path_factory):
    import tuner
    from tuner import gpus
    from tuner.deploy import export

    winners = [{"variant": v, "problem": giou.Problem(1024, 256, v["pred"], v["target"]).__dict__}
               for v in giou.covering_set()]
    out = export.write(tmp_path_factory.mktemp("hostile"), winners, gpus.attached().describe())
    return oploader.load(out, validate="sync")


def _close(got, want, pred_dtype) -> bool:
    """Equal to the float64 reference, or, where float32 arithmetic itself cannot hold the
    value (huge coordinates), to the same formula evaluated in float32; NaN where it has NaN."""
    import torch

    got, want = got.double().cpu(), want.double().cpu()
    same_nan = torch.equal(torch.isnan(got), torch.isnan(want))
    fin = torch.isfinite(got) & torch.isfinite(want)
    return bool(same_nan and torch.allclose(got[fin], want[fin], rtol=1e-3, atol=1e-3))


@settings(max_examples=int(os.environ.get("TUNER_HOSTILE_EXAMPLES", 1000)), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    B=st.sampled_from([0, 1, 2, 3, 17, 64, 1024, 4096]),
    S=st.sampled_from([1, 2, 7, 33, 256, 300, 512]),
    pair=st.sampled_from(PAIRS),
    scale=st.sampled_from([1.0, 256.0, -1e4, 1e6]),
    degenerate=st.booleans(),
    nonfinite=st.sampled_from([None, "nan", "inf"]),
    view=st.booleans(),
    counts=st.sampled_from(["ok", "high", "negative", "none"]),
    reduction=st.sampled_from(["mean", "sum", "none"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_hostile_inputs(op, B, S, pair, scale, degenerate, nonfinite, view, counts, reduction, seed):
    import torch

    KernelInputError = oploader.kernel_input_error()

    pred_dtype, target_dtype = pair
    g = torch.Generator().manual_seed(seed)
    p, t, n = giou.make_inputs(B, S, pred_dtype, target_dtype, "uniform", seed=seed)
    if target_dtype != "uint8":
        t = (t.float() * (scale / 256.0)).to(t.dtype)
    p = (p.float() * (scale / 256.0)).to(p.dtype)
    if degenerate and B:
        p = p.clone()
        p[..., [0, 2]] = p[..., [2, 0]]  # x2 < x1
    if nonfinite and B:
        p = p.clone()
        p.view(-1)[torch.randint(0, p.numel(), (1,), generator=g)] = float(nonfinite)
    if counts == "high" and B:
        n = n.clone()
        n[0] = S + 5
    elif counts == "negative" and B:
        n = n.clone()
        n[-1] = -3
    nb = None if counts == "none" else n
    pc, tc = p.cuda(), t.cuda()
    nbc = nb.cuda() if nb is not None else None
    if view and B:  # the same values through a non-contiguous view
        pc = pc.transpose(0, 1).contiguous().transpose(0, 1)
        tc = tc.transpose(0, 1).contiguous().transpose(0, 1)
    variant = oploader.chosen(pred_dtype, target_dtype, B, S)["params"]
    valid = giou.valid_mask(t, nb)
    # What validation reports: counts outside [0, S], and non-finite valid target boxes
    # (a float16 target scaled past 65504 is inf).
    bad = (counts in ("high", "negative") and B > 0) or bool((~torch.isfinite(t.float()).all(-1) & valid).any())
    expect_error = bad and variant["validation"] != "none"
    try:
        got = op(pc, tc, nbc, reduction)
        torch.cuda.synchronize()
    except KernelInputError as exc:
        assert expect_error, f"unexpected error: {exc}"
    else:
        assert not expect_error, "bad input was not reported"
        want = giou.reference(p, t, nb, reduction)
        assert _close(got, want, pred_dtype), f"{variant.name}: {got} vs {want}"
    # Mixed devices: a clear error, never a crash.
    if B:
        with pytest.raises(ValueError, match="is on"):
            op(pc, t, nbc)
    # Whatever happened, the next valid call works.
    a, b, c = giou.make_inputs(4, 8, "bfloat16", "uint8", device="cuda")
    assert giou.check("after", op(a, b, c), giou.reference(a, b, c), giou.LOSS_TOL)[0]
