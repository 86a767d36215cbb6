"""The tuned op against torch.nn.functional.embedding_bag, side by side in one run
(`tuner bench --family embedding_bag`): the PR's configuration in every mode and index
distribution, smaller bags, its wide-row shape, and 16-bit weights; forward alone (no grad)
and forward + backward (the dense gradient of weight, as torch gives with sparse=False, taken
with torch.autograd.grad so that no .grad accumulation is timed). Each pair is checked against
the other, forward and gradient, before it is timed.

Two floors for the forward's GPU time, both of the bytes of the gathered rows (ids x dim x element
size): moved once at the copy bandwidth (3.0 TB/s, measured on the H100 hosts), and a read of as many contiguous
bytes measured in the same run by the same profiler (torch's sum of a buffer that size: a
streaming read, which a gather of random rows does not beat).

With `--problems FILE` (tuner.capture's shapes), the op against F.embedding_bag alone at each
captured problem."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

import tuner
from tuner import runtime
from tuner.report.bench import HBM_TBS, TORCH_SERVING, _fmt, kernel_us, side_by_side, wall_us, write, write_against
from tuner.families import embedding_bag as eb

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
TUNED = "tuned op"


def _relative(got, want) -> float:
    return float((got.float() - want.float()).abs().max()) / max(float(want.float().abs().max()), 1e-3)


def floors(elements: int, dtype) -> list[dict]:
    """The forward's floors for `elements` gathered elements of `dtype`: at HBM_TBS, and a read of
    a buffer of as many (random values, summed in float32) timed by the profiler."""
    moved = elements * torch.empty((), dtype=dtype).element_size()
    data = torch.randn(elements, device="cuda").to(dtype)
    read = kernel_us(lambda: data.sum(dtype=torch.float32))
    del data
    return [{"impl": f"floor: gathered rows at {HBM_TBS} TB/s", "fwd_kernel_us": moved / (HBM_TBS * 1e6)},
            {"impl": "floor: a read of as many bytes", "fwd_kernel_us": read}]


def bench(directory, args) -> list[dict]:
    """`tuner bench --family embedding_bag`: the export in `directory` at CONFIGS."""
    return run(directory, out=args.out)


def bench_problems(directory, problems: list[dict], args) -> list[dict]:
    """`tuner bench --family embedding_bag --problems FILE`."""
    return run_problems(directory, problems, out=args.out)


def run(directory: Path, out: Path | None = None, configs=CONFIGS) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dtype pairs the artifact did not tune warn once; the rows say so
        op = tuner.load(directory)
    rows, cache = [], {}
    for p in configs:
        key = (p.rows, p.dim, p.bags, p.bag_size, p.weight, p.index, p.distribution)
        if key not in cache:
            cache.clear()  # one weight at a time on the GPU
            w, idx, offs, _ = eb.make_inputs(**vars(p), seed=0, device="cuda")
            cache[key] = (w.requires_grad_(), idx, offs, torch.randn(p.bags, p.dim, device="cuda").to(w.dtype))
        w, idx, offs, g = cache[key]
        impls = {TUNED: lambda: op(w, idx, offs, p.mode),
                 TORCH: lambda: F.embedding_bag(idx, w, offs, mode=p.mode)}
        with torch.no_grad():
            fwd_err = _relative(impls[TUNED](), impls[TORCH]())
        grads = {name: torch.autograd.grad(fn(), w, g)[0] for name, fn in impls.items()}
        bwd_err = _relative(grads[TUNED], grads[TORCH])
        del grads
        if not (fwd_err <= TOL[p.weight] and bwd_err <= TOL[p.weight]):
            raise AssertionError(f"the tuned op disagrees with torch on {p.key()}: forward {fwd_err:.3g}, "
                                 f"gradient {bwd_err:.3g}")
        tuner.check_errors()

        def forward(fn):
            def call():
                with torch.no_grad():
                    return fn()
            return call

        def both(fn):
            return lambda: torch.autograd.grad(fn(), w, g)

        fwd = wall_us({name: (forward(fn), None) for name, fn in impls.items()})
        fwd_bwd = wall_us({name: (both(fn), None) for name, fn in impls.items()})
        config = {"weight": p.weight, "index": p.index, "rows": p.rows, "dim": p.dim, "mode": p.mode,
                  "ids": p.distribution, "bag_size": p.bag_size}
        for row in floors(idx.numel() * p.dim, w.dtype):
            rows.append({"impl": row["impl"], **config, "fwd_kernel_us": row["fwd_kernel_us"]})
            print(_fmt(rows[-1]), flush=True)
        for name, fn in impls.items():
            row = {"impl": name, **config, "fwd_wall_us": fwd[name], "fwd_kernel_us": kernel_us(forward(fn)),
                   "fwd_bwd_wall_us": fwd_bwd[name], "fwd_bwd_kernel_us": kernel_us(both(fn))}
            rows.append(row)
            print(_fmt(row), flush=True)
    if out is not None:
        write(rows, Path(out), size="bag_size")
    return rows


def torch_op(mode: str):
    """F.embedding_bag as a model calls it; where torch has no backward (bfloat16 max), a call that
    wants a gradient runs it in float32, as the tuned op's own baseline does."""
    def call(w, idx, offs):
        if mode == "max" and w.dtype == torch.bfloat16 and w.requires_grad and torch.is_grad_enabled():
            return F.embedding_bag(idx, w.float(), offs, mode=mode).to(w.dtype)
        return F.embedding_bag(idx, w, offs, mode=mode)
    return call


