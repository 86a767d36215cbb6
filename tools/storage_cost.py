"""What a study's storage costs per trial: Optuna's plain ask and tell against tuner's writes.

    python tools/storage_cost.py --storage postgresql+psycopg://user@host/db --processes 1,4
    python tools/storage_cost.py --storage journal+postgresql://user@host/db

Three loops, each in N processes on one fresh study, no sampler work to speak of:
  optuna-ask-tell  `study.ask` with 7 categorical parameters, 3 user attributes, `study.tell`
  tuner-claim      what a random or grid search writes: a claimed trial (parameters and
                   attributes in one write), the probe's intermediate value and the pruner's
                   question, the packed result, `study.tell`
  tuner-ask        what a tpe search writes: `study.ask`, 2 attributes, then as tuner-claim
Prints trials per second for each loop and process count. (A searcher's heartbeat is one
write every few seconds, whatever the number of trials: not counted.)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
import uuid

PARAMS = {f"p{i}": [f"v{j}" for j in range(4)] for i in range(7)}
RESULT = {"result": {"fwd_us": 10.5, "fwd_spread_us": 0.2, "bwd_us": 30.1, "bwd_spread_us": 0.4, "regs_fwd": 40,
                     "regs_bwd": 64, "spill_bytes": 0, "compile_s": 1.2, "loss_error": 1e-6, "grad_error": 2e-6,
                     "device": "host/cuda:0"}}


def _loop(kind: str, url: str, name: str, trials: int, seed: int, out, start) -> None:
    import random

    import optuna
    from optuna.distributions import CategoricalDistribution

    from tuner.search import pruning
    from tuner.store import study as studies

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = studies.storage(url)
    study = optuna.load_study(study_name=name, storage=st, sampler=optuna.samplers.RandomSampler(seed=seed),
                              pruner=pruning.pruner(pruning.DEFAULT_FACTOR))
    dists = {k: CategoricalDistribution(v) for k, v in PARAMS.items()}
    rng = random.Random(seed)
    start.wait()  # all processes loaded and connected: the loops run side by side
    for _ in range(trials):
        if kind == "tuner-claim":
            trial = studies.claim(study, {k: rng.choice(v) for k, v in PARAMS.items()}, dists,
                                  {"variant": "v", "owner": "host/1/2"})
        else:
            trial = study.ask(dists)
        if kind == "optuna-ask-tell":
            for key in ("a", "b", "c"):
                trial.set_user_attr(key, 1.0)
        else:
            if kind == "tuner-ask":
                trial.set_user_attr("variant", "v")
                trial.set_user_attr("owner", "host/1/2")
            trial.report(rng.random(), 10)
            trial.should_prune()
            trial.set_user_attr("result", RESULT["result"])
        study.tell(trial, rng.random())
    out.put(time.time())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--processes", default="1,4")
    ap.add_argument("--trials", type=int, default=200, help="per process")
    ap.add_argument("--loops", default="optuna-ask-tell,tuner-claim,tuner-ask")
    args = ap.parse_args()

    import optuna

    from tuner.store import study as studies

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ctx = mp.get_context("spawn")
    for kind in args.loops.split(","):
        for n in (int(x) for x in args.processes.split(",")):
            name = f"storage-cost-{kind}-{n}-{uuid.uuid4().hex[:8]}"
            optuna.create_study(study_name=name, storage=studies.storage(args.storage))
            out, start = ctx.Queue(), ctx.Barrier(n + 1)
            procs = [ctx.Process(target=_loop, args=(kind, args.storage, name, args.trials, i, out, start))
                     for i in range(n)]
            started = time.perf_counter()
            for p in procs:
                p.start()
            start.wait()
            began = time.time()
            for p in procs:
                p.join()
            if any(p.exitcode for p in procs):
                print(f"{kind}: a process failed")
                return 1
            wall = max(out.get() for _ in procs) - began  # from the common start to the last one's end
            print(f"{kind:16s} {n} process(es): {n * args.trials / wall:6.1f} trials/s "
                  f"({n * args.trials} trials, {time.perf_counter() - started:.1f} s with start-up)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
