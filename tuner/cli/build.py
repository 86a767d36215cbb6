"""`tuner variants`, `build` and `bench`: a family's space, its compiled variants and its tuned op against torch."""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time

from tuner import gpus, paths
from tuner.cli import target as cli_target
from tuner.errors import TunerError, UsageError


def _spread(variants: list, limit: int | None) -> list:
    """`limit` variants spread over the space (a fixed shuffle, so reruns pick the same ones)."""
    if not limit or limit >= len(variants):
        return variants
    picked = list(variants)
    random.Random(0).shuffle(picked)
    return picked[:limit]


def compilable(arch: str) -> str:
    """`arch` where the installed nvcc compiles for it (CUDA 13 has no sm_50-sm_72), else a usage
    error that says which it does; as it is where no nvcc is there to ask."""
    from tuner.build import toolkit

    known = toolkit.compute_capabilities()
    number = int(re.match(r"sm_(\d+)", arch).group(1))
    if known is not None and number not in known:
        raise UsageError(f"--arch {arch}: the installed nvcc ({toolkit.nvcc_version()}) does not compile for it; "
                         f"it does sm_{', sm_'.join(map(str, sorted(known)))}")
    return arch


def cmd_variants(args: argparse.Namespace) -> int:
    import pandas as pd

    arch = compilable(gpus.resolve(args.gpu, args.arch))
    rows = []
    for space in cli_target.spaces(args):
        for v in space:
            rows.append({"name": v.name, **v.as_dict()})
    if args.json:  # every variant, unless --limit says how many
        shown = rows if args.limit == 0 or "--limit" not in args.options else rows[:args.limit]
        print(json.dumps({"arch": arch, "count": len(rows), "variants": shown}, indent=1))
        return 0
    # object columns: a dimension's values as they are (32, not 32.0; None shown as "off", not NaN)
    table = pd.DataFrame(rows, dtype=object).drop(columns=["name"])
    # opt-in and test-only dimensions say nothing while every row has the same off value
    table = table.drop(columns=[c for c in table if table[c].map(lambda v: v is None or v is False).all()])
    table = table.map(lambda v: "off" if v is None else v)
    print(f"{len(rows)} valid variants for {arch}")
    shown = table if args.limit == 0 else table.head(args.limit)
    print(shown.to_string(index=False))
    if len(shown) < len(table):
        print(f"... {len(table) - len(shown)} more (--limit 0 shows all, --json for machine-readable output)")
    return 0


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cmd_build(args: argparse.Namespace) -> int:
    import pandas as pd

    from tuner import families
    from tuner.build import compile as build

    arch = compilable(gpus.resolve(args.gpu, args.arch))
    if args.covering:
        dtypes = cli_target.dtype_fields(families.get(args.family))
        mixed = sorted(o for o in args.options if o in ("--limit", "--all-dtypes") or o[2:] in dtypes)
        if mixed:
            raise UsageError(f"--covering builds its own set (every value of every dimension, every dtype pair): "
                             f"drop {' and '.join(mixed)}, or --covering")
        variants = families.get(args.family).covering_set()
    else:
        variants = _spread([v for s in cli_target.spaces(args) for v in s], args.limit)
    started, cpu = time.monotonic(), _children_cpu_s()
    results = build.build(variants, arch, jobs=args.jobs)
    wall, cpu = time.monotonic() - started, _children_cpu_s() - cpu
    rows = [{
        "variant": b.variant.name, "ok": b.ok, "cached": b.cached, "unit": b.unit_size,
        "compile_s": round(b.compile_s, 2),
        "regs_fwd": b.regs("forward") or "", "regs_bwd": b.regs("backward") or "", "spill_bytes": b.spill_bytes,
        "smem_bytes": b.smem_bytes,
    } for b in results]
    if args.json:
        print(json.dumps({"arch": arch, "wall_s": wall, "builds": [b.summary() for b in results]}, indent=1))
    else:
        print(pd.DataFrame(rows).to_string(index=False))
    fresh = [b for b in results if not b.cached]
    failed = [b for b in results if not b.ok]
    units = len({b.so for b in fresh if b.ok})
    per_variant = f"{cpu / len(fresh):.2f} s of one core a variant (nvcc's CPU time), " if fresh else ""
    print(f"\n{len(results)} variants for {arch}: {len(fresh)} compiled ({units} libraries), "
          f"{len(results) - len(fresh)} cached, {len(failed)} failed; {per_variant}wall {wall:.1f} s "
          f"on {args.jobs or os.cpu_count()} cores", file=sys.stderr)
    for b in failed:
        print(f"\nFAILED {b.variant.name}:\n{b.error}", file=sys.stderr)
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from tuner.deploy import load as deploy

    fam = cli_target.family_cli(args)
    # the captured problems are read first: a bad file or family says so before any GPU is looked for
    problems = _captured(fam, args) if args.problems is not None else None
    attached = gpus.attached(asked=f"--gpu {args.gpu}" if args.gpu else "",
                             hint="; bench times the tuned op on this machine's GPU")
    if args.gpu and not attached.matches(args.gpu):
        raise TunerError(f"--gpu {args.gpu} was asked for, but the attached GPU is {attached.name}")
    directory = args.artifact or deploy.find_export(args.gpu or "auto", args.family)
    args.out = args.out or paths.bench_dir()
    info = attached.describe()
    print(f"# {info['gpu_name']} ({info['arch']}), driver {info['driver']}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}")
    if problems is not None:
        fam.bench_problems(directory, problems, args)  # its last line says where it is slower than torch
        print(f"wrote {args.out}/bench.csv, bench.md")
        return 0
    fam.bench(directory, args)
    print(f"wrote {args.out}/bench.csv, bench.md, bench.png")
    return 0


def _captured(fam, args: argparse.Namespace) -> list[dict]:
    """The family's problems in a tuner.capture file (`--problems`); one that holds none raises."""
    if not cli_target.benches_problems(args.family):
        raise TunerError(f"--problems: the {args.family} family has no bench of captured problems")
    from tuner.deploy import captured

    return captured.read(args.problems, family=args.family)
