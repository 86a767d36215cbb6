"""`tuner search`: an Optuna study that compiles, verifies and times variants.

The stages, each a module: `config` (what is asked, what is reported), `asking` (which
variants next, claimed in the study; `ranking`, the default sampler's model), `pipeline`
(the run loop: compile while the GPUs evaluate; `tuner.evaluate` and `tuner.worker` do the
GPU side), `recording` (telling the study, the measurement log), `finalists` (the best few
timed again; the winner).
"""

from tuner.records import OBJECTIVES, objective_value
from tuner.search.config import SAMPLERS, SearchConfig, SearchReport
from tuner.search.pipeline import Search, finished, run
from tuner.search.recording import result_attrs

__all__ = ["OBJECTIVES", "SAMPLERS", "Search", "SearchConfig", "SearchReport", "finished", "objective_value",
           "result_attrs", "run"]
