"""What compiling a search's batch costs, as a search builds it (its problem's focus, its units) and
as an export builds the same variants (host code optimized, `serving=True`), in turns in one run:
wall time and the CPU time of the compilers (nvcc and what it runs), each build on an empty cache.
No GPU needed: the number that bounds a first search on a many-core host is the compilers' CPU.

    python tools/compile_cost.py [--families giou rms_norm ...] [--variants 32] [--rounds 3] [--jobs N]
                                 [--kinds search export]

Another checkout's compile, beside this one's: `PYTHONPATH=DIR python tools/compile_cost.py ...` (its
tuner is imported in place of this one's), the two in turns.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import tempfile
import time


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=["giou", "rms_norm", "embedding_bag", "cross_entropy"])
    ap.add_argument("--variants", type=int, default=32, help="variants a build (a search's first batch: 32-48)")
    ap.add_argument("--rounds", type=int, default=3, help="builds of each kind, in turns")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="nvcc processes at once (default: the cores)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--kinds", nargs="+", choices=("search", "export"), default=["search", "export"])
    args = ap.parse_args()

    os.environ["TUNER_HOME"] = tempfile.mkdtemp(prefix="compile-cost-home-")
    from tuner import families
    from tuner.build import compile as build

    print(f"{args.variants} variants a build, {args.jobs} jobs, {args.arch}; median of {args.rounds} (wall s / CPU s)")
    for name in args.families:
        fam = families.get(name)
        variants = list(fam.space())
        random.Random(0).shuffle(variants)
        variants = variants[:args.variants]
        focus = fam.search_focus(fam.Problem().__dict__) if hasattr(fam, "search_focus") else None
        kinds = [kind == "export" for kind in args.kinds]  # serving: an export's flags
        times: dict[bool, list[tuple[float, float]]] = {serving: [] for serving in kinds}
        for _ in range(args.rounds):
            for serving in kinds:
                os.environ["TUNER_CACHE"] = tempfile.mkdtemp(prefix="compile-cost-cache-")  # nothing cached
                t0, cpu0 = time.perf_counter(), _children_cpu()
                built = build.build(variants, args.arch, jobs=args.jobs, focus=focus, serving=serving)
                failed = [b for b in built if not b.ok]
                if failed:
                    raise SystemExit(f"{failed[0].variant.name}: {failed[0].error[-500:]}")
                times[serving].append((time.perf_counter() - t0, _children_cpu() - cpu0))
        medians = {s: (statistics.median(t[0] for t in got), statistics.median(t[1] for t in got))
                   for s, got in times.items()}
        line = "   ".join(f"{'export flags' if s else 'search build'} {w:6.1f} / {c:6.1f}" for s, (w, c) in medians.items())
        if len(medians) == 2:
            (sw, sc), (ew, ec) = medians[False], medians[True]
            line += f"   search / export: wall {sw / ew:.2f}x, CPU {sc / ec:.2f}x"
        print(f"{name:14s} {line}", flush=True)


if __name__ == "__main__":
    main()
