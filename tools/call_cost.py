"""What a call of the tuned op costs the host beside torch's own call, at small shapes where the host
bounds a call.

For each family's export (`FAMILY=DIR`), at a few small problems (and any given with --problem), each
way of calling is timed as back-to-back calls (the fastest of several rounds, all ways interleaved in
each round: host noise only adds), forward without gradients and forward+backward
(`torch.autograd.grad`), in µs a call:

- `F`: torch's own function as a user calls it (F.rms_norm, F.cross_entropy, F.embedding_bag, F.linear
  then F.cross_entropy);
- `torch op`: the family's baseline, torch's op with what the op's contract adds (cross-entropy's
  float32 loss);
- `torch path`: the loaded op's own path to torch's op, whatever its table says
  (`tuner.runtime.torch_path`: from C++, the declaration's guards where it has them, then torch's
  op), what a call costs where torch's op serves it; "-" where the family has no baseline;
- `packet`: what `tuner.load` returns (`torch.ops.tuner.<op>`; since 2026-12-02 its calls go to
  the binding's entry, `tuner.entries.loaded`);
- `entry`: the binding's own Python function (`tuner.runtime.entry`);
- `TF`: `tuner.functional`'s function with torch's signature (what `tuner.patch` calls).

Every way is checked against the float64 reference first. "served" says who ran the op's call: a
variant (its kernels ran) or torch's op. One markdown table on stdout and in OUT/call_cost.md.
`--kernels` adds a second table: each way's GPU time a call (the profiler's kernels over 20 calls,
as `tuner bench` sums them) and its host time a call (20 calls issued without waiting for the GPU,
which they cannot fill), to tell a call the host bounds from one the GPU does.

    python tools/call_cost.py OUT giou=DIR embedding_bag=DIR ... [--problem FAMILY:key=value,...] [--no-baseline]
        [--rounds N] [--round-ms MS] [--kernels]

`--no-baseline` loads the exports with `baseline=False`: the nearest variant serves every call of a
tuned dtype pair, to see what a variant's call costs where torch's op would serve.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

# Small problems: each family's default problem with these fields replaced.
SMALL = {
    "giou": ({"batch": 8, "slots": 16}, {"batch": 64, "slots": 32}),
    "embedding_bag": ({"rows": 1000, "dim": 32, "bags": 64, "bag_size": 20},
                      {"rows": 1_000_000, "dim": 32, "bags": 8192, "bag_size": 20}),
    "rms_norm": ({"rows": 1, "width": 4096}, {"rows": 64, "width": 2048}, {"rows": 512, "width": 4096},
                 {"rows": 64, "width": 2048, "x": "bfloat16", "weight": "float32"},
                 {"rows": 4096, "width": 2048, "x": "float16", "weight": "float32"}),
    "cross_entropy": ({"rows": 1, "vocab": 32000}, {"rows": 64, "vocab": 32000}, {"rows": 512, "vocab": 32000},
                      {"rows": 1, "vocab": 128256}),
    "linear_cross_entropy": ({"tokens": 1, "width": 2048, "vocab": 32000},
                             {"tokens": 64, "width": 2048, "vocab": 32000}),
}
WAYS = ("F", "torch op", "torch path", "packet", "entry", "TF")


def user_calls(family: str) -> dict:
    """torch's function and tuner.functional's, each as a function of the op's inputs."""
    import torch.nn.functional as F

    import tuner.functional as TF

    if family == "rms_norm":
        return {"F": lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
                "TF": lambda x, w, eps: TF.rms_norm(x, (x.shape[-1],), w, eps)}
    if family == "cross_entropy":
        return {"F": lambda lg, t, ii, ls, red, _: F.cross_entropy(lg, t, ignore_index=ii, label_smoothing=ls,
                                                                    reduction=red),
                "TF": lambda lg, t, ii, ls, red, _: TF.cross_entropy(lg, t, ignore_index=ii, label_smoothing=ls,
                                                                      reduction=red)}
    if family == "embedding_bag":
        return {"F": lambda w, i, o, mode, psw, last, pad: F.embedding_bag(
                    i, w, o, mode=mode, per_sample_weights=psw, include_last_offset=last, padding_idx=pad),
                "TF": lambda w, i, o, mode, psw, last, pad: TF.embedding_bag(
                    i, w, o, mode=mode, per_sample_weights=psw, include_last_offset=last, padding_idx=pad)}
    if family == "linear_cross_entropy":
        return {"F": lambda h, w, t, ii, ls, red: F.cross_entropy(F.linear(h, w), t, ignore_index=ii,
                                                                   label_smoothing=ls, reduction=red),
                "TF": lambda h, w, t, ii, ls, red: TF.linear_cross_entropy(h, w, t, ignore_index=ii,
                                                                            label_smoothing=ls, reduction=red)}
    return {}  # GIoU's functional form takes torchvision's boxes, not the op's padded images


