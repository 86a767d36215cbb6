"""The command line under generated input: every command, with random flags, values and files
(negative, zero, huge, non-numeric, NaN, empty; missing paths, folders, damaged files, unknown
storage schemes). Each invocation must exit 0, 1 or 2, never print a traceback, say what went
wrong in one line, and, for a read-only command that fails, leave nothing behind.

Reproducible: the invocations come from random.Random(SEED); a failure prints the command line.
Fast: in-process calls of tuner.cli.main, with the searches replaying a recording, builds and
the dashboard only with input that stops them before they compile or serve, and no GPU."""

from __future__ import annotations

import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from tuner.cli import main as cli

SEED = 20240611
GENERATED = 500
REC = Path(__file__).parent / "data" / "h100-giou-bf16-u8.jsonl"
STUDY = "giou-H100-B1024-S256-bfloat16-uint8-article-mean-fwd+bwd"
READ_ONLY = {"variants", "show", "list", "report", "export-best", "bench", "samplers", "dashboard"}


class F:
    """A file the invocation names, made in its own home when it runs (see `_file`)."""

    def __init__(self, kind: str):
        self.kind = kind

    def __repr__(self) -> str:
        return f"<{self.kind}>"


FLAG = object()  # an option that takes no value

# values that no number option takes
BAD = ["-1", "-3", "0", "-0", "1e30", str(10**30), "nan", "NaN", "inf", "-inf", "", " ", "abc", "1.5", "0x10",
       "1,2", "--"]
FILES = [F("missing"), F("folder"), F("garbage"), F("binary"), F("empty"), F("array")]
STORAGES = [F("default"), F("study"), *FILES, "foo://bar", "postgresql://u:pw@127.0.0.1:1/db",
            "journal+postgresql://u@127.0.0.1:1/db", "sqlite:///db.sqlite", "journal+mysql://x", "://", ""]


def values(valid, bad):
    """Mostly a valid value, else one the parser must refuse (the invocation is then a usage error)."""
    def pick(rng):
        return rng.choice(valid) if valid and rng.random() < 0.6 else rng.choice(bad)

    pick.bad = bad
    return pick


def num(*valid: str, zero: bool = False, real: bool = False, also: tuple[str, ...] = ()):
    """A number option's values: BAD but 0 where `zero` is allowed and 1.5 where it is `real`."""
    return values(valid, [b for b in BAD if not (zero and b in ("0", "-0") or real and b == "1.5")] + list(also))


def one_of(*values):
    return lambda rng: rng.choice(values)


def flag(rng):
    return FLAG


DTYPES = one_of("float32", "float16", "bfloat16", "uint8", "int32", "int64", "int3", "", "fp8")
PROBLEM = {
    "giou": {"--batch": num("1024", "512", "1"), "--slots": num("256", "8"), "--pred": DTYPES, "--target": DTYPES,
             "--boxes": one_of("article", "uniform", "full", "none"), "--reduction": one_of("mean", "sum", "max")},
    "embedding_bag": {"--rows": num("1000", "1"), "--dim": num("64", "3"), "--bags": num("100"),
                      "--bag-size": num("0", "20", zero=True), "--mode": one_of("sum", "mean", "max", "min"),
                      "--weight": DTYPES, "--index": DTYPES, "--ids": one_of("random", "one_hot", "zipf")},
    "rms_norm": {"--rows": num("4096", "1"), "--width": num("4096", "7"), "--x": DTYPES, "--weight": DTYPES},
}
SPACE = {
    "giou": {"--pred": DTYPES, "--target": DTYPES, "--all-dtypes": flag, "--device-assert": flag},
    "embedding_bag": {"--weight": DTYPES, "--index": DTYPES, "--all-dtypes": flag},
    "rms_norm": {"--x": DTYPES, "--weight": DTYPES, "--all-dtypes": flag},
}
BENCH = {
    "giou": {"--shapes": one_of("64x256", "0x4", "x", "", "64x256,,1x1", "-5x2"),
             "--dtypes": one_of("bfloat16/uint8", "a/b/c", "", "float32/float32,bfloat16/uint8", "/", "float32")},
    "embedding_bag": {},
    "rms_norm": {"--shapes": one_of("4096x4096", "10x", "x", "", "1x2x3", "0x5"), "--dtype": DTYPES},
}
GPU = {"--gpu": one_of("H100", "h100", "L4", "auto", "V1000", "", "A10G")}
TARGET = {**GPU, "--arch": one_of("sm_90", "sm_9", "", "sm_100a", "x", "sm_75")}  # the compiling commands
STUDY_OPTS = {"--storage": one_of(*STORAGES), "--study": one_of(STUDY, "x", "", "a/b", "ééé", "x" * 300, "--"),
              "--objective": one_of("fwd", "bwd", "fwd+bwd", "sideways")}
