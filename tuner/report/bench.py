"""The bench harness: time implementations side by side in one run on one GPU, and report.

A family's bench (tuner/report/declared.py, from its declaration) makes the rows: its tuned op,
what users run today, and floors and anchors (rows named "floor: ..." and "anchor: ..."), each
checked against the family's reference before it is timed. Two times per call: wall time of
back-to-back calls (what a training step pays, launch overheads included) and GPU kernel
time (the profiler's sum of the kernels one call launches).
"""

from __future__ import annotations

import contextlib
import csv
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from tuner import runtime

TORCH_SERVING = "tuned op, torch's op serving"  # the op's own path to torch's op (tuner.runtime.torch_path)
HBM_TBS = 3.0  # a device-to-device copy's bandwidth measured on the H100 hosts: bandwidth floors are bytes over it

# ------------------------------------------------------------------- timing

def wall_us(timed: dict[str, tuple[Callable[[], object], str | None]], budget_s: float = 0.25,
            rounds: int = 7) -> dict[str, float]:
    """Per name, the median over rounds of back-to-back calls (host clock, synchronised per
    round). The rounds of all names are interleaved, so that the host's and the GPU's drift
    during a run falls on every row alike and the ratios between rows hold. `timed` maps a
    name to (call, how the loaded op reports bad input while it runs, or None to leave it)."""
    plan = {}
    for name, (fn, mode) in timed.items():
        with _validating(mode):
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
            with _validating(mode):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(v) for name, v in times.items()}


def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
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


