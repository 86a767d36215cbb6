"""The search on CPU: replayed measurements (--simulate) drive storage, resume and failures."""

import collections
import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

from tuner import errors, search
from tuner.store import journal
from tuner.store import records
from tuner.store import study
from tuner.store import trials
from tuner.errors import GpuError
from tuner.families import giou
from tuner.search import asking

import simdata


@pytest.fixture
def sim(tmp_path, tuner_home):
    return simdata.write(tmp_path / "sim.jsonl")


def _cfg(sim, **kw):
    kw = {"gpu": "H100", "problem": giou.Problem(), "trials": 30, "simulate": sim, "progress": False,
          "seed": 1, **kw}
    return search.SearchConfig(**kw)


def _finished(st):
    return [t for t in st.get_trials() if t.state.name in ("COMPLETE", "PRUNED", "FAIL")
            and t.user_attrs.get("reason") != "interrupted"]


def test_search_reaches_the_trial_count_and_records_measurements(sim):
    report = search.run(_cfg(sim, trials=40))
    st = study.load(report.study_name)
    assert len(_finished(st)) == 40
    assert st.user_attrs["gpu"]["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert st.user_attrs["problem"]["batch"] == 1024
    recs = list(records.read(report.records_path))
    assert len(recs) == report.trials - report.duplicates
    assert report.winner is not None and report.winner["variant"].startswith("giou.bfloat16.uint8")
    best = min(t.value for t in st.get_trials() if t.value is not None)
    assert report.winner["objective_us"] == pytest.approx(best)


def test_rerunning_a_finished_study_does_nothing(sim):
    search.run(_cfg(sim, trials=20))
    started = time.monotonic()
    again = search.run(_cfg(sim, trials=20))
    assert again.trials == 0 and again.compiled == 0 and again.evaluated == 0
    assert time.monotonic() - started < 10
    assert again.winner is not None


def test_a_known_variant_is_not_evaluated_again(sim):
    report = search.run(_cfg(sim, trials=120, sampler="tpe"))
    st = study.load(report.study_name)
    recs = [r["variant"] for r in records.read(report.records_path)]
    assert len(recs) == len(set(recs))
    dups = [t for t in st.get_trials() if "duplicate_of" in study.facts(t)]
    assert report.duplicates == len(dups) > 0
    by_number = {t.number: t for t in st.get_trials()}
    for t in dups:
        original = by_number[study.facts(t)["duplicate_of"]]
        assert original.user_attrs["variant"] == t.user_attrs["variant"]
        assert t.value == original.value and t.state == original.state


def test_every_failure_kind_is_a_failed_trial_with_its_reason(sim):
    space = giou.space()
    name = study.study_name("giou", "H100", giou.Problem().key(), "fwd+bwd")
    st = optuna.create_study(study_name=name, storage=study.storage())
    failing = {r["variant"]: r["reason"] for r in records.read(sim) if r["status"] == "fail"}
    for v in space:
        if v.name in failing:
            st.enqueue_trial(space.tuned(v))
    report = search.run(_cfg(sim, trials=len(failing) + 5))
    st = study.load(report.study_name)
    got = {t.user_attrs["variant"]: t.user_attrs.get("reason") for t in st.get_trials()
           if t.state.name == "FAIL"}
    assert got == failing
    assert set(failing.values()) == set(simdata.FAILURES)
    assert len([t for t in st.get_trials() if t.state.name in ("COMPLETE", "PRUNED")]) >= 5


def test_gpu_mismatch_is_refused_with_a_clear_message(sim):
    with pytest.raises(GpuError, match="L4.*H100"):
        search.run(_cfg(sim, gpu="L4"))


def _cli(*args, env_home, **kw):
    env = {**os.environ, "TUNER_HOME": str(env_home), "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _study_trials(home):
    name = study.study_name("giou", "H100", giou.Problem().key(), "fwd+bwd")
    try:
        return optuna.load_study(study_name=name, storage=journal.storage(f"{home}/studies/tuner.journal")).get_trials()
    except Exception:  # not created yet
        return []


def test_kill_and_resume_loses_no_finished_trial(sim, tuner_home):
    import random

    args = ["search", "--gpu", "H100", "--simulate", str(sim), "--trials", "60", "--quiet", "--seed", "3",
            "--simulate-delay", "0.05", "--sampler", "random"]
    kept = {}
    rng = random.Random(7)
    for _ in range(5):  # SIGKILL at five random moments
        proc = _cli(*args, env_home=tuner_home)
        time.sleep(rng.uniform(1.0, 4.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        trials = _study_trials(tuner_home)  # the storage is readable after each kill
        for t in trials:
            if t.state.name == "COMPLETE":
                kept.setdefault(t.number, t.value)
    proc = _cli(*args, env_home=tuner_home)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    trials = {t.number: t for t in _study_trials(tuner_home)}
    lost = [n for n, v in kept.items() if trials[n].state.name != "COMPLETE" or trials[n].value != v]
    assert lost == []
    assert not any(t.state.name == "RUNNING" for t in trials.values())
    assert len([t for t in trials.values() if t.state.name in ("COMPLETE", "PRUNED", "FAIL")
                and t.user_attrs.get("reason") != "interrupted"]) >= 60
    interrupted = [t for t in trials.values() if t.user_attrs.get("reason") == "interrupted"]
    retried = {t.user_attrs.get("retry_of") for t in trials.values()} - {None}
    assert {t.number for t in interrupted} <= retried


def test_sigterm_ends_a_search_as_ctrl_c_does_and_the_same_command_goes_on(sim, tuner_home):
    """A batch job's time limit sends SIGTERM: the search says so and exits 143 (128 + 15), where
    SIGTERM's default ended it silently, mid-step; run again, it finishes from what was kept."""
    args = ["search", "--gpu", "H100", "--simulate", str(sim), "--trials", "80", "--quiet", "--seed", "5",
            "--simulate-delay", "0.1", "--sampler", "random"]
    proc = _cli(*args, env_home=tuner_home)
    deadline = time.monotonic() + 240  # margins for 2 busy cores: the first trials take about 2 s alone
    while sum(t.state.name == "COMPLETE" for t in _study_trials(tuner_home)) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, "the search ended before it was signalled"
        time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    assert err.rstrip().endswith("tuner search: terminated (SIGTERM); its finished trials are kept, "
                                 "and the same command goes on from them")
    kept = {t.number: t.value for t in _study_trials(tuner_home) if t.state.name == "COMPLETE"}
    assert kept
    # `tuner list` counts trials as --trials does, the ones left running apart
    left = _study_trials(tuner_home)
    done = sum(t.state.name in ("COMPLETE", "PRUNED", "FAIL") and not study.interrupted(t) for t in left)
    running = sum(t.state.name == "RUNNING" for t in left)
    out, _ = _cli("list", env_home=tuner_home).communicate(timeout=120)
    row = next(line.split() for line in out.splitlines() if line.startswith("giou-"))
    assert (int(row[1]), int(row[2])) == (done, running), out
    proc = _cli(*args, env_home=tuner_home)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    trials = {t.number: t for t in _study_trials(tuner_home)}
    assert all(trials[n].state.name == "COMPLETE" and trials[n].value == v for n, v in kept.items())
    assert len([t for t in trials.values() if t.state.name in ("COMPLETE", "PRUNED", "FAIL")
                and t.user_attrs.get("reason") != "interrupted"]) >= 80


def test_two_processes_share_a_study_without_evaluating_a_variant_twice(sim, tuner_home):
    args = ["search", "--gpu", "H100", "--simulate", str(sim), "--trials", "60", "--quiet",
            "--simulate-delay", "0.02", "--sampler", "tpe"]
    procs = [_cli(*args, "--seed", str(seed), env_home=tuner_home) for seed in (1, 2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    trials = _study_trials(tuner_home)
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED", "FAIL")]
    assert len(finished) >= 60
    assert len({t.user_attrs["owner"] for t in trials}) == 2  # both did work
    name = study.study_name("giou", "H100", giou.Problem().key(), "fwd+bwd")
    evaluated = [r["variant"] for r in records.read(tuner_home / "studies" / f"{name}.jsonl")]
    assert len(evaluated) == len(set(evaluated))


def test_show_and_list(sim, tuner_home):
    search.run(_cfg(sim, trials=15))
    show = _cli("show", "--gpu", "H100", env_home=tuner_home)
    out, err = show.communicate(timeout=120)
    assert show.returncode == 0, err
    assert "top" in out and "boxes_per_thread" in out and "re-timed" in out
    js = _cli("show", "--gpu", "H100", "--json", env_home=tuner_home)
    out, _ = js.communicate(timeout=120)
    assert len(json.loads(out)["trials"]) == 15
    ls = _cli("list", env_home=tuner_home)
    out, _ = ls.communicate(timeout=120)
    assert "giou-H100-B1024-S256-bfloat16-uint8-article-mean-fwd+bwd" in out


def test_cli_reports_errors_without_traceback(sim, tuner_home):
    p = _cli("search", "--gpu", "L4", "--simulate", str(sim), env_home=tuner_home)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1
    assert "error" in err and "L4" in err and "Traceback" not in err
    p = _cli("show", "--study", "nope", env_home=tuner_home)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "no study 'nope'" in err


REAL = __import__("pathlib").Path(__file__).parent / "data" / "h100-giou-bf16-u8.jsonl"


def test_replaying_the_recorded_h100_dataset_finds_a_fast_variant(tuner_home):
    recs = [r for r in records.read(REAL) if r["status"] == "ok"]
    assert len(recs) > 500 and all(r["gpu"]["gpu_name"] == "NVIDIA H100 80GB HBM3" for r in recs)
    objective = sorted(r["fwd"]["median_us"] + r["bwd"]["median_us"] for r in recs)
    for sampler in ("tpe", "ranked"):
        report = search.run(_cfg(REAL, trials=150, sampler=sampler, seed=0, study=sampler))
        # 150 trials land in the best 2% of what the whole recording holds.
        assert report.winner["objective_us"] <= objective[len(objective) // 50], sampler


def test_importing_records_skips_known_variants(tuner_home, tmp_path):
    report = search.run(_cfg(REAL, trials=20, sampler="random", study="first"))
    imported = search.run(_cfg(REAL, trials=25, sampler="random", study="second", seed=1,
                               import_records=report.records_path))
    assert imported.imported == 20 and imported.trials == 5
    # Random sampling draws only variants the study has not seen: five new ones, none imported.
    assert imported.duplicates == 0 and imported.evaluated == 5
    new = {r["variant"] for r in records.read(imported.records_path)}
    assert len(new) == 5 and not new & {r["variant"] for r in records.read(report.records_path)}


def test_report_writes_table_importance_and_plots(tuner_home):
    from tuner.report import report

    result = search.run(_cfg(REAL, trials=60, sampler="random"))
    out = tuner_home / "rep"
    importance = report.report(study.load(result.study_name), out)
    assert set(importance) == {d.name for d in giou.DIMS}
    assert len((out / "trials.csv").read_text().splitlines()) == 61
    for png in ("time_by_dimension.png", "time_vs_registers.png"):
        assert (out / png).stat().st_size > 5000


def test_clearly_slow_variants_are_pruned_and_never_win(sim):
    report = search.run(_cfg(sim, trials=60, sampler="random"))
    st = study.load(report.study_name)
    pruned = [t for t in st.get_trials() if t.state.name == "PRUNED"]
    complete = [t for t in st.get_trials() if t.state.name == "COMPLETE"]
    assert pruned and complete and report.pruned == len(pruned)
    best = min(t.value for t in complete)
    # each was over 1.5x the best known when it was probed, so over 1.5x the final best
    assert all(t.value > 1.5 * best and t.intermediate_values for t in pruned)
    assert all("fwd_us" in study.facts(t) for t in pruned)  # the probe's times are kept
    assert report.winner["variant"] not in {t.user_attrs["variant"] for t in pruned}
    timed = search.run(_cfg(sim, trials=60, sampler="random", study="every-variant-timed", prune=None))
    st = study.load(timed.study_name)
    assert timed.pruned == 0 and not [t for t in st.get_trials() if t.state.name == "PRUNED"]


def test_the_pruner_compares_with_the_best_finished_value():
    from tuner.search.pruning import SlowerThanBest

    st = optuna.create_study(pruner=SlowerThanBest(2.0))
    first = st.ask()
    first.report(100.0, 10)
    assert not first.should_prune()  # nothing finished yet
    st.tell(first, 10.0)
    slow, close = st.ask(), st.ask()
    slow.report(21.0, 10)
    close.report(19.0, 10)
    assert slow.should_prune() and not close.should_prune()
    with pytest.raises(ValueError):
        SlowerThanBest(1.0)
    # the best as its caller keeps it (a search: its prior best and what it told), not a scan of the study
    kept = optuna.create_study(pruner=SlowerThanBest(2.0, best=lambda: 5.0))
    kept.tell(kept.ask(), 10.0)
    t = kept.ask()
    t.report(11.0, 10)
    assert t.should_prune()  # over 2 x 5, though not over 2 x the study's 10
    unknown = optuna.create_study(pruner=SlowerThanBest(2.0, best=lambda: None))
    t = unknown.ask()
    t.report(1e9, 10)
    assert not t.should_prune()


def test_a_finished_study_is_reported_without_starting_cuda(sim, monkeypatch):
    from tuner import gpus

    done = search.run(_cfg(sim, trials=20))
    live = _cfg(sim, trials=20, simulate=None)
    monkeypatch.setattr(gpus, "visible_name", lambda: "NVIDIA H100 80GB HBM3")
    report = search.finished(live)
    assert report is not None and report.winner == done.winner and report.trials == 0
    assert search.finished(_cfg(sim, trials=21, simulate=None)) is None  # more trials asked for
    monkeypatch.setattr(gpus, "visible_name", lambda: "NVIDIA L4")
    assert search.finished(live) is None  # another GPU: the full path says why not
    monkeypatch.setattr(gpus, "visible_name", lambda: None)
    assert search.finished(live) is None


def test_two_devices_evaluate_side_by_side_each_variant_once(sim):
    report = search.run(_cfg(sim, trials=48, sampler="random", devices="0,1", simulate_delay=0.1))
    st = study.load(report.study_name)
    done = [t for t in st.get_trials() if t.state.name in ("COMPLETE", "PRUNED", "FAIL")]
    assert len(done) >= 48 and report.evaluated + report.failed.get("compile error", 0) == len(done)
    devices = {study.facts(t).get("device") for t in done if "device" in study.facts(t)}
    assert devices == {"simulated/0", "simulated/1"}  # both slots measured, and each trial says which
    evaluated = [r["variant"] for r in records.read(report.records_path)]
    assert len(evaluated) == len(set(evaluated)) == len(done)
    # side by side: 48 evaluations of 0.1 s on two slots take about half of 4.8 s
    assert report.wall_s < 48 * 0.1 * 0.8


# ------------------------------------------------------------------ --trials above the space

FAMILIES = os.path.join(os.path.dirname(__file__), "families")


@pytest.fixture
def small(tuner_home, tmp_path):
    """The toy family's space (8 variants) and a recording of all of it."""
    from tuner import families

    families.add_path(FAMILIES)
    fam = families.get("scale_add")
    gpu = {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}
    path = tmp_path / "scale_add.jsonl"
    for v in fam.space():
        fwd = 10.0 / v["items"] + v["block_size"] / 1000
        records.append(path, {"problem": fam.Problem().key(), "variant": v.name, "gpu": gpu, "status": "ok",
                              "fwd": {"median_us": fwd, "spread_us": 0.1}, "bwd": {"median_us": fwd, "spread_us": 0.1}})
    return fam, path


def _measured(st):
    """Each variant's trials that measured it (not copies of another trial's outcome)."""
    return collections.Counter(t.user_attrs["variant"] for t in _finished(st) if "duplicate_of" not in study.facts(t))


@pytest.mark.parametrize("sampler", search.SAMPLERS)
def test_trials_above_the_space_stop_once_every_variant_is_measured(small, capsys, sampler):
    fam, path = small
    # seed 2: tpe's random start finds every variant (with seed 1 it never tries one in 400 trials)
    report = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=50, simulate=path,
                                            progress=False, seed=2, sampler=sampler))
    st = study.load(report.study_name)
    names = {v.name for v in fam.space()}
    assert _measured(st) == dict.fromkeys(names, 1)
    assert len(_finished(st)) == report.trials == len(names) + report.duplicates
    if sampler == "tpe":  # it may propose a variant again while some are unseen, never after
        copies = [t.number for t in _finished(st) if "duplicate_of" in study.facts(t)]
        assert max(copies, default=-1) < max(t.number for t in _finished(st) if "duplicate_of" not in study.facts(t))
    else:
        assert report.duplicates == 0
    assert report.winner is not None and report.retimed
    assert "every variant of the space is measured: 8 of --trials 50\n" in capsys.readouterr().err
    again = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=60, simulate=path,
                                           progress=False, seed=2, sampler=sampler))
    assert again.trials == 0 and again.winner == report.winner  # nothing left to ask


def _failing_whole_checks(monkeypatch, fam, fails):
    """The family's finalists checked whole, and `fails(round, name)` says which fail their check."""
    from tuner.search import evaluate

    monkeypatch.setattr(fam, "FINALISTS_WHOLE", True, raising=False)
    rounds = []
    real = evaluate.SimulatedEvaluator.retime

    def retime(self, variants, prepared, objective, whole=False, baseline=False, check=False):
        assert whole
        rounds.append([v.name for v in variants])
        out = real(self, variants, prepared, objective)
        return {n: {"failed": "wrong result: forward max"} if fails(len(rounds), n) else t for n, t in out.items()}

    monkeypatch.setattr(evaluate.SimulatedEvaluator, "retime", retime)
    return rounds


def test_finalists_that_fail_their_whole_check_never_win(small, monkeypatch, capsys):
    """A search that checked only its problem's part (EmbeddingBag: one mode) checks its finalists
    whole: those that fail are rejected, kept in the study, and the next best take their place."""
    from tuner.deploy import export

    fam, path = small
    rounds = _failing_whole_checks(monkeypatch, fam, lambda r, name: r == 1)
    cfg = search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path, progress=False,
                              seed=1, sampler="grid", top_k=3)
    report = search.run(cfg)
    st = study.load(report.study_name)
    by_speed = list(trials.top(trials.trials_frame(st, fam.space()), 8)["variant"])
    assert rounds == [by_speed[:3], by_speed[3:6]]
    assert set(st.user_attrs["rejected"]) == set(by_speed[:3])
    assert report.winner["variant"] == by_speed[3] and export._winner(st)["variant"].name == by_speed[3]
    assert capsys.readouterr().err.count("rejected by its whole check: wrong result: forward max") == 3
    from tuner.cli import studies as cli_studies

    shown = cli_studies._show(st, 5)
    assert "finalists rejected by their whole check (3), never exported:" in shown
    assert f"  {by_speed[0]}: wrong result: forward max" in shown

    # a search stopped before its finalists: nothing checked whole to export, so it says what to do
    st.set_user_attr("winner", None)
    with pytest.raises(errors.TunerError, match="run the same `tuner search` again"):
        export._winner(st)


def test_the_likely_finalists_are_built_whole_while_the_last_batch_is_evaluated(small, monkeypatch):
    from tuner.search import evaluate

    fam, path = small
    _failing_whole_checks(monkeypatch, fam, lambda r, name: False)
    builds = []
    real = evaluate.SimulatedEvaluator.prepare

    def prepare(self, variants, whole=False, on_ready=None):
        builds.append((whole, sorted(v.name for v in variants)))
        return real(self, variants, whole)

    monkeypatch.setattr(evaluate.SimulatedEvaluator, "prepare", prepare)
    report = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path,
                                            progress=False, seed=1, sampler="grid", top_k=3, batch=4, prune=False))
    st = study.load(report.study_name)
    first = [t.user_attrs["variant"] for t in st.get_trials() if t.number < 4]
    ok = trials.top(trials.trials_frame(st, fam.space()), 8)
    early = sorted(ok[ok["variant"].isin(first)]["variant"][:3])
    assert [b for b in builds if b[0]] == [(True, early), (True, sorted(ok["variant"][:3]))]
    # the search's own builds came first, in two batches of 4, then the ahead one with the last batch
    assert [len(b[1]) for b in builds if not b[0]] == [4, 4]


