"""`tuner bench` of a family that declares its op, made from the declaration: the tuned op beside
the torch op it replaces (eager and torch.compile), what users run today (the family's
`bench_rows`) and its `anchors()` (name -> a function of the op's inputs, e.g. Liger's kernel),
each checked against the float64 reference first (the output and every gradient), timed forward
and forward+backward (tuner.report.bench), after the floors: the bytes a forward, and a
forward+backward, must move at least (`least_bytes`, or the family's `floor_bytes(problem,
inputs)` where its op moves less: a fused backward), and the family's `bench_floors`. The
problems: `--shapes` x `--dtypes`, or the family's `BENCH_PROBLEMS`. With `--problems FILE`
(tuner.capture's shapes), the op against the torch op alone at each captured problem. The
declaration's other words for its bench are in `bench_at` (docs/writing-a-family.md lists them)."""

from __future__ import annotations

import warnings
from pathlib import Path

from tuner import families, opspec, runtime
from tuner.errors import TunerError
from tuner.space import dtype_fields
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
    given = [t for t in op.differentiable if values[t.name] is not None]  # an optional one may be left out
    for t in given:
        values[t.name] = values[t.name].detach().requires_grad_()
    args = tuple(values[a.name] for a in op.inputs)
    plain = tuple(a.detach() if hasattr(a, "detach") else a for a in args)
    want = spec.reference(*plain)
    # a number's output gradient is 1, as a loss's backward gives it (the search times it so too); others random
    grad = (torch.ones(want.shape, device=want.device) if want.dim() == 0 else
            torch.randn(want.shape, device=want.device)).to(args[0].dtype)
    gradients = opspec.reference_gradients(op, spec.reference, plain, grad)
    answers = (want, *(g for t, g in zip(op.differentiable, gradients) if t in given))
    tolerance = declared.tolerance(fam)
    names = ["output"] + [f"grad_{t.name}" for t in given]
    dtypes = [args[0].dtype] + [values[t.name].dtype for t in given]

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


def problems(family: str, shapes, dtypes) -> list[dict]:
    """The bench's problems: each dtype tuple (a dtype per field, or one for all) at each shape."""
    fam, op, _ = _parts(family)
    fields, out = dtype_fields(fam), []
    for given in dtypes:
        given = (given,) if isinstance(given, str) else tuple(given)
        named = dict(zip(fields, given * len(fields) if len(given) == 1 else given))
        for sizes in shapes:
            if len(sizes) != len(op.sizes):
                raise TunerError(f"--shapes: {'x'.join(map(str, sizes))} gives {len(sizes)} sizes, {family} has "
                                 f"{len(op.sizes)} ({', '.join(op.sizes)})")
            out.append({**fam.Problem().__dict__, **dict(zip(op.sizes, sizes)), **named})
    return out


def _configs(fam, op, problems: list[dict]) -> tuple[list[str], str]:
    """The keys that tell the problems' rows apart (dtypes, sizes, then any other field that varies)
    and the size the summary's tables run across (the one with the most values)."""
    varying = [k for k in problems[0] if len({repr(p.get(k)) for p in problems}) > 1]
    sizes = [n for n in op.sizes if n in problems[0]]
    keys = list(dict.fromkeys([*dtype_fields(fam), *sizes, *varying]))
    return keys, max(sizes, key=lambda n: len({p[n] for p in problems}))


def _anchors(fam) -> dict:
    """The family's `anchors()` (name -> a function of the op's inputs), left out where one needs
    a package this machine lacks (as Liger's rows do without `pip install 'tuner[bench]'`)."""
    try:
        return getattr(fam, "anchors", dict)()
    except ImportError as exc:
        print(f"{exc.name or exc} is not installed (pip install 'tuner[bench]'): the anchors' rows are left out",
              flush=True)
        return {}


