"""Capture a set of shapes that look like real models' (what `tuner.capture` records of a training
run), for `tuner search --problems` and `tuner bench --problems`:

    python tools/capture_shapes.py rms_norm shapes.json        # a Llama-style set: 8 (tokens, hidden, dtypes)
    python tools/capture_shapes.py embedding_bag shapes.json   # a DLRM-style set of 8 tables and bags
    python tools/capture_shapes.py cross_entropy shapes.json   # training steps of small Llama-style models
    python tools/capture_shapes.py rms_norm held-out.json --held-out   # other shapes, for a second check

Each shape is called a few times through the torch module a model holds (nn.RMSNorm,
nn.EmbeddingBag) under `tuner.capture`, forward and backward, on the GPU; cross-entropy's are the
F.cross_entropy calls of whole training steps (embedding, blocks of RMSNorm and an MLP, the LM
head, the loss over the vocabulary) of small Llama-style models with real vocabularies."""

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
# (batch, sequence, hidden, vocabulary, dtype): the vocabularies of Llama 2 (32000), Mistral (32768),
# GPT-2 (50257: no vector divides it), Llama 3 (128256) and Qwen 2 (151936), 1 in 7 labels ignored
CROSS_ENTROPY = [(4, 1024, 256, 32000, "bfloat16"), (8, 2048, 256, 32000, "bfloat16"),
                 (4, 2048, 256, 32768, "bfloat16"), (8, 1024, 256, 50257, "bfloat16"),
                 (2, 2048, 256, 128256, "bfloat16"), (4, 4096, 256, 128256, "bfloat16"),
                 (2, 4096, 256, 151936, "bfloat16"), (16, 512, 256, 32000, "float32")]
CROSS_ENTROPY_HELD_OUT = [(2, 2048, 256, 49152, "bfloat16"), (1, 8192, 256, 256000, "bfloat16"),
                          (6, 1024, 256, 100352, "bfloat16"), (2, 1024, 256, 128256, "float16"),
                          (3, 1000, 256, 32001, "bfloat16")]


def llama_step(batch: int, seq: int, hidden: int, vocab: int, dtype: str, device: str = "cuda"):
    """A training step of a small Llama-style model (2 blocks of RMSNorm and a SiLU MLP, an LM head,
    the loss over the vocabulary): a function that runs one forward and backward."""
    dt = getattr(torch, dtype)
    embed = torch.nn.Embedding(vocab, hidden, device=device, dtype=dt)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(
        torch.nn.RMSNorm(hidden, eps=1e-6, device=device, dtype=dt), torch.nn.Linear(hidden, 4 * hidden, device=device, dtype=dt),
        torch.nn.SiLU(), torch.nn.Linear(4 * hidden, hidden, device=device, dtype=dt)) for _ in range(2))
    norm = torch.nn.RMSNorm(hidden, eps=1e-6, device=device, dtype=dt)
    head = torch.nn.Linear(hidden, vocab, bias=False, device=device, dtype=dt)
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
    labels = tokens[:, 1:].clone()
    labels[torch.rand(labels.shape, device=device) < 1 / 7] = -100

    def step():
        h = embed(tokens[:, :-1])
        for block in blocks:
            h = h + block(h)
        logits = head(norm(h))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), labels.reshape(-1))
        loss.backward()
        return loss

    return step


def cross_entropy(shapes, calls: int) -> None:
    for shape in shapes:
        step = llama_step(*shape)
        for _ in range(calls):
            step()


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
    p.add_argument("family", choices=("rms_norm", "embedding_bag", "cross_entropy"))
    p.add_argument("out")
    p.add_argument("--held-out", action="store_true", help="the second set of shapes, for a check of other shapes")
    p.add_argument("--calls", type=int, default=3, help="calls per shape")
    args = p.parse_args()
    run, shapes = {"rms_norm": (rms_norm, RMS_NORM_HELD_OUT if args.held_out else RMS_NORM),
                   "embedding_bag": (embedding_bag, EMBEDDING_BAG_HELD_OUT if args.held_out else EMBEDDING_BAG),
                   "cross_entropy": (cross_entropy, CROSS_ENTROPY_HELD_OUT if args.held_out else CROSS_ENTROPY),
                   }[args.family]
    run(shapes, 1)  # first calls (CUDA's start, kernels loaded) outside the capture: a training run's steady state
    torch.cuda.synchronize()
    with tuner.capture(args.out) as cap:
        run(shapes, args.calls)
        torch.cuda.synchronize()
    for problem in cap.problems:
        print(f"{problem['key']}: {problem['calls']} calls, {problem['time_us']:.0f} us, {problem['share']:.0%}")


if __name__ == "__main__":
    main()
