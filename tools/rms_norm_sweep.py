"""GPU time of RMSNorm variants' forward and backward, each from CUDA-graph replays, at a few
shapes: which parameters make a fast forward, which a fast backward, and whether one variant
is both (GPU machine).

    python tools/rms_norm_sweep.py [--shapes 4096x4096,8192x8192] [--limit N] [--where k=v,...]
"""

from __future__ import annotations

import argparse
import random

import torch

from tuner import gpus
from tuner.build import compile as build
from tuner.report.bench import graph_us
from tuner.families import rms_norm
from tuner.measure.declared import Evaluation


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,8192x8192")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--limit", type=int, default=160, help="variants sampled from the space (seeded)")
    ap.add_argument("--where", default="", help="parameters to keep, e.g. vec=4|8,rstd=saved")
    args = ap.parse_args()
    fixed = dict(kv.split("=") for kv in args.where.split(",") if kv)
    variants = [v for v in rms_norm.space(args.dtype, args.dtype)
                if all(str(v.as_dict()[k]) in val.split("|") for k, val in fixed.items())]
    random.Random(0).shuffle(variants)
    variants = variants[:args.limit]
    ev = Evaluation("rms_norm")
    kernels = []
    for b in build.build(variants, gpus.attached().arch):
        if b.ok:
            kernels.append(ev.load(b.so, b.variant.name, b.entry))
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    floor = {}
    results = {k.name: {} for k in kernels}
    for rows, width in shapes:
        x, w = rms_norm.make_inputs(rows, width, args.dtype, args.dtype, seed=0)
        g = torch.randn_like(x)
        once = rows * width * x.element_size() / 3.0e12 * 1e6
        floor[(rows, width)] = (2 * once, 5 * once)
        for k in kernels:
            values = {"x": x, "weight": w, "eps": rms_norm.DEFAULT_EPS}
            fwd, outs = k.prepare(values)
            fwd()
            bwd, _ = k.prepare_backward({"y": g}, values, {"rstd": outs["rstd"]})
            results[k.name][(rows, width)] = (graph_us(fwd, calls=10, replays=5, rounds=3),
                                              graph_us(bwd, calls=10, replays=5, rounds=3))
        report(results, floor, [(rows, width)])
    report(results, floor, shapes, overall=True)


def report(results, floor, shapes, overall=False) -> None:
    for rows, width in shapes if not overall else []:
        f_floor, b_floor = floor[(rows, width)]
        print(f"\n{rows}x{width}: floor fwd {f_floor:.1f} us, fwd+bwd {b_floor:.1f} us")
        for label, key in (("fwd", lambda r: r[0]), ("bwd", lambda r: r[1]), ("fwd+bwd", lambda r: r[0] + r[1])):
            best = sorted(results, key=lambda n: key(results[n][(rows, width)]))[:6]
            for n in best:
                f, b = results[n][(rows, width)]
                print(f"  best {label:8s} fwd {f:6.1f} ({f / f_floor:.2f}x)  fwd+bwd {f + b:6.1f} "
                      f"({(f + b) / b_floor:.2f}x)  {n}", flush=True)
    if not overall:
        return
    total = {n: sum(sum(r) / floor[s][1] for s, r in results[n].items()) for n in results}
    print("\nbest fwd+bwd over all shapes (sum of ratios to the floor):")
    for n in sorted(total, key=total.get)[:8]:
        print(f"  {total[n] / len(shapes):.3f}x  {n}", flush=True)


if __name__ == "__main__":
    main()
