"""Capture a set of shapes that look like real models' (what `tuner.capture` records of a training
run), for `tuner search --problems` and `tuner bench --problems`:

    python tools/capture_shapes.py rms_norm shapes.json        # a Llama-style set: 8 (tokens, hidden, dtypes)
    python tools/capture_shapes.py embedding_bag shapes.json   # a DLRM-style set of 8 tables and bags
    python tools/capture_shapes.py rms_norm held-out.json --held-out   # other shapes, for a second check

Each shape is called a few times through the torch module a model holds (nn.RMSNorm,
nn.EmbeddingBag) under `tuner.capture`, forward and backward, on the GPU."""

from __future__ import annotations

import argparse

import torch

import tuner

# (tokens, hidden, x dtype, weight dtype): Llama-style blocks of several sizes and batch shapes,
# weights kept in float32 where mixed precision keeps them so
RMS_NORM = [(8192, 2048, "bfloat16", "bfloat16"), (16384, 4096, "bfloat16", "bfloat16"),
            (4096, 4096, "bfloat16", "bfloat16"), (8192, 8192, "bfloat16", "bfloat16"),
            (32768, 2048, "bfloat16", "bfloat16"), (65536, 768, "bfloat16", "bfloat16"),
            (4096, 5120, "bfloat16", "float32"), (16384, 1024, "float32", "float32")]
RMS_NORM_HELD_OUT = [(12288, 3072, "bfloat16", "bfloat16"), (2048, 14336, "bfloat16", "bfloat16"),
                     (24576, 1536, "float16", "float16"), (4096, 2048, "float16", "float32"),
                     (131072, 512, "bfloat16", "bfloat16"), (1024, 8192, "float32", "float32")]
# (rows, dim, bags, mean bag size, mode, weight dtype): DLRM-style tables, from one-hot to long bags
EMBEDDING_BAG = [(1_000_000, 32, 8192, 20, "sum", "float32"), (2_000_000, 64, 4096, 40, "max", "bfloat16"),
                 (2_000_000, 64, 4096, 40, "sum", "bfloat16"), (5_000_000, 128, 2048, 150, "sum", "float32"),
                 (100_000, 64, 16384, 10, "mean", "float16"), (500_000, 128, 8192, 1, "sum", "float32"),
                 (4_000_000, 16, 8192, 50, "sum", "float32"), (1_000_000, 256, 2048, 8, "mean", "bfloat16")]
EMBEDDING_BAG_HELD_OUT = [(3_000_000, 32, 4096, 30, "sum", "float32"), (200_000, 128, 8192, 5, "mean", "float32"),
                          (1_000_000, 64, 8192, 60, "max", "float16"), (8_000_000, 64, 1024, 100, "sum", "bfloat16")]


def rms_norm(shapes, calls: int) -> None:
    for tokens, hidden, x, w in shapes:
        norm = torch.nn.RMSNorm(hidden, eps=1e-6, device="cuda", dtype=getattr(torch, w))
        inputs = torch.randn(tokens, hidden, device="cuda", dtype=getattr(torch, x), requires_grad=True)
        for _ in range(calls):
            norm(inputs).float().square().mean().backward()


def embedding_bag(tables, calls: int) -> None:
    for rows, dim, bags, size, mode, dtype in tables:
        table = torch.nn.EmbeddingBag(rows, dim, mode=mode, device="cuda", dtype=getattr(torch, dtype))
        lengths = torch.randint(0, 2 * size + 1, (bags,), device="cuda") if size > 1 else torch.ones(
            bags, dtype=torch.long, device="cuda")
        offsets = torch.cumsum(lengths, 0) - lengths
        ids = torch.randint(0, rows, (int(lengths.sum()),), device="cuda")
        # torch has no bfloat16 backward of max: a model with such a table runs it forward only
        backward = not (mode == "max" and dtype == "bfloat16")
        for _ in range(calls):
            out = table(ids, offsets)
            if backward:
                out.float().square().mean().backward()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("family", choices=("rms_norm", "embedding_bag"))
    p.add_argument("out")
    p.add_argument("--held-out", action="store_true", help="the second set of shapes, for a check of other shapes")
    p.add_argument("--calls", type=int, default=3, help="calls per shape")
    args = p.parse_args()
    run, shapes = ((rms_norm, RMS_NORM_HELD_OUT if args.held_out else RMS_NORM) if args.family == "rms_norm" else
                   (embedding_bag, EMBEDDING_BAG_HELD_OUT if args.held_out else EMBEDDING_BAG))
    run(shapes, 1)  # first calls (CUDA's start, kernels loaded) outside the capture: a training run's steady state
    torch.cuda.synchronize()
    with tuner.capture(args.out) as cap:
        run(shapes, args.calls)
        torch.cuda.synchronize()
    for problem in cap.problems:
        print(f"{problem['key']}: {problem['calls']} calls, {problem['time_us']:.0f} us, {problem['share']:.0%}")


if __name__ == "__main__":
    main()
