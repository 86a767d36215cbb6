"""What a command's arguments point at: the family's command-line part, the problem its options
describe, and the study they name (shared by every command module, below all of them)."""

from __future__ import annotations

from tuner import gpus
from tuner.space import dtype_fields, dtype_name
from tuner.errors import TunerError, UsageError

# options of show and report that say nothing about which study to read
NAME_FREE = {"--storage", "--json", "--top-k", "--out", "--debug"}


def family_cli(args):
    """The family's command-line part (its options, spaces, problem and bench)."""
    return cli_part(args.family)


def cli_part(family: str):
    """A family's command-line part: its cli.py where it declares no op; else the one its declaration
    gives: `describe` (tuner.space.describe over its Problem), `tuner bench`'s options (its sizes
    and dtypes) and the bench itself (tuner.report.declared's, made from the declaration)."""
    import functools
    import types

    from tuner import families, space

    if _keeps_cli(family):
        return families.part(family, "cli")
    return types.SimpleNamespace(describe=functools.partial(space.describe, families.get(family).Problem),
                                 add_bench_args=functools.partial(_bench_args, family),
                                 bench=functools.partial(_declared, "bench", family),
                                 bench_problems=functools.partial(_declared, "bench_problems", family))


def benches_problems(family: str) -> bool:
    """Whether `tuner bench --problems` has a bench of the family's captured problems: the
    declaration's, or its cli part's `bench_problems`."""
    from tuner import families

    return not _keeps_cli(family) or hasattr(families.part(family, "cli"), "bench_problems")


def _keeps_cli(family: str) -> bool:
    """A family whose command-line part is its own cli.py: one that keeps one, or declares no op."""
    from tuner import families

    return families.has_part(family, "cli") or getattr(families.get(family), "OP_DECLARATION", None) is None


def _declared(name: str, family: str, *args, **kwargs):
    """tuner.report.declared's `name`, imported when called: it imports torch (seconds), which a
    search's own process never needs (its workers import it) and would wait for before they start."""
    from tuner.report import declared

    return getattr(declared, name)(family, *args, **kwargs)


def _bench_args(family: str, p) -> None:
    """`tuner bench`'s options for a bench made from the declaration: its shapes (`BENCH_SHAPES`,
    else its Problem's sizes) and dtypes (`BENCH_DTYPES`, else its Problem's); none for a family
    whose bench runs the problems it declares (`BENCH_PROBLEMS`)."""
    from tuner import families
    from tuner.cli import args as cli_args

    fam, op = families.get(family), families.get(family).OP_DECLARATION
    if hasattr(fam, "BENCH_PROBLEMS"):
        return
    shapes = getattr(fam, "BENCH_SHAPES", None) or (tuple(getattr(fam.Problem(), n) for n in op.sizes),)
    shown = ",".join("x".join(str(n) for n in s) for s in shapes)
    p.add_argument("--shapes", type=cli_args.shapes_of(op.sizes), default=shapes,
                   help=f"{'x'.join(n.upper() for n in op.sizes)}, comma-separated (default {shown})")
    fields = dtype_fields(fam)
    if fields:
        default = getattr(fam, "BENCH_DTYPES", None) or (tuple(getattr(fam.Problem(), f) for f in fields),)
        shown = ",".join("/".join(d) for d in default)
        p.add_argument("--dtypes", "--dtype", dest="dtypes", type=_dtype_list(fields), default=default,
                       help=f"{'/'.join(fields)} dtypes, comma-separated; one name sets every one "
                            f"(default {shown})")


def add_search_dtypes(family: str, p) -> None:
    """`tuner search --dtypes`: one problem per dtype tuple at the options' sizes, searched in one
    command (for a family with dtype fields). The family's `TRAINING_DTYPES`, where it has them,
    are named in the help: the tuples mixed-precision training calls it with."""
    from tuner import families

    fam = families.get(family)
    fields = dtype_fields(fam)
    if not fields:
        return
    import argparse

    training = tuple(tuple(d) for d in getattr(fam, "TRAINING_DTYPES", ()))
    parse = _dtype_list(fields)

    def dtypes(text: str):
        if text != "training":
            return parse(text)
        if not training:
            raise argparse.ArgumentTypeError(f"{family} names no dtypes models train with (TRAINING_DTYPES): give "
                                             f"the {'/'.join(fields)} tuples")
        return training
    p.add_argument("--dtypes", type=dtypes,
                   metavar="/".join(fields) + ",...",
                   help=f"search each of these {'/'.join(fields)} dtype tuples (comma-separated; one name sets "
                        "every field) at the options' sizes, one study each of --trials trials"
                        + (f"; `training`: those models train with, {','.join('/'.join(d) for d in training)}"
                           if training else ""))


def dtype_problems(args) -> list:
    """The problems `--dtypes` names: the options' problem with each tuple's dtypes, once each."""
    from tuner import families

    fam, base = families.get(args.family), problem(args)
    fields = list(dtype_fields(fam))
    found = []
    for given in dict.fromkeys(args.dtypes):
        values = {**base.__dict__, **dict(zip(fields, given))}
        fam.space_for(values)
        found.append(fam.Problem(**values))
    return found


