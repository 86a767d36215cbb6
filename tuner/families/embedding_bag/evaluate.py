"""What the search's worker needs of the EmbeddingBag family: load a built variant, check it
against the float64 reference, and give its forward as a call to time."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tuner.families import embedding_bag as eb
from tuner.families.embedding_bag.kernel import EmbeddingBagKernel

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


class Evaluation:
    """Per worker process: timing inputs made once per problem (the PR's weight is 2.5 GB)."""

    def __init__(self):
        self.inputs: dict[tuple, tuple] = {}

    def load(self, so: str, name: str) -> EmbeddingBagKernel:
        return EmbeddingBagKernel(so, name)

    def check(self, kernel: EmbeddingBagKernel, problem: dict) -> dict[str, Any]:
        """On fresh inputs shaped like the problem but with fewer rows (the float64 reference runs on
        the CPU), and on an odd shape (dim not a multiple of the loads, empty bags): every mode."""
        import torch

        p = eb.Problem(**problem)
        worst = 0.0
        for shape in (dict(rows=min(p.rows, 20_000), bags=min(p.bags, 256)),
                      dict(rows=97, dim=p.dim + 1, bags=13, bag_size=3)):
            q = dataclasses.replace(p, **shape)
            for mode in eb.MODES:
                w, idx, offs, psw = eb.make_inputs(q, seed=int(torch.randint(1 << 30, ()).item()), device="cuda",
                                                   per_sample_weights=mode == "sum")
                out = torch.full((q.bags, q.dim), float("nan"), dtype=w.dtype, device="cuda")
                got, _ = kernel.forward(w, idx, offs, mode, psw, out=out)
                want, _ = eb.reference(w.cpu(), idx.cpu(), offs.cpu(), mode, None if psw is None else psw.cpu())
                err = float((got.cpu().double() - want).abs().max()) / max(float(want.abs().max()), 1.0)
                worst = max(worst, err)
                if not err <= TOL[q.weight]:
                    finite = bool(torch.isfinite(got).all())
                    return {"ok": False, "reason": "wrong result" if finite else "nan",
                            "message": f"{mode} rows={q.rows} dim={q.dim}: relative error {err:.3g}",
                            "loss_error": worst}
        if kernel.take_errors():
            return {"ok": False, "reason": "wrong result", "message": "validation flagged valid inputs",
                    "loss_error": worst}
        return {"ok": True, "reason": "", "message": "", "loss_error": worst}

    def calls(self, kernel: EmbeddingBagKernel, problem: dict, objective: str) -> tuple[Callable, Callable | None]:
        key = tuple(sorted(problem.items()))
        if key not in self.inputs:
            self.inputs.clear()  # one problem's weight at a time
            self.inputs[key] = eb.make_inputs(eb.Problem(**problem), seed=1234, device="cuda")
        w, idx, offs, _ = self.inputs[key]
        mode = problem["mode"]
        fwd, _, _ = kernel.prepare(w, idx, offs, mode)
        return fwd, None  # the backward is not written yet

    def errors(self, kernel: EmbeddingBagKernel) -> int:
        return kernel.take_errors()
