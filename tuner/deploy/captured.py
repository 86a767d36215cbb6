"""The files `tuner.capture` writes: the problems a training run called the families' ops with,
per problem its calls and their time (tuner/deploy/capturing.py records them). Reading one needs no
torch: `tuner search --problems FILE` reads it before its worker starts CUDA.

    {"format": 1, "tuner": ..., "torch": ..., "gpu": ...,
     "problems": [{"family": "rms_norm", "problem": {"rows": 4096, "width": 4096, "x": "bfloat16",
                   "weight": "bfloat16"}, "key": "...", "calls": 12, "time_us": 1234.5,
                   "ops": {"torch.nn.functional.rms_norm": 12}}]}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from tuner import families
from tuner.errors import SpaceError, TunerError
from tuner.space import SIZE_MAX

FORMAT = 1


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def with_shares(problems: list[dict]) -> list[dict]:
    """Each problem's fraction of the total time, or of the calls where no time was measured."""
    by = "time_us" if any(p["time_us"] > 0 for p in problems) else "calls"
    total = sum(p[by] for p in problems)
    return [{**p, "share": p[by] / total if total else 0.0} for p in problems]



# ---------------------------------------------------------------------- reading

def read(path: str | os.PathLike, family: str | None = None) -> list[dict]:
    """The problems of a capture file (of one family if given), largest time first, each with
    "family", "problem", "key", "calls", "time_us", "ops" and "share" (of the returned ones).
    A file that is missing, damaged or holds none raises TunerError naming it."""
    path = Path(path)
    if family is not None:
        families.get(family)  # an unknown name: SpaceError, listing the known ones
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise TunerError(f"capture file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TunerError(f"capture file {path} is not JSON: {exc}") from None
    except RecursionError:  # arrays or objects nested past Python's stack: no capture writes those
        raise TunerError(f"capture file {path} is not a capture: JSON nested too deeply") from None
    except OSError as exc:
        raise TunerError(f"capture file {path} cannot be read: {exc.strerror}") from None
    # (type: JSON's true equals 1 in Python, and is no format)
    if not isinstance(doc, dict) or type(doc.get("format")) is not int or doc["format"] != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise TunerError(f"capture file {path} has format {found!r}; this tuner reads format {FORMAT}")
    if not isinstance(doc.get("problems"), list):
        raise TunerError(f"capture file {path} has no list of problems")
    problems = _merged([_checked(path, i, p) for i, p in enumerate(doc["problems"], 1)])
    problems = [p for p in problems if family is None or p["family"] == family]
    if not problems:
        raise TunerError(f"capture file {path} holds no {family + ' ' if family else ''}problems")
    return with_shares(sorted(problems, key=lambda p: (-p["time_us"], -p["calls"])))


def _merged(problems: list[dict]) -> list[dict]:
    """One entry per problem: a problem listed twice (captures of two runs joined, a file edited by
    hand) has its calls, time and ops added up, so that it is searched once, with its whole share."""
    found: dict[tuple, dict] = {}
    for p in problems:
        key = (p["family"], json.dumps(p["problem"], sort_keys=True))
        if key not in found:
            found[key] = {**p, "ops": dict(p["ops"])}
            continue
        into = found[key]
        into["calls"] += p["calls"]
        into["time_us"] += p["time_us"]
        for op, n in p["ops"].items():
            into["ops"][op] = into["ops"].get(op, 0) + n
    return list(found.values())


def problems(path: str | os.PathLike, family: str) -> list[tuple[Any, float]]:
    """(Problem, share) for each of a family's problems in a capture file, largest first."""
    cls = families.get(family).Problem
    return [(cls(**p["problem"]), p["share"]) for p in read(path, family)]


def _values_wrong(fam, cls, given: dict) -> list[str]:
    """What a problem's values hold that its command line would refuse: a size below 1 (0 where it
    may be) or above SIZE_MAX, a value outside its choices, a float that is not finite or a share
    outside [0, 1], a dtype the family does not take (`space_for`)."""
    wrong = []
    for f in dataclasses.fields(cls):
        opt, v = f.metadata.get("option", {}), given[f.name]
        parse = opt.get("parse")
        if opt.get("choices") and v not in opt["choices"]:
            wrong.append(f"{f.name}={v!r} is not one of {', '.join(map(str, opt['choices']))}")
        elif type(v) is int and parse in (None, "size") and v < 1:
            wrong.append(f"{f.name}={v} is below 1")
        elif type(v) is int and parse == "size_or_zero" and v < 0:
            wrong.append(f"{f.name}={v} is below 0")
        elif type(v) is int and parse in (None, "size", "size_or_zero") and v > SIZE_MAX:
            wrong.append(f"{f.name}={v} is above {SIZE_MAX}")
        elif type(v) is float and (not math.isfinite(v) or (parse == "fraction" and not 0 <= v <= 1)):
            wrong.append(f"{f.name}={v!r} is not {'a number from 0 to 1' if parse == 'fraction' else 'finite'}")
    if not wrong:
        try:
            fam.space_for(given)
        except SpaceError as exc:
            wrong.append(str(exc))
    return wrong


def _checked(path: Path, index: int, entry: Any) -> dict:
    """One problem of a file, checked: a known family, exactly its Problem's fields with values of
    their defaults' types, a count and a time."""
    where = f"capture file {path}, problem {index}"
    if not isinstance(entry, dict) or not isinstance(entry.get("problem"), dict):
        raise TunerError(f"{where} is not an object with a 'problem' object")
    family = entry.get("family")
    if family not in families.names():
        raise TunerError(f"{where} is of unknown family {family!r}; known: {', '.join(families.names())}")
    cls, given = families.get(family).Problem, entry["problem"]
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    wrong = ([f"missing {f}" for f in fields if f not in given] + [f"unknown {f}" for f in given if f not in fields]
             + [f"{f}={v!r} is not {type(fields[f]).__name__}" for f, v in given.items()
                if f in fields and type(v) is not type(fields[f])])
    if not wrong:
        wrong = _values_wrong(families.get(family), cls, given)
    if wrong:
        raise TunerError(f"{where} is not a {family} problem: {', '.join(wrong)}")
    calls, time_us = entry.get("calls"), entry.get("time_us")
    if type(calls) is not int or calls < 1:
        raise TunerError(f"{where}: calls must be a whole number of at least 1, got {calls!r}")
    if type(time_us) not in (int, float) or not math.isfinite(time_us) or time_us < 0:
        raise TunerError(f"{where}: time_us must be a finite number of at least 0, got {time_us!r}")
    return {"family": family, "problem": dict(given), "key": cls(**given).key(), "calls": calls,
            "time_us": float(time_us), "ops": _ops(entry.get("ops"))}


def _ops(ops: Any) -> dict[str, int]:
    """The torch functions a problem was captured from, with their call counts (what is not one is dropped)."""
    if not isinstance(ops, dict):
        return {}
    return {k: n for k, n in ops.items() if isinstance(k, str) and type(n) is int}
