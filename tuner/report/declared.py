"""`tuner bench` of a family that declares its op, made from the declaration: the tuned op beside
the torch op it replaces (eager and torch.compile) and the family's `anchors()` (name -> a function
of the op's inputs, e.g. Liger's kernel), each checked against the float64 reference first (the
output and every gradient), timed forward and forward+backward (tuner.report.bench), after the
bandwidth floor: the bytes a forward, and a forward+backward, must move at least (`least_bytes`,
or the family's `floor_bytes(problem)` where its op moves less: a fused backward). With
`--problems FILE` (tuner.capture's shapes), the op against the torch op alone at each captured
problem. A family's `tuned_rows()` adds rows of the tuned op called otherwise (cross-entropy's
gradient written over its logits)."""

from __future__ import annotations

import warnings
from pathlib import Path

from tuner import families, opspec, runtime
from tuner.errors import TunerError
from tuner.report.bench import HBM_TBS, TORCH_SERVING, _fmt, graph_us, kernel_us, side_by_side, write, write_against

TUNED = "tuned op"


def _parts(family: str):
    op = families.part(family, "op")
    return families.get(family), op.OP_DECLARATION, op.OP


def describe(family: str, problem: dict) -> str:
    """A problem in a line, as every listing writes it (tuner.space.describe)."""
    from tuner import space

    return space.describe(families.get(family).Problem, problem)


def _load(directory: Path, baseline: bool = True):
    import tuner

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuner.load(directory, baseline=baseline)


def _inputs(family: str, problem: dict):
    """(inputs, output gradient, agree): the op's inputs (the differentiable ones requiring grad),
    the gradient of its output (1 for a number: a loss's), and a check of an implementation's
    output and gradients against the float64 reference."""
    import torch

    from tuner.measure import accuracy, declared

    fam, op, spec = _parts(family)
    values = declared.inputs(fam, op, problem, seed=0)
    for t in op.differentiable:
        values[t.name] = values[t.name].detach().requires_grad_()
    args = tuple(values[a.name] for a in op.inputs)
    plain = tuple(a.detach() if hasattr(a, "detach") else a for a in args)
    want = spec.reference(*plain)
    # a number's output gradient is 1, as a loss's backward gives it (the search times it so too); others random
    grad = (torch.ones(want.shape, device=want.device) if want.dim() == 0 else
            torch.randn(want.shape, device=want.device)).to(args[0].dtype)
    answers = (want, *opspec.reference_gradients(op, spec.reference, plain, grad))
    tolerance = declared.tolerance(fam)
    names = ["output"] + [f"grad_{t.name}" for t in op.differentiable]
    dtypes = [args[0].dtype] + [values[t.name].dtype for t in op.differentiable]

    def agree(name, out, grads):
        for what, got, answer, dtype in zip(names, (out, *grads), answers, dtypes):
            ok, _, message = accuracy.check(what, got, answer, tolerance[str(dtype).removeprefix("torch.")], dtype)
            if not ok:
                raise AssertionError(f"{name} disagrees with the float64 reference at {describe(family, problem)}: "
                                     f"{message}")

    return args, grad, agree


def least_bytes(inputs: tuple, grad) -> tuple[int, int]:
    """What an op must move at least: a forward reads its input tensors once and writes its output
    (`grad`: its shape, in the dtype the bench gives it); a forward+backward then reads the output's
    gradient and the inputs again and writes the gradients of those that require one. Saved tensors
    are left out (a variant's choice, not the op's need)."""
    tensors = [t for t in inputs if hasattr(t, "nbytes")]
    read, out = sum(t.nbytes for t in tensors), grad.nbytes
    return read + out, read + out + out + read + sum(t.nbytes for t in tensors if t.requires_grad)


def _problem(family: str, sizes, dtype: str | None) -> dict:
    fam, op, _ = _parts(family)
    if len(sizes) != len(op.sizes):
        raise TunerError(f"--shapes: {'x'.join(map(str, sizes))} gives {len(sizes)} sizes, {family} has "
                         f"{len(op.sizes)} ({', '.join(op.sizes)})")
    from tuner.space import dtype_name

    return {**fam.Problem().__dict__, **dict(zip(op.sizes, sizes)), **{t.name: dtype_name(dtype) for t in op.varying}}