def test_no_winner_when_every_finalist_fails_its_whole_check(small, monkeypatch):
    fam, path = small
    rounds = _failing_whole_checks(monkeypatch, fam, lambda r, name: True)
    report = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path,
                                            progress=False, seed=1, sampler="grid", top_k=3))
    st = study.load(report.study_name)
    complete = list(trials.top(trials.trials_frame(st, fam.space()), 8)["variant"])
    assert sum(rounds, []) == complete and max(map(len, rounds)) == 3 and report.winner is None
    assert set(st.user_attrs["rejected"]) == set(complete) and len(complete) >= 4


@pytest.fixture
def opposed(small, tmp_path, monkeypatch):
    """The toy family as one whose forward wants many items per thread and whose backward few
    (as EmbeddingBag's 16-bit forward and sorted backward want different mappings), joinable."""
    fam, _ = small
    monkeypatch.setattr(fam, "JOINED_TEMPLATE", "never rendered in a simulation", raising=False)
    gpu = {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}
    path = tmp_path / "opposed.jsonl"
    for v in fam.space():
        fwd, bwd = 10.0 / v["items"] + v["block_size"] / 1000, 2.5 * v["items"] + v["block_size"] / 1000
        records.append(path, {"problem": fam.Problem().key(), "variant": v.name, "gpu": gpu, "status": "ok",
                              "fwd": {"median_us": fwd, "spread_us": 0.1}, "bwd": {"median_us": bwd, "spread_us": 0.1}})
    return fam, path