RECORDINGS = one_of(F("rec"), F("rec"), F("rec"), F("small"), *FILES)

OPTIONS = {
    "variants": lambda fam: {**TARGET, **SPACE[fam], "--json": flag, "--limit": num("0", "1", "5", zero=True)},
    "build": lambda fam: {**TARGET, **SPACE[fam], "--limit": num(), "--jobs": num("1", "2"),
                          "--covering": flag, "--json": flag},
    "search": lambda fam: {**TARGET, **STUDY_OPTS, **PROBLEM[fam], "--simulate": RECORDINGS,
                           "--trials": num("5", "10", "20"), "--timeout": num("0.5", "30", real=True),
                           "--sampler": one_of("ranked", "tpe", "random", "grid", "bogus"),
                           "--no-warm-start": flag, "--simulate-delay": num("0", "0.001", zero=True, real=True),
                           "--jobs": num("1", "2"), "--ask-batch": num("1", "8", "64"), "--top-k": num("1", "3"),
                           "--eval-timeout": num("1", "60", real=True),
                           "--devices": one_of("0", "all", "0,1", "0,0", "x", "-1", ""),
                           "--prune": values(["0", "1.5", "3"], ["0.5", "1", "nan", "-2", "1e30", "abc", ""]),
                           "--seed": num("0", "7", str(2**32 - 1), zero=True),
                           "--import-records": one_of(F("small"), *FILES),
                           "--plant-faults": one_of("oob", "compile", "hang,oob", "nope", "", ","),
                           "--quiet": flag},
    "show": lambda fam: {**GPU, **STUDY_OPTS, **PROBLEM[fam], "--json": flag, "--top-k": num("1", "10")},
    "export-best": lambda fam: {**GPU, "--study": STUDY_OPTS["--study"], "--storage": STUDY_OPTS["--storage"],
                                "--out": one_of("out", F("folder"), F("binary"), "missing/deeper/out"),
                                "--wheel": one_of("w", F("binary")), "--sources-only": flag},
    "bench": lambda fam: {**GPU, **BENCH[fam], "--artifact": one_of(*FILES),
                          "--out": one_of("b", F("binary"), F("folder"))},
    "report": lambda fam: {**GPU, **STUDY_OPTS, **PROBLEM[fam], "--out": one_of("r", F("binary"), F("folder"))},
    "samplers": lambda fam: {**PROBLEM[fam], "--simulate": RECORDINGS,
                             "--samplers": one_of("ranked", "random", "ranked,random", "tpe", "grid", "bogus", "",
                                                  ","),
                             "--seeds": num("1", "2"), "--first-seed": num("0", "5", str(2**32 - 1), zero=True),
                             "--within": num("0", "0.03", "0.5", "1", zero=True), "--max-trials": num("3", "10"),
                             "--objective": STUDY_OPTS["--objective"],
                             "--csv": one_of("t.csv", F("folder"), "missing/t.csv"),
                             "--fail-above": num("0", "7", "100", zero=True, real=True)},
    "list": lambda fam: {"--storage": STUDY_OPTS["--storage"]},
    "dashboard": lambda fam: {"--storage": STUDY_OPTS["--storage"], "--host": one_of("127.0.0.1", "", "bad host"),
                              "--port": num("1", "8080", "65535", also=("65536",))},
}
FAMILIES = ("giou", "embedding_bag", "rms_norm")


def generate(rng: random.Random, reports: list[int]) -> tuple[list, bool]:
    """One invocation: a command, some of its options (a few from another family), some noise; and
    whether it gives a number option a value the parser must refuse (then it must exit 2)."""
    command = rng.choice(list(OPTIONS))
    family = rng.choice(FAMILIES) if rng.random() < 0.4 else "giou"
    own = OPTIONS[command](family)
    pool = dict(own)
    if rng.random() < 0.1:  # another family's options: unrecognized, or read as this one's
        pool.update(PROBLEM[rng.choice(FAMILIES)])
    chosen = dict((name, pool[name](rng)) for name in rng.sample(list(pool), rng.randint(0, min(6, len(pool)))))
    if family != "giou" or rng.random() < 0.1:
        chosen["--family"] = family if rng.random() < 0.9 else "nope"
    _keep_it_quick(command, chosen, rng, reports)
    refused = any(value in getattr(own.get(name), "bad", ()) for name, value in chosen.items())
    argv: list = [command]
    for name, value in chosen.items():
        argv += [name] if value is FLAG else [name, value]
    noise = rng.random()
    if noise < 0.06:
        argv.append("--bogus")
    elif noise < 0.10:
        argv.append("stray")
    elif noise < 0.14 and len(argv) > 1:
        argv.pop()  # an option left without its value, or a value alone
        refused = refused and argv[-1] not in pool  # the refused value may be the one dropped
    elif noise < 0.16:
        argv.append("--help")
    elif noise < 0.19:
        argv = rng.choice([[], ["nonsense"], [""], ["--family", "giou"]]) + argv[1:]
    return argv, refused


