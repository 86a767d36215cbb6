"""GIoU loss implementations side by side, in one run on one GPU (`tuner bench`).

Every implementation computes the same thing, 1 - GIoU averaged over the valid
boxes (torchvision's eps): the article's own loss is the mean GIoU and does its
arithmetic on uint8 targets, which overflows, so its loop, concatenation and
padded forms are written here with float32 math on upcast targets. Each is
checked against the float64 reference (forward and gradient) before it is timed.

Two times per call: wall time of back-to-back calls (what a training step pays,
launch overheads included) and GPU kernel time (the profiler's sum of the
kernels one call launches). Anchors from the same run: one kernel launch through
the dispatcher, `x.sum().backward()` on a [B, S, 4] leaf (autograd's own cost),
and `F.mse_loss` on two [B, S, 4] float32 tensors (a native C++ loss with C++
autograd: what a call of an op costs when no Python runs on its path). The tuned
op is also timed with its other two ways of reporting bad input (validate="sync"
and "deferred"), and inside `torch.compile(mode="reduce-overhead")` (CUDA graphs).
"""

from __future__ import annotations

import csv
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from tuner import runtime
from tuner.families import giou

EPS = 1e-7


def giou_1m(p, t):
    """1 - GIoU of matching boxes, float32 math."""
    return giou.giou_loss_elementwise(p.float(), t.float(), EPS)


def loop_loss(pred, targets_list):
    """The article's per-sample loop (its loss_fn), as 1 - GIoU."""
    total, count = 0.0, 0
    for i, targets in enumerate(targets_list):
        n = targets.shape[0]
        if n > 0:
            total = total + giou_1m(pred[i, :n], targets).sum()
            count += n
    return total / max(count, 1)


def concat_loss(pred, targets_list, mask):
    """The article's concatenation: gather the valid predictions, one call on the flat boxes."""
    return giou_1m(pred[mask], torch.cat(targets_list)).mean()


def padded_loss(pred, target, num_boxes):
    """The article's padded form: every slot, masked, averaged over the valid ones."""
    mask = torch.arange(pred.shape[1], device=pred.device)[None, :] < num_boxes[:, None]
    loss = giou_1m(pred, target)
    return torch.where(mask, loss, 0).sum() / mask.sum().clamp(min=1)


def torchvision_loss(pred, target, num_boxes):
    from torchvision.ops import generalized_box_iou_loss

    mask = torch.arange(pred.shape[1], device=pred.device)[None, :] < num_boxes[:, None]
    loss = generalized_box_iou_loss(pred.float(), target.float(), reduction="none", eps=EPS)
    return torch.where(mask, loss, 0).sum() / mask.sum().clamp(min=1)


class SimpleKernel:
    """The article's single CUDA kernel: one thread per slot, fp32 math, the sums done apart."""

    def __init__(self, pred_dtype: str, target_dtype: str):
        from tuner import build, gpus
        from tuner.families.giou.kernel import GiouKernel

        v = giou.space(pred_dtype, target_dtype).variant(
            boxes_per_thread=1, padding="branch", validation="none", block_size=256, loads="scalar",
            reduction="atomic", backward="recompute")
        (b,) = build.build([v], gpus.attached().arch)
        self.kernel = GiouKernel(b.so, v.name)

    def __call__(self, pred, target, num_boxes):
        k = self

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, p):
                loss, _, _ = k.kernel.forward(p, target, num_boxes, "none", check=False)
                ctx.save_for_backward(p)
                return loss

            @staticmethod
            def backward(ctx, g):
                (p,) = ctx.saved_tensors
                dummy = torch.empty((), device=p.device)
                return k.kernel.backward(g.contiguous(), p, target, num_boxes, dummy, dummy, "none")

        per_box = Fn.apply(pred)
        return per_box.sum() / num_boxes.clamp(0, pred.shape[1]).sum().clamp(min=1)


# ------------------------------------------------------------------- timing