def _floors(fam, problem: dict, inputs, grad) -> tuple[list[dict], dict]:
    """The bandwidth floor (the bytes a forward, and a forward+backward, must move at least:
    `least_bytes`, or the family's `floor_bytes(problem, inputs)`, either may be None), and the family's
    `bench_floors(problem, inputs)`: name -> a row's numbers measured there, or (forward,
    forward+backward) calls timed beside the rows (either None); where the family sets
    `BENCH_READ_FLOOR`, a streaming read of the forward's bytes timed too. Returns (rows, calls)."""
    fwd, both = fam.floor_bytes(problem, inputs) if hasattr(fam, "floor_bytes") else least_bytes(inputs, grad)
    floor = {"impl": f"floor: HBM at {HBM_TBS} TB/s",
             **{k: b / (HBM_TBS * 1e6) for k, b in (("fwd_kernel_us", fwd), ("fwd_bwd_kernel_us", both)) if b}}
    rows, calls = [floor], _host_floors(fam, inputs)
    if getattr(fam, "BENCH_READ_FLOOR", False) and fwd:
        rows.append({"impl": "floor: a read of as many bytes", "fwd_kernel_us": kernel_us(read_floor(fwd, inputs))})
    for name, got in getattr(fam, "bench_floors", lambda *_: {})(problem, inputs).items():
        if isinstance(got, dict):
            rows.append({"impl": name, **got})
        else:
            calls[name] = got
    return rows, calls


