"""The command line's answers to bad input: one line on stderr and exit 1 (our errors, files,
storages) or exit 2 (usage), never a traceback; and what a failing command leaves behind: nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import tuner
from tuner.cli import main as cli
from tuner.errors import GpuError

REC = Path(__file__).parent / "data" / "h100-giou-bf16-u8.jsonl"
STUDY = "giou-H100-B1024-S256-bfloat16-uint8-article-mean-fwd+bwd"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str, command: str) -> str:
    """The one line of a failed command."""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tuner {command}: error: "), err
    return lines[0]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh TUNER_HOME that is also the working folder, on a machine without a GPU."""
    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return tmp_path


@pytest.fixture(scope="module")
def one_study(tmp_path_factory):
    """A journal holding one study of 10 trials (replayed measurements)."""
    where = tmp_path_factory.mktemp("one-study")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_HOME", str(where))
        assert cli.main(["search", "--gpu", "H100", "--simulate", str(REC), "--trials", "10", "--quiet"]) == 0
    return where / "studies" / "tuner.journal"


def _with_study(home: Path, journal: Path) -> None:
    (home / "studies").mkdir()
    shutil.copy(journal, home / "studies" / "tuner.journal")


# ------------------------------------------------------------------ storages

def test_a_folder_as_storage_is_one_line(home, capsys):
    (home / "d").mkdir()
    for argv in (["list"], ["show", "--study", "x"], ["report", "--study", "x"], ["export-best", "--gpu", "H100"],
                 ["search", "--gpu", "H100", "--simulate", str(REC), "--trials", "5", "--quiet"]):
        code, _, err = run(capsys, *argv, "--storage", "d")
        assert code == 1
        assert "storage d: a folder" in error_line(err, argv[0])


def test_a_device_or_pipe_as_storage_is_one_line(home, capsys):
    """Read as a journal, /dev/zero filled the memory and a pipe waited for ever; /dev/null (read
    empty) stands for both here."""
    for argv in (["list"], ["show", "--study", "x"], ["search", "--gpu", "H100", "--simulate", str(REC), "--trials", "5",
                                                     "--quiet"]):
        for storage in ("/dev/null", "sqlite:////dev/null"):
            code, _, err = run(capsys, *argv, "--storage", storage)
            assert code == 1
            assert f"storage {storage}: not a regular file" in error_line(err, argv[0])
    assert list(home.iterdir()) == []


def test_a_study_name_read_from_a_storage_never_leads_its_files_elsewhere(home):
    from tuner.errors import TunerError
    from tuner.store import study

    for name in ("../../x", "/tmp/x", "a\\b", ".x", "a\nb", ""):
        with pytest.raises(TunerError, match="cannot name a file"):
            study.records_path(name)
    assert study.records_path("giou-H100-B1024-fwd+bwd").name == "giou-H100-B1024-fwd+bwd.jsonl"


def test_a_measurement_log_that_cannot_be_written_fails_before_the_study_is_made(home, capsys):
    """It failed at the first trial, leaving a study of one finished and two running trials."""
    log = home / "studies" / "giou-H100-B1024-S256-bfloat16-uint8-article-mean-fwd+bwd.jsonl"
    log.mkdir(parents=True)
    code, _, err = run(capsys, "search", "--gpu", "H100", "--simulate", str(REC), "--trials", "3", "--quiet")
    assert code == 1 and f"{log}: Is a directory" in error_line(err, "search")
    assert sorted(p.name for p in (home / "studies").iterdir()) == [log.name]  # no journal, no study


def test_an_unknown_scheme_is_one_line(home, capsys):
    code, _, err = run(capsys, "list", "--storage", "foo://bar")
    assert code == 1 and "storage foo://bar: unknown scheme 'foo'" in error_line(err, "list")
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("url", ["postgresql://u:secret@127.0.0.1:1/db",
                                 "journal+postgresql://u:secret@127.0.0.1:1/db"])