def graph_us(fn: Callable[[], object], calls: int = 20, replays: int = 10, rounds: int = 5) -> float:
    """GPU time of one call with no host overhead: `calls` calls captured in a CUDA graph, the
    graph replayed back to back, timed with CUDA events; the median of `rounds`."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as capture wants
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (calls * replays))
    del graph
    return statistics.median(times)


def side_by_side(config: dict, impls: dict[str, Callable], inputs: tuple, grad, floor: dict | list | None = None,
                 check: Callable | None = None, gpu_us: Callable[[Callable[[], object]], float] = graph_us,
                 modes: dict[str, str] | None = None, timed: dict[str, tuple] | None = None,
                 inference: bool = False) -> list[dict]:
    """One configuration's rows: each implementation `fn(*inputs)`, checked first by `check(name,
    out, grads)` (grads of the inputs that require grad, for output gradient `grad`), then timed
    forward (no grad) and forward+backward: wall time of back-to-back calls, GPU time from
    CUDA-graph replays (`*_kernel_us`; `gpu_us=kernel_us` for the profiler's sum of kernels,
    where a call may not capture in a graph; `inference`: the forward under torch.no_grad, as an
    inference step calls it). `modes`: how the loaded op reports bad input while a row runs
    (tuner.runtime.set_validate; as set else). `timed`: rows of calls of their own
    (name -> (forward, forward+backward), either None), unchecked: floors and anchors that are
    not the op's computation, timed in the same turns. `floor` (a row or rows: {"impl": "floor:
    ...", "fwd_kernel_us": ..., "fwd_bwd_kernel_us": ...}) comes first."""
    leaves = [t for t in inputs if getattr(t, "requires_grad", False)]
    plain = [t.detach() if hasattr(t, "detach") else t for t in inputs]
    # where some rows name a mode, every other one runs "async": not in the mode a row before it left
    modes = {name: modes.get(name, "async") for name in [*impls, *(timed or {})]} if modes else {}
    called = no_grad if inference else (lambda f: f)

    def forward(fn):
        return called(lambda: fn(*plain))

    def both(fn):
        return lambda: torch.autograd.grad(fn(*inputs), leaves, grad)

    def fresh(grad: bool):  # each check on its own copy: an implementation may write over its inputs (Liger's does)
        copies = [t.detach().clone().requires_grad_(grad and t.requires_grad) if hasattr(t, "detach") else t
                  for t in inputs]
        return copies, [c for c, t in zip(copies, inputs) if getattr(t, "requires_grad", False)]

    for name, fn in impls.items():
        if check is not None:
            with _validating(modes.get(name)):  # the output copied before the next call: a CUDA graph's
                out = torch.utils._pytree.tree_map(  # replay writes over its last one
                    lambda t: t.clone() if isinstance(t, torch.Tensor) else t, fn(*fresh(False)[0]))
                copies, copied_leaves = fresh(True)
                check(name, out, torch.autograd.grad(fn(*copies), copied_leaves, grad))
            del out, copies, copied_leaves
    calls = {name: (forward(fn), both(fn)) for name, fn in impls.items()}
    calls |= {name: (f and called(f), fb) for name, (f, fb) in (timed or {}).items()}
    fwd = wall_us({name: (f, modes.get(name)) for name, (f, _) in calls.items() if f is not None})
    fwd_bwd = wall_us({name: (fb, modes.get(name)) for name, (_, fb) in calls.items() if fb is not None})
    floors = [floor] if isinstance(floor, dict) else list(floor or [])
    rows = [{"impl": f["impl"], **config, **{k: v for k, v in f.items() if k != "impl"}} for f in floors]
    for name, (f, fb) in calls.items():
        row = {"impl": name, **config}
        with _validating(modes.get(name)):
            if f is not None:
                row.update(fwd_wall_us=fwd[name], fwd_kernel_us=gpu_us(f))
            if fb is not None:
                row.update(fwd_bwd_wall_us=fwd_bwd[name], fwd_bwd_kernel_us=gpu_us(fb))
        rows.append(row)
    return rows


@contextlib.contextmanager
def _validating(mode: str | None):
    """The loaded op reporting bad input as `mode` says, then "async" again; None: as set."""
    if mode is None:
        yield
        return
    runtime.set_validate(mode)
    try:
        yield
    finally:
        runtime.set_validate("async")


METRICS = ("fwd_wall_us", "fwd_kernel_us", "fwd_bwd_wall_us", "fwd_bwd_kernel_us")
MEASURES = (("forward+backward", "fwd_bwd"), ("forward", "fwd"))


def _config(row: dict) -> dict:
    """What a row was measured on: every key but the implementation and the metrics."""
    return {k: v for k, v in row.items() if k != "impl" and k not in METRICS}


def _title(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


def _fmt(row: dict) -> str:
    vals = " ".join(f"{k}={row[k]:.1f}" for k in METRICS if k in row)
    return f"{_title(_config(row))} {row['impl']:<26} {vals}"


def write(rows: list[dict], out: Path, size: str) -> None:
    """CSV, a markdown report (tables across `size`, then every configuration with ratios to
    the tuned op and to the floors and anchors) and a PNG plot."""
    _write_csv(rows, out)
    (out / "bench.md").write_text(summary(rows, size) + markdown(rows))
    plot(rows, out / "bench.png", size)


def _write_csv(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    keys = ["impl"] + list(dict.fromkeys(k for r in rows for k in _config(r))) + list(METRICS)
    with open(out / "bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


# ------------------------------------------------- captured problems against torch

# A tuned time more than 2% above torch's counts as slower: closer than that, one run's spread
# decides which is ahead.
SLOWER = 1.02
CELLS = (("fwd GPU", "fwd_kernel_us"), ("fwd+bwd GPU", "fwd_bwd_kernel_us"),
         ("fwd wall", "fwd_wall_us"), ("fwd+bwd wall", "fwd_bwd_wall_us"))


def serving_against(rows: list[dict], torch_row: str) -> str:
    """The row a variant is weighed against in deciding who serves: the op's own path to torch's op
    where the rows have it (the guard's launch and copies included: what a call pays where torch's op
    serves it), else torch's op as users call it."""
    return TORCH_SERVING if any(r["impl"] == TORCH_SERVING for r in rows) else torch_row


def ratios(rows: list[dict], baseline: str, tuned: str = "tuned op") -> list[tuple[dict, dict[str, float | None]]]:
    """Per configuration (a captured problem), in the rows' order: tuned / baseline in each of
    CELLS, None where either row lacks that time."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        groups.setdefault(tuple(_config(r).items()), {})[r["impl"]] = r
    out = []
    for key, by_impl in groups.items():
        mine, theirs = by_impl.get(tuned, {}), by_impl.get(baseline, {})
        out.append((dict(key), {cell: mine[k] / theirs[k] if k in mine and theirs.get(k) else None
                                for cell, k in CELLS}))
    return out


def against(rows: list[dict], baseline: str, tuned: str = "tuned op", above: float = SLOWER) -> list[str]:
    """A line per configuration with its ratios (`*` marks a slower cell), and last `slower than
    torch at N of M`: of the M = 4 cells x configurations, N are above `above` or have no
    ratio (nothing shows that the tuned op is not slower there)."""
    lines, slower, cells = [], 0, 0
    for config, r in ratios(rows, baseline, tuned):
        shown = []
        for cell, ratio in r.items():
            worse = ratio is None or ratio > above
            slower += worse
            cells += 1
            shown.append(f"{cell} {'-' if ratio is None else f'{ratio:.2f}x'}{'*' if worse else ''}")
        lines.append(f"{_title(config)}: tuned/torch " + ", ".join(shown))
    lines.append(f"slower than torch at {slower} of {cells}")
    return lines


def write_against(rows: list[dict], out: Path, baseline: str, tuned: str = "tuned op") -> list[str]:
    """Print `against`'s lines and write them, then every configuration's table, to bench.md
    (bench.csv beside it); returns the lines."""
    lines = against(rows, baseline, tuned)
    for line in lines:
        print(line, flush=True)
    _write_csv(rows, out)
    head = (f"Per captured problem, {tuned} / {baseline} (`*`: above {SLOWER}x, slower):\n\n"
            + "".join(f"- {line}\n" for line in lines[:-1]) + f"\n**{lines[-1]}**\n")
    (out / "bench.md").write_text(head + markdown(rows))
    return lines


def read(path: Path) -> list[dict]:
    """Rows of a bench.csv, numbers as numbers (to rewrite its report)."""
    def number(v: str):
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
        return v

    with open(path, newline="") as f:
        return [{k: (float(v) if k in METRICS else number(v)) for k, v in r.items() if v != ""}
                for r in csv.DictReader(f)]


def _by_config_without(rows: list[dict], size: str) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = tuple((k, v) for k, v in _config(r).items() if k != size)
        groups.setdefault(key, []).append(r)
    return groups


def _baselines_last(names):
    return sorted(dict.fromkeys(names), key=lambda name: name.startswith(("floor:", "anchor:")))


def summary(rows: list[dict], size: str) -> str:
    """Per configuration but `size`, wall µs per call (GPU kernel µs) of every row across the
    sizes: forward+backward, then forward. Floors and anchors last."""
    lines = []
    for key, part in _by_config_without(rows, size).items():
        sizes = sorted({r[size] for r in part})
        at = {(r["impl"], r[size]): r for r in part}
        impls = _baselines_last(r["impl"] for r in part)
        for what, m in MEASURES:
            shown = [i for i in impls if any(f"{m}_wall_us" in at.get((i, n), {}) for n in sizes)]
            if not shown:
                continue
            lines.append(f"\n**{_title(dict(key))}: {what} wall µs per call (GPU kernel µs)**\n")
            lines.append("| implementation | " + " | ".join(f"{size}={n}" for n in sizes) + " |")
            lines.append("|---|" + "---:|" * len(sizes))
            for impl in shown:
                cells = []
                for n in sizes:
                    r = at.get((impl, n), {})
                    wall, kernel = r.get(f"{m}_wall_us"), r.get(f"{m}_kernel_us")
                    cells.append("not run" if wall is None else f"{wall:,.1f} ({kernel:,.1f})")
                lines.append(f"| {impl} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict]) -> str:
    """Every configuration: each row's times, and ratios of wall times to the tuned op and to
    each floor and anchor that has that time (of GPU times to a floor that has only those)."""
    lines = []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(_config(r).items()), []).append(r)
    for key, part in groups.items():
        # the family's tuned row comes first among the rows that are not floors or anchors
        tuned = next((r for r in part if not r["impl"].startswith(("floor:", "anchor:"))), {})
        bases = [r for r in part if r["impl"].startswith(("floor:", "anchor:"))]
        ratios = [(f"{what} wall / tuned", f"{m}_wall_us", tuned) for what, m in (("fwd", "fwd"), ("fwd+bwd", "fwd_bwd"))]
        for b in bases:
            label = b["impl"].split(":", 1)[1].strip()
            for what, m in (("fwd", "fwd"), ("fwd+bwd", "fwd_bwd")):
                # a floor of GPU time alone (bytes over bandwidth, a read measured by the profiler)
                # is compared in GPU time
                kind = "wall" if f"{m}_wall_us" in b else "kernel" if f"{m}_kernel_us" in b else None
                if kind:
                    ratios.append((f"{what} {kind} / {label}", f"{m}_{kind}_us", b))
        lines.append(f"\n### {_title(dict(key))}\n")
        lines.append("| implementation | fwd wall µs | fwd kernel µs | fwd+bwd wall µs | fwd+bwd kernel µs | "
                     + " | ".join(name for name, _, _ in ratios) + " |")
        lines.append("|---|" + "---:|" * (4 + len(ratios)))
        for r in part:
            def v(k):
                return f"{r[k]:.1f}" if k in r else "-"

            def ratio(k, base):
                return f"{r[k] / base[k]:.2f}x" if k in r and k in base and base[k] else "-"

            lines.append(f"| {r['impl']} | " + " | ".join(v(k) for k in METRICS) + " | "
                         + " | ".join(ratio(k, base) for _, k, base in ratios) + " |")
        impls = [r for r in part if not r["impl"].startswith(("floor:", "anchor:"))]
        fastest = {k: min((r for r in impls if k in r), key=lambda r: r[k], default={}).get("impl", "-")
                   for k in ("fwd_wall_us", "fwd_bwd_wall_us")}
        lines.append(f"\nFastest in wall time (floors and anchors aside): forward **{fastest['fwd_wall_us']}**, "
                     f"forward+backward **{fastest['fwd_bwd_wall_us']}**.")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, size: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _by_config_without(rows, size)
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4.5), squeeze=False)
    for ax, (key, part) in zip(axes[0], groups.items()):
        part = [r for r in part if "fwd_bwd_wall_us" in r] or part
        metric = "fwd_bwd_wall_us" if any("fwd_bwd_wall_us" in r for r in part) else "fwd_wall_us"
        for impl in dict.fromkeys(r["impl"] for r in part):
            pts = sorted((r[size], r[metric]) for r in part if r["impl"] == impl and metric in r)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                    linewidth=3 if impl == "tuned op" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(size)
        ax.set_ylabel(("forward+backward" if metric == "fwd_bwd_wall_us" else "forward") + " wall time per call (µs)")
        ax.set_title(_title(dict(key)), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
