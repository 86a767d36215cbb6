"""The EmbeddingBag winners of docs/benchmarks.md (joined, each dtype's), exported and benched at the
PR's configuration by the checkout this runs from: run it from two checkouts in one session, in
turns, to compare them (its rows append to OUT/rows-TAG.jsonl).

    cd OLD && TUNER_HOME=/tmp/old PYTHONPATH=. python3 NEW/tools/eb_declared_bench.py old1 OUT
    cd NEW && TUNER_HOME=/tmp/new python3 tools/eb_declared_bench.py new1 OUT
"""
import json
import sys
from pathlib import Path

import tuner
from tuner import gpus
from tuner.deploy import export
from tuner.families import embedding_bag as eb
from tuner.families.embedding_bag import bench
from tuner.variant import Variant

tag, out = sys.argv[1], Path(sys.argv[2])
print(tag, tuner.__file__, flush=True)


def v(weight, name):
    validation, mapping, *rest = name.split(".")
    split = int(rest.pop(0)[5:]) if rest[0].startswith("split") else None
    order = rest.pop(0) if rest[0] == "longest" else None
    vec, unroll, block, staging, backward = rest
    return Variant.of(eb.FAMILY, {"weight": weight, "index": "int64", "validation": validation, "mapping": mapping,
                                  "split": split, "order": order, "vec": int(vec), "unroll": int(unroll),
                                  "block_size": int(block[1:]), "staging": staging, "backward": backward})


J = {"float32": ("none.block.longest.4.4.b128.shared.atomic", "inline.warp.longest.4.1.b512.shared.atomic"),
     "float16": ("hoisted.block.8.1.b256.direct.sorted", "inline.subwarp.split64.8.1.b64.shared.sorted"),
     "bfloat16": ("none.block.8.1.b256.direct.sorted", "kernel.subwarp.split32.8.1.b64.shared.sorted")}
winners = []
for w, (f, b) in J.items():
    joined = Variant.joined(v(w, f), v(w, b))
    for mode in (eb.MODES if w == "float32" else ("sum",)):
        winners.append({"variant": joined, "problem": eb.Problem(weight=w, mode=mode).__dict__})
directory = export.write(out / f"artifact-{tag}", winners, gpus.attached().describe())
configs = [eb.Problem(mode=m) for m in eb.MODES] + [eb.Problem(weight=w) for w in ("float16", "bfloat16")]
rows = bench.run(directory, configs=configs)
with open(out / f"rows-{tag}.jsonl", "a") as f:
    for r in rows:
        f.write(json.dumps({"tree": tag, **r}) + "\n")