def wall_us(timed: dict[str, tuple[Callable[[], object], str]], budget_s: float = 0.25,
            rounds: int = 7) -> dict[str, float]:
    """Per name, the median over rounds of back-to-back calls (host clock, synchronised per
    round). The rounds of all names are interleaved, so that the host's and the GPU's drift
    during a run falls on every row alike and the ratios between rows hold. `timed` maps a
    name to (call, validate mode of the tuned op while it runs)."""
    plan = {}
    for name, (fn, mode) in timed.items():
        runtime.set_validate(mode)
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        one = max(time.perf_counter() - t0, 1e-6)
        # calls per round, and rounds: the per-sample loop takes a second or more a call
        plan[name] = (max(1, min(200, int(budget_s / rounds / one))), rounds if one < 0.05 else 2)
    times: dict[str, list[float]] = {name: [] for name in timed}
    for r in range(rounds):
        for name, (fn, mode) in timed.items():
            calls, wanted = plan[name]
            if r >= wanted:
                continue
            runtime.set_validate(mode)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    runtime.set_validate("async")
    return {name: statistics.median(v) for name, v in times.items()}


def _no_grad(fn: Callable[[], object]) -> Callable[[], object]:
    def call():
        with torch.no_grad():
            return fn()
    return call


def kernel_us(fn: Callable[[], object], calls: int = 10) -> float:
    """GPU time of one call: the profiler's sum of its kernels' durations, averaged."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    if time.perf_counter() - t0 > 0.01:  # the per-sample loop: thousands of kernels a call
        calls = 2
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0
                and e.key and not e.key.startswith("ProfilerStep"))
    return total / calls


# -------------------------------------------------------------------- suite

def implementations(op, pred_dtype: str, target_dtype: str) -> dict[str, Callable]:
    """name -> f(pred, target, num_boxes, targets_list, mask) -> loss."""
    compiled = torch.compile(padded_loss)
    simple = SimpleKernel(pred_dtype, target_dtype)
    return {
        "tuned op": lambda p, t, n, tl, m: op(p, t, n),
        "article loop": lambda p, t, n, tl, m: loop_loss(p, tl),
        "article concat": lambda p, t, n, tl, m: concat_loss(p, tl, m),
        "padded eager": lambda p, t, n, tl, m: padded_loss(p, t, n),
        "torch.compile padded": lambda p, t, n, tl, m: compiled(p, t, n),
        "torchvision + mask": lambda p, t, n, tl, m: torchvision_loss(p, t, n),
        "simple CUDA kernel": lambda p, t, n, tl, m: simple(p, t, n),
    }


def reduce_overhead(op) -> Callable:
    """The tuned op inside torch.compile(mode="reduce-overhead"): its calls replay CUDA graphs.
    Made per shape, so that no recompilation limit turns it back into eager calls."""
    compiled = torch.compile(lambda p, t, n: op(p, t, n), mode="reduce-overhead", dynamic=False)
    return lambda p, t, n, tl, m: compiled(p, t, n)


# Rows timed with the tuned op switched to another way of reporting bad input.
VALIDATE_ROWS = {"tuned op, validate=sync": "sync", "tuned op, validate=deferred": "deferred"}


LOOP_MAX_BATCH = 1024  # the per-sample loop takes seconds a call beyond this; left out there


def run(op, batches=(64, 256, 1024, 4096), dtypes=(("bfloat16", "uint8"), ("float32", "float32")),
        slots: int = 256, out: Path | None = None) -> list[dict]:
    rows = []
    one = torch.zeros(1, device="cuda")
    for pred_dtype, target_dtype in dtypes:
        impls = implementations(op, pred_dtype, target_dtype)
        for B in batches:
            pred, target, counts = giou.make_inputs(B, slots, pred_dtype, target_dtype, "article", device="cuda",
                                                    seed=B)
            mask = torch.arange(slots, device="cuda")[None, :] < counts[:, None]
            targets_list = [target[i, : int(c)] for i, c in enumerate(counts.tolist())]
            want, want_grad = giou.reference_with_grad(pred, target, counts, "mean")
            leaf_floor = torch.randn(B, slots, 4, device="cuda", requires_grad=True)
            x, y = torch.rand(B, slots, 4, device="cuda"), torch.rand(B, slots, 4, device="cuda")
            leaf_x = x.clone().requires_grad_(True)

            def mse_fwd_bwd():
                leaf_x.grad = None
                F.mse_loss(leaf_x, y).backward()

            floors = {
                "floor: one kernel launch": (lambda: one.fill_(1.0), None),
                "floor: x.sum().backward()": (None, lambda: leaf_floor.sum().backward()),
                "anchor: F.mse_loss (native op)": (lambda: F.mse_loss(x, y), mse_fwd_bwd),
            }
            tuned = impls["tuned op"]
            cases = {**impls, **{name: tuned for name in VALIDATE_ROWS},
                     "tuned op, torch.compile reduce-overhead": reduce_overhead(op)}
            for name, fn in cases.items():
                if name == "article loop" and B > LOOP_MAX_BATCH:
                    continue
                leaf = pred.clone().requires_grad_(True)
                loss = fn(leaf, target, counts, targets_list, mask)
                loss.backward()
                ok_l = giou.check("loss", loss, want, 1e-4)[0]
                ok_g = giou.check("grad", leaf.grad, want_grad, giou.GRAD_TOL[pred_dtype],
                                  getattr(torch, pred_dtype))[0]
                if not (ok_l and ok_g):
                    raise AssertionError(f"{name} B={B} {pred_dtype}/{target_dtype} disagrees with the reference")

                def fwd(fn=fn):
                    return fn(pred, target, counts, targets_list, mask)

                def fwd_bwd(fn=fn, leaf=leaf):
                    leaf.grad = None
                    fn(leaf, target, counts, targets_list, mask).backward()

                floors[name] = (fwd, fwd_bwd)
            fwd_wall = wall_us({name: (_no_grad(f), VALIDATE_ROWS.get(name, "async"))
                                for name, (f, _) in floors.items() if f is not None})
            fwd_bwd_wall = wall_us({name: (fb, VALIDATE_ROWS.get(name, "async"))
                                    for name, (_, fb) in floors.items() if fb is not None})
            for name, (f, fb) in floors.items():
                row = {"impl": name, "pred": pred_dtype, "target": target_dtype, "B": B, "S": slots}
                runtime.set_validate(VALIDATE_ROWS.get(name, "async"))
                if f is not None:
                    row["fwd_wall_us"] = fwd_wall[name]
                    row["fwd_kernel_us"] = kernel_us(_no_grad(f))
                if fb is not None:
                    row["fwd_bwd_wall_us"] = fwd_bwd_wall[name]
                    row["fwd_bwd_kernel_us"] = kernel_us(fb)
                runtime.set_validate("async")
                rows.append(row)
                print(_fmt(row), flush=True)
    if out is not None:
        write(rows, out)
    return rows


def _fmt(row: dict) -> str:
    vals = " ".join(f"{k}={row[k]:.1f}" for k in ("fwd_wall_us", "fwd_kernel_us", "fwd_bwd_wall_us",
                                                  "fwd_bwd_kernel_us") if k in row)
    return f"{row['pred']:>8}/{row['target']:<7} B={row['B']:<5} {row['impl']:<26} {vals}"


def write(rows: list[dict], out: Path) -> None:
    """CSV, a markdown table with ratios to the tuned op and to the floors, and a PNG plot."""
    out.mkdir(parents=True, exist_ok=True)
    keys = ["impl", "pred", "target", "B", "S", "fwd_wall_us", "fwd_kernel_us", "fwd_bwd_wall_us",
            "fwd_bwd_kernel_us"]
    with open(out / "bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    (out / "bench.md").write_text(summary(rows) + markdown(rows))
    plot(rows, out / "bench.png")


def read(path: Path) -> list[dict]:
    """Rows of a bench.csv, numbers as numbers (to rewrite its report)."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = {k: v for k, v in r.items() if v != ""}
            row.update(B=int(row["B"]), S=int(row["S"]))
            row.update({k: float(v) for k, v in row.items() if k.endswith("_us")})
            rows.append(row)
    return rows