def _anchors(fam) -> dict:
    """The family's `anchors()` (name -> a function of the op's inputs), left out where one needs
    a package this machine lacks (as Liger's rows do without `pip install 'tuner[bench]'`)."""
    try:
        return getattr(fam, "anchors", dict)()
    except ImportError as exc:
        print(f"{exc.name or exc} is not installed (pip install 'tuner[bench]'): the anchors' rows are left out",
              flush=True)
        return {}


def bench(family: str, directory, args) -> list[dict]:
    import torch

    fam, op, spec = _parts(family)
    tuned = _load(directory)
    impls = {TUNED: tuned}
    # the family's other ways to call the tuned op (`tuned_rows()`: name -> a function of the inputs)
    impls.update({f"{TUNED}, {k}": fn for k, fn in (getattr(fam, "tuned_rows", lambda: {})()).items()})
    impls.update({f"anchor: torch {op.name}": spec.torch_op, "anchor: torch.compile": torch.compile(spec.torch_op)})
    impls.update({f"anchor: {k}": fn for k, fn in _anchors(fam).items()})
    # GPU time from CUDA-graph replays, or the profiler's sum of kernels where an anchor cannot be
    # captured in a graph (the family's BENCH_GRAPHS = False)
    gpu_us = graph_us if getattr(fam, "BENCH_GRAPHS", True) else kernel_us
    rows = []
    for sizes in args.shapes:
        problem = _problem(family, sizes, getattr(args, "dtype", None))
        inputs, grad, agree = _inputs(family, problem)
        fwd, both = fam.floor_bytes(problem) if hasattr(fam, "floor_bytes") else least_bytes(inputs, grad)
        floor = {"impl": f"floor: HBM at {HBM_TBS} TB/s", "fwd_kernel_us": fwd / (HBM_TBS * 1e6),
                 "fwd_bwd_kernel_us": both / (HBM_TBS * 1e6)}
        part = side_by_side(dict(zip(op.sizes, sizes)) | {t.name: problem[t.name] for t in op.varying}, impls,
                            inputs, grad, floor, agree, gpu_us=gpu_us)
        for r in part:
            print(_fmt(r) + "".join(f" {k[:-10]}/floor={r[k] / floor[k]:.2f}x" for k in ("fwd_kernel_us",
                  "fwd_bwd_kernel_us") if floor and r is not part[0]), flush=True)
        rows += part
        del inputs, grad, agree
        torch.cuda.empty_cache()
    if args.out is not None:
        write(rows, Path(args.out), size=next(iter(op.sizes)))
    return rows


def torch_name(family: str) -> str:
    """The torch op's row in a declared family's bench."""
    return f"anchor: torch {_parts(family)[1].name}"


def bench_problems(family: str, directory, problems: list[dict], args) -> list[dict]:
    return run_problems(family, directory, problems, Path(args.out))


def run_problems(family: str, directory, problems: list[dict], out: Path, baseline: bool = True) -> list[dict]:
    """The tuned op against the torch op alone at each captured problem (tuner.deploy.captured.read's
    entries), at its exact shape and dtypes: what swapping the op into that run changes. Writes
    bench.csv and bench.md into `out` (the ratios, and how many cells are slower than torch). Beside
    them, the op's own path to torch's op (`TORCH_SERVING`): what the op costs where torch's op serves.
    `baseline=False`: the nearest variant serves every problem (tuner.deploy.regions)."""
    import torch

    _, op, spec = _parts(family)
    impls, rows = {TUNED: _load(directory, baseline), torch_name(family): spec.torch_op}, []
    if runtime.torch_path(family) is not None:
        impls[TORCH_SERVING] = runtime.torch_path(family)
    for captured in problems:
        p = captured["problem"]
        inputs, grad, agree = _inputs(family, p)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. torch's op of mixed dtypes warns that it is not fused
            config = {**{t.name: p[t.name] for t in op.varying}, **{n: p[n] for n in op.sizes}}
            part = side_by_side(config, impls, inputs, grad, check=agree)
        for r in part:
            print(_fmt(r), flush=True)
        rows += part
        del inputs, grad, agree
        torch.cuda.empty_cache()
    write_against(rows, Path(out), torch_name(family), TUNED)
    return rows
