"""Do default searches pick the same winner? N default searches and one exhaustive grid, each
in a fresh TUNER_HOME, then all their winners re-timed together in one process.

    python tools/winner_stability.py --gpu H100 [--searches 3] [--family giou] [-- extra search args]

Prints each search's wall time and variants/min (from its own summary line), then the
winners and the grid's best re-timed side by side (interleaved, `LiveEvaluator.retime`: the
close ones get an extra round), and a verdict: every winner within --within (3%) of the
fastest of them and of the grid's best. Builds are shared (one TUNER_CACHE), so only the
first search pays for its compiles; studies and measurements are not.
"""

import argparse
import os
import subprocess
import sys
import tempfile


def _search(home: str, gpu: str, family: str, extra: list[str]) -> tuple[str, str]:
    """(winner's variant name, the search's summary line) of one `tuner search` in `home`."""
    env = {**os.environ, "TUNER_HOME": home}
    cmd = [sys.executable, "-m", "tuner", "search", "--family", family, "--gpu", gpu, "--quiet", "--study", "s",
           *extra]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    summary = next(line for line in out.splitlines() if line.startswith("this run:"))
    table = out.split("re-timed, interleaved (the winner is the first):", 1)[1].splitlines()
    winner = next(line.split()[0] for line in table[2:] if line.strip())
    return winner, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--family", default="giou")
    ap.add_argument("--searches", type=int, default=3)
    ap.add_argument("--within", type=float, default=0.03)
    ap.add_argument("--keep", metavar="DIR", help="copy each run's measurement log (studies/*.jsonl) here")
    ap.add_argument("extra", nargs="*", help="more `tuner search` options (problem, objective), after --")
    args = ap.parse_args()

    from tuner import families
    from tuner.search.evaluate import LiveEvaluator

    family = families.get(args.family)
    picked: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="tuner-stability-") as root:
        for i in range(args.searches):
            winner, summary = _search(f"{root}/search-{i}", args.gpu, args.family, args.extra)
            print(f"search {i}: winner {winner}; {summary}", flush=True)
            _keep(f"{root}/search-{i}", args.keep, f"search-{i}")
            picked.setdefault(winner, []).append(f"search {i}")
        grid_home = f"{root}/grid"
        problem = _problem(family, args.extra)
        space_size = len(family.space_for(problem.__dict__))
        winner, summary = _search(grid_home, args.gpu, args.family,
                                  [*args.extra, "--sampler", "grid", "--trials", str(space_size), "--prune", "0"])
        print(f"grid: winner {winner}; {summary}", flush=True)
        _keep(grid_home, args.keep, "grid")
        picked.setdefault(winner, []).append("grid")
    space = family.space_for(problem.__dict__)
    by_name = {v.name: v for v in space}
    variants = [by_name[name] for name in picked]
    ev = LiveEvaluator(args.gpu, problem, "fwd+bwd")
    try:
        timings = ev.retime(variants, ev.prepare(variants), "fwd+bwd")
    finally:
        ev.close()
    objective = {n: t["fwd"]["median_us"] + t.get("bwd", {}).get("median_us", 0.0) for n, t in timings.items()}
    fastest = min(objective.values())
    print(f"\nre-timed together (fwd+bwd µs, one process, {args.gpu}):")
    for name in sorted(objective, key=objective.get):
        print(f"  {objective[name]:8.2f}  {objective[name] / fastest:6.3f}x  {name}  <- {', '.join(picked[name])}")
    grid_best = min(objective[n] for n, who in picked.items() if "grid" in who)
    worst = max(objective[n] for n, who in picked.items() if any(w.startswith("search") for w in who))
    ok = worst <= fastest * (1 + args.within) and worst <= grid_best * (1 + args.within)
    print(f"slowest search winner / fastest: {worst / fastest:.3f}; / grid's best: {worst / grid_best:.3f}; "
          f"{'PASS' if ok else 'FAIL'} (within {args.within:.0%})")
    return 0 if ok else 1


def _keep(home: str, folder: str | None, name: str) -> None:
    import shutil
    from pathlib import Path

    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for log in Path(home, "studies").glob("*.jsonl"):
            shutil.copy(log, Path(folder) / f"{name}.jsonl")


def _problem(family, extra: list[str]):
    """The problem the searches tuned, parsed from the extra options as `tuner search` does."""
    from tuner.cli import main as cli
    from tuner.cli import target as cli_target

    p = cli.parser(family.FAMILY)
    args = p.parse_args(["search", "--family", family.FAMILY, "--gpu", "x", *extra])
    return cli_target.problem(args)


if __name__ == "__main__":
    sys.exit(main())