def summary(rows: list[dict]) -> str:
    """Per dtype pair, wall µs per call (GPU kernel µs) of every row across batch sizes:
    forward+backward, then forward. Floors and anchors last."""
    lines = []
    for pred, target in dict.fromkeys((r["pred"], r["target"]) for r in rows):
        part = [r for r in rows if (r["pred"], r["target"]) == (pred, target)]
        batches = sorted({r["B"] for r in part})
        impls = list(dict.fromkeys(r["impl"] for r in part))
        impls.sort(key=lambda name: name.startswith(("floor:", "anchor:")))
        at = {(r["impl"], r["B"]): r for r in part}
        for what, key in (("forward+backward", "fwd_bwd"), ("forward", "fwd")):
            shown = [i for i in impls if any(f"{key}_wall_us" in at.get((i, B), {}) for B in batches)]
            lines.append(f"\n**pred {pred}, target {target}: {what} wall µs per call (GPU kernel µs)**\n")
            lines.append("| implementation | " + " | ".join(f"B={B}" for B in batches) + " |")
            lines.append("|---|" + "---:|" * len(batches))
            for impl in shown:
                cells = []
                for B in batches:
                    r = at.get((impl, B), {})
                    wall, kernel = r.get(f"{key}_wall_us"), r.get(f"{key}_kernel_us")
                    cells.append("not run" if wall is None else f"{wall:,.1f} ({kernel:,.1f})")
                lines.append(f"| {impl} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict]) -> str:
    lines = []
    groups = sorted({(r["pred"], r["target"], r["B"]) for r in rows}, key=lambda g: (g[0], g[1], g[2]))
    for pred, target, B in groups:
        part = [r for r in rows if (r["pred"], r["target"], r["B"]) == (pred, target, B)]
        tuned = next((r for r in part if r["impl"] == "tuned op"), {})
        launch = next((r for r in part if r["impl"] == "floor: one kernel launch"), {})
        sumb = next((r for r in part if r["impl"] == "floor: x.sum().backward()"), {})
        mse = next((r for r in part if r["impl"].startswith("anchor: F.mse_loss")), {})
        lines.append(f"\n### pred {pred}, target {target}, B={B}, S={part[0]['S']}\n")
        lines.append("| implementation | fwd wall µs | fwd kernel µs | fwd+bwd wall µs | fwd+bwd kernel µs "
                     "| fwd wall / tuned | fwd+bwd wall / tuned | fwd wall / F.mse_loss | fwd+bwd wall / F.mse_loss "
                     "| fwd wall / launch floor | fwd+bwd wall / sum().backward() floor |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in part:
            def v(key):
                return f"{r[key]:.1f}" if key in r else "-"

            def ratio(key, base):
                return f"{r[key] / base[key]:.2f}x" if key in r and key in base and base[key] else "-"

            lines.append(f"| {r['impl']} | {v('fwd_wall_us')} | {v('fwd_kernel_us')} | {v('fwd_bwd_wall_us')} | "
                         f"{v('fwd_bwd_kernel_us')} | {ratio('fwd_wall_us', tuned)} | "
                         f"{ratio('fwd_bwd_wall_us', tuned)} | {ratio('fwd_wall_us', mse)} | "
                         f"{ratio('fwd_bwd_wall_us', mse)} | {ratio('fwd_wall_us', launch)} | "
                         f"{ratio('fwd_bwd_wall_us', sumb)} |")
        impls = [r for r in part if not r["impl"].startswith(("floor:", "anchor:"))]
        fastest = {k: min((r for r in impls if k in r), key=lambda r: r[k], default={}).get("impl", "-")
                   for k in ("fwd_wall_us", "fwd_bwd_wall_us")}
        lines.append(f"\nFastest in wall time (floors and anchors aside): forward **{fastest['fwd_wall_us']}**, "
                     f"forward+backward **{fastest['fwd_bwd_wall_us']}**.")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted({(r["pred"], r["target"]) for r in rows})
    fig, axes = plt.subplots(1, len(pairs), figsize=(5 * len(pairs), 4.5), squeeze=False)
    for ax, (pred, target) in zip(axes[0], pairs):
        part = [r for r in rows if (r["pred"], r["target"]) == (pred, target) and "fwd_bwd_wall_us" in r]
        for impl in dict.fromkeys(r["impl"] for r in part):
            pts = sorted((r["B"], r["fwd_bwd_wall_us"]) for r in part if r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                    linewidth=3 if impl == "tuned op" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch B (S=256, article's boxes)")
        ax.set_ylabel("forward+backward wall time per call (µs)")
        ax.set_title(f"pred {pred}, target {target}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