def test_the_best_forward_and_backward_are_joined_when_that_is_faster(opposed, monkeypatch):
    from tuner.cli import studies as cli_studies
    from tuner.search import evaluate
    from tuner.deploy import export
    from tuner.variant import Variant

    fam, path = opposed
    builds = []
    real = evaluate.SimulatedEvaluator.prepare

    def prepare(self, variants, whole=False, on_ready=None):
        builds.append((whole, [v.name for v in variants]))
        return real(self, variants, whole)

    monkeypatch.setattr(evaluate.SimulatedEvaluator, "prepare", prepare)
    report = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path,
                                            progress=False, seed=1, sampler="grid", top_k=2, batch=4, prune=False))
    st = study.load(report.study_name)
    by_name = fam.space().by_name()
    fwd, bwd = by_name["scale_add.b64.4"], by_name["scale_add.b64.1"]
    joined = Variant.joined(fwd, bwd)
    assert joined.name == "scale_add.b64.4.bwd.b64.1" and joined.halves() == (fwd, bwd)
    # the best two by the sum (2 items per thread) and the joined one, re-timed together
    assert [r["variant"] for r in st.user_attrs["retimed"]] == [joined.name, "scale_add.b64.2", "scale_add.b128.2"]
    assert report.winner["halves"] == {"forward": fwd.name, "backward": bwd.name}
    assert report.winner["objective_us"] == pytest.approx(2 * (2.5 + 0.064))
    assert export._winner(st)["variant"] == joined
    # built whole beside the last batch (the best so far, joined too: from the first batch's
    # measurements, b128 there), then as the finalists
    ahead, final = [names for whole, names in builds if whole]
    assert ahead[-1] == "scale_add.b128.4.bwd.b128.1" and sorted(final) == sorted(r["variant"] for r in st.user_attrs["retimed"])
    assert cli_studies._show(st, 3).split("re-timed, interleaved (the winner is the first):\n")[1].splitlines()[1] \
        .split()[0] == joined.name


