"""GIoU's command line: its space options (the dtypes, and opt-in device asserts), how an
export's problem reads in a line, and `tuner bench`'s options (the problem's come from its
declared fields, tuner.cli.target)."""

from __future__ import annotations

import argparse

from tuner.cli import args as cli_args
from tuner.families import giou


def add_space_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pred", default="bfloat16", help="pred dtype: float32, float16, bfloat16 (default)")
    p.add_argument("--target", default="uint8", help="target dtype: uint8 (default), float16, bfloat16, float32")
    p.add_argument("--all-dtypes", action="store_true", help="every (pred, target) dtype pair")
    p.add_argument("--device-assert", action="store_true",
                   help="variants that also stop on a device-side assert when validation fails (opt-in)")


def spaces(args) -> list:
    if args.all_dtypes:
        return [giou.space(p, t, args.device_assert) for p in giou.PRED_DTYPES for t in giou.TARGET_DTYPES]
    return [giou.space(args.pred, args.target, args.device_assert)]


def describe(problem: dict) -> str:
    """A tuned problem in one line (export-best's listing)."""
    return f"{problem['pred']}/{problem['target']} B={problem['batch']} S={problem['slots']}"


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=cli_args.sizes, default=(64, 256, 1024, 4096),
                   help="batch sizes, comma-separated (default 64,256,1024,4096)")
    p.add_argument("--dtypes", type=cli_args.pairs, default=(("bfloat16", "uint8"), ("float32", "float32")),
                   help="pred/target pairs, comma-separated (default bfloat16/uint8,float32/float32)")


def bench(directory, args) -> list[dict]:
    import tuner
    from tuner.families.giou import bench as giou_bench

    op = tuner.load(directory)
    return giou_bench.run(op, args.batches, args.dtypes, out=args.out)
