"""Where the host time of one RMSNorm forward+backward goes, the tuned op beside F.rms_norm
(GPU machine): the profiler's CPU self time per event, for an export DIR.

    python tools/rms_norm_host.py DIR
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import tuner
from tuner.families import rms_norm

op = tuner.load(sys.argv[1])
x, w = (t.requires_grad_() for t in rms_norm.make_inputs(4096, 4096, seed=0))
g = torch.randn_like(x)
for name, fn in (("tuned op", lambda: op(x, w, 1e-6)), ("F.rms_norm", lambda: F.rms_norm(x, (4096,), w, 1e-6))):
    for _ in range(20):
        torch.autograd.grad(fn(), (x, w), g)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        torch.autograd.grad(fn(), (x, w), g)
    host = (time.perf_counter() - t0) / 50 * 1e6
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            torch.autograd.grad(fn(), (x, w), g)
    print(f"\n{name}: {host:.1f} us of host time a call (launches queued, no sync)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
