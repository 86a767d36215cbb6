"""`tuner` command line: one function per command, shared flags from parent parsers."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Callable

from tuner import gpus
from tuner.errors import TunerError

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    COMMANDS[fn.__name__.removeprefix("cmd_").replace("_", "-")] = fn
    return fn


def _target_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--gpu", help="GPU name (L4, A100, H100, T4, ...) or 'auto' for the attached one")
    p.add_argument("--arch", help="architecture such as sm_89; overrides --gpu")
    return p


def _dtype_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--pred", default="bfloat16", help="pred dtype: float32, float16, bfloat16 (default)")
    p.add_argument("--target", default="uint8", help="target dtype: uint8 (default), float16, bfloat16, float32")
    p.add_argument("--all-dtypes", action="store_true", help="every (pred, target) dtype pair")
    p.add_argument("--device-assert", action="store_true",
                   help="variants that also stop on a device-side assert when validation fails (opt-in)")
    return p


def _spaces(args):
    from tuner.families import giou

    if args.all_dtypes:
        return [giou.space(p, t, args.device_assert) for p in giou.PRED_DTYPES for t in giou.TARGET_DTYPES]
    return [giou.space(args.pred, args.target, args.device_assert)]


def _spread(variants: list, limit: int | None) -> list:
    """`limit` variants spread over the space (a fixed shuffle, so reruns pick the same ones)."""
    if not limit or limit >= len(variants):
        return variants
    picked = list(variants)
    random.Random(0).shuffle(picked)
    return picked[:limit]


@command
def cmd_variants(args: argparse.Namespace) -> int:
    import pandas as pd

    arch = gpus.resolve(args.gpu, args.arch)
    rows = []
    for space in _spaces(args):
        for v in space:
            rows.append({"name": v.name, **v.as_dict()})
    if args.json:
        print(json.dumps({"arch": arch, "count": len(rows), "variants": rows}, indent=1))
        return 0
    table = pd.DataFrame(rows).drop(columns=["name", "device_assert"])
    print(f"{len(rows)} valid variants for {arch}")
    shown = table if args.limit == 0 else table.head(args.limit)
    print(shown.to_string(index=False))
    if len(shown) < len(table):
        print(f"... {len(table) - len(shown)} more (--limit 0 shows all, --json for machine-readable output)")
    return 0


@command
def cmd_build(args: argparse.Namespace) -> int:
    import pandas as pd

    from tuner import build
    from tuner.families import giou

    arch = gpus.resolve(args.gpu, args.arch)
    if args.covering:
        variants = giou.covering_set()
    else:
        variants = _spread([v for s in _spaces(args) for v in s], args.limit)
    started = time.monotonic()
    results = build.build(variants, arch, jobs=args.jobs)
    wall = time.monotonic() - started
    rows = [{
        "variant": b.variant.name, "ok": b.ok, "cached": b.cached, "compile_s": round(b.compile_s, 2),
        "regs_fwd": b.registers.get("forward_mean", b.registers.get("forward_none", "")),
        "regs_bwd": b.registers.get("backward_mean", ""), "spill_bytes": b.spill_bytes,
        "smem_bytes": b.smem_bytes,
    } for b in results]
    if args.json:
        print(json.dumps({"arch": arch, "wall_s": wall, "builds": [b.summary() for b in results]}, indent=1))
    else:
        print(pd.DataFrame(rows).to_string(index=False))
    fresh = [b for b in results if not b.cached]
    failed = [b for b in results if not b.ok]
    times = sorted(b.compile_s for b in fresh if b.ok)
    median = f"{times[len(times) // 2]:.2f} s" if times else "-"
    print(f"\n{len(results)} variants for {arch}: {len(fresh)} compiled, {len(results) - len(fresh)} cached, "
          f"{len(failed)} failed; median compile {median}; wall {wall:.1f} s", file=sys.stderr)
    for b in failed:
        print(f"\nFAILED {b.variant.name}:\n{b.error}", file=sys.stderr)
    return 1 if failed else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tuner", description="Tune CUDA kernel variants of PyTorch ops.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    target, dtypes = _target_parser(), _dtype_parser()

    s = sub.add_parser("variants", parents=[target, dtypes], help="list the valid variants")
    s.add_argument("--json", action="store_true")
    s.add_argument("--limit", type=int, default=40, help="rows to print (0: all)")

    s = sub.add_parser("build", parents=[target, dtypes], help="compile variants (no GPU needed)")
    s.add_argument("--limit", type=int, help="build this many variants, spread over the space")
    s.add_argument("--jobs", type=int, help="parallel compiles (default: all cores)")
    s.add_argument("--covering", action="store_true",
                   help="the covering set: every value of every dimension, every dtype pair")
    s.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except TunerError as exc:
        if args.debug:
            raise
        print(f"tuner {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tuner {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