def run_problems(directory: Path, problems: list[dict], out: Path, baseline: bool = True) -> list[dict]:
    """The tuned op against F.embedding_bag alone at each captured problem (tuner.deploy.captured.read's
    entries), on the family's inputs for its exact shape, dtypes and mode: what swapping the op
    into that training run changes; beside them, the op's own path to torch's op (TORCH_SERVING, what
    a call costs where torch's op serves it). All are checked against torch's forward and gradient first.
    GPU times are the profiler's sum of kernels (kernel_us), as in `run`, not graph replays:
    torch's dense backward synchronized inside its sort-and-unique in older releases, which a
    CUDA graph cannot capture (pytorch#93807), and this one is not known to be free of it.
    Writes bench.csv and bench.md (the ratios, and how many cells are slower than torch).
    `baseline=False`: the nearest variant serves every problem (tuner.deploy.regions)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op = tuner.load(directory, baseline=baseline)
    torch_path = runtime.torch_path(eb.FAMILY)
    rows = []
    for captured in problems:
        p = eb.Problem(**captured["problem"])
        w, idx, offs, _ = eb.make_inputs(**vars(p), seed=0, device="cuda")
        w.requires_grad_()
        g = torch.randn(p.bags, p.dim, device="cuda").to(w.dtype)
        impls = {TUNED: lambda w, idx, offs: op(w, idx, offs, p.mode), TORCH: torch_op(p.mode)}
        if torch_path is not None:
            impls[TORCH_SERVING] = lambda w, idx, offs: torch_path(w, idx, offs, p.mode)
        with torch.no_grad():
            want = impls[TORCH](w, idx, offs)
        want_grad = torch.autograd.grad(impls[TORCH](w, idx, offs), w, g)[0]

        def agree(name, got, grads):
            tuner.check_errors()  # bad input the kernel saw raises here, not in a timing loop
            errors = (_relative(got, want), _relative(grads[0], want_grad))
            if not all(e <= TOL[p.weight] for e in errors):
                raise AssertionError(f"{name} disagrees with torch on {p.key()}: forward {errors[0]:.3g}, "
                                     f"gradient {errors[1]:.3g}")

        config = {"weight": p.weight, "index": p.index, "rows": p.rows, "dim": p.dim, "mode": p.mode,
                  "bags": p.bags, "bag_size": p.bag_size, "ids": p.distribution}
        part = side_by_side(config, impls, (w, idx, offs), g, check=agree, gpu_us=kernel_us)
        for r in part:
            print(_fmt(r), flush=True)
        rows += part
        del w, idx, offs, g, want, want_grad, agree
        torch.cuda.empty_cache()
    write_against(rows, Path(out), TORCH, TUNED)
    return rows
