import re

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


@pytest.mark.parametrize("family,args,message", [
    ("rms_norm", ("float64",), "x dtype 'float64' is not one of ['float32', 'float16', 'bfloat16']"),
    ("cross_entropy", ("fp8",), "logits dtype 'fp8' is not one of"),
    ("embedding_bag", ("float32", "int16"), "index dtype 'int16' is not one of ['int64', 'int32']")])
def test_every_familys_space_names_the_dtypes_it_takes(family, args, message):
    from tuner import families

    with pytest.raises(SpaceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        families.get(family).space(*args)
    assert families.get(family).space(*(["bf16"] if family != "embedding_bag" else ["fp16", "i32"])).fixed


def test_dtype_names_and_sizes_read_torchs_aliases():
    from tuner.space import dtype_name, itemsize

    assert dtype_name("BF16", ("bfloat16",)) == "bfloat16" and dtype_name("half") == "float16"
    assert [itemsize(n) for n in ("bf16", "float32", "u8", "long")] == [2, 4, 1, 8]


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


def _toy_op():
    from tuner import declare

    return declare.Op("toy", inputs=(declare.Tensor("u", dtypes=("float32", "bfloat16")),
                                     declare.Tensor("v", like="u"), declare.Scalar("smooth_by", "float", 0.0),
                                     declare.Scalar("steps", "int", 1_000_000),
                                     declare.Scalar("mode", "str", "mean", choices=("none", "mean", "sum"))),
                      outputs=(declare.Tensor("out", like="u"),), sizes={"rows": "leading(u)", "cols": "u.size(-1)"})


def test_a_declared_problem_is_made_from_the_op():
    """Sizes, then each varying tensor's dtype, then the scalars asked for, in their order: fields,
    options of the command line and the key alike."""
    import dataclasses
    import pickle

    from tuner.cli import args as cli_args
    from tuner.families import rms_norm
    from tuner.space import problem_class

    Problem = problem_class(_toy_op(), "toy", {"rows": 64, "cols": 32, "u": "bf16", "smooth_by": 0},
                            scalars=("mode", "smooth_by", "steps"))
    assert Problem.family == "toy" and [f.name for f in dataclasses.fields(Problem)] == [
        "rows", "cols", "u", "mode", "smooth_by", "steps"]
    p = Problem()
    assert (p.u, p.mode, p.smooth_by, p.steps) == ("bfloat16", "mean", 0.0, 1_000_000)  # dtypes canonical, 0 a float
    assert p.key() == "R64-C32-bfloat16-mean-sb0-s1000000"
    assert Problem(3, 5, "float32", "sum", 0.125, -2).key() == "R3-C5-float32-sum-sb0.125-s-2"
    options = {f.name: f.metadata["option"] for f in dataclasses.fields(Problem)}
    assert options["cols"]["help"] == "cols: u.size(-1)" and options["u"] == {
        "help": "u dtype", "flag": None, "choices": None, "parse": None, "dtype": True}
    assert options["mode"]["choices"] == ("none", "mean", "sum") and options["mode"]["help"] == "mode: none, mean, sum"
    assert [getattr(cli_args, options[n]["parse"])(text) for n, text in (("smooth_by", "0.1"), ("steps", "-3"))] == [
        0.1, -3]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.rows = 1
    # RMSNorm's: the keys its studies and exports were made under
    assert rms_norm.Problem().key() == "R4096-W4096-bfloat16-bfloat16"
    assert rms_norm.Problem(12, 64, "float32", "float16").key() == "R12-W64-float32-float16"
    assert pickle.loads(pickle.dumps(rms_norm.Problem(3, 5))) == rms_norm.Problem(3, 5)  # found as its module's Problem
    assert problem_class(_toy_op(), "toy", {"rows": 1, "cols": 2, "u": "float32"}, key=lambda q: "one")().key() == "one"


def test_a_declared_problem_takes_fields_of_its_own():
    """`fields`: one that shapes the inputs alone follows the dtypes (and its value the key), one
    named as a made field replaces it; GIoU's Problem, made so, has the key of its studies."""
    import dataclasses

    from tuner.families import giou
    from tuner.space import option, problem_class

    Problem = problem_class(_toy_op(), "toy", {"rows": 64, "cols": 32, "u": "float32"}, scalars=("mode",),
                            fields={"spread": option("wide", "how u is drawn", flag="--draw", choices=("wide", "flat")),
                                    "cols": option(32, "columns", parse="size_or_zero")})
    assert [f.name for f in dataclasses.fields(Problem)] == ["rows", "cols", "u", "spread", "mode"]
    options = {f.name: f.metadata["option"] for f in dataclasses.fields(Problem)}
    assert options["spread"]["flag"] == "--draw" and options["cols"]["parse"] == "size_or_zero"
    assert Problem(cols=0, spread="flat").key() == "R64-C0-float32-flat-mean"
    assert giou.Problem().key() == "B1024-S256-bfloat16-uint8-article-mean"
    assert giou.Problem(64, 32, "float32", "float32", "full", "sum").key() == "B64-S32-float32-float32-full-sum"


@pytest.mark.parametrize("defaults, kw, message", [
    ({"rows": 1, "u": "float32"}, {}, r"toy's problem: give defaults\['cols'\]"),
    ({"rows": 1, "cols": 2, "u": "float64"}, {}, "u's default dtype 'float64' is not one of its dtypes"),
    ({"rows": 1, "cols": 2, "u": "float32", "colz": 3}, {}, "'colz' is no field of it"),
    ({"rows": 1, "cols": 2, "u": "float32"}, {"helps": {"mode": "?"}}, "'mode' is no field of it"),
    ({"rows": 1, "cols": 2, "u": "float32"}, {"scalars": ("v",)}, "'v' is no scalar of the op"),
])
def test_a_declared_problem_says_what_its_family_left_out(defaults, kw, message):
    from tuner.declare import DeclarationError
    from tuner.space import problem_class

    with pytest.raises(DeclarationError, match=message):
        problem_class(_toy_op(), "toy", defaults, **kw)


@pytest.mark.parametrize("parse, text, want", [("real", "-1e-3", -1e-3), ("real", "inf", None), ("real", "x", None),
                                               ("whole", "-100", -100), ("whole", "1.5", None),
                                               ("boolean", "True", True), ("boolean", "no", False),
                                               ("boolean", "maybe", None)])
def test_a_scalars_option_reads_its_type(parse, text, want):
    import argparse

    from tuner.cli import args as cli_args

    if want is None:
        with pytest.raises(argparse.ArgumentTypeError):
            getattr(cli_args, parse)(text)
    else:
        assert getattr(cli_args, parse)(text) == want


@pytest.mark.parametrize("family, fields, why", [
    ("embedding_bag", {"rows": -5}, "rows must be a whole number from 1 to 2147483647, got -5"),
    ("embedding_bag", {"dim": 1.5}, "dim must be a whole number from 1"),
    ("embedding_bag", {"bags": True}, "bags must be a whole number from 1"),
    ("embedding_bag", {"bag_size": -1}, "bag_size must be a whole number from 0"),
    ("embedding_bag", {"rows": 2**31}, "rows must be a whole number from 1 to 2147483647"),
    ("embedding_bag", {"mode": "avg"}, "mode must be one of sum, mean, max, got 'avg'"),
    ("embedding_bag", {"distribution": "zipf"}, "distribution must be one of random, one_hot, multi_hot"),
    ("embedding_bag", {"weight": 3}, "weight must be a word, got 3"),
    ("giou", {"reduction": "max"}, "reduction must be one of"),
    ("cross_entropy", {"label_smoothing": float("nan")}, "label_smoothing must be a number from 0 to 1, got nan"),
    ("cross_entropy", {"label_smoothing": 1.5}, "label_smoothing must be a number from 0 to 1"),
    ("rms_norm", {"width": "4096"}, "width must be a whole number from 1"),
])
def test_a_problem_built_in_python_takes_what_its_command_line_takes(family, fields, why):
    """`Problem(rows=-5)` went on to fail later (or ran on); now it is refused as `--rows -5` is,
    with a TunerError that is a ValueError too."""
    import numpy as np

    from tuner import families
    from tuner.errors import ProblemError, TunerError

    Problem = families.get(family).Problem
    with pytest.raises(ProblemError, match=re.escape(f"{family}'s problem: {why}")) as caught:
        Problem(**fields)
    assert isinstance(caught.value, TunerError) and isinstance(caught.value, ValueError)
    Problem()  # the defaults pass
    assert families.get("embedding_bag").Problem(rows=np.int64(7), bag_size=0).rows == 7  # NumPy's ints are whole