@pytest.mark.parametrize("caps", [{"n": 1 << 10}, {"n": 1 << 30}, {}])
def test_finalists_are_checked_at_the_problem_sizes_where_the_search_checked_smaller(small, monkeypatch, caps):
    """A family whose checks take smaller sizes than its problem's (CHECK_SIZES) has its finalists
    checked at the problem's own, not built whole; one whose caps leave the problem as it is, none."""
    from tuner.search import evaluate

    fam, path = small
    monkeypatch.setattr(fam, "CHECK_SIZES", caps, raising=False)
    asked = []
    real = evaluate.SimulatedEvaluator.retime

    def retime(self, variants, prepared, objective, whole=False, baseline=False, check=False):
        asked.append((whole, check))
        return real(self, variants, prepared, objective, whole, baseline, check)

    monkeypatch.setattr(evaluate.SimulatedEvaluator, "retime", retime)
    search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path, progress=False,
                                   seed=1, sampler="grid", top_k=2))
    assert asked == [(False, caps.get("n", 1 << 30) < fam.Problem().n)]


def test_a_joined_variant_that_fails_its_check_is_rejected(opposed, monkeypatch):
    from tuner.search import evaluate

    fam, path = opposed
    real = evaluate.SimulatedEvaluator.retime

    def retime(self, variants, prepared, objective, whole=False, baseline=False, check=False):
        out = real(self, variants, prepared, objective)
        return {n: {"failed": "wrong result: backward sum"} if ".bwd." in n else t for n, t in out.items()}

    monkeypatch.setattr(evaluate.SimulatedEvaluator, "retime", retime)
    report = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path,
                                            progress=False, seed=1, sampler="grid", top_k=2))
    st = study.load(report.study_name)
    assert report.winner["variant"] == "scale_add.b64.2" and "halves" not in report.winner
    assert st.user_attrs["rejected"] == {"scale_add.b64.4.bwd.b64.1": "wrong result: backward sum"}


