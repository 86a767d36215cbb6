"""The tuned RMSNorm against what users run (`tuner bench --family rms_norm`): torch's
F.rms_norm (eager), torch.compile of it, and Liger's Triton kernel (`pip install
'tuner[bench]'`), beside the bandwidth floor: the bytes a call must move once, at 3.0 TB/s.
Every row is checked against the float64 reference first; GPU times come from CUDA-graph
replays (no host overhead), wall times from back-to-back calls (tuner.report.bench). With `--problems
FILE` (tuner.capture's shapes), the op against F.rms_norm alone at each captured shape."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

import tuner
from tuner import opspec
from tuner.measure.accuracy import check
from tuner.report.bench import HBM_TBS, _fmt, side_by_side, write, write_against
from tuner.families import rms_norm
from tuner.measure.declared import TOLERANCE as TOL

EPS = rms_norm.DEFAULT_EPS
TUNED = "tuned op"
TORCH = "anchor: torch F.rms_norm"


def _torch(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def implementations(op) -> dict:
    impls = {TUNED: lambda x, w: op(x, w, EPS), TORCH: _torch, "anchor: torch.compile": torch.compile(_torch)}
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        impls["anchor: Liger"] = lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)
    except ImportError:
        print("Liger is not installed (pip install 'tuner[bench]'): its rows are left out", flush=True)
    return impls


def _load(directory: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuner.load(directory)


def _inputs(n: int, width: int, x: str, weight: str):
    """x and weight (requiring grad), an output gradient, and a check of a row's y and gradients
    against the float64 reference (tolerance of x's dtype, rounding to each output's dtype allowed)."""
    xs, w = (t.requires_grad_() for t in rms_norm.make_inputs(n, width, x, weight, seed=0))
    g = torch.randn_like(xs)
    answers = (rms_norm.reference(xs.detach(), w.detach()),
               *opspec.reference_gradients(rms_norm.OP_DECLARATION, rms_norm.reference, (xs.detach(), w.detach()), g))

    def agree(name, y, grads):
        for what, got, want, dtype in zip(("y", "grad_x", "grad_weight"), (y, *grads), answers, (x, x, weight)):
            ok, _, message = check(what, got, want, TOL[x], getattr(torch, dtype))
            if not ok:
                raise AssertionError(f"{name} disagrees with the float64 reference at {n}x{width}: {message}")

    return xs, w, g, agree


def run(directory: Path, shapes, dtype: str = "bfloat16", out: Path | None = None) -> list[dict]:
    op = _load(directory)
    impls, rows = implementations(op), []
    for n, width in shapes:
        x, w, g, agree = _inputs(n, width, dtype, dtype)
        once = n * width * x.element_size() / (HBM_TBS * 1e12) * 1e6  # x read, y written; x, dy read, dx written
        floor = {"impl": f"floor: HBM at {HBM_TBS} TB/s", "fwd_kernel_us": 2 * once, "fwd_bwd_kernel_us": 5 * once}
        part = side_by_side({"dtype": dtype, "rows": n, "width": width}, impls, (x, w), g, floor, agree)
        for r in part:
            print(_fmt(r) + "".join(f" {k[:-10]}/floor={r[k] / floor[k]:.2f}x" for k in ("fwd_kernel_us",
                  "fwd_bwd_kernel_us") if r is not part[0]), flush=True)
        rows += part
        del x, w, g, agree
        torch.cuda.empty_cache()
    if out is not None:
        write(rows, Path(out), size="rows")
    return rows


def run_problems(directory: Path, problems: list[dict], out: Path) -> list[dict]:
    """The tuned op against F.rms_norm alone at each captured problem (tuner.deploy.captured.read's
    entries), at its exact shape and dtypes: what swapping the op into that training run changes.
    Writes bench.csv and bench.md (the ratios, and how many cells are slower than torch)."""
    op = _load(directory)
    impls = {TUNED: lambda x, w: op(x, w, EPS), TORCH: _torch}
    rows = []
    for captured in problems:
        p = captured["problem"]
        x, w, g, agree = _inputs(p["rows"], p["width"], p["x"], p["weight"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # F.rms_norm of mixed dtypes warns that it is not fused
            part = side_by_side({k: p[k] for k in ("x", "weight", "rows", "width")}, impls, (x, w), g, check=agree)
        for r in part:
            print(_fmt(r), flush=True)
        rows += part
        del x, w, g, agree
        torch.cuda.empty_cache()
    write_against(rows, Path(out), TORCH, TUNED)
    return rows