def _keep_it_quick(command: str, chosen: dict, rng: random.Random, reports: list[int]) -> None:
    """Searches replay short runs; builds stop before compiling; samplers run a few short runs;
    only a few reports are made (matplotlib takes seconds); exports write sources only."""
    if command == "search":
        if rng.random() < 0.8:
            chosen.setdefault("--simulate", F("rec"))
            chosen.setdefault("--gpu", "H100")
            chosen.pop("--arch", None)
        chosen.setdefault("--trials", rng.choice(["5", "10"]))
        chosen.setdefault("--quiet", FLAG)
    elif command == "build":
        name, value = rng.choice([("--limit", rng.choice(BAD)), ("--jobs", rng.choice(BAD)), ("--gpu", "V1000"),
                                  ("--gpu", "auto"), ("--arch", "sm_9")])
        chosen[name] = value
        if name == "--gpu":
            chosen.pop("--arch", None)
    elif command == "samplers":
        chosen.setdefault("--simulate", F("rec"))
        if chosen.get("--max-trials") not in BAD:
            chosen["--max-trials"] = rng.choice(["3", "5"])
        if chosen.get("--seeds") not in BAD:
            chosen["--seeds"] = "1"
        if chosen.get("--samplers") in (None, "ranked,random"):
            chosen["--samplers"] = rng.choice(["ranked", "random"])
    elif command == "report":
        storage = chosen.get("--storage")
        if rng.random() < 0.3 and len(reports) < 3:
            chosen["--storage"] = F("default")  # the one study, for a report that is made
            reports.append(1)
        elif isinstance(storage, F) and storage.kind in ("default", "study"):
            chosen["--storage"] = F("missing")
    elif command == "export-best":
        chosen["--sources-only"] = FLAG  # binaries would build the torch binding: minutes


def _file(kind: str, home: Path, journal: Path, small: Path) -> str | None:
    """The file an F names, made in `home` (None: the default storage, given no option)."""
    if kind == "rec":
        return str(REC)
    if kind == "small":
        return str(small)
    if kind == "missing":
        return "missing/none.jsonl"
    if kind == "folder":
        (home / "folder").mkdir(exist_ok=True)
        return "folder"
    if kind in ("study", "default"):
        target = home / "study.journal" if kind == "study" else home / "studies" / "tuner.journal"
        target.parent.mkdir(exist_ok=True)
        shutil.copy(journal, target)
        return None if kind == "default" else "study.journal"
    content = {"garbage": b'garbage\n{"op_code": 99}\n\x00\xff\n', "binary": bytes(range(256)) * 16,
               "empty": b"", "array": b'[1, 2]\n5\n"x"\n'}[kind]
    (home / f"{kind}.bin").write_bytes(content)
    return f"{kind}.bin"


def materialize(argv: list, home: Path, journal: Path, small: Path) -> list[str]:
    out: list[str] = []
    for i, arg in enumerate(argv):
        if isinstance(arg, F):
            path = _file(arg.kind, home, journal, small)
            if path is None:
                if out and out[-1] == "--storage":
                    out.pop()
                continue
            arg = path
        out.append(arg)
    return out


def snapshot(home: Path) -> set[str]:
    return {str(p.relative_to(home)) for p in home.rglob("*")}


def check(argv: list[str], refused: bool, code, out: str, err: str, made: set[str]) -> list[str]:
    """What is wrong with one invocation's answer."""
    command = next((a for a in argv if a in OPTIONS), "")
    wrong = []
    if refused and code != 2:
        wrong.append("a number out of range, not refused by the parser")
    lines = [line for line in err.splitlines() if "warning: " not in line]  # a warning is a line of its own
    if code not in (0, 1, 2):
        wrong.append(f"exit {code!r}")
    if "Traceback" in out + err:
        wrong.append("a traceback")
    if code == 2:
        if len(lines) != 1 or ": error: " not in lines[0] or not lines[0].startswith("tuner"):
            wrong.append("a usage error that is not one error line")
    if code == 1:
        # samplers prints its progress on stderr before the verdict of --fail-above
        said = lines[-1:] if command == "samplers" else lines
        if len(said) != 1 or not said[0].startswith("tuner ") or len(said[0]) > 1000:
            wrong.append(f"{len(said)} lines for an error, not one short one")
    if code != 0 and command in READ_ONLY and made:
        wrong.append(f"a failed {command} made {sorted(made)}")
    return wrong


