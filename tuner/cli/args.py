"""Argument types of the command line: each number is checked against a sensible range by the
parser, so `--trials -5` is a usage error (exit 2) instead of an empty study, and `--limit -3`
never means "all"."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Callable

from tuner import paths
from tuner.space import SIZE_MAX
from tuner.errors import TunerError


class Parser(argparse.ArgumentParser):
    """A usage error in one line, exit 2, named by the command it is about (`tuner search: error:
    ...`), an unknown option included: the usage itself only with --help."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` shows the usage)\n")

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # said by the command they were given to, not by the top-level parser
            commands = getattr(self, "commands", None)
            command = getattr(parsed, "command", None)
            owner = commands.choices.get(command, self) if commands is not None and command else self
            owner.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def _quoted(text: str) -> str:
    """The value as typed, cut short: the error stays one line."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else str(x)


def integer(lo: int, hi: int) -> Callable[[str], int]:
    """A type for whole numbers from lo to hi."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}, got {_quoted(text)}")
        return value

    return parse


def number(lo: float, hi: float, above_lo: bool = False, unit: str = "") -> Callable[[str], float]:
    """A type for finite numbers from lo (or above it) to hi."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (lo < value <= hi if above_lo else lo <= value <= hi):  # NaN fails both
            span = f"above {_num(lo)} and up to {_num(hi)}" if above_lo else f"from {_num(lo)} to {_num(hi)}"
            raise argparse.ArgumentTypeError(f"expected a number {span}{unit}, got {_quoted(text)}")
        return value

    return parse


COUNT_MAX = 1_000_000  # trials, finalists, rows shown: far beyond any family's space
count = integer(1, COUNT_MAX)
count_or_zero = integer(0, COUNT_MAX)
jobs = integer(1, 1024)
seed = integer(0, 2**32 - 1)  # what NumPy's and Optuna's samplers take
size = integer(1, SIZE_MAX)  # a tensor dimension
size_or_zero = integer(0, SIZE_MAX)
port = integer(1, 65535)
seconds = number(0, 30 * 86400, above_lo=True, unit=" seconds (30 days)")
delay = number(0, 3600, unit=" seconds")
fraction = number(0, 1)
percent = number(0, 100)
whole = integer(-2**63, 2**63 - 1)  # an op's int scalar (int64_t)


def name(text: str) -> str:
    """A storage: not blank (an empty one meant the default, silently)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a name, got {_quoted(text)}")
    return text


def study_name(text: str) -> str:
    """A study's name: not blank, and a name rather than a path (it names the study's measurement
    log and report folder: `--study ../x` wrote outside $TUNER_HOME)."""
    from tuner.errors import TunerError
    from tuner.store.study import plain_name

    try:
        return plain_name(name(text))
    except TunerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def folder(text: str) -> Path:
    """A folder to write into (made where missing): not a file that is there (`--out /dev/null`), which
    failed half-way, after the command had written what came before; not blank (it wrote into the
    current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a folder, got {_quoted(text)}")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{_quoted(text)} is a file, not a folder")
    above = paths.nearest_existing(path)  # where it would be made
    if not above.is_dir():
        raise argparse.ArgumentTypeError(f"{_quoted(text)} cannot be made: {above} is a file, not a folder")
    return path


def real(text: str) -> float:
    """Any finite number (an op's float scalar)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {_quoted(text)}")
    return value


def boolean(text: str) -> bool:
    """true or false (an op's bool scalar; 1 and 0, yes and no too)."""
    word = text.strip().lower()
    if word not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {_quoted(text)}")
    return word in ("true", "1", "yes")


def prune_factor(text: str) -> float:
    """0 (time every variant in full), or a factor over 1: a factor of 1 or below would prune the
    best variant itself, and past 100 a probe prunes nothing."""
    value = number(0, 100)(text)
    if 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected 0 (no pruning) or a factor above 1 and up to 100, "
                                         f"got {_quoted(text)}")
    return value


def devices(text: str) -> str:
    """`all`, or distinct CUDA indices such as 0,1 (the text itself: gpus.device_indices reads it)."""
    if text.strip().lower() == "all":
        return text
    found = [x.strip() for x in text.split(",")]
    if not all(re.fullmatch(r"[0-9]{1,4}", x) for x in found) or len(set(map(int, found))) != len(found):
        raise argparse.ArgumentTypeError(f"expected 'all' or distinct CUDA indices such as 0,1, got {_quoted(text)}")
    return text


def shapes(text: str) -> tuple[tuple[int, int], ...]:
    """Comma-separated ROWSxWIDTH shapes, such as 4096x4096,8192x1024."""
    return shapes_of(("rows", "width"))(text)


def shapes_of(names) -> Callable[[str], tuple[tuple[int, ...], ...]]:
    """The parser of comma-separated shapes of one size per name, such as 4096x4096,8192x1024 for
    (rows, width): a shape of another length is refused with the usage."""
    names = tuple(names)
    form = "x".join(n.upper() for n in names)
    example = ",".join("x".join(str(n) for n in e) for e in ((4096,) * len(names), (8192,) + (1024,) * (len(names) - 1)))

    def parse(text: str) -> tuple[tuple[int, ...], ...]:
        found = []
        for shape in text.lower().split(","):
            parts = shape.split("x")
            try:
                if len(parts) != len(names):
                    raise argparse.ArgumentTypeError(shape)
                found.append(tuple(size(p) for p in parts))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"expected {form} shapes such as {example}, "
                                                 f"got {_quoted(text)}") from None
        return tuple(found)
    return parse


def recording(path: Path | None, flag: str) -> None:
    """A measurement log named on the command line (--simulate, --import-records) must be one: a
    file of UTF-8 text whose lines are JSON objects (a line cut short by a kill is skipped where it
    is read). Checked before a search starts, so that a wrong file is one line, not a traceback."""
    if path is None:
        return
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not a regular file" if path.exists() else "no such file"
        raise TunerError(f"{flag} {path}: {what}; expected a "
                         "measurement log (a search's studies/<study>.jsonl)")
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("{"):
                    continue
                try:
                    json.loads(line)
                except RecursionError:  # an array or object nested past Python's stack: no object either
                    pass
                except ValueError:
                    continue  # not JSON at all: a damaged line, skipped as a cut one is
                raise TunerError(f"{flag} {path}: line {number} is not a measurement (a JSON object)")
    except UnicodeDecodeError:
        raise TunerError(f"{flag} {path}: not a measurement log (not UTF-8 text)") from None
    from tuner.store import records

    records.read_some(path, flag)  # one record at least, its timings plain numbers: before any study is made


def given_options(p: argparse.ArgumentParser, command: str, argv: list[str]) -> set[str]:
    """The options the user gave, each by every name of its action (`--bag-s 20`, which argparse
    takes for `--bag-size`, is `--bag-size`; `--dtype` is `--dtypes` too): what a command asks of
    `args.options` (did the user name the problem?) holds however an option was spelt."""
    commands = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices
    known = commands[command]._option_string_actions if command in commands else p._option_string_actions
    given = set()
    for word in (a.split("=", 1)[0] for a in argv if a.startswith("--")):
        prefixed = [o for o in known if o.startswith(word)]
        action = known.get(word) or (known[prefixed[0]] if len(prefixed) == 1 else None)
        given |= set(action.option_strings) if action is not None else {word}
    return given
