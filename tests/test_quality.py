"""Search quality in simulation: trials a sampler needs to reach a near-best variant of the
recorded H100 space (tuner/search/quality.py, `tuner samplers`)."""

import math
from pathlib import Path

import optuna
import pytest

from tuner import search
from tuner.search import quality
from tuner.search.evaluate import SimulatedEvaluator
from tuner.families import giou

DATA = Path(__file__).parent / "data" / "h100-giou-bf16-u8.jsonl"  # the tuning set
HELD_OUT = Path(__file__).parent / "data" / "h100-giou-f32-f32.jsonl"  # float32 pred and target
PROBLEM = giou.Problem(pred="bfloat16", target="uint8")
SPACE = 1136  # every bf16/uint8 variant is in the recording


def _finished(s: search.Search) -> list:
    """Trials told, in trial order (random and grid also queue trials ahead: those wait)."""
    return sorted((t for t in s.study.trials if t.state.name != "WAITING"), key=lambda t: t.number)


def _search(sampler: str, seed: int, trials: int, **kw) -> search.Search:
    cfg = search.SearchConfig(gpu="auto", problem=PROBLEM, trials=trials, sampler=sampler, simulate=DATA, seed=seed,
                              progress=False, storage=optuna.storages.InMemoryStorage(), **kw)
    s = search.Search(cfg, SimulatedEvaluator(DATA, PROBLEM, "fwd+bwd", "auto"))
    s.run()
    return s


def test_the_recording_covers_the_space():
    assert quality.space_size(PROBLEM) == SPACE
    assert quality.dataset_best(DATA, PROBLEM) == pytest.approx(14.752, abs=1e-3)


@pytest.mark.parametrize("sampler, seed", [("random", 0), ("tpe", 0), ("ranked", 0), ("ranked", 3)])
def test_the_count_is_where_a_plain_search_first_gets_there(sampler, seed, tuner_home):
    """Stopping early changes nothing before the stop: a search of exactly `count` trials, with
    no stop condition, gets within 3% of the best at its last trial and not before."""
    count = quality.trials_to_reach(DATA, PROBLEM, sampler, seed)
    assert 1 <= count <= SPACE
    target = 1.03 * quality.dataset_best(DATA, PROBLEM)
    trials = _finished(_search(sampler, seed, count, batch=quality.LIVE_BATCH.get(sampler)))
    assert len(trials) == count
    reached = [t.number for t in trials if t.state.name == "COMPLETE" and t.value <= target]
    assert reached[0] == count - 1
    if sampler in ("random", "ranked"):  # both draw without replacement: every trial a new variant
        assert len({t.user_attrs["variant"] for t in trials}) == count


def test_a_seed_is_reproducible_and_leaves_nothing_behind(tuner_home):
    first = quality.trials_to_reach(DATA, PROBLEM, "tpe", 1)
    assert first == quality.trials_to_reach(DATA, PROBLEM, "tpe", 1)
    assert not any(tuner_home.iterdir())  # runs use a scratch TUNER_HOME


def test_bounds_of_the_count(tuner_home):
    assert quality.trials_to_reach(DATA, PROBLEM, "random", 0, within=100.0) == 1  # any variant will do
    needed = quality.trials_to_reach(DATA, PROBLEM, "tpe", 0)
    assert quality.trials_to_reach(DATA, PROBLEM, "tpe", 0, max_trials=needed - 1) is None
    assert quality.trials_to_reach(DATA, PROBLEM, "tpe", 0, max_trials=needed) == needed


def test_stop_when_ends_the_search_early(tuner_home):
    s = _search("random", 0, SPACE, batch=8, stop_when=lambda best: True)
    # the batch that met it and the one asked while it was evaluated are finished, no more
    assert s.report.trials == len(_finished(s)) == 16


