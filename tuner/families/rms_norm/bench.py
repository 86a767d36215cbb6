"""The tuned RMSNorm against what users run (`tuner bench --family rms_norm`): torch's
F.rms_norm (eager), torch.compile of it, and Liger's Triton kernel (`pip install
'tuner[bench]'`), with the bandwidth floor: the bytes a call must move once, at 3.0 TB/s.
Every row is checked against the float64 reference first. GPU times (`*_kernel_us`) come from
CUDA-graph replays (no host overhead); wall times from back-to-back calls."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

import tuner
from tuner.bench import _fmt, graph_us, wall_us, write
from tuner.families import rms_norm
from tuner.families.rms_norm.evaluate import relative_error, tolerance

HBM_TBS = 3.0
EPS = rms_norm.DEFAULT_EPS


def floor_us(rows: int, width: int, size: int) -> tuple[float, float]:
    """(forward, forward+backward): x read and y written; then x and dy read and dx written."""
    once = rows * width * size / (HBM_TBS * 1e12) * 1e6
    return 2 * once, 5 * once


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
    impls = implementations(op)
    rows = []
    for n, width in shapes:
        x, w = rms_norm.make_inputs(n, width, dtype, dtype, seed=0)
        x.requires_grad_(), w.requires_grad_()
        g = torch.randn_like(x)
        want = rms_norm.reference(x.detach(), w.detach())
        want_x, want_w = rms_norm.reference_backward(x.detach(), w.detach(), g)
        for name, fn in impls.items():
            gx, gw = torch.autograd.grad(fn(x, w), (x, w), g)
            with torch.no_grad():
                errors = [(relative_error(got, ref), tolerance(ref, dtype)) for got, ref in
                          ((fn(x, w), want), (gx, want_x), (gw, want_w))]
            if not all(e <= t for e, t in errors):
                raise AssertionError(f"{name} disagrees with the float64 reference at {n}x{width}: {errors}")
        del gx, gw, want, want_x, want_w

        def forward(fn):
            return lambda: fn(x.detach(), w.detach())

        def both(fn):
            return lambda: torch.autograd.grad(fn(x, w), (x, w), g)

        config = {"dtype": dtype, "rows": n, "width": width}
        fwd = wall_us({name: (forward(fn), None) for name, fn in impls.items()})
        fwd_bwd = wall_us({name: (both(fn), None) for name, fn in impls.items()})
        floor_fwd, floor_both = floor_us(n, width, x.element_size())
        floor = {"impl": f"floor: HBM at {HBM_TBS} TB/s", **config, "fwd_kernel_us": floor_fwd,
                 "fwd_bwd_kernel_us": floor_both}
        part = [floor]
        for name, fn in impls.items():
            part.append({"impl": name, **config, "fwd_wall_us": fwd[name], "fwd_kernel_us": graph_us(forward(fn)),
                         "fwd_bwd_wall_us": fwd_bwd[name], "fwd_bwd_kernel_us": graph_us(both(fn))})
        for r in part:
            print(_fmt(r) + _ratios(r, part), flush=True)
        rows += part
        del x, w, g
        torch.cuda.empty_cache()
    if out is not None:
        write(rows, Path(out), size="rows")
        (Path(out) / "bench.md").write_text(table(rows) + (Path(out) / "bench.md").read_text())
    return rows


def _ratios(row: dict, part: list[dict]) -> str:
    floor = part[0]
    return "".join(f" {k.removesuffix('_kernel_us')}/floor={row[k] / floor[k]:.2f}x"
                   for k in ("fwd_kernel_us", "fwd_bwd_kernel_us") if k in row and row is not floor)


def table(rows: list[dict]) -> str:
    """GPU µs per call (graph replays) and wall µs, with the tuned op's ratio to the floor and
    to the fastest other row of each shape."""
    lines = ["| rows x width | implementation | fwd GPU µs | fwd / floor | fwd+bwd GPU µs | fwd+bwd / floor "
             "| fwd wall µs | fwd+bwd wall µs |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        floor = next(f for f in rows if f["impl"].startswith("floor:") and f["rows"] == r["rows"]
                     and f["width"] == r["width"])

        def cell(k, d=1):
            return f"{r[k]:.{d}f}" if k in r else "-"

        lines.append(f"| {r['rows']} x {r['width']} | {r['impl']} | {cell('fwd_kernel_us')} | "
                     f"{r['fwd_kernel_us'] / floor['fwd_kernel_us']:.2f}x | {cell('fwd_bwd_kernel_us')} | "
                     f"{r['fwd_bwd_kernel_us'] / floor['fwd_bwd_kernel_us']:.2f}x | {cell('fwd_wall_us')} | "
                     f"{cell('fwd_bwd_wall_us')} |")
    return "\n".join(lines) + "\n"