def invoke(argv: list[str], capsys) -> tuple[object, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:  # noqa: BLE001 - an escaped exception is what the fuzz looks for
        code = f"raised {type(exc).__name__}: {exc}"
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    """A journal holding one study of 10 trials (replayed measurements)."""
    where = tmp_path_factory.mktemp("fuzz-study")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_HOME", str(where))
        assert cli.main(["search", "--gpu", "H100", "--simulate", str(REC), "--trials", "10", "--quiet"]) == 0
    return where / "studies" / "tuner.journal"


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """The recording's first 40 measurements (what --import-records takes quickly)."""
    path = tmp_path_factory.mktemp("fuzz-small") / "small.jsonl"
    with open(REC) as f:
        path.write_text("".join(next(f) for _ in range(40)))
    return path


@pytest.fixture
def no_gpu_no_dashboard(monkeypatch):
    """A machine without a GPU (as CI is; on a GPU host no search or bench starts for real), and
    without optuna-dashboard (a dashboard that started would serve until stopped)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)


FIXED = [(argv, False) for argv in [
    ["build", "--gpu", "H100", "--limit", "1", "--jobs", "1"],  # the one build that compiles (or says nvcc is missing)
    ["search", "--gpu", "H100", "--simulate", F("rec"), "--trials", "5", "--quiet"],
    ["show"], ["report"], ["list"], ["export-best", "--gpu", "H100"], ["dashboard"],
    ["--help"], ["search", "--help"], [],
]]


def test_generated_invocations(tmp_path, monkeypatch, capsys, journal, small, no_gpu_no_dashboard):
    rng = random.Random(SEED)
    reports: list[int] = []
    cases = [generate(rng, reports) for _ in range(GENERATED)] + FIXED
    wrong, codes, commands, slowest = [], Counter(), Counter(), (0.0, "")
    started = time.monotonic()
    for i, (case, refused) in enumerate(cases):
        home = tmp_path / f"{i:03d}"
        home.mkdir()
        monkeypatch.setenv("TUNER_HOME", str(home))
        monkeypatch.chdir(home)
        argv = materialize(case, home, journal, small)
        before = snapshot(home)
        began = time.monotonic()
        code, out, err = invoke(argv, capsys)
        took = time.monotonic() - began
        slowest = max(slowest, (took, shlex.join(argv)))
        codes[code] += 1
        commands[next((a for a in argv if a in OPTIONS), "(none)")] += 1
        for why in check(argv, refused, code, out, err, snapshot(home) - before):
            wrong.append(f"#{i} {why}: tuner {shlex.join(argv)}\n    stderr: {err[-600:]!r}")
        if took > 60:
            wrong.append(f"#{i} took {took:.0f} s: tuner {shlex.join(argv)}")
    print(f"\n{len(cases)} invocations (seed {SEED}) in {time.monotonic() - started:.1f} s; exit codes "
          f"{dict(sorted(codes.items(), key=str))}; by command {dict(commands)}; slowest {slowest[0]:.1f} s: "
          f"tuner {slowest[1]}")
    assert not wrong, f"{len(wrong)} of {len(cases)} invocations went wrong:\n" + "\n".join(wrong[:30])
    assert len(cases) >= 300 and all(commands[c] >= 5 for c in OPTIONS)
    assert {0, 1, 2} <= set(codes)


def test_generated_invocations_as_processes(tmp_path, journal, small):
    """A few of them as `python -m tuner`, half with stdout closed before the first write (`| head
    -0`): what only a process shows, such as a broken pipe or the exit code of an exception."""
    rng = random.Random(SEED + 1)
    cases = [c for c, _ in (generate(rng, [1, 1, 1]) for _ in range(40)) if "dashboard" not in c][:8]  # no reports
    cases.append(["variants", "--gpu", "H100"])  # more than a pipe holds (its stdout is closed)
    cases.append(["search", "--gpu", "H100", "--simulate", F("rec"), "--trials", "5", "--quiet"])
    procs = []
    for i, case in enumerate(cases):
        home = tmp_path / f"{i:02d}"
        home.mkdir()
        argv = materialize(case, home, journal, small)
        closed = i % 2 == 0
        read, write = os.pipe()
        env = {**os.environ, "TUNER_HOME": str(home), "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": os.pathsep.join(sys.path)}
        procs.append((argv, closed, read, subprocess.Popen(
            [sys.executable, "-m", "tuner", *argv], cwd=home, env=env, stdout=write, stderr=subprocess.PIPE,
            text=True)))
        os.close(write)
        if closed:
            os.close(read)
    wrong = []
    for argv, closed, read, proc in procs:
        if not closed:
            with os.fdopen(read) as f:
                f.read()
        _, err = proc.communicate(timeout=120)
        if proc.returncode not in (0, 1, 2) or "Traceback" in err or "Exception ignored" in err:
            wrong.append(f"exit {proc.returncode}{' (stdout closed)' if closed else ''}: tuner {shlex.join(argv)}\n"
                         f"    stderr: {err[-600:]!r}")
    assert not wrong, "\n".join(wrong)