def test_an_unreachable_postgres_is_one_line_at_once(home, capsys, url):
    # port 1 on the loopback refuses at once: the error must not wait on retries (timed without the
    # first imports of the driver and its dialect, seconds on 2 busy cores)
    import optuna  # noqa: F401
    import psycopg  # noqa: F401
    import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401

    started = time.monotonic()
    code, _, err = run(capsys, "show", "--study", "x", "--storage", url)
    assert time.monotonic() - started < 5
    line = error_line(err, "show")
    assert code == 1 and "127.0.0.1" in line and "secret" not in line and "***" in line


@pytest.mark.filterwarnings("ignore::tuner.store.journal_records.JournalDamageWarning")  # the damage, on purpose
def test_a_damaged_journal_is_no_traceback(home, capsys):
    (home / "bad.journal").write_bytes(b'{"op_code": 0, "worker_id": "w", "study_name": "other", "directions": [1]}\n'
                                       b"garbage\n\x00\xff\xfe\n[1, 2]\n")  # a record, then damage
    code, _, err = run(capsys, "show", "--study", "x", "--storage", "bad.journal")
    assert code == 1 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("tuner show: error: no study 'x' in bad.journal")


@pytest.mark.filterwarnings("ignore::tuner.store.journal_records.JournalDamageWarning")  # the damage, on purpose
def test_records_of_the_wrong_types_are_damage_not_a_crash(home, capsys, one_study):
    """Valid JSON of the wrong types (a trial's value a string, a result that is no object, a
    spill count that is no number): show, list and report skip or ignore them, in one warning."""
    import json

    lines = [json.loads(line) for line in one_study.read_text().splitlines()]
    tells = [r for r in lines if r["op_code"] == 6]
    tells[1]["values"] = ["x"]
    results = [r for r in lines if r["op_code"] == 8 and "result" in r["user_attr"]]
    results[2]["user_attr"] = {"result": "oops"}
    results[3]["user_attr"]["result"]["spill_bytes"] = "many"
    (home / "typed.journal").write_text("".join(json.dumps(r) + "\n" for r in lines))
    for argv in (["show"], ["list"], ["report", "--out", "rep"]):
        code, out, err = run(capsys, *argv, "--storage", "typed.journal")
        assert code == 0 and "error" not in err, err
    assert (home / "rep" / "trials.csv").exists()
    from tuner.store import journal_records

    assert journal_records.parse(json.dumps(tells[1]).encode())[1] == "values of the wrong type"


@pytest.mark.filterwarnings("ignore::tuner.store.journal_records.JournalDamageWarning")  # the damage, on purpose
@pytest.mark.parametrize("attr", [{"gpu": "x"}, {"retimed": "x"}, {"retimed": [1, 2]}, {"baseline": 5},
                                  {"winner": "oops"}, {"problem": [1]}])
def test_a_study_attribute_of_the_wrong_type_is_damage_not_a_crash(home, capsys, one_study, attr):
    """A study's attribute of another type than a search writes (an editor, another tool) is a
    damaged record: show, list and export-best go on with the study as it was before it."""
    import json

    from tuner.store import journal_records

    record = {"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": attr}
    (home / "typed.journal").write_text(one_study.read_text() + json.dumps(record) + "\n")
    for argv in (["show"], ["list"], ["export-best", "--gpu", "H100", "--sources-only", "--out", "exp"]):
        code, _, err = run(capsys, *argv, "--storage", "typed.journal")
        assert code == 0 and "error" not in err, (argv, err)
    assert journal_records.parse(json.dumps(record).encode())[1] == f"study attribute {next(iter(attr))} of the wrong type"


def test_a_missing_driver_names_the_projects_extra(home, capsys, monkeypatch):
    from tuner.store import journal

    def no_psycopg(url):
        raise ImportError("No module named 'psycopg'")

    monkeypatch.setattr(journal, "storage", no_psycopg)
    code, _, err = run(capsys, "list", "--storage", "journal+postgresql://u@127.0.0.1:1/db")
    assert code == 1 and "pip install -e '.[postgres]'" in error_line(err, "list")


