"""Input sets shared by the variants a worker checks (tuner.measure.cases)."""

from tuner.measure.cases import Cases


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
