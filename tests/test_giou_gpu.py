"""Forward and backward of compiled variants against the float64 reference, on the GPU.

Run on a machine with a CUDA GPU: `pytest -m gpu`. Outputs are poisoned with NaN
before every launch, so an unwritten element fails the check.
"""

import pytest

from tuner.families import giou

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1), (1, 7), (3, 256), (3, 300), (1024, 7), (1024, 256), (3, 1), (1024, 300)]


@pytest.fixture(scope="module")
def kernels(shared_home):
    import torch

    from tuner import gpus
    from tuner.build import compile as build
    from tuner.measure.declared import DeclaredKernel

    arch = gpus.attached().arch
    cover = giou.covering_set()
    # The default problem (bf16 pred, uint8 target) gets a second, different variant.
    cover.append(giou.space().variant(boxes_per_thread=4, padding="predicate", validation="hoisted",
                                      block_size=256, loads="vector", reduction="two_pass", backward="fused"))
    built = build.build(cover, arch)
    failed = [f"{b.variant.name}: {b.error}" for b in built if not b.ok]
    assert not failed, "\n".join(failed)
    torch.manual_seed(0)
    return [(b.variant, DeclaredKernel(giou.FAMILY, b.so, b.variant.name, b.entry)) for b in built]


@pytest.fixture(scope="module")
def evaluation():
    from tuner.measure.declared import Evaluation

    return Evaluation(giou.FAMILY)


def _values(pred, target, nb, reduction="mean"):
    return {"pred": pred, "target": target, "num_boxes": nb, "reduction": reduction, "eps": giou.DEFAULT_EPS}


def _loss(kernel, pred, target, nb, reduction, check=True):
    """The forward's loss, bad input raised at once (check=True) or kept (check=False)."""
    return kernel.forward(_values(pred, target, nb, reduction), check)["loss"]


def _counts(B, S, kind, device):
    import torch

    if kind == "empty":
        return torch.zeros(B, dtype=torch.int64, device=device)
    if kind == "full":
        return torch.full((B,), S, dtype=torch.int64, device=device)
    counts = torch.randint(0, S + 1, (B,), device=device)
    counts[0] = 0  # one all-padding image
    if B > 1:
        counts[-1] = S  # one full image
    return counts


def _run(evaluation, kernel, variant, B, S, reduction, counts_kind, use_counts):
    """Forward and backward on fresh inputs against the float64 reference (as the search checks)."""
    p, t, n = giou.make_inputs(B, S, variant["pred"], variant["target"], device="cuda",
                               counts=_counts(B, S, counts_kind, "cpu"))
    _, failed = evaluation.run_case(kernel, evaluation.case(_values(p, t, n if use_counts else None, reduction)))
    assert not failed, f"{variant.name} B={B} S={S} {reduction} counts={counts_kind} num_boxes={use_counts}: {failed}"