def read_floor(nbytes: int, inputs):
    """A read of `nbytes` contiguous bytes, in the first floating-point input's dtype, on its device:
    torch's sum of a buffer that size (a streaming read, which a gather of scattered rows does not
    beat), the measured form of a bandwidth floor."""
    import torch

    first = next(t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point())
    data = torch.randn(nbytes // first.element_size(), device=first.device).to(first.dtype)
    return lambda: data.sum(dtype=torch.float32)


def _host_floors(fam, inputs) -> dict:
    """Where the family's calls are bound by the host (`BENCH_HOST_FLOORS`): one kernel launch
    through the dispatcher, autograd's own cost (`x.sum().backward()` on a float32 leaf shaped as
    the first floating-point input), and `F.mse_loss` on two float32 tensors of that shape (a
    native C++ loss with C++ autograd: what an op's call costs when no Python runs on its path),
    timed beside the rows."""
    import torch
    import torch.nn.functional as F

    if not getattr(fam, "BENCH_HOST_FLOORS", False):
        return {}
    first = next(t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point())
    one, leaf = torch.zeros(1, device=first.device), torch.randn(first.shape, device=first.device, requires_grad=True)
    x, y = (torch.rand(first.shape, device=first.device) for _ in range(2))
    leaf_x = x.clone().requires_grad_(True)

    def mse_both():
        leaf_x.grad = None
        F.mse_loss(leaf_x, y).backward()

    return {"floor: one kernel launch": (lambda: one.fill_(1.0), None),
            "floor: x.sum().backward()": (None, lambda: leaf.sum().backward()),
            "anchor: F.mse_loss (native op)": (lambda: F.mse_loss(x, y), mse_both)}


def bench(family: str, directory, args) -> list[dict]:
    fam = families.get(family)
    if hasattr(fam, "BENCH_PROBLEMS"):
        chosen = fam.BENCH_PROBLEMS
    else:  # a family without dtype fields has no --dtypes
        chosen = problems(family, args.shapes, getattr(args, "dtypes", None) or ((),))
    return bench_at(family, directory, [{**fam.Problem().__dict__, **p} for p in chosen],
                    Path(args.out) if args.out is not None else None)


def bench_at(family: str, directory, chosen: list[dict], out: Path | None = None) -> list[dict]:
    """The rows of each problem: the tuned op, its other ways to be called (the family's
    `tuned_rows()`; `BENCH_VALIDATE`: its other ways to report bad input; `BENCH_REDUCE_OVERHEAD`:
    inside torch.compile's CUDA graphs), the family's `bench_rows(problem, inputs)` (what users run
    today), the torch op (eager, and torch.compile unless `BENCH_COMPILED` is False) and
    `anchors()`, after the floors."""
    import torch

    fam, op, spec = _parts(family)
    tuned = _load(directory)
    compiled = torch.compile(spec.torch_op) if getattr(fam, "BENCH_COMPILED", True) else None
    # GPU time from CUDA-graph replays, or the profiler's sum of kernels where a row cannot be
    # captured in a graph (the family's BENCH_GRAPHS = False)
    gpu_us = graph_us if getattr(fam, "BENCH_GRAPHS", True) else kernel_us
    keys, size = _configs(fam, op, chosen)
    rows = []
    for problem in chosen:
        # each problem's compiled rows compiled afresh: dynamo's limit of 8 graphs a function
        # (shapes times grad modes) would leave the later problems' rows eager, unsaid
        torch._dynamo.reset()
        inputs, grad, agree = _inputs(family, problem)
        impls = {TUNED: tuned}
        impls.update({f"{TUNED}, {k}": fn for k, fn in (getattr(fam, "tuned_rows", lambda: {})()).items()})
        modes = {f"{TUNED}, validate={m}": m for m in getattr(fam, "BENCH_VALIDATE", ())}
        impls.update({name: tuned for name in modes})
        if getattr(fam, "BENCH_REDUCE_OVERHEAD", False):
            impls[f"{TUNED}, torch.compile reduce-overhead"] = torch.compile(lambda *a: tuned(*a),
                                                                             mode="reduce-overhead", dynamic=False)
        impls.update(getattr(fam, "bench_rows", lambda *_: {})(problem, inputs))
        impls.update(variant_rows(family, problem))
        impls[f"anchor: torch {op.name}"] = spec.torch_op
        if compiled is not None:
            impls["anchor: torch.compile"] = compiled
        impls.update({f"anchor: {k}": fn for k, fn in _anchors(fam).items()})
        floors, timed = _floors(fam, problem, inputs, grad)
        part = side_by_side({k: problem[k] for k in keys}, impls, inputs, grad, floors, agree, gpu_us=gpu_us,
                            modes=modes, timed=timed, inference=True)
        base = next((f for f in floors if f["impl"].startswith("floor: HBM")), None)
        for r in part:
            print(_fmt(r) + "".join(f" {k[:-10]}/floor={r[k] / base[k]:.2f}x" for k in ("fwd_kernel_us",
                  "fwd_bwd_kernel_us") if base and k in base and k in r and r["impl"] != base["impl"]), flush=True)
        rows += part
        del inputs, grad, agree, impls
        torch.cuda.empty_cache()
    if out is not None:
        write(rows, Path(out), size=size)
    return rows


def variant_rows(family: str, problem: dict) -> dict:
    """The family's `BENCH_VARIANTS` as rows: name -> (parameters, scalars, finish): the variant of
    the problem's space with those parameters (built for the attached GPU at its first call, the
    check's), called with those scalars in place of the call's (a reduction of none, say) as an
    autograd function with its own backward, and its output handed to `finish(output, *inputs)` (the
    torch ops a simple kernel leaves the rest to)."""
    import functools

    import torch

    from tuner import gpus
    from tuner.build import compile as build
    from tuner.measure.declared import DeclaredKernel

    fam, op, _ = _parts(family)
    names, out = [a.name for a in op.inputs], op.outputs[0].name
    differentiable = {t.name for t in op.differentiable}

    def row(params: dict, scalars: dict, finish):
        @functools.cache
        def kernel():
            v = fam.space_for(problem).variant(**params)
            (b,) = build.build([v], gpus.attached().arch, serving=True)
            return DeclaredKernel(family, b.so, v.name, b.entry)

        class Variant(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                ctx.values = {**dict(zip(names, args)), **scalars}
                outs = kernel().forward(ctx.values, check=False)
                ctx.saved = {t.name: outs[t.name] for t in op.saves}
                return outs[out]

            @staticmethod
            def backward(ctx, grad):
                call, grads = kernel().prepare_backward({out: grad}, ctx.values, ctx.saved)
                call()
                return tuple(grads.get(n) if n in differentiable else None for n in names)

        return lambda *args: finish(Variant.apply(*args[:len(names)]), *args)

    return {name: row(*how) for name, how in getattr(fam, "BENCH_VARIANTS", {}).items()}


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

    fam, op, spec = _parts(family)
    impls, rows = {TUNED: _load(directory, baseline), torch_name(family): spec.torch_op}, []
    if runtime.torch_path(family) is not None:
        impls[TORCH_SERVING] = runtime.torch_path(family)
    # as the bench's, unless the family says otherwise for these rows (PROBLEMS_GRAPHS: no anchor among them)
    gpu_us = graph_us if getattr(fam, "PROBLEMS_GRAPHS", getattr(fam, "BENCH_GRAPHS", True)) else kernel_us
    chosen = [{**fam.Problem().__dict__, **c["problem"]} for c in problems]
    keys, _ = _configs(fam, op, chosen)
    for p in chosen:
        inputs, grad, agree = _inputs(family, p)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. torch's op of mixed dtypes warns that it is not fused
            part = side_by_side({k: p[k] for k in keys}, impls, inputs, grad, check=agree, gpu_us=gpu_us)
        for r in part:
            print(_fmt(r), flush=True)
        rows += part
        del inputs, grad, agree
        torch.cuda.empty_cache()
    write_against(rows, Path(out), torch_name(family), TUNED)
    return rows
