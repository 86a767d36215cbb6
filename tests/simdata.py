"""A synthetic measurement log for CPU tests of the search (shapes like a real one)."""

import json
import random

from tuner.families import giou

FAILURES = ["compile error", "illegal address", "device-side assert", "hang", "wrong result", "nan",
            "launch error", "crash"]


def write(path, problem=None, seed=0, gpu_name="NVIDIA H100 80GB HBM3"):
    problem = problem or giou.Problem()
    rng = random.Random(seed)
    space = giou.space(problem.pred, problem.target)
    gpu = {"gpu_name": gpu_name, "arch": "sm_90", "torch": "2.11.0", "cuda": "13.0"}
    with open(path, "w") as f:
        for i, v in enumerate(space):
            rec = {"problem": problem.key(), "variant": v.name, "params": space.tuned(v), "gpu": gpu,
                   "compile_s": 1.5, "regs_fwd": 20 + v["boxes_per_thread"], "regs_bwd": 36, "spill_bytes": 0}
            if i < len(FAILURES) * 3 and i % 3 == 0:
                rec.update(status="fail", reason=FAILURES[i // 3], message="planted")
            else:
                fwd = 5 + v["block_size"] / 256 + rng.random()
                rec.update(status="ok", fwd={"median_us": fwd, "spread_us": 0.1},
                           bwd={"median_us": fwd + 2, "spread_us": 0.1}, loss_error=1e-7, grad_error=1e-3)
            f.write(json.dumps(rec) + "\n")
    return path
