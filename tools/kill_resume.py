"""Kill `tuner search` with SIGKILL at random moments, restart it, and count what was lost.

    python tools/kill_resume.py --kills 5 --study killtest -- --gpu H100 --trials 120 --sampler random

Everything after `--` goes to `tuner search`. After each kill the storage is opened
and read (it must be readable), and every finished trial is remembered; at the end
the search runs to completion and each remembered trial must still be there with
the same value. Prints the figures: kills, trials finished before each kill, lost.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import time


def finished(storage_url: str, name: str) -> dict[int, tuple[str, float | None]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        st = optuna.load_study(study_name=name, storage=storage_url)
    except KeyError:
        return {}
    return {t.number: (t.state.name, t.value) for t in st.get_trials()
            if t.state.name in ("COMPLETE", "FAIL") and t.user_attrs.get("reason") != "interrupted"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--study", default="killtest")
    ap.add_argument("--min-s", type=float, default=3.0, help="earliest kill after a start")
    ap.add_argument("--max-s", type=float, default=20.0, help="latest kill after a start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("search", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    extra = args.search[1:] if args.search[:1] == ["--"] else args.search

    from tuner.store import study as studies

    url = studies.storage_url(None)
    cmd = [sys.executable, "-m", "tuner", "search", "--study", args.study, "--quiet", *extra]
    rng = random.Random(args.seed)
    kept: dict[int, tuple[str, float | None]] = {}
    landed = 0
    for k in range(args.kills):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait = rng.uniform(args.min_s, args.max_s)
        time.sleep(wait)
        if proc.poll() is not None:
            print(f"kill {k + 1}: the search had already finished after {wait:.1f} s")
            continue
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        landed += 1
        now = finished(url, args.study)  # raises if the storage were unreadable
        for number, outcome in now.items():
            kept.setdefault(number, outcome)
        print(f"kill {k + 1} after {wait:.1f} s: storage readable, {len(now)} trials finished so far", flush=True)
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr[-3000:])
        return 1
    final = finished(url, args.study)
    lost = [n for n, outcome in kept.items() if final.get(n) != outcome]
    print(f"resumed to completion in {time.monotonic() - started:.1f} s: {len(final)} trials finished; "
          f"kills {landed}, finished trials seen before the kills {len(kept)}, lost {len(lost)}")
    return 0 if not lost else 2


if __name__ == "__main__":
    sys.exit(main())