def test_a_joining_search_prunes_only_a_variant_behind_in_both_halves(small, tmp_path, monkeypatch):
    """Four items per thread: the best forward, but a backward that puts the variant's sum at 2x
    the best sum. The pruner of a search without joins drops it; a joining search must time it,
    since its forward is the joined winner's."""
    fam, _ = small
    monkeypatch.setattr(fam, "JOINED_TEMPLATE", "never rendered in a simulation", raising=False)
    gpu = {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}
    path = tmp_path / "far_apart.jsonl"
    for v in fam.space():
        fwd, bwd = 20.0 / v["items"] + v["block_size"] / 1000, 2.0 * v["items"] ** 2 + v["block_size"] / 1000
        records.append(path, {"problem": fam.Problem().key(), "variant": v.name, "gpu": gpu, "status": "ok",
                              "fwd": {"median_us": fwd, "spread_us": 0.1}, "bwd": {"median_us": bwd, "spread_us": 0.1}})
    # 2 items (18 µs) first, so that the pruner has a best to compare the others with
    order = sorted(fam.space(), key=lambda v: (v["items"] != 2, v.name))
    monkeypatch.setattr(asking, "shuffled", lambda space, seed: list(order))
    report = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path,
                                            progress=False, seed=1, sampler="grid", top_k=2, batch=2))
    st = study.load(report.study_name)
    pruned = {t.user_attrs["variant"] for t in st.get_trials() if t.state.name == "PRUNED"}
    assert pruned == set() and report.pruned == 0
    assert report.winner["halves"] == {"forward": "scale_add.b64.4", "backward": "scale_add.b64.1"}
    # the same search without joins prunes the variants of 4 items (sums of 37 µs, over 1.5 x 18)
    monkeypatch.delattr(fam, "JOINED_TEMPLATE")
    plain = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path,
                                           progress=False, seed=1, sampler="grid", top_k=2, batch=2,
                                           study="without-joins"))
    st = study.load(plain.study_name)
    assert {t.user_attrs["variant"] for t in st.get_trials() if t.state.name == "PRUNED"} == {
        "scale_add.b64.4", "scale_add.b128.4"}


