"""Forward+backward of one cross-entropy variant, reduction mean and none, at one shape: what a
variant that writes the gradient in its forward costs each reduction (docs/benchmarks.md,
"Reduction none"). The variant is exported alone and loaded with `baseline=False`; each reduction's
gradient (of an output gradient of random numbers: each row's own for none) is checked against
float64 first, then `torch.autograd.grad` of the op's loss is timed with CUDA events (20 steps,
median of 7 rounds). One JSON line: µs a step per reduction, and the fused floor: the logits read
once and the gradient written once at the device-to-device copy bandwidth measured in the same run
(a copy of the logits, timed as the steps are).

    python tools/ce_reduction.py '{"threads_per_row": 1024, "block_size": 1024, "vec": 8, "gradient": "forward"}' \
        [--rows 4096] [--vocab 32000] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import warnings
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("params", help="the variant's parameters, JSON (the nearest variant is taken)")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    import tuner
    from tuner import gpus
    from tuner.deploy import export
    from tuner.families import cross_entropy as ce

    v = ce.space(args.dtype).nearest(json.loads(args.params))
    problem = ce.Problem(args.rows, args.vocab, args.dtype).__dict__
    directory = export.write(Path(tempfile.mkdtemp()) / "export", [{"variant": v, "problem": problem}],
                             gpus.attached().describe())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = tuner.load(directory, baseline=False)
    x, t = ce.make_inputs(args.rows, args.vocab, args.dtype, seed=3)
    x.requires_grad_()
    out = {"variant": v.name}

    def timed(fn) -> float:  # µs a call: 5 warm-up calls, then the median of 7 rounds of 20
        for _ in range(5):
            fn()
        times = []
        for _ in range(7):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / 20)
        return statistics.median(times)

    for reduction in ("mean", "none"):
        g = torch.rand((args.rows,) if reduction == "none" else (), device="cuda") + 0.5
        (got,) = torch.autograd.grad(op(x, t, -100, 0.0, reduction), x, g)
        x64 = x.detach().double().requires_grad_()
        (want,) = torch.autograd.grad(F.cross_entropy(x64, t, reduction=reduction), x64, g.double())
        error = float((got.double() - want).norm() / want.norm())
        if error > 1e-2:
            raise SystemExit(f"{v.name} {reduction}: gradient's relative error {error:.3g}")

        out[reduction] = round(timed(lambda: torch.autograd.grad(op(x, t, -100, 0.0, reduction), x, g)), 1)
        out[f"{reduction}_error"] = f"{error:.2g}"
    copy = torch.empty_like(x)
    copy_us = timed(lambda: copy.copy_(x))  # reads and writes the logits' bytes once: the floor's traffic
    out["copy_tb_s"] = round(2 * x.numel() * x.element_size() / copy_us / 1e6, 2)
    out["floor_us"] = round(copy_us, 1)
    out["mean_over_floor"], out["none_over_floor"] = (round(out[r] / copy_us, 3) for r in ("mean", "none"))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
