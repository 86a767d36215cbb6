"""Several searchers on one study in a real PostgreSQL server, in Optuna's relational schema and
as a journal table: heartbeats, a killed searcher."""

import collections
import datetime
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

import simdata
from tuner.search import heartbeat
from tuner.store import records
from tuner.store import study

TRIALS = 200


def _searcher(sim, url, home, seed):
    args = ["search", "--gpu", "H100", "--simulate", str(sim), "--trials", str(TRIALS), "--sampler", "random",
            "--storage", url, "--study", "shared", "--simulate-delay", "0.4", "--seed", str(seed), "--quiet"]
    # Each as if on a host of its own: no searcher can see another's process, only its heartbeats.
    env = {**os.environ, "TUNER_HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path), "TUNER_HOST": f"host{seed}"}
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("scheme", ["postgresql+psycopg", "journal+postgresql"])
def test_three_searchers_one_killed_lose_nothing_and_finish_the_study(scheme, postgres_url, tuner_home, tmp_path):
    postgres_url = scheme + postgres_url[postgres_url.index("://"):]
    sim = simdata.write(tmp_path / "sim.jsonl")
    procs = [_searcher(sim, postgres_url, tuner_home, seed) for seed in (1, 2, 3)]
    st = None
    storage = None
    deadline = time.monotonic() + 300  # three searchers and PostgreSQL on 2 busy cores
    victim = None
    while time.monotonic() < deadline:  # kill a searcher in the middle of a trial
        time.sleep(0.5)
        ended = [(i, p.returncode, p.stderr.read()[-3000:]) for i, p in enumerate(procs) if p.poll() is not None]
        assert len(ended) < len(procs), f"every searcher ended before the kill: {ended}"
        try:
            storage = storage or study.storage(postgres_url)  # one engine for every look
            st = optuna.load_study(study_name="shared", storage=storage)
        except KeyError:
            continue
        running = st.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        # whichever searcher still runs and holds a trial: on 2 busy cores one can finish its share
        # before a look at the study sees another's trial running
        holders = [p for p in procs if p.poll() is None
                   and any(f"/{p.pid}/" in t.user_attrs.get("owner", "") for t in running)]
        if len([t for t in st.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]) >= 10 and holders:
            victim = holders[0]
            victim.send_signal(signal.SIGKILL)
            killed_at = datetime.datetime.now()
            victim.wait()
            break
    else:
        done = len([t for t in st.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]) if st else None
        raise AssertionError(f"no searcher held a running trial to kill ({done} trials complete)")
    before = {t.number: t.value for t in st.get_trials() if t.state.name == "COMPLETE"}
    running = {t.number for t in st.get_trials() if t.state.name == "RUNNING"
               and f"/{victim.pid}/" in t.user_attrs.get("owner", "")}
    assert running, "the killed searcher held no trial"
    for p in [p for p in procs if p is not victim]:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]

    trials = {t.number: t for t in optuna.load_study(study_name="shared",
                                                     storage=study.storage(postgres_url)).get_trials()}
    # no finished trial lost
    assert all(trials[n].state.name == "COMPLETE" and trials[n].value == v for n, v in before.items())
    # the killed searcher's trials were failed as stale once its beat stopped (GRACE_S, seen within a
    # beat or two, with margins for 2 busy cores: 60 s; not the pipeline's fallback wait of minutes)
    # and queued again
    retried = {t.user_attrs.get("retry_of") for t in trials.values()}
    for n in running:
        t = trials[n]
        assert t.state.name == "FAIL" and study.interrupted(t)
        assert (t.datetime_complete - killed_at).total_seconds() <= heartbeat.GRACE_S + 3 * heartbeat.HEARTBEAT_S + 30
        assert n in retried
    assert not [t for t in trials.values() if t.state.name == "RUNNING"]
    # the study has its trial count, and no variant was evaluated twice
    assert study.finished_count(optuna.load_study(study_name="shared", storage=study.storage(postgres_url))) >= TRIALS
    evaluated = collections.Counter(r["variant"] for r in records.read(study.records_path("shared")))
    assert evaluated and max(evaluated.values()) == 1
    print(f"killed at {killed_at:%H:%M:%S}; stale after "
          f"{max((trials[n].datetime_complete - killed_at).total_seconds() for n in running):.1f} s; "
          f"{len(evaluated)} variants evaluated once each")