def test_a_joining_ranked_batch_takes_the_best_forwards_and_the_best_backwards(small, monkeypatch):
    """The model ranks the unseen variants by forward time for part of a batch and by backward time
    for the rest, in proportion to the best forward's and backward's times; by the sum it would
    take 2 items per thread, which neither half wants."""
    import types

    fam, _ = small
    monkeypatch.setattr(fam, "JOINED_TEMPLATE", "never rendered in a simulation", raising=False)
    monkeypatch.setattr(asking, "MIN_OUTCOMES", 2)
    space = fam.space()
    timed = {"scale_add.b64.1", "scale_add.b64.2", "scale_add.b64.4", "scale_add.b128.2"}

    slower = {"bwd": 1.0}  # the backward's times scaled by this

    def outcomes(objective=None):
        times = {v.name: (20.0 / v["items"] + v["block_size"] / 1000,
                          slower["bwd"] * (4.0 * v["items"] + v["block_size"] / 1000)) for v in space if v.name in timed}
        pick = {"fwd": lambda t: t[0], "bwd": lambda t: t[1]}.get(objective, sum)
        return {name: pick(t) for name, t in times.items()}

    book = types.SimpleNamespace(dists=asking.distributions(space), seen=set(timed), outcomes=outcomes)
    cfg = search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, seed=1, progress=False)
    asker = asking.Asker(cfg, book, space, None, "scale_add")
    assert asker.halves
    # best forward 5.06 µs, best backward 4.06: one of each, the unseen b128.4, then a b128.1 or b256.1
    assert [v["items"] for v in asker._picks(2)] == [4, 1]
    slower["bwd"] = 3.0  # a backward of 12.2 µs: a quarter of 4 picks by forward time, the rest by backward
    picks = asker._picks(4)
    assert [v["items"] for v in picks][:3] == [4, 1, 1] and len(picks) == 4
    slower["bwd"], asker.halves = 1.0, False  # by the sum: 2 items, the one unseen variant of them
    assert [v.name for v in asker._picks(1)] == ["scale_add.b256.2"]


