"""What the search's worker needs of the EmbeddingBag family: load a built variant, check its
forward and backward against the float64 reference, and give both as calls to time."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tuner.measure import timing
from tuner.measure.cases import Cases
from tuner.families import embedding_bag as eb
from tuner.families.embedding_bag.kernel import EmbeddingBagKernel

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def gradient_tolerance(weight: str, hits: int) -> float:
    """A row's gradient is a float32 sum of one term per hit of its id; whatever the order (atomics
    or a sorted reduction) its rounding error grows about as sqrt(hits) * eps. Allowed: 16 times
    that on top of the output's tolerance (a lost entry of a row hit 20,000 times still fails)."""
    return TOL[weight] + 16 * 2.0**-24 * max(hits, 1) ** 0.5


def relative_error(got, want) -> float:
    """Largest error over the largest reference magnitude (a floor keeps all-zero references honest),
    computed where the reference lies: one number comes back from the GPU, not the tensors."""
    import torch

    if not want.numel():
        return 0.0
    err = (got.to(want.device, torch.float64) - want).abs().max()
    scale = want.abs().max().clamp(min=1e-3)
    return float(err / scale)


def make_case(q: eb.Problem, mode: str, seed: int, padding: bool = False) -> dict:
    """Inputs on the GPU and their float64 answers, computed there too: the output, the gradient of
    weight and (sum) of per_sample_weights for a random output gradient. On the CPU the reference
    took most of a check and, at normal priority, starved the next batch's compiles (run at nice
    10 beside the checks) of the cores. The inputs are drawn on the CPU, then moved, so that a
    seed means the same inputs on every machine."""
    import torch

    w, idx, offs, psw = eb.make_inputs(q, seed=seed, device="cuda", per_sample_weights=mode == "sum")
    pad = int(idx[0]) if padding and idx.numel() else None
    g = torch.randn(q.bags, q.dim, generator=torch.Generator().manual_seed(seed)).to(w.dtype).cuda()
    want, _ = eb.reference(w, idx, offs, mode, psw, padding_idx=pad)
    want_w, want_psw = eb.reference_backward(w, idx, offs, mode, psw, g, padding_idx=pad)
    hits = int(idx.long().bincount().max()) if idx.numel() else 0
    return dict(problem=q, mode=mode, inputs=(w, idx, offs, psw), padding_idx=pad, grad=g, want=want,
                want_w=want_w, want_psw=want_psw, hits=hits)


def run_case(kernel: EmbeddingBagKernel, case: dict) -> tuple[float, str]:
    """(worst relative error, what failed or ""): the forward into a NaN-filled output, then the
    backward, against the case's float64 answers."""
    import torch

    q, mode = case["problem"], case["mode"]
    w, idx, offs, psw = case["inputs"]
    out = torch.full((q.bags, q.dim), float("nan"), dtype=w.dtype, device="cuda")
    call, saved = kernel.prepare(w, idx, offs, mode, psw, padding_idx=case["padding_idx"], out=out)
    call()
    worst = relative_error(out, case["want"])
    if not worst <= TOL[q.weight]:
        return worst, "forward"
    grad_w, grad_psw = kernel.backward(saved, case["grad"], psw_grad=psw is not None)
    err = relative_error(grad_w, case["want_w"])
    if psw is not None:
        err = max(err, relative_error(grad_psw, case["want_psw"]))
    return max(worst, err), "" if err <= gradient_tolerance(q.weight, case["hits"]) else "backward"


def check_case(kernel: EmbeddingBagKernel, q: eb.Problem, mode: str, seed: int, padding: bool = False) -> tuple:
    return run_case(kernel, make_case(q, mode, seed, padding))


