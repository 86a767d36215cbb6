"""`tuner search`: an Optuna study that compiles, verifies and times variants.

The stages, each a module: `config` (what is asked, what is reported), `asking` (which
variants next, claimed in the study; `ranking`, the default sampler's model), `evaluate`
(where the measurements come from: the GPUs' workers, `tuner.measure.worker`, or a recording),
`pipeline` (the run loop: compile while the GPUs evaluate; `pruning`), `recording` (telling the
study, the measurement log), `finalists` (the best few timed again; the winner), `problems`
(several problems in one command); `quality` measures the samplers in simulation.
"""

import importlib

from tuner.store.records import OBJECTIVES, objective_value
from tuner.search.config import SAMPLERS, SearchConfig, SearchReport

# The pipeline (Optuna, the evaluators) is imported on first use: the command line reads the
# samplers' names here, and a search's worker starts before Optuna is imported (tuner.cli).
_LAZY = {"Search": "pipeline", "finished": "pipeline", "run": "pipeline", "result_attrs": "recording"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["OBJECTIVES", "SAMPLERS", "Search", "SearchConfig", "SearchReport", "finished", "objective_value",
           "result_attrs", "run"]
