"""What the search's worker needs of a family that declares its op (tuner.declare), made from the
declaration: a variant called through its C table with the declared argument structs
(`DeclaredKernel`), and `Evaluation` (load, check against the float64 reference, the calls to
time, torch's op as the baseline).

Of the family it reads: `make_inputs(**problem, seed=, device=)`, the input tensors of a problem (a
dict of the declared sizes, each varying tensor's dtype by the tensor's name, and any scalar); its
op's `OP` (tuner.opspec.spec: the reference and the torch op); and, where it has them, `ODD_SIZES`
(sizes beside the problem's that every variant is checked at too: widths no vector divides, rows
that do not fill a block), `TOLERANCE` (relative error beyond rounding, by output dtype) and
`TOLERANCE_OF` (output -> the input whose dtype's tolerance it is held to)."""

from __future__ import annotations

import ctypes
import types
from typing import Any, Callable

from tuner import families, opspec
from tuner.measure import abi, timing
from tuner.measure.accuracy import check
from tuner.measure.cases import Cases, sized
from tuner.measure.kernel import CHECK, TORCH_DTYPES, Kernel, dtype_name, launched, stream

TOLERANCE = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3, "float64": 1e-12}


def tolerance(module) -> dict[str, float]:
    """Relative error allowed beyond rounding, by dtype: the core's, where the family gives none."""
    return {**TOLERANCE, **getattr(module, "TOLERANCE", {})}


def inputs(module, op, problem: dict, seed: int) -> dict:
    """name -> value of the op's inputs for a problem: the family's `make_inputs` tensors, and each
    scalar as the problem gives it, else its default."""
    tensors = module.make_inputs(**problem, seed=seed, device="cuda")
    tensors = tensors if isinstance(tensors, (tuple, list)) else (tensors,)
    values = dict(zip((t.name for t in op.tensors), tensors))
    for s in op.scalars:
        values[s.name] = problem.get(s.name, s.default)
    return values