class Evaluation:
    """Per worker process: timing inputs made once per problem (the PR's weight is 2.5 GB)."""

    def __init__(self):
        self.inputs: dict[tuple, tuple] = {}
        self.cases = Cases()  # input sets and their float64 answers, per check case

    def load(self, so: str, name: str, entry: str | None = None) -> EmbeddingBagKernel:
        return EmbeddingBagKernel(so, name, entry)

    def _case(self, q: eb.Problem, mode: str, padding: bool) -> dict:
        """The next input set of this case. Drawing the inputs (on the CPU) and their float64
        answers costs more than a variant's run, so each set is made once and shared by a few variants."""
        return self.cases.get((q, mode, padding), self._make(q, mode, padding))

    @staticmethod
    def _make(q: eb.Problem, mode: str, padding: bool):
        return lambda seed: make_case(q, mode, seed % (1 << 30), padding)

    @staticmethod
    def _checks(problem: dict, whole: bool = False) -> list[tuple]:
        """(shape, mode, padding) of each case a check runs: the problem's mode, or every mode."""
        p = eb.Problem(**problem)
        small = dict(rows=min(p.rows, 8192), bags=min(p.bags, 256))
        shapes = [(dataclasses.replace(p, **small), False),
                  (dataclasses.replace(p, **small, distribution="one_hot"), False),
                  (dataclasses.replace(p, rows=97, dim=p.dim + 1, bags=13, bag_size=3), True)]
        return [(q, mode, padding) for q, padding in shapes for mode in (eb.MODES if whole else (p.mode,))]

    def warm(self, problem: dict) -> None:
        """The input sets, answers and timing inputs the first variants need, made while they compile."""
        for q, mode, padding in self._checks(problem):
            self.cases.prime((q, mode, padding), self._make(q, mode, padding))
        self._timing_inputs(problem)

    def check(self, kernel: EmbeddingBagKernel, problem: dict, whole: bool = False) -> dict[str, Any]:
        """The problem's mode (a search's build has no other), or with `whole` every mode (the
        finalists' whole builds), forward and backward, on inputs shaped like the problem but with fewer rows
        and bags (the inputs are drawn on the CPU, at a cost that grows with their size; several
        blocks of bags and 8192 rows already show a wrong index, sum or mapping): with the
        problem's ids and with one very frequent id (long runs of one row in the backward), and on
        an odd shape (dim not a multiple of the loads, empty bags, a padding_idx)."""
        worst = 0.0
        for q, mode, padding in self._checks(problem, whole):
            err, failed = run_case(kernel, self._case(q, mode, padding))
            worst = max(worst, err)
            if failed:
                return {"ok": False, "reason": "wrong result" if err == err else "nan",
                        "message": f"{failed} {mode} {q.distribution} rows={q.rows} dim={q.dim}: "
                                   f"relative error {err:.3g}", "loss_error": worst}
        if kernel.take_errors():
            return {"ok": False, "reason": "wrong result", "message": "validation flagged valid inputs",
                    "loss_error": worst}
        return {"ok": True, "reason": "", "message": "", "loss_error": worst}

    def _timing_inputs(self, problem: dict) -> tuple:
        import torch

        key = tuple(sorted(problem.items()))
        if key not in self.inputs:
            self.inputs.clear()  # one problem's weight at a time
            p = eb.Problem(**problem)
            w, idx, offs, _ = eb.make_inputs(p, seed=1234, device="cuda")
            g = torch.randn(p.bags, p.dim, generator=torch.Generator().manual_seed(1)).to(w.dtype).cuda()
            self.inputs[key] = (w, idx, offs, g)
        return self.inputs[key]

    def calls(self, kernel: EmbeddingBagKernel, problem: dict, objective: str) -> tuple[Callable, Callable | None]:
        """The forward, and unless the objective is the forward alone, the backward (the dense
        gradient of weight, into a buffer zeroed once: the op's zeroing is the same for every variant)."""
        w, idx, offs, g = self._timing_inputs(problem)
        fwd, saved = kernel.prepare(w, idx, offs, problem["mode"])
        fwd()  # the backward reads what the forward saves
        if objective == "fwd":
            return fwd, None
        bwd, _, _ = kernel.prepare_backward(saved, g)
        return fwd, bwd

    def baseline(self, problem: dict, objective: str) -> tuple[Callable, Callable | None] | None:
        """torch's F.embedding_bag on the timing inputs, as `calls` gives a variant's; None for a
        bfloat16 max, whose backward torch does not have. torch's backward allocates and zeroes
        the weight's gradient, which a variant's timed backward leaves out (the op does it): the
        zeroing is timed here too, and `records.served_by` adds it to the variant's backward."""
        import torch
        import torch.nn.functional as F

        if problem["mode"] == "max" and problem["weight"] == "bfloat16" and objective != "fwd":
            return None  # (a search's problem has no per_sample_weights, torch's other bfloat16 gap)
        w, idx, offs, g = self._timing_inputs(problem)

        def fwd():
            return F.embedding_bag(idx, w, offs, mode=problem["mode"])

        if objective == "fwd":
            return fwd, None
        wg = w.detach().requires_grad_()
        out = F.embedding_bag(idx, wg, offs, mode=problem["mode"])
        zeroed = torch.empty_like(w)
        return fwd, timing.gradient_call((out,), (wg,), (g,)), zeroed.zero_

    def errors(self, kernel: EmbeddingBagKernel) -> int:
        return kernel.take_errors()
