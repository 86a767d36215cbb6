import pytest

from tuner.errors import SpaceError
from tuner.families import giou
from tuner.variant import Variant


def test_space_sizes():
    # 4*2*4*5*2*2*2 = 1280 points; hoisted needs k >= 2 (-80), block*k <= 4096 (-64).
    assert len(giou.space()) == 1136
    assert sum(len(s) for s in giou.all_spaces()) == 12 * 1136


def test_constraints_exclude_before_rendering():
    s = giou.space()
    names = {v.name for v in s}
    assert not any(".k1." in n and ".hoisted." in n for n in names)
    assert not any(".k8." in n and ".b1024." in n for n in names)
    with pytest.raises(SpaceError, match="hoisted"):
        s.variant(boxes_per_thread=1, padding="branch", validation="hoisted", block_size=64,
                  loads="scalar", reduction="atomic", backward="recompute")
    with pytest.raises(SpaceError, match="block_size=96"):
        s.variant(boxes_per_thread=1, padding="branch", validation="none", block_size=96,
                  loads="scalar", reduction="atomic", backward="recompute")


def test_variant_identity_is_stable_and_hashable():
    s = giou.space("bf16", "u8")
    v = s.variant(boxes_per_thread=4, padding="branch", validation="hoisted", block_size=256,
                  loads="vector", reduction="atomic", backward="recompute")
    assert v.name == "giou.bfloat16.uint8.k4.branch.hoisted.b256.vector.atomic.recompute"
    assert Variant.from_json(v.to_json()) == v
    assert hash(v) == hash(Variant.from_json(v.to_json()))
    assert v in s and v.replace(block_size=128) in s
    assert v not in giou.space("float32", "uint8")
    with pytest.raises(Exception):
        v.params = ()  # frozen
    assert giou.space(device_assert=True).variant(**s.tuned(v)).name.endswith(".device_assert")


def test_names_are_unique():
    names = [v.name for s in giou.all_spaces() for v in s]
    assert len(names) == len(set(names))


def test_covering_set_covers_every_value_and_dtype_pair():
    cover = giou.covering_set()
    for dim in giou.DIMS:
        assert {v[dim.name] for v in cover} == set(dim.values), dim.name
    assert {(v["pred"], v["target"]) for v in cover} == {
        (p, t) for p in giou.PRED_DTYPES for t in giou.TARGET_DTYPES}
    for v in cover:
        assert v in giou.space(v["pred"], v["target"])


def test_unknown_dtype_is_refused():
    with pytest.raises(SpaceError, match="float64"):
        giou.space("float64", "uint8")


def test_families_are_found_by_folder():
    from tuner import families
    from tuner.errors import SpaceError

    assert "giou" in families.names()
    assert families.get("giou").FAMILY == "giou"
    assert (families.templates("giou") / families.get("giou").TEMPLATE).is_file()
    with pytest.raises(SpaceError, match="unknown kernel family 'nope'; known: .*giou"):
        families.get("nope")


def test_parameter_names_are_identifiers():
    from tuner.errors import SpaceError
    from tuner.space import Dim, Space

    with pytest.raises(SpaceError, match="must be identifiers"):
        Space("toy", {}, [Dim("backward:vec", (1, 2), "a joined variant's key, not a dimension")])
