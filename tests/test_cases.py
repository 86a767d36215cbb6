"""Input sets shared by the variants a worker checks (tuner.measure.cases)."""

import types

from tuner.measure.cases import Cases, sized


def test_sets_are_given_in_turn_and_replaced_after_their_uses():
    made = []

    def make(seed):
        made.append(seed)
        return len(made)

    cases = Cases(sets=3, uses=2)
    got = [cases.get("k", make) for _ in range(12)]
    # three sets in turn, each used twice, then three fresh ones, and so on
    assert got == [1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6]
    assert len(set(made)) == 6  # fresh seeds
    assert cases.get("other", make) == 7  # a key has its own sets


def test_consecutive_checks_never_share_a_set():
    cases = Cases(sets=3, uses=8)
    got = [cases.get("k", lambda seed: object()) for _ in range(40)]
    assert all(a is not b for a, b in zip(got, got[1:]))
    assert len({id(g) for g in got}) >= 40 // 8


def test_a_set_made_ahead_serves_its_full_share_of_checks():
    made = []

    def make(seed):
        made.append(seed)
        return len(made)

    cases = Cases(sets=3, uses=2)
    cases.prime("k", make)
    cases.prime("k", make)  # once: the first check's set
    assert made and len(made) == 1
    got = [cases.get("k", make) for _ in range(7)]
    assert got == [1, 2, 3, 1, 2, 3, 4] and len(made) == 4


def test_large_sets_are_kept_fewer_and_dropped_before_their_replacement(monkeypatch):
    import torch

    from tuner.measure import cases as module

    monkeypatch.setattr(module, "CPU_BYTES", 3000)  # room for one set of 2,000 bytes, not two
    alive = []

    def make(seed):
        assert len([a for a in alive if a() is not None]) <= 1  # the used-up set is gone first
        case = {"x": torch.empty(500), "answers": [torch.empty(0, dtype=torch.float64)]}
        import weakref

        alive.append(weakref.ref(case["x"]))
        return case

    cases = Cases(sets=3, uses=2)
    made = []
    for _ in range(6):
        case = cases.get("k", make)
        made.append(alive.index(next(a for a in alive if a() is case["x"])))
        del case  # the test keeps none: what stays alive is what the sets hold
    assert made == [0, 0, 1, 1, 2, 2]  # one set at a time, each used twice
    assert module.nbytes({"a": torch.empty(3), "b": (torch.empty(2, dtype=torch.float64),)})[0] == 28


def test_a_large_set_made_ahead_is_the_only_one_kept(monkeypatch):
    import torch

    from tuner.measure import cases as module

    monkeypatch.setattr(module, "CPU_BYTES", 3000)
    made = []

    def make(seed):
        made.append(seed)
        return {"x": torch.empty(500)}

    cases = Cases(sets=3, uses=2)
    cases.prime("k", make)
    first = cases.get("k", make)
    assert cases.get("k", make) is first and len(made) == 1  # its second use, not a second set beside it


def test_a_check_takes_the_problem_with_its_sizes_capped():
    family = types.SimpleNamespace(CHECK_SIZES={"rows": 65536, "bags": 10, "absent": 3})
    problem = {"rows": 5_000_000, "bags": 4, "dim": 128, "mode": "sum"}
    assert sized(family, problem) == {"rows": 65536, "bags": 4, "dim": 128, "mode": "sum"}
    assert sized(types.SimpleNamespace(), problem) == problem