# ------------------------------------------------------------------ numbers, checked by the parser

RANGES = [
    ["build", "--gpu", "H100", "--limit", "-3"], ["build", "--gpu", "H100", "--limit", "0"],
    ["build", "--gpu", "H100", "--jobs", "0"], ["variants", "--gpu", "H100", "--limit", "-1"],
    *[["search", "--family", "cross_entropy", "--gpu", "H100", "--label-smoothing", v] for v in ("-0.1", "1.5")],
    *[["search", "--gpu", "H100", "--simulate", str(REC), flag, value] for flag, value in [
        ("--trials", "-5"), ("--trials", "0"), ("--trials", "1e30"), ("--trials", str(10**30)), ("--timeout", "-1"),
        ("--timeout", "0"), ("--timeout", "inf"), ("--timeout", "nan"), ("--jobs", "0"), ("--jobs", "100000"),
        ("--ask-batch", "0"), ("--top-k", "0"), ("--eval-timeout", "0"), ("--eval-timeout", "1e30"),
        ("--prune", "0.5"), ("--prune", "1"), ("--prune", "-1"), ("--prune", "nan"), ("--seed", "-1"),
        ("--seed", str(2**32)), ("--simulate-delay", "-1"), ("--devices", "0,0"), ("--devices", "x"),
        ("--devices", ""), ("--batch", "0"), ("--slots", "-1"), ("--batch", "1.5")]],
    ["show", "--top-k", "0"], ["show", "--top-k", "x"],
    *[["samplers", "--simulate", str(REC), flag, value] for flag, value in [
        ("--seeds", "0"), ("--first-seed", "-1"), ("--within", "2"), ("--within", "nan"), ("--max-trials", "0"),
        ("--fail-above", "101"), ("--fail-above", "-1")]],
    ["dashboard", "--port", "0"], ["dashboard", "--port", "65536"],
    ["search", "--family", "embedding_bag", "--gpu", "H100", "--rows", "0"],
    ["search", "--family", "embedding_bag", "--gpu", "H100", "--bag-size", "-1"],
    ["show", "--family", "rms_norm", "--gpu", "H100", "--width", "0"],
    ["bench", "--shapes", "64x0"], ["bench", "--dtypes", "bfloat16/uint8/float32"],
    ["bench", "--family", "rms_norm", "--shapes", "4096x"], ["bench", "--family", "rms_norm", "--shapes", "1x2x3"],
]


