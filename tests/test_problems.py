"""Several captured problems searched in one command, on CPU: trials split by share, each problem
its own study warm-started from the others', the baseline's recorded timings replayed beside the
finalists, and an export that serves each problem with its winner or with torch's op."""

import json
from pathlib import Path
import subprocess
import sys

import pytest

from tuner.deploy import export
from tuner.families import giou
from tuner.search import problems

DATA = "tests/data/h100-giou-bf16-u8.jsonl"


def test_trials_split_by_share_with_a_floor():
    assert problems.split([0.75, 0.25], 200) == [300, 100]
    assert problems.split([0.6, 0.3, 0.1], 100) == [180, 90, 64]  # each gets a first batch and a ranked one
    assert problems.split([0.9, 0.05, 0.05], 100) == [200, 64, 64]  # and none more than twice the average
    assert problems.split([0.0, 0.0], 100) == [100, 100]  # nothing timed: an even split


def _recording(tmp_path):
    """The bf16/uint8 recording for the default problem, and the same variants 5x faster for a
    small one; torch's op recorded slower than every variant at the default problem and faster
    than every one at the small problem."""
    big, small = giou.Problem(), giou.Problem(batch=64, slots=32)
    lines = []
    for line in open(DATA):
        rec = json.loads(line)
        lines.append(rec)
        fast = {**rec, "problem": small.key()}
        for half in ("fwd", "bwd"):
            if half in fast:
                fast[half] = {**fast[half], "median_us": fast[half]["median_us"] / 5}
        lines.append(fast)
    t = lambda f, b: {"fwd": {"median_us": f, "spread_us": 0.1}, "bwd": {"median_us": b, "spread_us": 0.1}}  # noqa: E731
    lines += [{"problem": big.key(), "baseline": t(500.0, 900.0)}, {"problem": small.key(), "baseline": t(0.5, 0.5)}]
    path = tmp_path / "recording.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"format": 1, "problems": [
        {"family": "giou", "problem": small.__dict__, "calls": 10, "time_us": 100.0},
        {"family": "giou", "problem": big.__dict__, "calls": 10, "time_us": 300.0}]}))
    return path, shapes


def _tuner(*args, home):
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=600,
                          env={"TUNER_HOME": str(home), "PATH": "/usr/bin:/bin", "HOME": str(home)})