def served(fn) -> str:
    """"variant" where the call ran a variant's kernels (a tuned template's `*_kernel`), else "torch"
    (with the guard in front of it: `tuner_guard_kernel`)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return "variant" if any("tuner_variant" in n or "_kernel<" in n and "at::" not in n and "tuner_guard" not in n
                            for n in names) else "torch"


def per_call_us(calls: dict, rounds: int = 7, budget_s: float = 0.02) -> dict[str, float]:
    """The fastest round's µs a call of each, rounds interleaved."""
    import torch

    counts = {}
    for name, fn in calls.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        counts[name] = max(10, min(2000, int(budget_s / max(time.perf_counter() - t0, 1e-6))))
    best = {name: float("inf") for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(counts[name]):
                fn()
            torch.cuda.synchronize()
            best[name] = min(best[name], (time.perf_counter() - t0) / counts[name] * 1e6)
    return best


def kernel_host_us(calls: dict, n: int = 20) -> tuple[dict[str, float], dict[str, float]]:
    """Each call's GPU µs (`tuner bench`'s: the profiler's kernels over `n` calls, divided by `n`)
    and host µs (`n` calls issued back to back, the clock stopped before waiting for the GPU)."""
    import torch

    from tuner.report import bench

    gpu, host = {}, {}
    for name, fn in calls.items():
        gpu[name] = bench.kernel_us(fn, n)
        best = float("inf")
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
        host[name] = best
    return gpu, host


def family_rows(family: str, directory: Path, problems: list[dict], baseline: bool = True, rounds: int = 7,
                round_s: float = 0.02, kernels: bool = False) -> list[dict]:
    import torch

    from tuner import families, runtime
    from tuner.report import declared

    fam = families.get(family)
    spec = families.part(family, "op").OP
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        packet = declared._load(directory, baseline=baseline)
    entry = getattr(runtime, "entry", lambda op: packet)(spec.op)  # a checkout before it had none
    path = getattr(runtime, "torch_path", lambda family: None)(family)  # a checkout before it had none
    ways = {"torch op": spec.torch_op, **({"torch path": path} if path else {}), "packet": packet, "entry": entry,
            **user_calls(family)}
    rows = []
    for change in problems:
        problem = {**fam.Problem().__dict__, **change}
        inputs, grad, agree = declared._inputs(family, problem)
        leaves = [t for t in inputs if getattr(t, "requires_grad", False)]
        plain = [t.detach() if hasattr(t, "detach") else t for t in inputs]
        who = served(lambda: packet(*plain))
        fwd, both = {}, {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's mixed-dtype norm warns that it is not fused
            try:
                for name, fn in ways.items():
                    if name in ("torch path", "packet", "entry", "TF"):
                        agree(name, fn(*plain), torch.autograd.grad(fn(*inputs), leaves, grad))
                    fwd[name] = (lambda fn=fn: fn(*plain))
                    both[name] = (lambda fn=fn: torch.autograd.grad(fn(*inputs), leaves, grad))
                fwd_us, both_us = per_call_us(fwd, rounds, round_s), per_call_us(both, rounds, round_s)
                split = {"fwd": kernel_host_us(fwd), "fwd+bwd": kernel_host_us(both)} if kernels else None
            except (NotImplementedError, RuntimeError, AssertionError) as exc:  # torch cannot run it, or a check failed
                print(f"{family} {change}: not measured: {str(exc).splitlines()[0]}", flush=True)
                continue
        label = " ".join(f"{k}={v}" for k, v in change.items())
        rows.append({"family": family, "problem": label, "served": who, "fwd": fwd_us, "fwd+bwd": both_us,
                     **({"split": split} if split else {})})
        print(row(rows[-1]), flush=True)
        del inputs, grad, agree, leaves, plain
        torch.cuda.empty_cache()
    return rows


def row(r: dict) -> str:
    def cells(us):
        return " / ".join(f"{us[w]:.1f}" if w in us else "-" for w in WAYS)

    def extra(us):  # the op's path beside torch's: entry over torch's op, TF over F
        parts = [f"{us['entry'] - us['torch op']:+.1f}"]
        parts.append(f"{us['TF'] - us['F']:+.1f}" if "TF" in us else "-")
        return " / ".join(parts)

    return (f"| {r['family']} | {r['problem']} | {r['served']} | {cells(r['fwd'])} | {extra(r['fwd'])} | "
            f"{cells(r['fwd+bwd'])} | {extra(r['fwd+bwd'])} |")


def table(rows: list[dict]) -> str:
    head = " / ".join(WAYS)
    return "\n".join([f"| family | problem | served | forward µs: {head} | entry-torch op / TF-F µs | "
                      f"forward+backward µs: {head} | entry-torch op / TF-F µs |",
                      "|---|---|---|---|---|---|---|", *(row(r) for r in rows)])


def split_table(rows: list[dict]) -> str:
    """GPU and host µs a call of each way (`--kernels`), forward and forward+backward."""
    head = " / ".join(WAYS)

    def cells(us):
        return " / ".join(f"{us[w]:.1f}" if w in us else "-" for w in WAYS)

    lines = [f"| family | problem | forward GPU µs: {head} | forward host µs | forward+backward GPU µs | "
             "forward+backward host µs |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "split" in r:
            (fg, fh), (bg, bh) = r["split"]["fwd"], r["split"]["fwd+bwd"]
            lines.append(f"| {r['family']} | {r['problem']} | {cells(fg)} | {cells(fh)} | {cells(bg)} | {cells(bh)} |")
    return "\n".join(lines)


def parse_problem(text: str) -> tuple[str, dict]:
    family, _, fields = text.partition(":")
    change = {}
    for field in filter(None, fields.split(",")):
        key, _, value = field.partition("=")
        change[key] = int(value) if value.lstrip("-").isdigit() else value
    return family, change


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("exports", nargs="+", help="FAMILY=DIR: an export of that family")
    ap.add_argument("--problem", action="append", default=[], help="FAMILY:key=value,...: another problem")
    ap.add_argument("--only-given", action="store_true", help="only the --problem problems")
    ap.add_argument("--no-baseline", action="store_true", help="load with baseline=False (the nearest variant serves)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds, the fastest kept (default 7)")
    ap.add_argument("--kernels", action="store_true", help="also each way's GPU and host µs a call (a second table)")
    ap.add_argument("--round-ms", type=float, default=20.0,
                    help="ms of calls a way a round (default 20; 30 rounds of 50 ms settle tenths of a µs)")
    args = ap.parse_args(argv)
    import torch

    extra: dict[str, list[dict]] = {}
    for text in args.problem:
        family, change = parse_problem(text)
        extra.setdefault(family, []).append(change)
    rows = []
    for item in args.exports:
        family, _, directory = item.partition("=")
        problems = ([] if args.only_given else list(SMALL.get(family, ()))) + extra.get(family, [])
        rows += family_rows(family, Path(directory), problems, baseline=not args.no_baseline, rounds=args.rounds,
                            round_s=args.round_ms / 1000, kernels=args.kernels)
    import tuner

    text = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}; "
            f"tuner from {Path(tuner.__file__).parent}\n\n" + table(rows)
            + (f"\n\n{split_table(rows)}" if args.kernels else ""))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "call_cost.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
