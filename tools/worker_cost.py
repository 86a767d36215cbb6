"""Where a search worker's time goes per variant, on the GPU it runs on: the variants a search
measured (its records), built again from the cache and run through the worker's own job (load,
check against float64, probe, timing), each phase timed on the host, the GPU's share from the
timings themselves, and the host's hottest functions (cProfile).

    python tools/worker_cost.py RECORDS --family F [--count 40] [--profile 25]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", help="a search's measurements (studies/<study>.jsonl)")
    ap.add_argument("--family", required=True)
    ap.add_argument("--count", type=int, default=40, help="variants to run")
    ap.add_argument("--profile", type=int, default=25, help="functions to list from cProfile (0: none)")
    args = ap.parse_args()

    import cProfile
    import json
    import pstats
    from collections import defaultdict

    from tuner import families
    from tuner.build import compile as build
    from tuner.measure import timing
    from tuner.measure.child import Child
    from tuner.search.evaluate import SEARCH_TIMING
    from tuner.search.pruning import PROBE_REPS

    family = families.get(args.family)
    problem = family.Problem()
    by_name = family.space_for(problem.__dict__).by_name()
    names = []
    for line in open(args.records):
        rec = json.loads(line)
        if rec.get("status") in ("ok", "pruned") and rec.get("variant") in by_name and rec["variant"] not in names:
            names.append(rec["variant"])
    names = names[:args.count]
    started = time.perf_counter()
    child = Child(0)
    focus = getattr(family, "search_focus", None)
    builds = build.build([by_name[n] for n in names], child.gpu["arch"], focus=focus(problem.__dict__) if focus else None)
    print(f"{len(builds)} variants built (from the cache) in {time.perf_counter() - started:.1f} s", flush=True)
    started = time.perf_counter()
    child.warm({"family": args.family, "problem": problem.__dict__})
    print(f"warm-up: {time.perf_counter() - started:.2f} s", flush=True)

    spent: dict[str, float] = defaultdict(float)
    evaluation = child.family(args.family)
    for what in ("load", "check", "calls"):
        def timed(*a, _f=getattr(evaluation, what), _w=what, **k):
            t = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                spent[_w] += time.perf_counter() - t
        setattr(evaluation, what, timed)
    ready, take, gpu_us = timing.Repetitions.__init__, timing.Repetitions.take, [0.0]

    def timed_ready(self, *a, **k):  # warm-up and estimate
        t = time.perf_counter()
        ready(self, *a, **k)
        spent["timing: warm-up"] += time.perf_counter() - t

    def timed_take(self, reps, graph=False):  # capture and repetitions
        t, before = time.perf_counter(), len(self.samples)
        out = take(self, reps, graph)
        spent["timing: repetitions"] += time.perf_counter() - t
        gpu_us[0] += sum(self.samples[before:]) + (len(self.samples) - before) * self.flush.us
        return out
    timing.Repetitions.__init__, timing.Repetitions.take = timed_ready, timed_take
    jobs = [{"kind": "evaluate", "family": args.family, "so": str(b.so), "entry": b.entry, "name": b.variant.name,
             "problem": problem.__dict__, "objective": "fwd+bwd", "timing": SEARCH_TIMING, "probe": PROBE_REPS}
            for b in builds if b.ok]
    child.run(jobs[0], lambda _: True)  # first-use costs apart
    spent.clear()
    gpu_us[0] = 0.0
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    statuses: dict[str, int] = defaultdict(int)
    for job in jobs[1:]:
        statuses[child.run(job, lambda _: True).get("status", "?")] += 1
    profile.disable()
    wall = time.perf_counter() - started
    n = max(len(jobs) - 1, 1)
    print(f"{args.family}: {n} variants in {wall:.2f} s, {1000 * wall / n:.1f} ms a variant ({dict(statuses)}); "
          + ", ".join(f"{k} {1000 * v / n:.1f} ms" for k, v in spent.items())
          + f"; timed GPU work (repetitions and flushes) {gpu_us[0] / 1000 / n:.1f} ms a variant", flush=True)
    if args.profile:
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(args.profile)
        stats.sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    main()
