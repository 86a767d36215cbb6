"""The export's last word on who serves each problem: the tuned op itself against torch's op at
every problem a variant serves, timed as `tuner bench` times them (wall time of back-to-back calls
and GPU time, forward and forward+backward), on the GPU the export is for. The search timed
kernels; a training step also pays the op's host path, and where a call is small enough for the
host to bound it, a faster kernel can still make a slower step. Where the op is slower than torch's
in a cell, torch's op serves that kind of call there (the forward's cells decide calls without a
gradient, forward+backward's training calls: tuner.deploy.regions.verdict); `tuner export-best`
writes the export again.
"Torch's op" here is the op's own path to it (`tuner.runtime.torch_path`: the declaration's guards
and torch's op, what a call costs where torch serves), so that a variant slower than torch's bare
call but faster than the guarded one keeps its problem.

Runs in a process of its own (`python -m tuner.deploy.serving DIR POINTS.json OUT.json`), once for the
tuned problems and the shapes around them (tuner.deploy.regions): it loads the export's op, which a
process holds once, and imports torch, which export-best does not need otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tuner import families


def problems_bench(family: str):
    """(run_problems(directory, problems, out) -> rows, the torch op's row name, the tuned op's) of
    a family: its declaration's (tuner.report.declared); None where it declares no op."""
    import functools

    if getattr(families.get(family), "OP_DECLARATION", None) is None:
        return None
    from tuner.report import declared

    return functools.partial(declared.run_problems, family), declared.torch_name(family), declared.TUNED


def checkable(manifest: dict) -> str | None:
    """Why the export's problems cannot be checked here (no bench of its family's problems, no GPU
    of its architecture), or None."""
    if problems_bench(manifest["family"]) is None:
        return f"the {manifest['family']} family has no bench of its problems"
    from tuner import gpus

    here = gpus.visible()
    if here is None:
        return "no GPU is attached"
    if here.arch != manifest.get("arch"):
        return f"the attached GPU is {here.name} ({here.arch}), the export is for {manifest.get('arch')}"
    return None


def measure(directory: Path, points: list[dict], timeout: float = 2700) -> dict[str, dict[str, float | None]]:
    """Problem key -> the op's ratio to torch's per cell at each of `points` (each {"problem": ...}),
    the op loaded so that its variants serve every shape (the nearest tuned problem's; at a tuned
    problem its own). A shape where the op was slower in a cell is timed twice more and each cell
    is the median of the three (`steadied`). A shape torch's op cannot run (a backward missing for a
    dtype) or too big for the GPU is left out, so that the variant keeps it, or the tuned problems
    around it decide."""
    if not points:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "points.json").write_text(json.dumps(points))
        out = Path(tmp) / "ratios.json"
        try:
            run = subprocess.run([sys.executable, "-m", "tuner.deploy.serving", str(directory),
                                  str(Path(tmp) / "points.json"), str(out)], timeout=timeout, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        except subprocess.TimeoutExpired:  # the export stays as the search chose it, and says why
            raise RuntimeError(f"timing {directory} took over {timeout:.0f} s") from None
        if run.returncode != 0:
            lines = run.stderr.strip().splitlines()
            raise RuntimeError(f"timing {directory} failed: {lines[-1] if lines else run.returncode}")
        return json.loads(out.read_text())


def _main(directory: str, points: str, out: str) -> None:
    import torch

    from tuner.deploy import export
    from tuner.report import bench

    manifest = export.read(Path(directory))
    run_problems, torch_row, tuned_row = problems_bench(manifest["family"])
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        def timed(problem: dict) -> dict[str, float | None]:
            rows = run_problems(Path(directory), [{"problem": problem}], Path(tmp), baseline=False)
            (_, cells), = bench.ratios(rows, bench.serving_against(rows, torch_row), tuned_row)
            return cells

        for p in json.loads(Path(points).read_text()):
            key = export.problem_key(p["problem"])
            try:
                cells = timed(p["problem"])
                if any(r is None or r > export.SLOWER for r in cells.values()):  # a verdict for torch's op: twice more
                    cells = steadied([cells, timed(p["problem"]), timed(p["problem"])])
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                print(f"{key}: not measured: too big for this GPU", file=sys.stderr)
                continue
            except (NotImplementedError, RuntimeError) as exc:  # torch cannot run it (a bfloat16 max backward)
                print(f"{key}: not measured: {str(exc).splitlines()[0]}", file=sys.stderr)
                continue
            found[key] = cells
    Path(out).write_text(json.dumps(found))


def steadied(runs: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Each cell's median over several timings of one shape (None where a timing lacks it): one
    noisy wall time on a busy host does not give a problem to torch's op."""
    import statistics

    return {cell: None if any(r[cell] is None for r in runs) else statistics.median(r[cell] for r in runs)
            for cell in runs[0]}


if __name__ == "__main__":
    _main(*sys.argv[1:4])
