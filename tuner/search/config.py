"""What a search is asked to do (SearchConfig, handed down once to every stage) and what it did
(SearchReport)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


# ranked: candidates ranked by a model of the study so far, claimed in batches (the default);
# tpe: Optuna's TPESampler, asked one trial at a time; random and grid: unseen variants in a
# shuffled order.
SAMPLERS = ("ranked", "tpe", "random", "grid")

# A variant whose probe (tuner.search.pruning) is this much slower than the best is pruned: a
# 10-repetition median is within a few % of the full one, and 1.5x is far behind.
PRUNE_FACTOR = 1.5


@dataclass
class SearchConfig:
    gpu: str
    problem: Any  # a family's Problem: a dataclass with `family` and `key()`
    trials: int = 200
    timeout: float | None = None
    sampler: str = "ranked"
    storage: Any = None  # a URL, a journal file's path, or an Optuna storage object; None: the default
    study: str | None = None
    objective: str = "fwd+bwd"
    simulate: Path | None = None
    simulate_delay: float = 0.0
    arch: str | None = None
    jobs: int | None = None
    batch: int | None = None
    top_k: int = 8  # finalists timed again: the search times each variant once, and its top few can swap
    eval_timeout: float = 60.0
    plant_faults: tuple[str, ...] = ()  # test only: variants with these faults (see the family's FAULTS)
    import_records: Path | None = None
    warm_start: bool = True  # ranked: the family's other studies in the storage say what to try first
    seed: int | None = 0  # None: a fresh random order each run
    progress: bool = True
    prune: float | None = PRUNE_FACTOR  # prune variants this much slower than the best; None: time all
    devices: str | None = None  # "all" or CUDA indices "0,1": a worker per GPU; None: device 0
    # called with the best objective so far after each trial is told; True stops asking for
    # more (trials already asked are still finished), as a timeout does
    stop_when: Callable[[float], bool] | None = None

    def study_name(self, gpu_label: str) -> str:
        from tuner.store import study

        return self.study or study.study_name(self.problem.family, gpu_label, self.problem.key(), self.objective)


@dataclass
class SearchReport:
    study_name: str
    records_path: Path
    trials: int = 0
    evaluated: int = 0
    compiled: int = 0
    duplicates: int = 0
    pruned: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    requeued: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    compile_s: float = 0.0
    verify_s: float = 0.0
    time_s: float = 0.0
    winner: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None  # the torch op's timings beside the finalists'
    retimed: list[dict[str, Any]] = field(default_factory=list)
    worker_restarts: int = 0
    worker_kills: int = 0
    imported: int = 0
    warm_started: int = 0  # variants tried first because the family's other studies ranked them high
    # (stage, start, end) in time.monotonic() seconds: "compile" (a piece of a batch), "gpu" (its
    # evaluation): what bounded the search, and how long it took to start
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    started: float = 0.0  # time.monotonic() when the search's loop began

    def busy(self, stage: str) -> float:
        """Seconds in which `stage` was at work (its spans merged where they overlap)."""
        total, end = 0.0, float("-inf")
        for _, a, b in sorted(s for s in self.spans if s[0] == stage):
            if b > end:
                total += b - max(a, end)
                end = b
        return total

    def pipeline(self, started: float) -> str:
        """Where a live search's time went (`started`: the command's start, time.monotonic())."""
        first_gpu = min((a for kind, a, _ in self.spans if kind == "gpu"), default=None)
        waited = self.busy("gpu start")
        return (f"pipeline: search loop began {self.started - started:.1f} s after the command's start, the GPU "
                f"{'-' if first_gpu is None else f'{first_gpu - started:.1f} s'} after it"
                f"{f' (its worker took {waited:.1f} s more than the first compiles)' if waited else ''}; "
                f"compiling {self.busy('compile'):.1f} s, GPU work {self.busy('gpu'):.1f} s "
                f"of the search's {self.wall_s:.1f} s\n" + self.timeline(started))

    def timeline(self, started: float) -> str:
        """Each stage's spans in seconds from the command's start (overlapping ones merged): where
        the compiler or the GPU waited."""
        parts = []
        for stage in ("compile", "gpu start", "gpu", "finalists"):
            merged: list[list[float]] = []
            for _, a, b in sorted(s for s in self.spans if s[0] == stage):
                if merged and a <= merged[-1][1] + 0.05:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            if merged:
                parts.append(f"{stage} " + ", ".join(f"{a - started:.1f}-{b - started:.1f}" for a, b in merged))
        return "timeline (s from the command's start): " + "; ".join(parts)