class DeclaredKernel(Kernel):
    """A built variant of a declared op, called with tensors by name."""

    def __init__(self, family: str, so, expected_name: str | None = None, entry: str | None = None):
        self.family = family
        super().__init__(so, expected_name, entry)
        self.op = families.part(family, "op").OP_DECLARATION
        self.error_text = self.op.error_text
        self.Args = abi.struct(family, self.op.structs["args"])
        self.BackwardArgs = abi.struct(family, self.op.structs["bwd_args"])
        _, fields = abi.table(family)  # the table as the declaration's `scratch` reads it (vt->f(...))
        self.table = types.SimpleNamespace(**{f: getattr(self, f"{f}_fn" if isinstance(kind, abi.Function) else f)
                                              for f, kind in fields[2:]})

    def _length(self, expression: str, sizes: list[int]) -> int:
        """A declared length (`scratch`, `workspace`): its C++ read as Python, `vt->` as `vt.`."""
        return int(eval(opspec.code(expression.replace("->", ".")), {"__builtins__": {}},  # noqa: S307
                        {"vt": self.table, "sizes": sizes}))

    def _word_fields(self, values: dict, sizes: list[int]) -> dict:
        """The forward's error fields and workspace, where declared: the zeroed words of
        `Kernel.workspace` (the errors' word first, then the workspace), no host flags."""
        if not (self.op.errors or self.op.workspace):
            return {}
        n = 1 + (max(self._length(self.op.workspace, sizes), 0) if self.op.workspace else 0)
        words = self.workspace(n, values[self.op.tensors[0].name].device).data_ptr()
        found = {"errors": words, "error_flags": None} if self.op.errors else {}
        if self.op.workspace:
            found["workspace"] = words + 4
        return found

    def _ready(self, values: dict) -> dict:
        """The inputs as the op hands them to a variant, after checking what the variant takes (its
        dtypes, contiguous tensors on one GPU, the declared shapes): an input that `converts` in its
        declared dtype, every tensor at an address aligned for the variant's loads (copied where not)."""
        import torch

        opspec.check(self.op, values)
        for t in self.op.varying:
            want, got = TORCH_DTYPES[getattr(self, f"{t.name}_dtype")], dtype_name(values[t.name])
            if got != want:
                raise ValueError(f"{self.op.name}: variant {self.name} takes {t.name} {want}, got {got}")
        ready = dict(values)
        for t in self.op.tensors:
            v = values[t.name]
            if v is None:
                continue
            if not v.is_contiguous():
                raise ValueError(f"{self.op.name}: variant {self.name} takes a contiguous {t.name}")
            v = v.to(getattr(torch, t.dtypes[0])) if t.converts else v
            ready[t.name] = v.clone() if v.data_ptr() % self.op.alignment else v
        return ready

    def _writes(self, saved, values: dict) -> bool:
        """Whether this variant writes a saved tensor at this call: one declared `only_if` a table field
        where it is set, one declared `when` a scalar has some words at those."""
        return opspec.kept(saved, values) and (saved.only_if is None or bool(getattr(self, saved.only_if)))

    def _pointers(self, values: dict) -> dict:
        """Each input tensor's address (None: an input left out, which the variants get as null)."""
        return {t.name: None if values[t.name] is None else values[t.name].data_ptr() for t in self.op.tensors}

    def _scalars_and_sizes(self, values: dict, sizes: list[int]) -> dict:
        found = {}
        for s in self.op.scalars:  # a word as its index; a number left out as 0, and whether it was given
            v = values[s.name]
            found[s.name] = s.choices.index(v) if s.choices else 0 if v is None else v
            if s.optional:
                found[f"{s.name}_given"] = int(v is not None)
        return {**found, **dict(zip(self.op.sizes, sizes))}

    def prepare(self, values: dict, into: dict | None = None) -> tuple[Callable, dict]:
        """(call, outputs): `call()` runs the forward of the inputs `values` (name -> tensor or
        number) into the outputs and saved tensors (name -> tensor; `into` gives some)."""
        values = self._ready(values)
        sizes = opspec.sizes(self.op, values)
        outs, pointers = {}, {}
        for t, saved in [(o, False) for o in self.op.outputs] + [(s, True) for s in self.op.saves]:
            if saved and not self._writes(t, values):  # no room, as the op keeps none, and a null pointer
                outs[t.name] = opspec.nothing(self.op, t, values)
                pointers[t.name] = None
                continue
            given = (into or {}).get(t.name)
            outs[t.name] = given if given is not None else opspec.empty(self.op, t, values, sizes)
            pointers[t.name] = outs[t.name].data_ptr()
        args = self.Args(**self._pointers(values), **pointers,
                         **self._scalars_and_sizes(values, sizes), **self._word_fields(values, sizes))
        work = self._work("forward", args, values)
        return self._call(self.forward_fn, args, values, (outs, work), "forward"), outs

    def forward(self, values: dict, check: bool | str = True) -> dict:
        """The forward of `values` run once: its outputs and saved tensors by name. Bad input that
        the variant's validation finds is raised at once (`check=True`: a sync), or kept until
        `take_errors()` (`check=False`, the search's way)."""
        call, outs = self.prepare(values)
        call()
        if getattr(self, "validates", 0) and CHECK[check] == "sync":
            self.raise_errors()
        return outs

    def prepare_backward(self, grads: dict, values: dict, saved: dict, into: dict | None = None) -> tuple[Callable, dict]:
        """(call, gradients) of the backward after a forward that wrote `saved`: `grads` holds each
        output's gradient by the output's name; `into` the input gradients to write (an empty
        tensor: not wanted)."""
        import torch

        values = self._ready(values)
        sizes = opspec.sizes(self.op, values)
        grads = {n: g.contiguous() for n, g in grads.items()}
        into = into or {}
        kept = {t.gradient_of: saved[t.name] for t in self.op.saves if t.gradient_of}  # written in place, as the op does
        gx = {t.name: kept.get(t.name, into.get(t.name)) for t in self.op.differentiable}
        first = values[self.op.tensors[0].name]  # an input left out has no gradient: empty, a null pointer
        gx = {n: g if g is not None else torch.empty_like(values[n]) if values[n] is not None else first.new_empty(0)
              for n, g in gx.items()}
        for n in self.op.zeroed:  # as the op allocates them (once: a timed call adds into the same buffer)
            gx[n].zero_()
        fields = {**{f"grad_{n}": g.data_ptr() for n, g in grads.items()},
                  **self._pointers(values),
                  **{t.name: saved[t.name].data_ptr() if self._writes(t, values) else None for t in self.op.saves},
                  **{f"grad_{n}": (g.data_ptr() if g.numel() else None) for n, g in gx.items()},
                  **self._scalars_and_sizes(values, sizes)}
        keep = [grads, gx]
        if self.op.scratch:
            n = self._length(self.op.scratch, sizes)
            scratch = torch.empty(max(n, 1), device=values[self.op.tensors[0].name].device, dtype=torch.float32)
            fields["scratch"] = scratch.data_ptr()
            keep.append(scratch)
        args = self.BackwardArgs(**fields)
        keep.append(self._work("backward", args, values))
        sorting = [n for n in self.op.sorted if getattr(self, "sorts", 0) and values[n].numel()
                   and any(g.numel() for g in gx.values())]

        latest = {}  # a call's sorted entries, kept until the next call's (stream-ordered: safe to free then)
        keep.append(latest)

        def sort():  # as the op does on each call: timed with the backward
            for n in sorting:
                latest[n] = torch.sort(values[n].reshape(-1).to(torch.int64), stable=True)
                setattr(args, f"{n}_sorted", latest[n].values.data_ptr())
                setattr(args, f"{n}_order", latest[n].indices.data_ptr())

        return self._call(self.backward_fn, args, values, (saved, keep), "backward", sort if sorting else None), gx

    def _work(self, what: str, args, values: dict):
        """The memory a pass declared `work` gets, as many bytes as the variant asks of this call's
        arguments (its table's `<pass>_work_bytes`), set in `args` (null where it asks for none, as
        the op gives it); None where it has none."""
        if what not in self.op.work:
            return None
        import torch

        n = int(getattr(self, f"{what}_work_bytes_fn")(ctypes.addressof(args)))
        work = torch.empty(n, dtype=torch.uint8, device=values[self.op.tensors[0].name].device) if n > 0 else None
        args.work = None if work is None else work.data_ptr()
        return work

    def _call(self, fn, args, values, outs, what: str, before: Callable | None = None) -> Callable:
        pointer, device = ctypes.addressof(args), values[self.op.tensors[0].name].device.index
        keep = (values, outs, args, self._words)  # what the pointers point into lives as long as the call
        blas = None
        if self.op.libraries:  # torch's cuBLAS handle of the stream current at the call, as the op's
            import torch

            blas = torch.cuda.current_blas_handle

        def call():
            if before is not None:
                before()
            if blas is not None:
                args.blas = blas()
            launched(fn(pointer, stream(device)), self, what)
            return keep

        return call


