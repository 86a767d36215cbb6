"""Run searchers on one shared study, SIGKILL one of them (or one of its GPU workers) in the
middle of a trial, let the rest finish, and check that nothing was lost.

    python tools/kill_shared.py --searchers 2 --kill searcher -- \
        --gpu H100 --trials 300 --sampler random --storage sqlite:////tmp/s.db --study shared
    python tools/kill_shared.py --searchers 1 --kill worker -- --gpu H200 --devices all ...

Everything after `--` goes to each `tuner search` (it must name --storage and --study); searcher i
gets --seed i. Checked at the end: every trial finished before the kill kept its value; a killed
searcher's running trials failed as interrupted and queued again (the delay is printed); with
--kill worker, no trial failed with reason crash; the study has its --trials; no variant has two
measurement records. Prints one summary line; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import signal
import subprocess
import sys
import time


def _option(args: list[str], name: str) -> str:
    if name not in args:
        sys.exit(f"kill_shared: pass {name} to tuner search")
    return args[args.index(name) + 1]


def _workers(pid: int) -> list[int]:
    """GPU worker processes of a searcher (multiprocessing spawn children, not its resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"spawn_main" in cmd:
            found.append(int(entry))
    return sorted(found)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--searchers", type=int, default=2)
    ap.add_argument("--kill", choices=("searcher", "worker"), default="searcher")
    ap.add_argument("--after", type=int, default=20, help="finished trials before the kill")
    ap.add_argument("--logs", default=".", help="folder for each searcher's output")
    ap.add_argument("--as-hosts", action="store_true",
                    help="give each searcher a host name of its own (TUNER_HOST): a death is then seen "
                         "from the heartbeats only, as across hosts")
    ap.add_argument("search", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    extra = args.search[1:] if args.search[:1] == ["--"] else args.search
    url, name, trials = _option(extra, "--storage"), _option(extra, "--study"), int(_option(extra, "--trials"))

    import optuna

    from tuner.store import records
    from tuner.store import study as studies

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.monotonic()
    procs, logs = [], []
    os.makedirs(args.logs, exist_ok=True)
    for i in range(args.searchers):
        logs.append(open(os.path.join(args.logs, f"searcher{i}.log"), "w"))
        env = {**os.environ, **({"TUNER_HOST": f"host{i}"} if args.as_hosts else {})}
        procs.append(subprocess.Popen([sys.executable, "-m", "tuner", "search", *extra, "--seed", str(i), "--quiet"],
                                      stdout=logs[-1], stderr=subprocess.STDOUT, env=env))
        time.sleep(2.0)  # the first creates the study
    target, running, before, killed_at = procs[0], set(), {}, None
    while killed_at is None:
        time.sleep(0.5)
        if any(p.poll() is not None for p in procs):
            print("kill_shared: a searcher ended before the kill; see", args.logs)
            return 1
        try:
            st = optuna.load_study(study_name=name, storage=studies.storage(url))
        except KeyError:
            continue
        trials_now = st.get_trials(deepcopy=False)
        mine = {t.number for t in trials_now if t.state.name == "RUNNING"
                and f"/{target.pid}/" in t.user_attrs.get("owner", "")}
        if sum(t.state.name == "COMPLETE" for t in trials_now) < args.after or not mine:
            continue
        victim = target.pid if args.kill == "searcher" else (_workers(target.pid) or [None])[0]
        if victim is None:
            continue
        os.kill(victim, signal.SIGKILL)
        killed_at = datetime.datetime.now()
        after = optuna.load_study(study_name=name, storage=studies.storage(url)).get_trials(deepcopy=False)
        before = {t.number: t.value for t in after if t.state.name == "COMPLETE"}
        # what the searcher still held when it died (a trial of `mine` may have finished meanwhile)
        running = {t.number for t in after if t.number in mine and t.state.name == "RUNNING"} \
            if args.kill == "searcher" else set()
    codes = [p.wait() for p in procs]
    wall = time.monotonic() - started
    ok = all(c == 0 for c in (codes[1:] if args.kill == "searcher" else codes))

    final = {t.number: t for t in optuna.load_study(study_name=name, storage=studies.storage(url)).get_trials()}
    lost = [n for n, v in before.items() if final[n].state.name != "COMPLETE" or final[n].value != v]
    retried = studies.retried(optuna.load_study(study_name=name, storage=studies.storage(url)))
    stale = [(final[n].datetime_complete - killed_at).total_seconds() for n in running
             if final[n].state.name == "FAIL" and studies.interrupted(final[n]) and n in retried]
    crashes = [n for n, t in final.items() if t.user_attrs.get("reason") == "crash"]
    done = studies.finished_count(optuna.load_study(study_name=name, storage=studies.storage(url)))
    measured = collections.Counter(r["variant"] for r in records.read(studies.records_path(name)) if "variant" in r)
    twice = [v for v, c in measured.items() if c > 1]
    # a worker killed between two variants is restarted without a re-run to show: that proves nothing
    reran = args.kill != "worker" or "(0 killed from outside" not in open(logs[0].name).read()
    ok = ok and not lost and len(stale) == len(running) and not crashes and done >= trials and not twice and reran
    print(f"{args.searchers} searcher(s), killed a {args.kill} after {len(before)} finished trials; "
          f"{wall:.1f} s; finished {done}/{trials}; lost {len(lost)}; "
          f"killed trials failed and re-queued {len(stale)}/{len(running)}"
          f"{f' after {max(stale):.1f} s' if stale else ''}; crash failures {len(crashes)}; "
          f"variants measured {len(measured)}, twice {len(twice)}; "
          f"{'' if reran else 'the killed worker was idle (no variant re-run); '}exit codes {codes}: "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