@pytest.mark.parametrize("argv", RANGES, ids=lambda a: " ".join(x if len(x) < 30 else "REC" for x in a))
def test_numbers_out_of_range_are_usage_errors(home, capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tuner {argv[0]}: error: ")  # the usage only with --help
    assert lines[0].endswith(f"(`tuner {argv[0]} --help` shows the usage)")
    assert list(home.iterdir()) == []  # --trials 0 made no empty study


def test_the_ends_of_the_ranges_are_accepted(home, capsys):
    code, out, _ = run(capsys, "variants", "--gpu", "H100", "--limit", "0")
    assert code == 0 and "more" not in out
    code, out, _ = run(capsys, "search", "--gpu", "H100", "--simulate", str(REC), "--trials", "1", "--prune", "0",
                       "--seed", str(2**32 - 1), "--top-k", "1", "--quiet")
    assert code == 0 and "1 trials" in out


# ------------------------------------------------------------------ no GPU

def test_bench_without_a_gpu_says_what_was_asked(home, capsys):
    code, _, err = run(capsys, "bench", "--gpu", "H100")
    line = error_line(err, "bench")
    assert code == 1 and line.startswith("tuner bench: error: --gpu H100: no CUDA GPU is attached "
                                         "(torch.cuda.is_available() is False)")
    assert "auto" not in line


def test_load_auto_without_a_gpu_names_the_call(home):
    with pytest.raises(GpuError, match=r"^tuner\.load\(gpu='auto'\): no CUDA GPU is attached") as caught:
        tuner.load(gpu="auto")
    assert "--gpu" not in str(caught.value)


@pytest.mark.parametrize("argv", [["variants", "--gpu", "auto"], ["show", "--gpu", "auto"],
                                  ["export-best", "--gpu", "auto"], ["search", "--gpu", "auto"],
                                  ["search", "--gpu", "H100"]])
def test_auto_without_a_gpu_is_one_line_and_writes_nothing(home, capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 1 and "no CUDA GPU is attached" in error_line(err, argv[0])
    assert list(home.iterdir()) == []


# ------------------------------------------------------------------ which study

def test_bare_show_and_report_read_the_only_study(home, capsys, one_study, tmp_path_factory, monkeypatch):
    _with_study(home, one_study)
    elsewhere = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(elsewhere)
    code, out, _ = run(capsys, "show")
    assert code == 0 and out.startswith(f"study {STUDY}")
    code, out, _ = run(capsys, "report")
    assert code == 0 and (home / "reports" / STUDY / "trials.csv").exists()
    assert list(elsewhere.iterdir()) == []  # reports go under TUNER_HOME, not the working folder
    code, _, _ = run(capsys, "report", "--out", "mine")
    assert code == 0 and (elsewhere / "mine" / "trials.csv").exists()


def test_bare_show_with_two_studies_lists_them(home, capsys, one_study):
    _with_study(home, one_study)
    assert run(capsys, "search", "--gpu", "H100", "--simulate", str(REC), "--trials", "5", "--quiet",
               "--study", "second")[0] == 0
    for command in ("show", "report"):
        code, _, err = run(capsys, command)
        line = error_line(err, command)
        assert code == 1 and STUDY in line and "second" in line and "--study" in line
    assert not (home / "reports").exists()
    code, out, _ = run(capsys, "show", "--study", "second")
    assert code == 0 and out.startswith("study second")


def test_options_that_name_a_study_keep_asking_for_the_gpu(home, capsys, one_study):
    _with_study(home, one_study)
    code, _, err = run(capsys, "show", "--batch", "512")
    assert code == 1 and "--gpu" in error_line(err, "show")


@pytest.mark.parametrize("argv", [["show"], ["report"], ["show", "--study", "x"], ["report", "--study", "x"],
                                  ["export-best", "--gpu", "H100"], ["export-best", "--study", "x"],
                                  ["dashboard"], ["show", "--storage", "sub/x.journal", "--study", "x"],
                                  ["report", "--storage", "sqlite:///sub/x.db", "--study", "x"]])
def test_read_only_commands_that_fail_create_nothing(home, capsys, argv, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # not installed: one line
    code, _, err = run(capsys, *argv)
    assert code == 1
    error_line(err, argv[0])
    assert list(home.iterdir()) == []


def test_list_of_a_missing_storage_creates_nothing(home, capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0 and out.startswith("no studies in")
    assert list(home.iterdir()) == []


# ------------------------------------------------------------------ files

@pytest.mark.parametrize("flag", ["--simulate", "--import-records"])
@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"[1, 2]\n5\n", None,
                                     b"[" * 100_000 + b"]" * 100_000 + b"\n"])  # nested past Python's stack
def test_a_file_that_is_no_measurement_log_is_one_line(home, capsys, flag, content):
    path = home / "f.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    argv = ["search", "--gpu", "H100", "--simulate", str(REC), "--trials", "5", "--quiet", flag, str(path)]
    code, _, err = run(capsys, *argv)
    assert code == 1 and f"{flag} {path}" in error_line(err, "search")


def test_export_best_refuses_a_wheel_without_binaries_before_writing(home, capsys, one_study):
    _with_study(home, one_study)
    code, _, err = run(capsys, "export-best", "--gpu", "H100", "--sources-only", "--wheel", "w")
    assert code == 2 and "--sources-only" in error_line(err, "export-best")
    assert not (home / "exports").exists()


# ------------------------------------------------------------------ main's handling

def test_a_study_without_a_trial_is_left_out_of_its_gpus_export(home, capsys, one_study):
    """A search stopped before its first trial (its --timeout spent at once) left a study that made
    every export of its GPU fail (KeyError); it is left out, with a line that says so."""
    import optuna

    from tuner.store import study

    _with_study(home, one_study)
    storage = study.storage(str(home / "studies" / "tuner.journal"))
    (made,) = optuna.get_all_study_summaries(storage)
    empty = optuna.create_study(storage=storage, study_name="giou-H100-B64-S256-bfloat16-uint8-article-mean-fwd+bwd")
    for k, v in made.user_attrs.items():  # the same family and GPU, another problem, no trial
        empty.set_user_attr(k, {**v, "batch": 64} if k == "problem" else v)
    with pytest.warns(UserWarning, match="B64-S256.*has no verified trial: left out of the export"):
        code, out, err = run(capsys, "export-best", "--gpu", "H100", "--sources-only")
    assert code == 0, err
    manifest = json.loads((home / "exports" / "giou-H100" / "manifest.json").read_text())
    assert [e["problem"]["batch"] for e in manifest["entries"]] == [1024]
    code, _, err = run(capsys, "export-best", "--gpu", "H100", "--study",
                       "giou-H100-B64-S256-bfloat16-uint8-article-mean-fwd+bwd", "--sources-only")
    assert code == 1 and "has no verified trial to export" in error_line(err, "export-best")


def test_an_unexpected_error_is_one_line_with_the_way_to_its_traceback(home, capsys, monkeypatch):
    def broken(args):
        raise RuntimeError("boom\nmore")

    monkeypatch.setitem(cli.COMMANDS, "list", broken)
    code, _, err = run(capsys, "list")
    assert code == 1 and "RuntimeError: boom" in error_line(err, "list") and "--debug" in err
    for argv in (["--debug", "list"], ["list", "--debug"]):
        with pytest.raises(RuntimeError):
            cli.main(argv)


def test_interrupted(home, capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "list", interrupted)
    code, _, err = run(capsys, "list")
    assert code == 130 and err == "tuner list: interrupted\n"


def test_a_warning_is_one_line(home, capsys, monkeypatch):
    def warns(args):
        warnings.warn("careful", UserWarning)
        return 0

    # pytest records warnings; print them as Python does outside it, through formatwarning
    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    monkeypatch.setitem(cli.COMMANDS, "list", warns)
    before = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "showwarning", show)
        code, _, err = run(capsys, "list")
    assert code == 0 and err == "tuner list: warning: careful\n"
    assert warnings.formatwarning is before  # the CLI's format is its own, not left behind


@pytest.mark.parametrize("argv", [
    ["variants", "--gpu", "NOPE"], ["variants", "--arch", "banana"], ["variants", "--arch", "sm_999"],
    ["variants", "--gpu", "H100", "--pred", "int8"],
    ["samplers", "--simulate", str(REC), "--samplers", "foo"],
    ["search", "--gpu", "H100", "--simulate", str(REC), "--plant-faults", "bogus"],
    ["search", "--gpu", "H100", "--arch", "sm_80", "--simulate", str(REC)],
    ["search", "--gpu", "H100", "--simulate", str(REC), "--study", ""],
    # a study's name names its files: a path would lead them out of $TUNER_HOME
    ["search", "--gpu", "H100", "--simulate", str(REC), "--study", "../x"], ["show", "--study", "/tmp/x"],
    ["report", "--study", ".hidden"], ["export-best", "--gpu", "H100", "--study", "a\nb"],
    ["report", "--out", ""], ["export-best", "--gpu", "H100", "--out", " "],  # blank wrote into the current folder
    ["show", "--storage", ""], ["export-best", "--gpu", "H100", "--study", " "],
    ["export-best", "--gpu", "H100", "--wheel", str(REC)], ["report", "--out", str(REC)],  # a file, not a folder
    ["export-best", "--gpu", "H100", "--wheel", str(REC / "sub")],  # under a file: made nowhere
    ["export-best", "--gpu", "H100", "--wheel", "w", "--sources-only"],
    ["show", "--gpu", "H100", "--arch", "sm_80"], ["export-best", "--gpu", "H100", "--arch", "banana"],  # no --arch
    ["search", "--gpu", "H100", "--simulate", str(REC), "--devices", "7"], ["variants", "--target", "uint8"],  # no GPU
    # options that undo each other: one of them would be ignored
    ["build", "--gpu", "H100", "--covering", "--limit", "3"], ["build", "--gpu", "H100", "--covering", "--pred",
                                                              "float16"],
    ["variants", "--gpu", "H100", "--all-dtypes", "--pred", "float16"],
    ["samplers", "--simulate", str(REC), "--samplers", "random", "--fail-above", "5"],
    ["bench", "--dtypes", "int8/uint8"], ["bench", "--dtypes", "uint8"],  # before the GPU: uint8 is no pred dtype
    ["bench", "--family", "rms_norm", "--dtype", "int8"], ["bench", "--family", "embedding_bag", "--shapes", "8x8"],
], ids=lambda a: " ".join(x if len(x) < 30 else "REC" for x in a))
def test_a_value_that_cannot_mean_anything_is_a_usage_error(home, capsys, argv):
    """Exit 2, as docs/cli.md says of a command line that cannot mean anything, and nothing written."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "", err
    error_line(err, argv[0])
    assert list(home.iterdir()) == []


def test_an_architecture_the_installed_nvcc_does_not_compile_is_a_usage_error(home, capsys):
    """CUDA 13 has no sm_50-sm_72: `variants` listed them and `build` counted a failed compile."""
    from tuner.build import toolkit

    known = toolkit.compute_capabilities()
    old = next((n for n in (50, 60, 70) if known is not None and n not in known), None)
    if old is None:
        pytest.skip("this machine's nvcc compiles for every old architecture asked (or there is none)")
    for argv in (["variants", "--arch", f"sm_{old}"], ["build", "--arch", f"sm_{old}", "--limit", "1"],
                 ["search", "--gpu", "H100", "--arch", f"sm_{old}"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == ""
        assert f"--arch sm_{old}: the installed nvcc" in error_line(err, argv[0]) and "it does sm_" in err
    assert list(home.iterdir()) == []


def test_a_home_that_is_a_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TUNER_HOME", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("")
    code, _, err = run(capsys, "search", "--gpu", "H100", "--simulate", str(REC), "--trials", "2", "--quiet")
    assert code == 1 and error_line(err, "search").endswith("a-file is a file, not a folder")


# ------------------------------------------------------------------ as a process

def _tuner(*argv: str, home: Path, stdout=subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "TUNER_HOME": str(home), "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "tuner", *argv], env=env, cwd=home, stdout=stdout,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("argv", [["variants", "--gpu", "H100"],  # more than a pipe holds: fails in print
                                  ["variants", "--gpu", "H100", "--limit", "1"]])  # fails at the last flush
def test_a_reader_that_goes_away_is_no_traceback(tmp_path, argv):
    read, write = os.pipe()
    proc = _tuner(*argv, home=tmp_path, stdout=write)
    os.close(write)
    os.close(read)  # `| head -0`: the reader is gone before the first write
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err == ""


def test_a_closed_stdout_is_no_traceback(tmp_path):
    """`tuner variants ... >&-`: Python starts without sys.stdout; the command runs, prints nothing."""
    env = {**os.environ, "TUNER_HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(["sh", "-c", f"'{sys.executable}' -m tuner variants --gpu H100 --limit 0 >&-"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""


@pytest.mark.parametrize("argv,command", [(["search", "--gpu", "H100", "--bogus", "1"], "search"),
                                          (["show", "--nope"], "show"), (["frob"], ""),
                                          (["search"], "search")])  # no --gpu: a usage error too
def test_a_usage_error_is_one_line_of_the_command_it_is_about(home, capsys, argv, command):
    code, out, err = run(capsys, *argv)
    name = f"tuner {command}".strip()
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"{name}: error: ")


@pytest.mark.parametrize("content", [bytes(range(256)) * 16, b'garbage\n[1, 2]\n{"not": "a record"}\n'], ids=["binary", "garbage"])
def test_a_file_that_is_no_journal_is_refused_in_one_line(home, capsys, content):
    path = home / "other.bin"
    path.write_bytes(content)
    recording = str(Path(__file__).parent / "data" / "h100-giou-bf16-u8.jsonl")
    for argv in (["list"], ["show", "--study", "x"], ["search", "--gpu", "H100", "--simulate", recording]):
        code, out, err = run(capsys, *argv, "--storage", str(path))
        assert code == 1 and out == "" and len(err.splitlines()) == 1, (argv, err)
        assert "not a journal" in err and "damaged" not in err
    assert path.read_bytes() == content  # nothing appended


@pytest.mark.filterwarnings("ignore::tuner.store.journal_records.JournalDamageWarning")  # the cut record, on purpose
def test_a_journal_whose_only_record_was_cut_is_still_a_journal(home, capsys):
    path = home / "cut.journal"
    path.write_bytes(b'{"op_code": 0, "worker_id": "w", "stu\n')  # a disk that filled up mid-append
    code, out, _ = run(capsys, "list", "--storage", str(path))
    assert code == 0 and out.startswith("no studies in")


def test_a_usage_error_and_a_missing_gpu_as_a_process(tmp_path):
    proc = _tuner("search", "--gpu", "H100", "--trials", "0", home=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == ""
    assert err.splitlines()[-1].startswith("tuner search: error: argument --trials")
    proc = _tuner("bench", "--gpu", "H100", home=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.startswith("tuner bench: error: --gpu H100: no CUDA GPU is attached")
    assert len(err.splitlines()) == 1 and list(tmp_path.iterdir()) == []


def _as_the_command(tmp_path, *argv, timeout=300):
    """`tuner ARGV` as its console script runs it, with an exit handler and an object freed only
    by the interpreter's teardown, each leaving a file behind."""
    code = (f"import atexit, pathlib, sys; atexit.register(pathlib.Path({str(tmp_path / 'handler')!r}).write_text, 'ran')\n"
            f"class Freed:\n    def __del__(self): pathlib.Path({str(tmp_path / 'teardown')!r}).write_text('ran')\n"
            "kept = Freed()\nfrom tuner.cli.main import main\nsys.exit(main())")
    env = {**os.environ, "TUNER_HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    for name in ("handler", "teardown"):
        (tmp_path / name).unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-c", code, *argv], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout)
    return proc, (tmp_path / "handler").exists(), (tmp_path / "teardown").exists()


def test_a_command_ends_without_the_interpreters_teardown_but_keeps_its_exit_and_its_results(tmp_path):
    """`tuner` leaves through os._exit after its exit handlers (tuner.cli.ending.leave): the code, the
    whole output, an exit handler's work and the study it wrote are all kept; the modules are not
    freed one by one (0.3-1 s)."""
    recording = str(Path(__file__).parent / "data" / "h100-giou-bf16-u8.jsonl")
    proc, handled, torn = _as_the_command(tmp_path, "search", "--gpu", "H100", "--simulate", recording,
                                          "--trials", "20", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1].startswith("measurements: ")  # the last line, flushed
    assert handled and not torn
    shown = _tuner("list", home=tmp_path)
    out, _ = shown.communicate(timeout=120)
    assert shown.returncode == 0 and " 20 " in out
    proc, handled, torn = _as_the_command(tmp_path, "show", "--study", "nope", timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith("tuner show: error:") and handled and not torn


def test_a_command_that_compiled_ends_the_same_way(tmp_path):
    """A build leaves the compile queue's idle threads behind (tuner.build.queue): they are stopped
    first, or the interpreter's exit would wait for them and free every module."""
    proc, handled, torn = _as_the_command(tmp_path, "build", "--gpu", "H100", "--limit", "1", "--jobs", "2",
                                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert handled and not torn
