"""Train a small Llama-style decoder on random tokens, then swap in the tuned RMSNorm.

    python examples/train_llama_rms_norm.py --capture shapes.json    # record the RMSNorm shapes
    tuner search --family rms_norm --gpu auto --problems shapes.json  # tune each of them
    tuner export-best --family rms_norm --gpu auto
    python examples/train_llama_rms_norm.py --compare                # step time, torch vs tuned

--compare loads the export and puts it into the model with one line, `tuner.patch(model)`.
--transformers trains transformers' LlamaForCausalLM (built from a config) instead of the model
here; --frozen-norms keeps the norms' weights frozen, as adapter (LoRA) fine-tuning does.

The tokens per step vary (batch x seq from a few choices, as bucketed batches do), so the norms
see several shapes: rows = batch x seq, width = --hidden. The export serves each captured shape
with its winner where it beat F.rms_norm, and with torch's own op elsewhere; `tuner bench
--family rms_norm --gpu auto --problems shapes.json` times the op alone at each of them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6
VOCAB = 32000


class Block(nn.Module):
    """Pre-norm attention and SwiGLU MLP (rotary embeddings left out: they change no norm's shape)."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(hidden, eps=EPS), nn.RMSNorm(hidden, eps=EPS)
        self.qkv, self.out = nn.Linear(hidden, 3 * hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
        ffn = 256 * ((8 * hidden // 3 + 255) // 256)  # Llama's 8/3 x hidden, rounded up to 256
        self.gate_up, self.down = nn.Linear(hidden, 2 * ffn, bias=False), nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm, self.head = nn.RMSNorm(hidden, eps=EPS), nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class HFLlama(nn.Module):
    """transformers' LlamaForCausalLM built from a config (random weights, nothing downloaded),
    returning logits as Llama above does; its norms are LlamaRMSNorm modules."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int):
        super().__init__()
        import transformers

        ffn = 256 * ((8 * hidden // 3 + 255) // 256)
        self.model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads, rms_norm_eps=EPS, max_position_embeddings=4096))

    def forward(self, tokens):
        return self.model(input_ids=tokens).logits


def batches(shapes, vocab: int, seed: int) -> list[torch.Tensor]:
    """One batch of random tokens per (batch, seq), seq + 1 long: inputs and next-token targets."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (b, s + 1), generator=g).cuda() for b, s in shapes]


def train_step(model, opt, tokens) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def ms_per_step(model, opt, data, rounds: int) -> float:
    """Median over `rounds` passes over every batch (one step of each shape), after a pass of
    warm-up (the allocator, cuBLAS's and the op's first calls), per step."""
    for tokens in data:
        train_step(model, opt, tokens)
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for tokens in data:
            train_step(model, opt, tokens)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3 / len(data))
    return statistics.median(times)


def capture(model, opt, data, path: str) -> None:
    import tuner

    with tuner.capture(path) as cap:
        for tokens in data * 2:
            train_step(model, opt, tokens)
    print(f"wrote {path}:")
    for p in cap.problems:
        print(f"  {p['family']} {p['key']}: {p['calls']} calls, {p['share']:.0%} of the captured time")
    print(f"next:\n  tuner search --family rms_norm --gpu auto --problems {path}\n"
          "  tuner export-best --family rms_norm --gpu auto\n  python examples/train_llama_rms_norm.py --compare")


def compare(model, opt, data, rounds: int) -> None:
    import tuner

    tuner.load(gpu="auto", family="rms_norm")
    start = {k: v.clone() for k, v in model.state_dict().items()}
    runs = []
    for label in ("torch's RMSNorm", "tuned op"):
        if label == "tuned op":
            print(tuner.patch(model))  # one line: every RMSNorm module the export serves
        model.load_state_dict(start)  # both from the same weights, on the same batches
        opt.state.clear()
        runs.append((train_step(model, opt, data[0]).item(), ms_per_step(model, opt, data, rounds)))
        print(f"{label:<17} first loss {runs[-1][0]:.4f}, {runs[-1][1]:.2f} ms per step", flush=True)
    (torch_loss, torch_ms), (tuned_loss, tuned_ms) = runs
    # a few bf16 roundings (2^-8 each) through the layers: 2% is far above them, far below a bug's
    if abs(tuned_loss - torch_loss) > 0.02 * abs(torch_loss):
        raise SystemExit(f"the losses disagree: torch {torch_loss:.4f}, tuned {tuned_loss:.4f}")
    print(f"tuned / torch step time: {tuned_ms / torch_ms:.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--capture", metavar="FILE", help="train a few steps under tuner.capture, write FILE")
    mode.add_argument("--compare", action="store_true", help="step time with torch's RMSNorm and the tuned op")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--shapes", default="4x1024,8x1024,2x3072,12x1024", help="BATCHxSEQ per step, in turn")
    ap.add_argument("--rounds", type=int, default=5, help="timed passes over the shapes (--compare)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--transformers", action="store_true", help="transformers' LlamaForCausalLM (LlamaRMSNorm)")
    ap.add_argument("--frozen-norms", action="store_true",
                    help="the norms' weights frozen, as adapter (LoRA) fine-tuning keeps them")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train_llama_rms_norm.py needs a CUDA GPU")
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    torch.manual_seed(args.seed)
    model = (HFLlama if args.transformers else Llama)(VOCAB, args.hidden, args.layers, args.heads)
    model = model.to("cuda", torch.bfloat16)
    if args.frozen_norms:
        for name, p in model.named_parameters():
            p.requires_grad_("norm" not in name)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    data = batches(shapes, VOCAB, args.seed)
    if args.capture:
        capture(model, opt, data, args.capture)
    else:
        compare(model, opt, data, args.rounds)


if __name__ == "__main__":
    main()
