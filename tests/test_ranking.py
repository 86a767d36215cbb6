"""The ranked sampler: its model ranks a known landscape, its batches are new variants, and
a warm start takes the family's other studies' best first."""

from pathlib import Path

import optuna
import pytest

from tuner import search
from tuner.store import records
from tuner.search.evaluate import SimulatedEvaluator
from tuner.families import giou
from tuner.search import asking
from tuner.search.ranking import Ranker

DATA = Path(__file__).parent / "data"
BF16 = giou.Problem(pred="bfloat16", target="uint8")
F32 = giou.Problem(pred="float32", target="float32")


def test_the_model_finds_the_best_of_a_landscape_it_can_express():
    """Time = a product of per-value costs and one interaction: after a quarter of the space is
    measured, the unseen variant it ranks first is the true best of the rest."""
    space = giou.space("bfloat16", "uint8")
    variants = list(space)

    def cost(v):
        t = {64: 1.3, 128: 1.1, 256: 1.0, 512: 1.05, 1024: 1.2}[v["block_size"]] * (1 + 0.1 * v["boxes_per_thread"])
        return t * (0.8 if v["loads"] == "vector" and v["boxes_per_thread"] == 1 else 1.0)

    ranker = Ranker(space, seed=0)
    known = {v.name: cost(v) for v in variants[::4]}
    unseen = [v.name for v in variants if v.name not in known]
    first = ranker.pick(1, known, unseen)[0]
    by_name = {v.name: v for v in variants}
    assert cost(by_name[first]) == pytest.approx(min(cost(by_name[n]) for n in unseen))


def test_a_batch_is_distinct_unseen_variants_and_failures_are_left_out():
    space = giou.space("bfloat16", "uint8")
    names = [v.name for v in space]
    outcomes = {n: float(i % 7 + 1) for i, n in enumerate(names[:40])}
    outcomes[names[40]] = None  # a failure
    unseen = names[41:]
    batch = Ranker(space, seed=1).pick(32, outcomes, unseen)
    assert len(batch) == len(set(batch)) == 32 and set(batch) <= set(unseen)
    assert Ranker(space, seed=1).pick(32, outcomes, unseen) == batch  # seeded


def _run(problem, data, storage, study, trials, **kw):
    cfg = search.SearchConfig(gpu="auto", problem=problem, trials=trials, simulate=data, seed=0, progress=False,
                              storage=storage, study=study, **kw)
    ev = SimulatedEvaluator(data, problem, "fwd+bwd", "auto")
    try:
        return search.Search(cfg, ev).run()
    finally:
        ev.close()


def test_a_first_batch_spreads_evenly_over_values_and_pairs():
    """Every value of every dimension about equally often (a 2-valued one 16 +- 1 times of 32),
    and every pair of values of two dimensions at least once: what a model of values and pairs
    needs to rank the next batch. A seeded random sample misses pairs."""
    import itertools
    from collections import Counter

    space = giou.space("bfloat16", "uint8")
    by_name = {v.name: v for v in space}
    picks = [by_name[n] for n in Ranker(space, seed=3).spread(32, list(by_name), chosen=[])]
    assert len({v.name for v in picks}) == 32
    for d in space.dims:
        counts = Counter(v[d.name] for v in picks)
        assert set(counts) == set(d.values) and max(counts.values()) - min(counts.values()) <= 2, d.name

    def pairs(variants):
        return {(a.name, v[a.name], b.name, v[b.name]) for v in variants for a, b in itertools.combinations(space.dims, 2)}

    assert pairs(picks) == pairs(space)
    # those already chosen count: a second spread fills in around the first
    more = Ranker(space, seed=3).spread(8, [n for n in by_name if n not in {v.name for v in picks}],
                                         chosen=[v.name for v in picks])
    assert not set(more) & {v.name for v in picks}


def test_a_warm_start_tries_the_other_studies_best_first(tuner_home):
    storage = optuna.storages.InMemoryStorage()
    _run(F32, DATA / "h100-giou-f32-f32.jsonl", storage, "f32", 300, sampler="random")
    report = _run(BF16, DATA / "h100-giou-bf16-u8.jsonl", storage, "bf16", asking.FIRST_BATCH, batch=64)
    f32 = optuna.load_study(study_name="f32", storage=storage)
    done = sorted((t for t in f32.get_trials(deepcopy=False) if t.value is not None), key=lambda t: t.value)
    best_params = [t.params for t in done[: max(1, int(len(done) * asking.WARM_TOP))]]
    # the other study's best that this space has, up to half the first batch; the rest spread
    warm = asking.warm_start(storage, "giou", "bf16", giou.space("bfloat16", "uint8"))
    assert report.warm_started == min(asking.FIRST_BATCH // 2, len(warm)) > 0
    st = optuna.load_study(study_name="bf16", storage=storage)
    first = sorted(st.get_trials(deepcopy=False), key=lambda t: t.number)[: report.warm_started]
    assert all(t.params in best_params for t in first)
    cold = _run(BF16, DATA / "h100-giou-bf16-u8.jsonl", storage, "bf16-cold", asking.FIRST_BATCH, batch=64,
                warm_start=False)
    assert cold.warm_started == 0


def test_ranked_measures_each_variant_once_and_logs_it(tuner_home):
    report = _run(BF16, DATA / "h100-giou-bf16-u8.jsonl", None, "ranked", 100, batch=32)
    logged = [r["variant"] for r in records.read(report.records_path)]
    assert report.trials == 100 and report.duplicates == 0 and len(logged) == len(set(logged)) == 100
