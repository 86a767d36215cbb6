"""Where the host time of an RMSNorm forward+backward goes: the tuned op (served by a variant, or
by torch's op where the export says so) beside F.rms_norm, on the GPU machine. Per shape the host
time of back-to-back calls (launches queued, no sync), the wall time (synchronized), the host time
of a forward alone, then the profiler's CPU self time per event at the first shape.

    python tools/rms_norm_host.py [--variant NAME] [--shapes 4096x4096,8192x2048] [--torch 1024x8192]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import tuner
from tuner import gpus
from tuner.cli import args as cli_args
from tuner.deploy import export
from tuner.families import rms_norm

EPS = 1e-6


def exported(variant: str, variant_shapes, torch_shapes):
    v = rms_norm.space().by_name()[variant]
    timed = {"fwd": {"median_us": 1.0}, "bwd": {"median_us": 1.0}}
    entries = [{"variant": v, "problem": rms_norm.Problem(r, c).__dict__, "timings": timed, "objective": "fwd+bwd",
                "objective_us": 2.0, "served_by": who}
               for shapes, who in ((variant_shapes, "variant"), (torch_shapes, "torch")) for r, c in shapes]
    return tuner.load(export.write(tempfile.mkdtemp(), entries, gpus.attached().describe()))


def per_call(fn, calls: int = 200) -> tuple[float, float]:
    """(host µs, wall µs) per call of `fn`, back to back."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="rms_norm.bfloat16.bfloat16.256.b256.4.2.recompute.atomic.4.blocks")
    p.add_argument("--shapes", type=cli_args.shapes, default=((4096, 4096), (8192, 2048)))
    p.add_argument("--torch", type=cli_args.shapes, default=((1024, 8192),), help="shapes served by torch's op")
    args = p.parse_args()
    op = exported(args.variant, args.shapes, args.torch)
    for rows, width in (*args.shapes, *args.torch):
        x, w = (t.requires_grad_() for t in rms_norm.make_inputs(rows, width, seed=0))
        g = torch.randn_like(x)
        served = torch.ops.tuner_rms_norm.served([rows, width], torch.bfloat16, torch.bfloat16)
        print(f"{rows} x {width}, served by {served}")
        impls = {"op": lambda: op(x, w, EPS), "op.default": lambda: op.default(x, w, EPS),
                 "F.rms_norm": lambda: F.rms_norm(x, (width,), w, EPS)}
        for _ in range(2):  # twice, to see the noise
            for name, fn in impls.items():
                host, wall = per_call(lambda: torch.autograd.grad(fn(), (x, w), g))
                fwd, _ = per_call(fn)
                print(f"  {name:12s} fwd+bwd host {host:6.1f} wall {wall:6.1f} us | fwd host {fwd:5.1f} us")
    rows, width = args.shapes[0]
    x, w = (t.requires_grad_() for t in rms_norm.make_inputs(rows, width, seed=0))
    g = torch.randn_like(x)
    for name, fn in (("op", lambda: op(x, w, EPS)), ("F.rms_norm", lambda: F.rms_norm(x, (width,), w, EPS))):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                torch.autograd.grad(fn(), (x, w), g)
        print(f"\n{name}, {rows} x {width}: CPU self time over 20 calls")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    main()