@pytest.mark.parametrize("B,S", SHAPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_forward_backward_match_reference(kernels, evaluation, B, S, reduction):
    for variant, kernel in kernels:
        _run(evaluation, kernel, variant, B, S, reduction, "mixed", use_counts=True)


@pytest.mark.parametrize("counts_kind", ["empty", "full"])
def test_all_padding_and_full_images(kernels, evaluation, counts_kind):
    for variant, kernel in kernels:
        for reduction in ("mean", "sum", "none"):
            _run(evaluation, kernel, variant, 3, 256, reduction, counts_kind, use_counts=True)


def test_padding_convention_without_num_boxes(kernels, evaluation):
    for variant, kernel in kernels:
        for reduction in ("mean", "none"):
            _run(evaluation, kernel, variant, 5, 300, reduction, "mixed", use_counts=False)


def test_repeated_calls_reuse_a_clean_workspace(kernels):
    # The last block resets the workspace: a second call must not see the first's sums.
    import torch

    for variant, kernel in kernels:
        pred, target, nb = giou.make_inputs(64, 256, variant["pred"], variant["target"], device="cuda")
        first = _loss(kernel, pred, target, nb, "sum").clone()
        second = _loss(kernel, pred, target, nb, "sum")
        torch.cuda.synchronize()
        ok, _, msg = giou.check("repeat", second, first, 1e-6)
        assert ok, f"{variant.name}: {msg}"


def test_validation_reports_bad_counts_without_killing_the_context(kernels):
    import torch

    from tuner.errors import KernelInputError

    for variant, kernel in kernels:
        pred, target, nb = giou.make_inputs(4, 16, variant["pred"], variant["target"], device="cuda")
        bad = nb.clone()
        bad[1] = 17
        if variant["validation"] == "none":
            loss = _loss(kernel, pred, target, bad, "mean")  # clamped, no report
            want = giou.reference(pred, target, bad, "mean")
            assert giou.check("clamped", loss, want, giou.LOSS_TOL)[0], variant.name
        else:
            with pytest.raises(KernelInputError, match="num_boxes"):
                _loss(kernel, pred, target, bad, "mean")
        bad[1] = -1
        if variant["validation"] != "none":
            with pytest.raises(KernelInputError, match="num_boxes"):
                _loss(kernel, pred, target, bad, "none")
        # The context is still usable and the flag was cleared.
        loss = _loss(kernel, pred, target, nb, "mean")
        assert giou.check("after", loss, giou.reference(pred, target, nb, "mean"), giou.LOSS_TOL)[0]
        assert torch.isfinite(loss).all()


def test_validation_reports_non_finite_targets(kernels):
    import torch

    from tuner.errors import KernelInputError

    for variant, kernel in kernels:
        if variant["target"] == "uint8" or variant["validation"] == "none":
            continue
        pred, target, nb = giou.make_inputs(4, 16, variant["pred"], variant["target"], device="cuda",
                                            counts=torch.tensor([3, 3, 3, 3]))
        target[2, 1, 0] = float("inf")  # a valid slot
        with pytest.raises(KernelInputError, match="non-finite"):
            _loss(kernel, pred, target, nb, "mean")
        target[2, 1, 0] = 1.0
        target[2, 10, 0] = float("nan")  # padding: not checked
        _loss(kernel, pred, target, nb, "mean")


def test_deferred_errors_are_kept_until_taken(kernels):
    variant, kernel = next((v, k) for v, k in kernels if v["validation"] != "none")
    pred, target, nb = giou.make_inputs(4, 16, variant["pred"], variant["target"], device="cuda")
    bad = nb.clone()
    bad[0] = 99
    _loss(kernel, pred, target, bad, "mean", check=False)
    assert kernel.take_errors() & 1
    assert kernel.take_errors() == 0


def test_bench_from_the_declaration_times_the_articles_rows(shared_home, tmp_path):
    """`tuner bench --family giou` (tuner/report/declared.py, GIoU's bench words): the floors, the
    tuned op in its three ways of reporting bad input and inside torch.compile's CUDA graphs, the
    article's losses and kernel, torch's eager loss and F.mse_loss, each checked against float64
    first; the article's loop is left out beyond LOOP_MAX_BATCH."""
    import csv

    from tuner import gpus
    from tuner.cli import main as cli
    from tuner.deploy import export

    variant = giou.space().variant(boxes_per_thread=1, padding="branch", validation="inline", block_size=256,
                                   loads="vector", reduction="two_pass", backward="recompute")
    artifact = export.write(tmp_path / "artifact", [{"variant": variant, "problem": giou.Problem().__dict__}],
                            gpus.attached().describe())
    assert cli.main(["bench", "--family", "giou", "--artifact", str(artifact), "--shapes", "64x256,2048x16",
                     "--dtypes", "bfloat16/uint8", "--out", str(tmp_path / "b")]) == 0
    with open(tmp_path / "b" / "bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    small = [r["impl"] for r in rows if r["batch"] == "64"]
    assert small == ["floor: HBM at 3.0 TB/s", "tuned op", "tuned op, validate=sync", "tuned op, validate=deferred",
                     "tuned op, torch.compile reduce-overhead", "article loop", "article concat",
                     "torchvision + mask", "simple CUDA kernel", "anchor: torch giou_loss", "anchor: torch.compile",
                     "floor: one kernel launch", "floor: x.sum().backward()", "anchor: F.mse_loss (native op)"]
    large = [r["impl"] for r in rows if r["batch"] == "2048"]
    assert "article loop" not in large and len(large) == len(small) - 1
    tuned = next(r for r in rows if r["impl"] == "tuned op")
    assert all(float(tuned[k]) > 0 for k in ("fwd_wall_us", "fwd_kernel_us", "fwd_bwd_wall_us", "fwd_bwd_kernel_us"))
    assert (tmp_path / "b" / "bench.md").exists() and (tmp_path / "b" / "bench.png").exists()
