"""Every family's default search as a new user runs it, first and later, in one table.

For each family: `tuner search --gpu auto --family F --quiet` in a fresh TUNER_HOME on an empty
build cache ("first": nothing built, the torch binding included), then in another fresh TUNER_HOME
with that cache kept ("later": the same search again on this machine). Each row: the command's wall
time, the variants it evaluated and their rate from the command's start, and where the time went
(the search's own sums of compile, verify and timing, when the GPU started, its busy time, the
finalists). Run it again whenever the search, the measurement or the declared machinery changes, and
compare with the table in docs/benchmarks.md. With --checkout, each family runs in every checkout
named, in turns (`python3 -m tuner` from that folder): before and after a change in one run; the
turns' order alternates from one family to the next (this checkout first for the first family,
last for the second, ...), so that no side always pays a fresh machine's cold caches.

Python's bytecode is not the build cache: a pip install leaves it beside the sources, and the
first search of a user's machine finds it. Images that install without it (PYTHONDONTWRITEBYTECODE,
as the GPU hosts here) make tuner keep it in its cache (`tuner.paths.keep_bytecode`), which a fresh
cache would not have: so a short warm-up search of each checkout fills one bytecode folder first,
copied into every fresh cache (`--bytecode none`: not copied, every first search compiles torch's
and Optuna's sources as well, 2-3 s of its start on those hosts).

    python tools/search_speed.py OUT [--families giou rms_norm ...] [--checkout DIR ...] [--runs first later]
                                     [--bytecode kept|none]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = ("first", "later")


def parse(log: str) -> dict:
    """The numbers a search prints (tuner/cli/main.py's summary lines), by name."""
    found: dict = {}
    m = re.search(r"this run: (\d+) variants .* in ([\d.]+) s from the command's start", log)
    if m:
        found.update(variants=int(m.group(1)), since_start=float(m.group(2)))
    m = re.search(r"(\d+) trials in [\d.]+ s of search", log)
    if m:
        found["trials"] = int(m.group(1))
    m = re.search(r"time: compile ([\d.]+) s .*verify ([\d.]+) s .*timing ([\d.]+) s", log)
    if m:
        found.update(compile=float(m.group(1)), verify=float(m.group(2)), timing=float(m.group(3)))
    m = re.search(r"the GPU ([\d.]+) s after it", log)
    if m:
        found["gpu_start"] = float(m.group(1))
    m = re.search(r"GPU work ([\d.]+) s", log)
    if m:
        found["gpu_work"] = float(m.group(1))
    m = re.search(r"finalists ([\d.]+)-([\d.]+)", log)
    if m:
        found["finalists"] = float(m.group(2)) - float(m.group(1))
    m = re.search(r"^timeline \(s from the command's start\): (.*)$", log, re.M)
    if m:
        found["timeline"] = m.group(1)
    # a search of several problems (a family's DEFAULT_PROBLEMS): its totals, and each problem's compile summed
    m = re.search(r"^(\d+) trials in ([\d.]+) s from the command's start", log, re.M)
    if m and "variants" not in found:
        found.update(variants=int(m.group(1)), trials=int(m.group(1)), since_start=float(m.group(2)))
        compiles = re.findall(r"trials in [\d.]+ s, compiling ([\d.]+) s", log)
        if compiles:
            found["compile"] = sum(map(float, compiles))
    return found


def search(tuner: list[str], cwd: str | None, family: str, home: Path, cache: Path, log: Path,
           extra: tuple[str, ...] = ()) -> dict:
    env = {**os.environ, "TUNER_HOME": str(home), "TUNER_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with open(log, "w") as out:
        code = subprocess.call([*tuner, "search", "--gpu", "auto", "--family", family, "--quiet", *extra], cwd=cwd,
                               env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    return {"wall": wall, "code": code, **parse(log.read_text(errors="replace"))}


def wait_for_binding(family: str) -> None:
    """The binding's background build (a first search starts it) ends before the next run starts."""
    while subprocess.call(["pgrep", "-f", f"tuner.build.binding {family}"], stdout=subprocess.DEVNULL) == 0:
        time.sleep(0.5)


def row(label: str, run: str, r: dict) -> str:
    def f(key, fmt="{:.1f}"):
        return fmt.format(r[key]) if key in r else "-"

    rate = 60 * r["variants"] / r["wall"] if "variants" in r and r["wall"] else None
    fail = "" if r["code"] == 0 else f" (exit {r['code']})"
    return (f"| {label} | {run} | {r['wall']:.1f}{fail} | {f('variants', '{}')} | "
            f"{'-' if rate is None else f'{rate:.0f}'} | {f('compile')} | {f('verify')} | {f('timing')} | "
            f"{f('gpu_start')} | {f('gpu_work')} | {f('finalists')} |")


HEADER = ("| family | run | wall s | variants | variants/min | compile s | verify s | timing s | "
          "GPU starts at s | GPU busy s | finalists s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("out", type=Path, help="folder for each run's log and the table (table.md)")
    ap.add_argument("--families", nargs="+", help="default: every installed family")
    ap.add_argument("--checkout", nargs="+", default=[], help="run each family from these checkouts too, in turns")
    ap.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    ap.add_argument("--bytecode", choices=("kept", "none"), default="kept",
                    help="kept (default): each fresh cache starts with Python's bytecode, as a pip install leaves it")
    args = ap.parse_args()

    from tuner import families

    names = args.families or families.names()
    places = [("this", ["tuner"], None)] + [(Path(c).name, [sys.executable, "-m", "tuner"], str(Path(c).resolve()))
                                            for c in args.checkout]
    args.out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="search-speed-"))
    lines, timelines = [HEADER], ["", "Timelines (s from the command's start):", ""]
    bytecode = base / "bytecode-cache"
    if args.bytecode == "kept":  # every checkout's imports, torch's and Optuna's among them
        for label, tuner, cwd in places:
            search(tuner, cwd, names[0], base / f"home-warm-{label}", bytecode, args.out / f"warm-{label}.log",
                   ("--trials", "8"))
            wait_for_binding(names[0])
    print(HEADER, flush=True)
    for i, family in enumerate(names):
        for label, tuner, cwd in (places if i % 2 == 0 else places[::-1]):
            if cwd is not None and not (Path(cwd) / "tuner" / "families" / family).is_dir():
                print(f"{family}: not in the checkout {label}: run here alone", flush=True)
                continue  # a family newer than the checkout
            cache = base / f"cache-{label}-{family}"
            for run in args.runs:
                if run != RUNS[0]:
                    wait_for_binding(family)
                home = base / f"home-{label}-{family}-{run}"
                if run == RUNS[0] and (bytecode / "bytecode").is_dir() and not (cache / "bytecode").exists():
                    shutil.copytree(bytecode / "bytecode", cache / "bytecode", symlinks=True)
                r = search(tuner, cwd, family, home, cache, args.out / f"{label}-{family}-{run}.log")
                line = row(family if len(places) == 1 else f"{family} ({label})", run, r)
                lines.append(line)
                timelines.append(f"- {family} ({label}) {run}: {r.get('timeline', '-')}")
                print(line, flush=True)
            shutil.rmtree(cache, ignore_errors=True)
    print("\n".join(timelines))
    (args.out / "table.md").write_text("\n".join(lines + timelines) + "\n")
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