@pytest.mark.slow
def test_captured_problems_searched_and_exported_with_the_baseline(tmp_path):
    recording, shapes = _recording(tmp_path)
    run = _tuner("search", "--gpu", "H100", "--simulate", str(recording), "--problems", str(shapes), "--trials", "40",
                 "--quiet", "--seed", "1", home=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    first, second = out.index("[1/2] giou"), out.index("[2/2] giou")
    # the problem as tuner.space.describe writes it: its dtypes, then every other field
    assert "bfloat16/uint8 batch=1024 slots=256 article mean: 75% of the captured time, 64 trials" in out[first:second]  # the larger share first
    assert "batch=64 slots=32 article mean: 25% of the captured time, 64 trials" in out[second:]
    big = next(line for line in out.splitlines() if line.startswith("  ") and "batch=1024" in line)
    small = next(line for line in out.splitlines() if line.startswith("  ") and "batch=64" in line)
    assert big.endswith("the winner serves it") and small.endswith("torch's op serves it")
    warm = int(small.split("(")[1].split()[0])
    assert warm > 0  # the second problem's first batch began from the first one's best
    assert "variants serve 1 of 2 problems" in out
    run = _tuner("export-best", "--gpu", "H100", "--sources-only", home=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "torch's op serves 1 of them" in run.stdout
    manifest = export.read(tmp_path / "exports" / "giou-H100")
    served = {e["problem"]["batch"]: e["served_by"] for e in manifest["entries"]}
    assert served == {1024: "variant", 64: "torch"}
    assert all(e["baseline_us"]["fwd"]["median_us"] > 0 for e in manifest["entries"])


def test_a_problem_whose_op_was_slower_than_torch_when_checked_goes_to_torch(tmp_path, monkeypatch):
    """export-best's check (tuner.deploy.serving, on the GPU) times the op itself against torch's: a kind
    of call slower in a cell, or not timed in one, is served by torch's op (training calls by the
    forward+backward cells, both kinds where both lost); the ratios stay in the manifest."""
    from tuner.deploy import serving
    from tuner.store import study as studies

    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    recording, shapes = _recording(tmp_path)
    run = _tuner("search", "--gpu", "H100", "--simulate", str(recording), "--problems", str(shapes), "--trials", "40",
                 "--quiet", "--seed", "1", home=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    names = studies.names_on("giou", "H100")
    big = giou.Problem().__dict__
    cells = {"fwd GPU": 0.6, "fwd+bwd GPU": 0.7, "fwd wall": 0.9}
    for fwd, wall, served, kind in ((0.9, 0.95, "variant", None), (0.9, 1.2, "variant", "training"),
                                    (0.9, None, "variant", "training"), (1.1, 1.2, "torch", None)):
        checked = {export.problem_key(big): {**cells, "fwd wall": fwd, "fwd+bwd wall": wall}}
        out = export.export(names, tmp_path / "out", checked=checked, binaries=False)
        entry = next(e for e in export.read(out)["entries"] if e["problem"] == big)
        assert (entry["served_by"], entry.get("torch_serves")) == (served, kind)
        assert entry["checked"]["fwd+bwd wall"] == wall
    assert studies.load(names[0]).user_attrs["baseline"]
    for family in ("giou", "rms_norm"):  # every declared family has a bench of its problems: only a GPU is wanted
        why = serving.checkable({"family": family, "arch": "sm_2000"})  # no GPU, or none of that arch
        assert why == "no GPU is attached" or why.startswith("the attached GPU is")


@pytest.mark.parametrize("family, argv, want", [
    ("giou", ["--pred", "bf16", "--target", "u8", "--boxes", "full", "--batch", "64"],
     {"pred": "bfloat16", "target": "uint8", "distribution": "full", "batch": 64}),
    ("rms_norm", ["--x", "fp16", "--weight", "float32", "--rows", "3"], {"x": "float16", "weight": "float32", "rows": 3}),
    ("embedding_bag", ["--bag-size", "0", "--ids", "one_hot", "--index", "i32"],
     {"bag_size": 0, "distribution": "one_hot", "index": "int32"}),
    ("cross_entropy", ["--label-smoothing", "0.1", "--reduction", "sum", "--vocab", "1001"],
     {"label_smoothing": 0.1, "reduction": "sum", "vocab": 1001}),
])
def test_a_problem_is_made_from_its_declared_options(family, argv, want):
    from tuner.cli import main as cli
    from tuner.cli import target

    args = cli.parser(family).parse_args(["search", "--family", family, "--gpu", "H100", *argv])
    made = target.problem(args)
    assert {k: getattr(made, k) for k in want} == want
    assert type(made).__name__ == "Problem" and made.family == family


def test_a_declared_option_checks_its_values_through_the_space(capsys):
    from tuner.cli import main as cli

    assert cli.main(["search", "--family", "rms_norm", "--gpu", "H100", "--x", "int8"]) == 2  # a usage error
    assert capsys.readouterr().err.strip() == "tuner search: error: x dtype 'int8' is not one of ['float32', 'float16', 'bfloat16']"
    with pytest.raises(SystemExit) as stop:
        cli.parser("embedding_bag").parse_args(["search", "--gpu", "H100", "--bag-size", "-1"])
    assert stop.value.code == 2


def test_dtypes_name_one_problem_each_at_the_options_sizes_and_training_is_the_family_s_word():
    from tuner.cli import main as cli
    from tuner.cli import target
    from tuner.families import cross_entropy, rms_norm

    args = cli.parser("rms_norm").parse_args(["search", "--family", "rms_norm", "--gpu", "H100", "--rows", "64",
                                              "--dtypes", "training"])
    made = target.dtype_problems(args)
    assert [(p.x, p.weight) for p in made] == list(rms_norm.TRAINING_DTYPES)
    assert ("bfloat16", "float32") in rms_norm.TRAINING_DTYPES and {p.rows for p in made} == {64}
    args = cli.parser("cross_entropy").parse_args(["search", "--family", "cross_entropy", "--gpu", "H100",
                                                   "--dtypes", "float32,bf16,float32"])
    assert [p.logits for p in target.dtype_problems(args)] == ["float32", "bfloat16"]  # once each
    assert ("float32",) in cross_entropy.TRAINING_DTYPES


@pytest.mark.parametrize("argv, why", [
    (["--dtypes", "training", "--x", "float16"], "--dtypes names each problem's dtypes: drop --x"),
    (["--dtypes", "training", "--study", "s"], "--dtypes searches one study per problem, named after it: drop --study"),
    (["--dtypes", "training", "--problems", "shapes.json"], "--problems and --dtypes each name the problems"),
    (["--dtypes", "bfloat16/int8"], "int8 is no weight dtype"),
    (["--family", "giou", "--dtypes", "training"], "giou names no dtypes models train with"),
])
def test_dtypes_beside_what_names_the_problem_another_way_is_a_usage_error(argv, why, capsys):
    from tuner.cli import main as cli

    try:
        code = cli.main(["search", "--gpu", "H100", *(argv if "--family" in argv else ["--family", "rms_norm", *argv])])
    except SystemExit as stop:  # refused by the parser itself
        code = stop.code
    assert code == 2
    assert why in capsys.readouterr().err


@pytest.mark.slow
def test_a_search_of_several_dtypes_makes_a_study_of_each(tmp_path):
    recording = tmp_path / "three.jsonl"
    recording.write_text("".join((Path(__file__).parent / "data" / f"h100-giou-{n}.jsonl").read_text() for n in ("bf16-u8", "f16-u8", "f32-f32")))
    run = _tuner("search", "--gpu", "H100", "--simulate", str(recording), "--dtypes", "bf16/u8,f16/u8,float32",
                 "--trials", "64", "--quiet", home=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "3 problems from --dtypes:" in run.stdout and "33% of the trials, 64 trials" in run.stdout
    run = _tuner("export-best", "--gpu", "H100", "--sources-only", home=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    manifest = export.read(tmp_path / "exports" / "giou-H100")
    assert sorted((e["problem"]["pred"], e["problem"]["target"]) for e in manifest["entries"]) == [
        ("bfloat16", "uint8"), ("float16", "uint8"), ("float32", "float32")]


def test_a_search_that_names_no_problem_tunes_the_family_s_default_problems_each_its_share_of_trials(monkeypatch):
    from tuner.cli import args as cli_args
    from tuner.cli import main as cli
    from tuner.cli import problems as cli_problems
    from tuner.families import embedding_bag as eb
    from tuner.search.config import SearchConfig

    def named(*argv):
        argv = ["search", "--family", "embedding_bag", "--gpu", "H100", *argv]
        p = cli.parser("embedding_bag")
        args = p.parse_args(argv)
        args.options = cli_args.given_options(p, "search", argv)  # as the command makes it
        return args, cli_problems.named(args)

    args, found = named()
    assert [(p.key(), share) for p, share in found] == [(eb.Problem(**change).key(), share)
                                                       for change, share in eb.DEFAULT_PROBLEMS]
    assert found[0][0] == eb.Problem() and found[1][0].bag_size < 20
    for given in (["--bag-size", "20"], ["--bag-s", "20"], ["--weight=float16"], ["--study", "mine"],
                  ["--import-records", "r.jsonl"], ["--simulate", "r.jsonl"]):  # `--bag-s`: argparse's abbreviation
        assert named(*given)[1] is None, given  # a problem or one study named: that one alone
    assert named("--dtypes", "float16/int64")[1][0][0].bag_size == eb.Problem().bag_size  # --dtypes: the options' sizes

    # each default problem gets its share of --trials (200: all of them, and 67), a study each, as `--problems`
    # searches them
    seen = []
    monkeypatch.setattr("tuner.search.problems.run", lambda cfgs, *a: seen.extend(cfgs) or [])
    cli_problems.search(SearchConfig(gpu="H100", problem=found[0][0], trials=args.trials), found, args, 0.0)
    assert [c.trials for c in seen] == [200, 67] and [c.problem for c in seen] == [p for p, _ in found]
    assert all(c.study is None for c in seen)
    seen.clear()  # however few: a quick search stays quick
    cli_problems.search(SearchConfig(gpu="H100", problem=found[0][0], trials=12), found, args, 0.0)
    assert [c.trials for c in seen] == [12, 4]
