"""What the search's worker needs of the RMSNorm family: load a variant, check its forward and
backward against the float64 reference (on the GPU), and give both as calls to time."""

from __future__ import annotations

from typing import Any, Callable

from tuner.measure.accuracy import check
from tuner.measure import timing
from tuner.measure.cases import Cases
from tuner.families import rms_norm
from tuner.families.rms_norm.kernel import RmsNormKernel

TOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}  # relative (norm) error beyond rounding


def make_case(problem: dict, rows: int, width: int, seed: int) -> dict:
    import torch

    x, w = rms_norm.make_inputs(rows, width, problem["x"], problem["weight"], seed=seed)
    grad = torch.randn(rows, width, device="cuda", generator=torch.Generator("cuda").manual_seed(seed + 1)).to(x.dtype)
    want = rms_norm.reference(x, w)
    want_x, want_w = rms_norm.reference_backward(x, w, grad)
    return dict(x=x, w=w, grad=grad, answers=((want, problem["x"]), (want_x, problem["x"]), (want_w, problem["weight"])))


def run_case(kernel: RmsNormKernel, case: dict) -> tuple[dict, str]:
    """({"loss_error": y's relative error, "grad_error": the gradients' worst}, what failed or ""),
    with outputs poisoned with NaN first."""
    import torch

    x, w = case["x"], case["w"]
    nan = float("nan")
    call, y, rstd = kernel.prepare(x, w, rms_norm.DEFAULT_EPS, torch.full_like(x, nan),
                                   torch.full((x.shape[0],), nan, device=x.device))
    call()
    back, gx, gw = kernel.prepare_backward(case["grad"], x, w, rstd, rms_norm.DEFAULT_EPS, torch.full_like(x, nan),
                                           torch.full_like(w, nan))
    back()
    errors, failed = {"loss_error": 0.0, "grad_error": 0.0}, ""
    for what, got, (want, dtype) in zip(("y", "grad_x", "grad_weight"), (y, gx, gw), case["answers"]):
        ok, err, message = check(what, got, want, TOL[dtype], getattr(torch, dtype))
        key = "loss_error" if what == "y" else "grad_error"
        errors[key] = max(errors[key], err)
        failed = failed or ("" if ok else message)
    return errors, failed


class Evaluation:
    def __init__(self):
        self.inputs: dict[tuple, tuple] = {}
        self.cases = Cases()

    def load(self, so: str, name: str, entry: str | None = None) -> RmsNormKernel:
        return RmsNormKernel(so, name, entry)

    def check(self, kernel: RmsNormKernel, problem: dict) -> dict[str, Any]:
        """The problem's shape, then odd ones: one row of a width no vector divides, and rows that
        do not fill the last block."""
        worst = {"loss_error": 0.0, "grad_error": 0.0}
        for (rows, width), key, make in self._checks(problem):
            errors, failed = run_case(kernel, self.cases.get(key, make))
            worst = {k: max(v, errors[k]) for k, v in worst.items()}
            if failed:
                finite = all(v < float("inf") for v in errors.values())
                return {"ok": False, "reason": "wrong result" if finite else "nan",
                        "message": f"{rows}x{width}: {failed}", **worst}
        return {"ok": True, "reason": "", "message": "", **worst}

    @staticmethod
    def _checks(problem: dict) -> list[tuple]:
        """((rows, width), key, make(seed)) of each input set a check uses."""
        return [((rows, width), (problem["x"], problem["weight"], rows, width),
                 lambda s, r=rows, w=width: make_case(problem, r, w, s % 2**31))
                for rows, width in ((problem["rows"], problem["width"]), (1, 1027), (37, 771))]

    def warm(self, problem: dict) -> None:
        """The input sets, answers and timing inputs the first variants need, made while they compile."""
        for _, key, make in self._checks(problem):
            self.cases.prime(key, make)
        self._timing_inputs(problem)

    def _timing_inputs(self, problem: dict) -> tuple:
        import torch

        key = tuple(sorted(problem.items()))
        if key not in self.inputs:
            self.inputs.clear()
            x, w = rms_norm.make_inputs(problem["rows"], problem["width"], problem["x"], problem["weight"], seed=1234)
            self.inputs[key] = (x, w, torch.randn_like(x))
        return self.inputs[key]

    def calls(self, kernel: RmsNormKernel, problem: dict, objective: str) -> tuple[Callable, Callable | None]:
        x, w, grad = self._timing_inputs(problem)
        fwd, _, rstd = kernel.prepare(x, w, rms_norm.DEFAULT_EPS)
        fwd()  # the backward reads the rstd it saves
        if objective == "fwd":
            return fwd, None
        bwd, _, _ = kernel.prepare_backward(grad, x, w, rstd, rms_norm.DEFAULT_EPS)
        return fwd, bwd

    def baseline(self, problem: dict, objective: str) -> tuple[Callable, Callable | None]:
        """torch's F.rms_norm on the timing inputs, as `calls` gives a variant's: the forward, and
        the backward alone (both gradients, from a graph kept for it)."""
        import torch
        import torch.nn.functional as F

        x, w, grad = self._timing_inputs(problem)
        shape, eps = (x.shape[-1],), rms_norm.DEFAULT_EPS

        def fwd():
            return F.rms_norm(x, shape, w, eps)

        if objective == "fwd":
            return fwd, None
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = F.rms_norm(xg, shape, wg, eps)
        return fwd, timing.gradient_call((y,), (xg, wg), (grad,))

    def errors(self, kernel: RmsNormKernel) -> int:
        return 0  # RMSNorm has no input a kernel validates
