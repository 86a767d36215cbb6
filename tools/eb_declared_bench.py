"""The EmbeddingBag winners of docs/benchmarks.md (joined, each dtype's), exported and benched at the
PR's configuration by the checkout this runs from: run it from two checkouts in one session, in
turns, each its own copy, to compare them (its rows append to OUT/rows-TAG.jsonl).

    cd OLD && TUNER_HOME=/tmp/old PYTHONPATH=. python3 tools/eb_declared_bench.py old1 OUT
    cd NEW && TUNER_HOME=/tmp/new python3 tools/eb_declared_bench.py new1 OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# each dtype's winner, by the names docs/benchmarks.md gives: the forward of one variant, the backward of another
JOINED = {"float32": ("none.block.longest.4.4.b128.shared.atomic", "inline.warp.longest.4.1.b512.shared.atomic"),
          "float16": ("hoisted.block.8.1.b256.direct.sorted", "inline.subwarp.split64.8.1.b64.shared.sorted"),
          "bfloat16": ("none.block.8.1.b256.direct.sorted", "kernel.subwarp.split32.8.1.b64.shared.sorted")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tag", help="names this run's export and rows (old1, new1, ...)")
    ap.add_argument("out", type=Path, help="folder for the export and rows-TAG.jsonl")
    args = ap.parse_args()

    import tuner
    from tuner import gpus
    from tuner.deploy import export
    from tuner.families import embedding_bag as eb
    from tuner.report import declared
    from tuner.variant import Variant

    print(args.tag, tuner.__file__, flush=True)
    winners = []
    for weight, (forward, backward) in JOINED.items():
        by_name = eb.space(weight, "int64").by_name()
        joined = Variant.joined(*(by_name[f"{eb.FAMILY}.{weight}.int64.{half}"] for half in (forward, backward)))
        for mode in eb.MODES if weight == "float32" else ("sum",):
            winners.append({"variant": joined, "problem": eb.Problem(weight=weight, mode=mode).__dict__})
    directory = export.write(args.out / f"artifact-{args.tag}", winners, gpus.attached().describe())
    configs = [eb.Problem(mode=m) for m in eb.MODES] + [eb.Problem(weight=w) for w in ("float16", "bfloat16")]
    rows = declared.bench_at(eb.FAMILY, directory, [{**p.__dict__, "per_sample_weights": False} for p in configs])
    with open(args.out / f"rows-{args.tag}.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps({"tree": args.tag, **r}) + "\n")


if __name__ == "__main__":
    main()