def test_no_join_where_one_variant_has_the_best_forward_and_backward(small, monkeypatch):
    fam, path = small  # forward and backward times alike
    monkeypatch.setattr(fam, "JOINED_TEMPLATE", "never rendered in a simulation", raising=False)
    report = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path,
                                            progress=False, seed=1, sampler="grid", top_k=2))
    assert ".bwd." not in report.winner["variant"] and "halves" not in report.winner
    assert ".bwd." not in " ".join(r["variant"] for r in study.load(report.study_name).user_attrs["retimed"])


def test_searchers_sharing_a_study_stop_when_the_space_is_measured(small, tuner_home):
    """The second searcher finds every variant taken by the first: it waits for them to finish
    instead of copying them, and both end with the space measured once."""
    fam, path = small
    args = ["search", "--family", "scale_add", "--gpu", "H100", "--simulate", str(path), "--trials", "100",
            "--quiet", "--sampler", "random", "--simulate-delay", "0.5"]  # 4 s for the 8 variants
    procs = [_cli(*args, "--seed", "1", env_home=tuner_home)]  # the family's path: in the environment
    time.sleep(1.0)
    procs.append(_cli(*args, "--seed", "2", env_home=tuner_home))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    name = study.study_name("scale_add", "H100", fam.Problem().key(), "fwd+bwd")
    assert _measured(study.load(name)) == dict.fromkeys((v.name for v in fam.space()), 1)
    assert len(study.load(name).get_trials()) < 16  # a copy only where both took a variant at once
    evaluated = [r["variant"] for r in records.read(tuner_home / "studies" / f"{name}.jsonl")]
    assert sorted(evaluated) == sorted(v.name for v in fam.space())
    assert all("every variant of the space is measured: 8 of --trials 100" in err for _, err in outs)


