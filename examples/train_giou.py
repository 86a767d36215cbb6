"""Train the article's toy face detector with the eager padded GIoU loss or the tuned op.

    python examples/train_giou.py --loss eager --steps 50
    python examples/train_giou.py --loss tuned --artifact exports/giou-H100 --steps 50

Tuned for this run's own shapes: capture them (the tuned op's calls are what a capture sees of
GIoU; the eager loss is Python that no mode recognises), search and export them, train again:

    python examples/train_giou.py --loss tuned --steps 5 --capture shapes.json
    tuner search --family giou --gpu auto --problems shapes.json && tuner export-best --gpu auto
    python examples/train_giou.py --loss tuned --steps 50

Both runs start from the same weights and see the same batches, so their losses
agree step by step (to bf16 autocast's precision). Prints per step the loss's own
forward and backward three ways: host (until the calls return: what the training
loop spends issuing them), wall (until the GPU has finished them, the GPU idle
before) and GPU (CUDA events around them); and the whole step's time.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import tuner


class Net(nn.Module):
    """The article's model: a conv stack and two linear layers, 256 box slots out."""

    def __init__(self, size: int = 256, slots: int = 256, hidden: int = 64):
        super().__init__()
        layers = []
        for i in range(4):
            layers += [nn.Conv2d(4 ** i, 4 ** (i + 1), 3, padding="same"), nn.MaxPool2d(2, 2), nn.ReLU()]
        self.conv = nn.Sequential(*layers)
        self.slots = slots
        self.lin1 = nn.Linear(size * size, slots * hidden)
        self.lin2 = nn.Linear(slots * hidden, slots * 4)

    def forward(self, x):
        x = self.conv(x.float())
        x = self.lin2(F.relu(self.lin1(x.flatten(1))))
        return x.view(-1, self.slots, 4)


def batch(generator, size: int, slots: int, image: int, device):
    """Random uint8 images and the article's boxes: floor(|N(0, 3)|) per image, padded with zeros."""
    images = torch.randint(0, 256, (size, 1, image, image), dtype=torch.uint8, generator=generator)
    counts = torch.randn(size, generator=generator).mul(3).abs().floor().clamp(0, slots).to(torch.int64)
    wh = torch.randint(1, image, (size, slots, 2), generator=generator)
    tl = torch.randint(0, image - 1, (size, slots, 2), generator=generator)
    boxes = torch.cat([tl, (tl + wh).clamp(0, image - 1)], -1)
    valid = torch.arange(slots)[None, :] < counts[:, None]
    boxes = torch.where(valid[..., None], boxes, 0).to(torch.uint8)
    return images.to(device, non_blocking=True), boxes.to(device, non_blocking=True), counts.to(device)


def eager_padded_loss(pred, target, num_boxes):
    """What one writes by hand: 1 - GIoU on every slot, masked, averaged over real boxes."""
    t = target.float()
    p = pred.float()
    x1, y1, x2, y2 = p.unbind(-1)
    a1, b1, a2, b2 = t.unbind(-1)
    iw = (torch.min(x2, a2) - torch.max(x1, a1)).clamp(min=0)
    ih = (torch.min(y2, b2) - torch.max(y1, b1)).clamp(min=0)
    inter = iw * ih
    union = (x2 - x1) * (y2 - y1) + (a2 - a1) * (b2 - b1) - inter
    area_c = (torch.max(x2, a2) - torch.min(x1, a1)) * (torch.max(y2, b2) - torch.min(y1, b1))
    loss = 1 - (inter / (union + 1e-7) - (area_c - union) / (area_c + 1e-7))
    mask = torch.arange(pred.shape[1], device=pred.device)[None, :] < num_boxes[:, None]
    return torch.where(mask, loss, 0).sum() / mask.sum().clamp(min=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loss", choices=("eager", "tuned"), default="tuned")
    ap.add_argument("--artifact", help="folder from `tuner export-best` (default: the attached GPU's export)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=64, help="width of the linear layers per slot (article: 64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--capture", metavar="FILE", help="record the loss's shapes into FILE (tuner.capture)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train_giou.py needs a CUDA GPU")
    device = torch.device("cuda")

    if args.loss == "tuned":
        loss_fn = tuner.load(args.artifact) if args.artifact else tuner.load(gpu="auto", family="giou")
    else:
        loss_fn = eager_padded_loss

    torch.manual_seed(args.seed)
    model = Net(hidden=args.hidden).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    times: dict[str, list[float]] = {"host": [], "wall": [], "gpu": [], "step": []}
    # with --capture, the loss's calls are recorded (tuner.capture); a plain run records nothing
    recording = tuner.capture(args.capture) if args.capture else contextlib.nullcontext()
    with recording:
        for step in range(args.steps):
            images, boxes, counts = batch(gen, args.batch, 256, 256, device)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                pred = model(images)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # The loss alone: its forward, and its backward down to pred.
            pred_leaf = pred.detach().requires_grad_(True)
            torch.cuda.synchronize()
            h0 = time.perf_counter()
            start.record()
            loss = loss_fn(pred_leaf, boxes, counts)
            loss.backward()
            end.record()
            h1 = time.perf_counter()
            torch.cuda.synchronize()
            h2 = time.perf_counter()
            pred.backward(pred_leaf.grad)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times["step"].append((time.perf_counter() - t0) * 1e3)
            times["host"].append((h1 - h0) * 1e6)
            times["wall"].append((h2 - h0) * 1e6)
            times["gpu"].append(start.elapsed_time(end) * 1e3)
            print(f"step {step:3d} loss {loss.item():.6f} loss fwd+bwd: host {times['host'][-1]:7.1f} us, "
                  f"wall {times['wall'][-1]:7.1f} us, GPU {times['gpu'][-1]:7.1f} us; step {times['step'][-1]:7.2f} ms",
                  flush=True)

    if args.capture:
        for p in recording.problems:
            print(f"captured {p['key']}: {p['calls']} calls, {p['share']:.0%} of the captured time")

    def median(key):
        warm = times[key][5:] or times[key]
        return sorted(warm)[len(warm) // 2]

    print(f"{args.loss}: median loss fwd+bwd host {median('host'):.1f} us, wall {median('wall'):.1f} us, "
          f"GPU {median('gpu'):.1f} us; median step {median('step'):.2f} ms")

if __name__ == "__main__":
    main()
