"""Fixed winners exported and benched by the checkout this runs from, to compare two checkouts'
numbers with the search's noise taken out: GIoU's README winner at the article's B=1024
(bfloat16/uint8), EmbeddingBag's winners of docs/benchmarks.md (joined, each dtype's) at the PR's
configuration. Run it from two checkouts in one session, in turns, each its own copy and
TUNER_HOME (its rows append to OUT/rows-TAG.jsonl):

    cd OLD && TUNER_HOME=/tmp/old PYTHONPATH=. python3 tools/fixed_bench.py old1 OUT [--families giou embedding_bag]
    cd NEW && TUNER_HOME=/tmp/new python3 tools/fixed_bench.py new1 OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GIOU = "k2.branch.none.b128.scalar.two_pass.recompute"  # README's winner, bfloat16/uint8
# each dtype's EmbeddingBag winner, by the names docs/benchmarks.md gives: the forward of one
# variant, the backward of another
JOINED = {"float32": ("none.block.longest.4.4.b128.shared.atomic", "inline.warp.longest.4.1.b512.shared.atomic"),
          "float16": ("hoisted.block.8.1.b256.direct.sorted", "inline.subwarp.split64.8.1.b64.shared.sorted"),
          "bfloat16": ("none.block.8.1.b256.direct.sorted", "kernel.subwarp.split32.8.1.b64.shared.sorted")}


def giou():
    from tuner.families import giou as g

    problem = g.Problem()
    variant = g.space(problem.pred, problem.target).by_name()[f"{g.FAMILY}.{problem.pred}.{problem.target}.{GIOU}"]
    return g.FAMILY, [{"variant": variant, "problem": problem.__dict__}], [problem.__dict__]


def embedding_bag():
    from tuner.families import embedding_bag as eb
    from tuner.variant import Variant

    winners = []
    for weight, (forward, backward) in JOINED.items():
        by_name = eb.space(weight, "int64").by_name()
        joined = Variant.joined(*(by_name[f"{eb.FAMILY}.{weight}.int64.{half}"] for half in (forward, backward)))
        for mode in eb.MODES if weight == "float32" else ("sum",):
            winners.append({"variant": joined, "problem": eb.Problem(weight=weight, mode=mode).__dict__})
    configs = [eb.Problem(mode=m) for m in eb.MODES] + [eb.Problem(weight=w) for w in ("float16", "bfloat16")]
    return eb.FAMILY, winners, [{**p.__dict__, "per_sample_weights": False} for p in configs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tag", help="names this run's exports and rows (old1, new1, ...)")
    ap.add_argument("out", type=Path, help="folder for the exports and rows-TAG.jsonl")
    ap.add_argument("--families", nargs="+", default=["giou", "embedding_bag"], choices=["giou", "embedding_bag"])
    args = ap.parse_args()

    import tuner
    from tuner import gpus
    from tuner.deploy import export
    from tuner.report import declared

    print(args.tag, tuner.__file__, flush=True)
    for name in args.families:
        family, winners, configs = globals()[name]()
        directory = export.write(args.out / f"artifact-{family}-{args.tag}", winners, gpus.attached().describe())
        rows = declared.bench_at(family, directory, configs)
        with open(args.out / f"rows-{args.tag}.jsonl", "a") as f:
            for r in rows:
                f.write(json.dumps({"tree": args.tag, "family": family, **r}) + "\n")


if __name__ == "__main__":
    main()