def test_auto_with_a_recording_names_the_study_as_a_live_search_would(sim, tmp_path):
    from tuner.search.evaluate import SimulatedEvaluator

    assert SimulatedEvaluator(sim, giou.Problem(), "fwd+bwd", "auto").gpu_label == "H100"
    named = search.run(_cfg(sim, trials=5))
    assert search.run(_cfg(sim, trials=5, gpu="auto")).study_name == named.study_name
    other = simdata.write(tmp_path / "other.jsonl", gpu_name="NVIDIA Quantum X9")  # a GPU tuner has no name for
    assert SimulatedEvaluator(other, giou.Problem(), "fwd+bwd", "auto").gpu_label == "NVIDIA Quantum X9"


def test_a_batch_is_evaluated_as_its_units_are_built_not_once_all_are(small, monkeypatch):
    """A build that hands on its first half and compiles the second for a while: the first
    half's variants are evaluated meanwhile, and every trial is told once."""
    import threading

    from tuner.search import evaluate

    fam, path = small
    real_prepare, real_evaluate = evaluate.SimulatedEvaluator.prepare, evaluate.SimulatedEvaluator.evaluate
    compiling = threading.Event()
    during: list[bool] = []

    def prepare(self, variants, whole=False, on_ready=None):
        out = real_prepare(self, variants, whole)
        if on_ready is None or len(variants) < 2:
            return out
        half = len(variants) // 2
        compiling.set()
        on_ready({v.name: out[v.name] for v in variants[:half]})
        time.sleep(1.0)  # the second unit compiles
        compiling.clear()
        return out

    def evaluate_(self, variant, prepared, on_probe=None, slot=0):
        during.append(compiling.is_set())
        return real_evaluate(self, variant, prepared, on_probe, slot)

    monkeypatch.setattr(evaluate.SimulatedEvaluator, "prepare", prepare)
    monkeypatch.setattr(evaluate.SimulatedEvaluator, "evaluate", evaluate_)
    report = search.run(search.SearchConfig(gpu="H100", problem=fam.Problem(), trials=8, simulate=path,
                                            progress=False, seed=1, sampler="grid", batch=8, prune=False))
    st = study.load(report.study_name)
    assert len([t for t in st.get_trials() if t.state.name == "COMPLETE"]) == 8 and report.evaluated == 8
    assert during[:4] == [True] * 4 and during[4:8] == [False] * 4, during  # half while the rest compiled


def test_the_finalists_ranking_is_the_tables(sim):
    """`trials.fastest` (the search's end, without pandas) ranks as `top` over `trials_frame` does:
    verified variants, each once, fastest first."""
    report = search.run(_cfg(sim, trials=40, study="fastest", sampler="random"))
    st = study.load(report.study_name)
    space = giou.space()
    table = trials.top(trials.trials_frame(st, space), 1000)
    got = trials.fastest(st)
    assert len(got) > 10 and [r["variant"] for r in got] == list(table["variant"])
    assert [r["objective_us"] for r in got] == list(table["objective_us"])
    assert [r["fwd_us"] for r in got] == list(table["fwd_us"])