def _dtype_list(fields: dict[str, tuple[str, ...]]):
    """The parser of a bench's dtypes (`--dtypes bfloat16/uint8,float32`): each item a dtype of each
    dtype field in order, or one dtype of them all, so that a dtype no variant takes is refused
    with the usage, before a GPU is looked for."""
    import argparse
    import re

    names = list(fields)

    def parse(text: str):
        found = []
        for item in text.split(","):
            given = tuple(item.split("/"))
            if len(given) not in (1, len(names)) or not all(re.fullmatch(r"\w+", d) for d in given):
                raise argparse.ArgumentTypeError(f"expected {'/'.join(names)} dtypes such as "
                                                 f"{'/'.join(fields[n][0] for n in names)}, got {text!r}")
            given = tuple(dtype_name(d) for d in (given * len(names) if len(given) == 1 else given))  # bf16 too
            for name, d in zip(names, given):
                if d not in fields[name]:
                    raise argparse.ArgumentTypeError(f"{item}: {d} is no {name} dtype ({', '.join(fields[name])})")
            found.append(given)
        return tuple(found)
    return parse


def add_space_args(parser, family: str) -> None:
    """The options that pick the spaces `variants` and `build` list: one per fixed field of the
    family's spaces (`fixed_spaces`: its dtypes), its default `space()`'s, `--all-dtypes` where
    there are any, and a switch per opt-in kind of variant (the family's `SPACE_FLAGS`: name -> help,
    a bool argument of `space()`); or the family's own (its cli part's `add_space_args`)."""
    import inspect

    from tuner import families

    own = getattr(cli_part(family), "add_space_args", None)
    if own is not None:
        return own(parser)
    fam = families.get(family)
    defaults = inspect.signature(fam.space).parameters
    for name, values in fam.space_for.choices.items():
        default = defaults[name].default
        parser.add_argument(f"--{name}", default=default, help=f"{name} dtype: {', '.join(values)} (default {default})")
    if fam.space_for.choices:  # a family of one space has nothing to pick
        parser.add_argument("--all-dtypes", action="store_true",
                            help=f"every ({', '.join(fam.space_for.choices)}) dtype pair")
    for name, help in getattr(fam, "SPACE_FLAGS", {}).items():
        parser.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=help)


def spaces(args) -> list:
    """The spaces the space options pick (the family's own `spaces(args)` where it has one)."""
    from tuner import families

    own = getattr(family_cli(args), "spaces", None)
    if own is not None:
        return own(args)
    fam = families.get(args.family)
    flags = {name: getattr(args, name) for name in getattr(fam, "SPACE_FLAGS", {})}
    if getattr(args, "all_dtypes", False):
        given = [f"--{name}" for name in fam.space_for.choices if f"--{name}" in getattr(args, "options", ())]
        if given:
            raise UsageError(f"--all-dtypes lists every dtype pair: drop {' and '.join(given)}, or --all-dtypes")
        return fam.all_spaces(**flags)
    return [fam.space_for({name: getattr(args, name) for name in fam.space_for.choices}, **flags)]


def add_problem_args(parser, family: str) -> None:
    """The options of the problem a command tunes for: one per field of the family's Problem as it
    declares them (`tuner.space.option`), or the family's own (its cli part's `add_problem_args`)."""
    import dataclasses

    from tuner import families
    from tuner.cli import args as cli_args

    own = getattr(cli_part(family), "add_problem_args", None)
    if own is not None:
        return own(parser)
    for f in dataclasses.fields(families.get(family).Problem):
        if "option" not in f.metadata:
            continue
        o = f.metadata["option"]
        parse = o["parse"] or ("size" if isinstance(f.default, int) else None)
        parser.add_argument(option_flag(f), dest=f.name, default=f.default,
                            type=getattr(cli_args, parse) if parse else None,
                            choices=o["choices"], help=f"{o['help']} (default {f.default})")


def option_flag(field) -> str:
    """The command-line flag of a Problem's option field (`--boxes`, or `--bag-size` from its name)."""
    return field.metadata["option"]["flag"] or "--" + field.name.replace("_", "-")


def problem(args):
    """The problem the options describe, its space's checks passed (dtypes it has variants for)."""
    import dataclasses

    from tuner import families
    from tuner.space import dtype_name

    own = getattr(family_cli(args), "problem", None)
    if own is not None:
        return own(args)
    fam = families.get(args.family)
    values = {}
    for f in dataclasses.fields(fam.Problem):
        if "option" in f.metadata:
            value = getattr(args, f.name)
            values[f.name] = dtype_name(value) if f.metadata["option"]["dtype"] else value
    fam.space_for(values)
    return fam.Problem(**values)


def study_name(args) -> str:
    from tuner.store import study

    if args.study:
        return args.study
    if not args.gpu:
        if not getattr(args, "options", {"?"}) - NAME_FREE:
            return only_study(args.storage)
        raise TunerError("name the study with --study, or give --gpu and the problem options")
    gpu = args.gpu
    if gpu.lower() == "auto":
        gpu = gpus.short_name(gpus.attached(asked="--gpu auto", hint="; name the GPU (--gpu H100) or the study "
                                                                     "(--study NAME)"))
    return study.study_name(args.family, gpu, problem(args).key(), args.objective)


def only_study(storage: str | None) -> str:
    """The storage's one study, where nothing named one."""
    from tuner.store import study

    names = sorted(s.study_name for s in study.summaries(storage))
    where = study.shown(study.storage_url(storage))
    if len(names) == 1:
        return names[0]
    if not names:
        raise TunerError(f"no studies in {where}; `tuner search` makes one")
    listed = ", ".join(names[:10])
    if len(names) > 10:
        listed += f" and {len(names) - 10} more (`tuner list` shows them)"
    raise TunerError(f"{len(names)} studies in {where}: {listed}; pass --study NAME")
