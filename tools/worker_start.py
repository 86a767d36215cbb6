"""Where a search worker's start goes, step by step, on the GPU it runs on: importing torch,
starting CUDA, describing the GPU, the L2 flush buffer, then each family's evaluation and its
warm-up (the check cases and timing inputs a first variant needs).

    python tools/worker_start.py [--families giou,rms_norm,embedding_bag]
"""

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="giou,rms_norm,embedding_bag", help="comma-separated families")
    args = ap.parse_args()
    last = [time.perf_counter()]

    def lap(what: str) -> None:
        now = time.perf_counter()
        print(f"{what}: {now - last[0]:.2f} s", flush=True)
        last[0] = now

    import torch

    lap("import torch")
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    lap("CUDA start")
    from tuner import families, gpus
    from tuner.measure import child, timing

    gpus.attached(0).describe(driver="")
    lap("describe the GPU")
    timing.L2Flush()
    torch.cuda.synchronize()
    lap("L2 flush buffer")
    for name in args.families.split(","):
        problem = families.get(name).Problem()
        evaluation = child.evaluation(name)
        lap(f"{name}: evaluation")
        evaluation.warm(problem.__dict__)
        torch.cuda.synchronize()
        lap(f"{name}: warm-up (check cases, timing inputs)")


if __name__ == "__main__":
    main()