def test_sampler_table_and_the_default_samplers_bound(tuner_home):
    table = quality.sampler_table(DATA, PROBLEM, ["ranked", "tpe", "random"], seeds=range(3))
    assert list(table["sampler"]) == ["ranked", "tpe", "random"]
    assert list(table["reached"]) == ["3/3", "3/3", "3/3"]
    for _, row in table.iterrows():
        assert 1 <= row["min"] <= row["p25"] <= row["median trials"] <= row["p75"] <= row["max"] <= SPACE
        assert row["median % of space"] == pytest.approx(100 * row["median trials"] / SPACE, abs=0.05)
    # within 7% of the space on 3 seeds here (seeds 0-2: 6.3%); README's `tuner samplers --fail-above 5` checks 20
    assert table.loc[table["sampler"] == "ranked", "median % of space"].iloc[0] <= 7
    assert "| ranked |" in quality.markdown(table)


def test_runs_in_processes_give_the_same_table(tuner_home):
    """`tuner samplers --jobs`: a run's seed decides it, wherever it runs; every run is heard of."""
    heard = []
    # seeds 16 and 17 reach within 3 and 18 trials: short runs that count
    here = quality.sampler_table(DATA, PROBLEM, ["ranked"], seeds=[16, 17], max_trials=20)
    apart = quality.sampler_table(DATA, PROBLEM, ["ranked"], seeds=[16, 17], max_trials=20, jobs=2,
                                  on_run=lambda name, seed, count: heard.append((name, seed, count)))
    assert here.equals(apart) and here.iloc[0]["reached"] == "2/2"
    assert sorted(heard) == [("ranked", 16, here.iloc[0]["min"]), ("ranked", 17, here.iloc[0]["max"])]


def test_the_default_sampler_on_a_recording_it_was_not_tuned_on(tuner_home):
    """float32/float32 on the same H100: the ranked sampler's settings were chosen on bfloat16."""
    problem = giou.Problem(pred="float32", target="float32")
    table = quality.sampler_table(HELD_OUT, problem, ["ranked"], seeds=range(20, 25))
    assert table.iloc[0]["reached"] == "5/5" and table.iloc[0]["median % of space"] <= 15


def test_a_run_that_never_reaches_makes_its_quantiles_unknown(tuner_home):
    needed = [quality.trials_to_reach(DATA, PROBLEM, "tpe", seed) for seed in (0, 1)]
    cap = (min(needed) + max(needed)) // 2  # one run gets there, the other does not
    row = quality.sampler_table(DATA, PROBLEM, ["tpe"], seeds=[0, 1], max_trials=cap).iloc[0]
    assert row["reached"] == "1/2" and row["min"] == min(needed)
    assert math.isnan(row["median trials"]) and math.isnan(row["max"]) and math.isnan(row["median % of space"])


def test_an_interrupted_table_in_processes_stops_at_once(tuner_home):
    """Ctrl-C during `tuner samplers --jobs 2`: the queued runs are dropped and the running ones
    ended (a shutdown that waited ran every queued run first, 20 s and more, or never returned).
    80 runs would take minutes; the command is to end within seconds of the signal."""
    import os
    import signal
    import subprocess
    import sys
    import time

    # SIGINT as a terminal delivers it, whatever this run inherited (a shell's background job ignores it)
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "samplers", "--simulate", str(DATA), "--seeds", "20",
                             "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TUNER_HOME": str(tuner_home)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    proc.stdout.readline()  # the recording's line: the table's runs have begun, or are about to
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    assert time.monotonic() - sent < 30  # margins for 2 busy cores; it took under a second alone
    assert "Traceback" not in out and out.rstrip().endswith("tuner samplers: interrupted")


def test_a_stopped_pool_leaves_no_thread_for_the_exit_to_wake():
    """Python 3.11's exit wakes a process pool's thread still running through a pipe that thread may
    close meanwhile: a traceback (bad file descriptor) after `tuner samplers: interrupted`."""
    import concurrent.futures
    import multiprocessing
    import time

    pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    running = pool.submit(time.sleep, 60)
    manager = pool._executor_manager_thread
    while not running.running():
        time.sleep(0.05)
    quality._stop(pool)
    assert not manager.is_alive()
