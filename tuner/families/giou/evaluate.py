"""What the search's worker needs of the GIoU family: load a built variant, check it against
the float64 reference, and give its forward and backward as calls to time."""

from __future__ import annotations

from typing import Any, Callable

from tuner.measure import timing
from tuner.measure.cases import Cases
from tuner.families.giou.kernel import GiouKernel
from tuner.families.giou.verify import make_case, run_case


class Evaluation:
    """Per worker process: timing inputs made once per problem, input sets shared between variants."""

    def __init__(self):
        self.inputs: dict[tuple, tuple] = {}
        self.cases = Cases()

    def load(self, so: str, name: str, entry: str | None = None) -> GiouKernel:
        return GiouKernel(so, name, entry)

    def check(self, kernel: GiouKernel, problem: dict) -> dict[str, Any]:
        """Correct first: the problem's own shape, then an odd one that ends mid-block, each on an
        input set shared with a few other variants (`tuner.measure.cases`). Returns
        {"ok", "reason", "message"} and the worst errors seen (`loss_error`, `grad_error`)."""
        worst = {"loss_error": 0.0, "grad_error": 0.0}
        for key, make in self._checks(problem):
            v = run_case(kernel, self.cases.get(key, make))
            worst = {"loss_error": max(worst["loss_error"], v.loss_error),
                     "grad_error": max(worst["grad_error"], v.grad_error)}
            if not v.ok:
                return {"ok": False, "reason": v.reason, "message": v.message, **worst}
        return {"ok": True, "reason": "", "message": "", **worst}

    @staticmethod
    def _checks(problem: dict):
        """(key, make(seed)) of each input set a check uses: the problem's shape, then an odd one."""
        for batch, slots in ((problem["batch"], problem["slots"]), (3, 7)):
            key = (problem["pred"], problem["target"], batch, slots, problem["reduction"], problem["distribution"])
            yield key, (lambda seed, k=key: make_case(*k, seed=seed))

    def warm(self, problem: dict) -> None:
        """The input sets, answers and timing inputs the first variants need, made while they compile."""
        for key, make in self._checks(problem):
            self.cases.prime(key, make)
        self.timing_inputs(problem)

    def timing_inputs(self, problem: dict) -> tuple:
        """Fixed random inputs per problem, so that variants are timed on the same data."""
        from tuner.families import giou

        key = tuple(sorted(problem.items()))
        if key not in self.inputs:
            self.inputs[key] = giou.make_inputs(problem["batch"], problem["slots"], problem["pred"],
                                                problem["target"], problem["distribution"], device="cuda",
                                                seed=1234)
        return self.inputs[key]

    def calls(self, kernel: GiouKernel, problem: dict, objective: str) -> tuple[Callable, Callable | None]:
        """Forward and backward calls on fixed inputs with preallocated outputs (no sync), their
        arguments laid out once: a timed call is a launch."""
        import torch

        red = problem["reduction"]
        pred, target, nb = self.timing_inputs(problem)
        need_grad = objective != "fwd"
        fwd, out, count, saved = kernel.prepare(pred, target, nb, red, need_grad=need_grad)
        if objective == "fwd":
            return fwd, None
        fwd()  # the backward reads the count (and a fused variant's saved gradient) the forward writes
        bwd, _ = kernel.prepare_backward(torch.ones_like(out), pred, target, nb, count, saved, red)
        return fwd, bwd

    def baseline(self, problem: dict, objective: str) -> tuple[Callable, Callable | None]:
        """The eager loss (spec.eager, float32) on the timing inputs: the forward, and the backward
        alone (pred's gradient, from a graph kept for it)."""
        import torch

        from tuner.families.giou.spec import eager

        red = problem["reduction"]
        pred, target, nb = self.timing_inputs(problem)

        def fwd():
            return eager(pred, target, nb, red)

        if objective == "fwd":
            return fwd, None
        leaf = pred.detach().requires_grad_()
        loss = eager(leaf, target, nb, red)
        grad_out = torch.ones_like(loss)
        return fwd, timing.gradient_call((loss,), (leaf,), (grad_out,))

    def errors(self, kernel: GiouKernel) -> int:
        """Error bits the kernels flagged since the last call (generated inputs are valid)."""
        return kernel.take_errors()
