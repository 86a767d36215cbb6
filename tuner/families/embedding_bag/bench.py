"""The exported EmbeddingBag winner against torch.nn.functional.embedding_bag, side by side in
one run (`tuner bench --family embedding_bag`): the PR's configuration in every mode and index
distribution, smaller bags, its wide-row shape, and 16-bit weights. Each is checked against
torch before it is timed. The winner is called through its C table (the op is not written yet),
so "wall" includes a ctypes call where torch's includes its dispatcher."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from tuner import build, gpus
from tuner import export as artifacts
from tuner.bench import _fmt, kernel_us, wall_us, write
from tuner.families import embedding_bag as eb
from tuner.families.embedding_bag.kernel import EmbeddingBagKernel
from tuner.variant import Variant

PR = eb.Problem()
CONFIGS = (
    [dataclasses.replace(PR, mode=m) for m in eb.MODES]
    + [dataclasses.replace(PR, distribution=d) for d in ("one_hot", "multi_hot")]
    + [dataclasses.replace(PR, bag_size=n) for n in (20, 10)]
    + [dataclasses.replace(PR, rows=128_000, dim=4096)]
    + [dataclasses.replace(PR, weight=w) for w in ("float16", "bfloat16")]
)
TOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1.6e-2}
TORCH = "anchor: torch F.embedding_bag"


def _winner(manifest: dict, directory: Path, weight: str, index: str, arch: str) -> EmbeddingBagKernel:
    """The artifact's winner for this dtype pair, else the first winner's parameters rendered for it."""
    entries = manifest["entries"]
    same = [e for e in entries if (e["params"]["weight"], e["params"]["index"]) == (weight, index)]
    e = (same or entries)[0]
    if same:
        variant, source = Variant.of(eb.FAMILY, e["params"]), (directory / e["source"]).read_text()
        (b,) = build.build([variant], arch, sources={variant.name: source})
    else:
        tuned = {k: v for k, v in e["params"].items() if k not in ("weight", "index")}
        variant = eb.space(weight, index).nearest(tuned)
        (b,) = build.build([variant], arch)
    if not b.ok:
        raise RuntimeError(f"building {variant.name} failed:\n{b.error}")
    return EmbeddingBagKernel(b.so, variant.name)


def run(directory: Path, out: Path | None = None, configs=CONFIGS) -> list[dict]:
    directory = Path(directory)
    manifest = artifacts.read(directory)
    arch = gpus.attached().arch
    rows, cache = [], {}
    for p in configs:
        key = (p.rows, p.dim, p.bags, p.bag_size, p.weight, p.index, p.distribution)
        if key not in cache:
            cache.clear()  # one weight at a time on the GPU
            cache[key] = eb.make_inputs(p, seed=0, device="cuda")
        w, idx, offs, _ = cache[key]
        k = _winner(manifest, directory, p.weight, p.index, arch)
        want = F.embedding_bag(idx, w, offs, mode=p.mode)
        call, got, _ = k.prepare(w, idx, offs, p.mode)
        call()
        err = float((got.float() - want.float()).abs().max()) / max(float(want.float().abs().max()), 1.0)
        if not err <= TOL[p.weight] or k.take_errors():
            raise AssertionError(f"{k.name} disagrees with torch on {p.key()} (relative error {err:.3g})")
        timed = {"tuned kernel": (call, None), TORCH: (lambda: F.embedding_bag(idx, w, offs, mode=p.mode), None)}
        with torch.no_grad():
            walls = wall_us(timed)
        config = {"weight": p.weight, "index": p.index, "rows": p.rows, "dim": p.dim, "mode": p.mode,
                  "ids": p.distribution, "bag_size": p.bag_size}
        for name, (fn, _) in timed.items():
            row = {"impl": name if name == TORCH else f"tuned kernel ({k.name})", **config,
                   "fwd_wall_us": walls[name], "fwd_kernel_us": kernel_us(fn)}
            rows.append(row)
            print(_fmt(row), flush=True)
    if out is not None:
        write(rows, Path(out), size="bag_size")
    return rows