class Evaluation:
    """The worker's side of a declared family: load, check, calls, baseline, errors."""

    def __init__(self, family: str):
        self.family, self.module = family, families.get(family)
        self.spec = families.part(family, "op").OP
        self.op = families.part(family, "op").OP_DECLARATION
        self.tolerance = tolerance(self.module)
        self.inputs: dict[tuple, tuple] = {}
        self.cases = Cases()
        # a search's build runs only its problem's sizes where the family says so (`search_focus`)
        self.search_odd = getattr(self.module, "FOCUS_RUNS_ODD_SIZES", True)

    def load(self, so: str, name: str, entry: str | None = None) -> DeclaredKernel:
        return DeclaredKernel(self.family, so, name, entry)

    def _values(self, problem: dict, seed: int) -> dict:
        return inputs(self.module, self.op, problem, seed)

    def _case(self, problem: dict, seed: int) -> dict:
        return self.case(self._values(problem, seed), seed)

    def case(self, values: dict, seed: int = 0) -> dict:
        """The inputs `values` (name -> tensor or number), an output gradient for each output, and
        the float64 answers of both passes: what `run_case` checks a variant on."""
        import torch

        outs = [opspec.empty(self.op, o, values) for o in self.op.outputs]
        g = torch.Generator(outs[0].device).manual_seed(seed + 1)
        grads = {o.name: torch.randn(out.shape, generator=g, device=out.device).to(out.dtype)
                 for o, out in zip(self.op.outputs, outs)}
        args = tuple(values[a.name] for a in self.op.inputs)
        want, want_grads = opspec.reference_answers(self.op, self.spec.reference, args, list(grads.values()))
        # an output is held to its dtype's tolerance, or to an input's where the family says its values
        # pass through that dtype on the way (`TOLERANCE_OF`: a loss of logits rounded to hidden's)
        by = getattr(self.module, "TOLERANCE_OF", {})
        answers = [(o.name, w, dtype_name(values[by[o.name]]) if o.name in by else dtype_name(out))
                   for o, w, out in zip(self.op.outputs, want, outs)]
        answers += [(f"grad_{t.name}", w, dtype_name(values[t.name])) for t, w in zip(self.op.differentiable, want_grads)
                    if values[t.name] is not None]  # an input left out has none
        return {"values": values, "grads": grads, "answers": answers}

    def run_case(self, kernel: DeclaredKernel, case: dict) -> tuple[dict, str]:
        """({"loss_error": the outputs' worst relative error, "grad_error": the gradients'}, what
        failed or ""), the outputs poisoned first (NaN; -1 in an integer one)."""
        import torch

        values = case["values"]
        nan = {t.name: opspec.poison(opspec.empty(self.op, t, values)) for t in (*self.op.outputs, *self.op.saves)}
        call, outs = kernel.prepare(values, into=nan)
        call()
        saved = {t.name: outs[t.name] for t in self.op.saves}
        given = [t.name for t in self.op.differentiable if values[t.name] is not None]
        into = {n: torch.full_like(values[n], float("nan")) for n in given}
        back, gx = kernel.prepare_backward(case["grads"], values, saved, into=into)
        back()
        got = [outs[o.name] for o in self.op.outputs] + [gx[n] for n in given]
        errors, failed = {"loss_error": 0.0, "grad_error": 0.0}, ""
        for (what, want, dtype), value in zip(case["answers"], got):
            ok, err, message = check(what, value, want, self.tolerance[dtype], getattr(torch, dtype))
            key = "grad_error" if what.startswith("grad_") else "loss_error"
            errors[key] = max(errors[key], err)
            failed = failed or ("" if ok else message)
        return errors, failed

    def _set(self, problem: dict) -> tuple:
        """(problem, key, make(seed)) of an input set."""
        return problem, tuple(sorted(problem.items())), lambda s: self._case(problem, s % 2**31)

    def _checks(self, problem: dict, odd: bool = True) -> list[tuple]:
        """The input sets a check uses: the problem's at the sizes a check takes (`cases.sized`),
        then, with `odd`, its odd sizes."""
        checked = sized(self.module, problem)
        odds = getattr(self.module, "ODD_SIZES", ()) if odd else ()
        return [self._set({**checked, **sizes}) for sizes in ({}, *odds)]

    def check(self, kernel: DeclaredKernel, problem: dict, whole: bool = False, full: bool = False) -> dict[str, Any]:
        """The variant against float64 on the problem's input sets; `whole` (a finalist built with
        every kernel, not the search's focus): at each word of the op's `kind` too (a bag's modes);
        `full` (a finalist): at the problem's own sizes too, with its own word."""
        worst = {"loss_error": 0.0, "grad_error": 0.0}
        kind = self.op.kind if whole and self.op.kind in problem else None
        words = self.op.choices(kind) if kind else (None,)
        odd = whole or self.search_odd
        checks = [c for w in words for c in self._checks(problem if w is None else {**problem, kind: w}, odd)]
        if full and sized(self.module, problem) != problem:
            checks.append(self._set(problem))
        for p, key, make in checks:
            errors, failed = self.run_case(kernel, self.cases.get(key, make))
            worst = {k: max(v, errors[k]) for k, v in worst.items()}
            if failed:
                finite = all(v < float("inf") for v in errors.values())
                where = "x".join(str(p[n]) for n in self.op.sizes if n in p) + (f" {kind} {p[kind]}" if kind else "")
                return {"ok": False, "reason": "wrong result" if finite else "nan", "message": f"{where}: {failed}",
                        **worst}
        return {"ok": True, "reason": "", "message": "", **worst}

    def warm(self, problem: dict) -> None:
        """The input sets, answers and timing inputs the first variants need, made while they compile."""
        for _, key, make in self._checks(problem, self.search_odd):
            self.cases.prime(key, make)
        self._timing_inputs(problem)

    def _timing_inputs(self, problem: dict) -> tuple[dict, dict]:
        import torch

        key = tuple(sorted(problem.items()))
        if key not in self.inputs:
            self.inputs.clear()
            values = self._values(problem, 1234)
            outs = {t.name: opspec.empty(self.op, t, values) for t in self.op.outputs}
            # a number's gradient is 1, as a loss's backward gives it; others random
            self.inputs[key] = (values, {n: torch.ones_like(o) if o.dim() == 0 else
                                         torch.randn_like(o, dtype=torch.float32).to(o.dtype) for n, o in outs.items()})
        return self.inputs[key]

    def calls(self, kernel: DeclaredKernel, problem: dict, objective: str) -> tuple[Callable, Callable | None]:
        values, grads = self._timing_inputs(problem)
        fwd, outs = kernel.prepare(values)
        fwd()  # the backward reads what it saves
        if objective == "fwd":
            return fwd, None
        bwd, _ = kernel.prepare_backward(grads, values, {t.name: outs[t.name] for t in self.op.saves})
        return fwd, bwd

    def baseline(self, problem: dict, objective: str) -> tuple[Callable, Callable | None]:
        """The torch op on the timing inputs, as `calls` gives a variant's: the forward, and the
        backward alone (every gradient, from a graph kept for it)."""
        values, grads = self._timing_inputs(problem)
        args = [values[a.name] for a in self.op.inputs]

        def fwd():
            return self.spec.torch_op(*args)

        if objective == "fwd":
            return fwd, None
        leaves = {t.name: values[t.name].detach().requires_grad_() for t in self.op.differentiable
                  if values[t.name] is not None}
        out = self.spec.torch_op(*(leaves.get(a.name, values[a.name]) for a in self.op.inputs))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return fwd, timing.gradient_call(tuple(outs), tuple(leaves.values()), tuple(grads.values()))

    def errors(self, kernel: DeclaredKernel) -> int:
        """Error bits the forward reported since the last call (generated inputs are valid)."""
        return kernel.take_errors()
