"""The tuned RMSNorm against what users run (`tuner bench --family rms_norm`): torch's
F.rms_norm (eager), torch.compile of it, and Liger's Triton kernel (`pip install
'tuner[bench]'`), beside the bandwidth floor: the bytes a call must move once, at 3.0 TB/s.
Every row is checked against the float64 reference first; GPU times come from CUDA-graph
replays (no host overhead), wall times from back-to-back calls (tuner.bench)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

import tuner
from tuner.accuracy import check
from tuner.bench import HBM_TBS, _fmt, side_by_side, write
from tuner.families import rms_norm
from tuner.families.rms_norm.evaluate import TOL

EPS = rms_norm.DEFAULT_EPS


def implementations(op) -> dict:
    impls = {"tuned op": lambda x, w: op(x, w, EPS),
             "anchor: torch F.rms_norm": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS),
             "anchor: torch.compile": torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS))}
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        impls["anchor: Liger"] = lambda x, w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "llama", False)
    except ImportError:
        print("Liger is not installed (pip install 'tuner[bench]'): its rows are left out", flush=True)
    return impls


def run(directory: Path, shapes, dtype: str = "bfloat16", out: Path | None = None) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = tuner.load(directory)
    impls, rows = implementations(op), []
    for n, width in shapes:
        x, w = (t.requires_grad_() for t in rms_norm.make_inputs(n, width, dtype, dtype, seed=0))
        g = torch.randn_like(x)
        answers = (rms_norm.reference(x.detach(), w.detach()), *rms_norm.reference_backward(x.detach(), w.detach(), g))

        def agree(name, y, grads):
            for what, got, want in zip(("y", "grad_x", "grad_weight"), (y, *grads), answers):
                ok, _, message = check(what, got, want, TOL[dtype], getattr(torch, dtype))
                if not ok:
                    raise AssertionError(f"{name} disagrees with the float64 reference at {n}x{width}: {message}")

        once = n * width * x.element_size() / (HBM_TBS * 1e12) * 1e6  # x read, y written; x, dy read, dx written
        floor = {"impl": f"floor: HBM at {HBM_TBS} TB/s", "fwd_kernel_us": 2 * once, "fwd_bwd_kernel_us": 5 * once}
        part = side_by_side({"dtype": dtype, "rows": n, "width": width}, impls, (x, w), g, floor, agree)
        for r in part:
            print(_fmt(r) + "".join(f" {k[:-10]}/floor={r[k] / floor[k]:.2f}x" for k in ("fwd_kernel_us",
                  "fwd_bwd_kernel_us") if r is not part[0]), flush=True)
        rows += part
        del x, w, g, answers
        torch.cuda.empty_cache()
    if out is not None:
        write(rows, Path(out), size="rows")
    return rows
