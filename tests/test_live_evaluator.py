"""LiveEvaluator's wiring without a GPU: a worker per device, jobs routed by slot, checks of
the devices (the GPU suite runs the real thing)."""

import os

import pytest

from tuner import gpus
from tuner.search import evaluate
from tuner.measure import worker
from tuner.errors import GpuError
from tuner.families import giou


H100 = "NVIDIA H100 80GB HBM3"


class FakeAttached:
    arch = "sm_90"

    def __init__(self, index, name=H100):
        self.index, self.name = index, name

    def describe(self):
        return {"gpu_name": self.name, "arch": self.arch}


class FakeWorker:
    made = []
    names: dict = {}  # device index -> the GPU its hello names

    def __init__(self, index, timeout, log_path=None, warm=None):
        self.index, self.log_path, self.jobs, self.restarts, self.closed = index, log_path, [], index, False
        self.killed = 0
        self.spawned = False
        FakeWorker.made.append(self)

    def spawn(self):
        self.spawned = True

    def ready(self):
        self.greeted = True
        return {"ready": True, "gpu": FakeAttached(self.index, FakeWorker.names.get(self.index, H100)).describe()}

    def evaluate(self, job, on_probe=None):
        self.jobs.append(job)
        if job["kind"] == "retime":
            return {"status": "ok", "timings": {k["name"]: {"fwd": {"median_us": 1.0 + self.index}}
                                                for k in job["kernels"]}}
        if job["kind"] == "check":  # a whole build checked: "bad" fails it, "crash" kills the child
            return {"status": "fail", "reason": "crash" if job["name"] == "crash" else "wrong result",
                    "message": "max"} if job["name"] in ("bad", "crash") else {"status": "ok"}
        return {"status": "ok", "probe_answer": on_probe({"fwd": {"median_us": 1.0}}) if on_probe else None}

    def close(self):
        self.closed = True


@pytest.fixture
def fakes(monkeypatch):
    def torch_asked(*args, **kwargs):
        raise AssertionError("the search's process asked torch about the GPU")

    monkeypatch.setattr(gpus, "attached_for", torch_asked)
    monkeypatch.setattr(gpus, "attached", torch_asked)
    monkeypatch.setattr(gpus, "visible", lambda index=0: None)  # no nvidia-smi: the hellos tell
    monkeypatch.setattr(worker, "Worker", FakeWorker)
    FakeWorker.made = []
    FakeWorker.names = {}
    return FakeWorker.names


def test_a_worker_per_device_and_jobs_go_to_the_slot_asked(fakes, tmp_path):
    ev = evaluate.LiveEvaluator("H100", giou.Problem(), "fwd+bwd", devices=[2, 5], log_path=tmp_path / "w.log")
    assert ev.parallel == 2 and [w.index for w in FakeWorker.made] == [2, 5]
    assert all(w.spawned for w in FakeWorker.made)  # started ahead, beside the first compiles
    assert [w.log_path for w in FakeWorker.made] == [f"{tmp_path / 'w.log'}.2", f"{tmp_path / 'w.log'}.5"]
    v = next(iter(giou.space()))
    got = ev.evaluate(v, {"so": "x.so", "entry": "e"}, on_probe=lambda probe: False, slot=1)
    assert got["device"].endswith("/cuda:5") and got["probe_answer"] is False
    (job,) = FakeWorker.made[1].jobs
    assert job["probe"] and job["entry"] == "e" and job["timing"] == evaluate.SEARCH_TIMING
    assert not FakeWorker.made[0].jobs
    ev.retime([v], {v.name: {"so": "x.so", "entry": "e"}}, "fwd+bwd")
    assert FakeWorker.made[0].jobs[-1]["kind"] == "retime"  # finalists on one GPU, side by side
    assert ev.restarts == 2 + 5
    ev.close()
    assert all(w.closed for w in FakeWorker.made)


def test_devices_of_another_model_are_refused(fakes):
    fakes[1] = "NVIDIA L4"
    with pytest.raises(GpuError, match="device 1 is NVIDIA L4"):
        evaluate.LiveEvaluator("H100", giou.Problem(), "fwd+bwd", devices=[0, 1]).gpu_info
    assert all(w.closed for w in FakeWorker.made)


def test_the_gpu_from_nvidia_smi_without_waiting_for_the_workers(fakes, monkeypatch):
    """With nvidia-smi, name, label and arch are known at once: the first compiles start while the
    workers import torch. Their hellos, read later, describe the GPU for the study."""
    monkeypatch.setattr(gpus, "visible", lambda index=0: gpus.Seen(H100, "sm_90"))
    ev = evaluate.LiveEvaluator("auto", giou.Problem(), "fwd+bwd")
    assert (ev.gpu_name, ev.gpu_label, ev.arch) == (H100, "H100", "sm_90")
    assert not getattr(FakeWorker.made[0], "greeted", False)
    assert ev.gpu_info["gpu_name"] == H100 and FakeWorker.made[0].greeted
    with pytest.raises(GpuError, match="the attached GPU is NVIDIA H100"):
        evaluate.LiveEvaluator("L4", giou.Problem(), "fwd+bwd")
    assert FakeWorker.made[-1].closed


def test_a_hello_that_disagrees_with_nvidia_smi_is_refused(fakes, monkeypatch):
    monkeypatch.setattr(gpus, "visible", lambda index=0: gpus.Seen(H100, "sm_90"))
    fakes[0] = "NVIDIA H200"
    ev = evaluate.LiveEvaluator("auto", giou.Problem(), "fwd+bwd")
    with pytest.raises(GpuError, match="CUDA_DEVICE_ORDER"):
        ev.gpu_info


def test_without_nvidia_smi_the_hello_names_the_gpu(fakes):
    ev = evaluate.LiveEvaluator("auto", giou.Problem(), "fwd+bwd")
    assert (ev.gpu_name, ev.gpu_label, ev.arch) == (H100, "H100", "sm_90")
    with pytest.raises(GpuError, match="the attached GPU is NVIDIA H100"):
        evaluate.LiveEvaluator("L4", giou.Problem(), "fwd+bwd").gpu_info


def test_device_lists(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert gpus.device_indices(None) == [0]
    assert gpus.device_indices("0, 3") == [0, 3]
    for bad in ("", "a", "1,1", "-1", "4", "0,7"):  # the last two: devices this machine does not show
        with pytest.raises(GpuError):
            gpus.device_indices(bad)


def test_all_devices_are_counted_without_starting_cuda(monkeypatch, tmp_path):
    """`--devices all` as CUDA_VISIBLE_DEVICES or nvidia-smi tells them: the search spawns a worker
    per GPU before it imports torch."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0,5")
    assert gpus.visible_count() == 3 and gpus.device_indices("all") == [0, 1, 2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-918d7d69,GPU-2f76e04a")
    assert gpus.visible_count() is None  # UUIDs: CUDA counts them
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0\\n1\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert gpus.visible_count() == 2 and gpus.device_indices("all") == [0, 1]


def test_whole_finalists_are_checked_one_job_each_before_they_are_timed(fakes):
    from tuner.families import embedding_bag

    ev = evaluate.LiveEvaluator("H100", embedding_bag.Problem(), "fwd+bwd")
    vs = [type("V", (), {"name": n}) for n in ("good", "bad", "crash", "unbuilt")]
    built = {n: {"so": f"{n}.so", "entry": "e"} for n in ("good", "bad", "crash")}
    got = ev.retime(vs, {**built, "unbuilt": {"so": None, "message": "ptxas error"}}, "fwd+bwd", whole=True)
    jobs = FakeWorker.made[0].jobs
    assert [(j["kind"], j.get("name")) for j in jobs] == [("check", "good"), ("check", "bad"), ("check", "crash"),
                                                          ("retime", None)]
    assert [k["name"] for k in jobs[-1]["kernels"]] == ["good"]
    assert got["good"] == {"fwd": {"median_us": 1.0}}
    assert got["bad"]["failed"] == "wrong result: max" and got["crash"]["failed"].startswith("crash")
    assert got["unbuilt"]["failed"] == "compile error: ptxas error"
    # none left to time: no retime job
    FakeWorker.made[0].jobs.clear()
    assert set(ev.retime(vs[1:3], built, "fwd+bwd", whole=True)) == {"bad", "crash"}
    assert [j["kind"] for j in FakeWorker.made[0].jobs] == ["check", "check"]


def test_on_several_devices_the_finalists_checks_are_dealt_over_the_workers_and_timed_on_all(fakes):
    from tuner.families import embedding_bag
    from tuner.measure.child import RETIME_TIMING

    ev = evaluate.LiveEvaluator("H100", embedding_bag.Problem(), "fwd+bwd", devices=[0, 1])
    names = ("good", "bad", "other", "crash", "last")
    vs = [type("V", (), {"name": n}) for n in names]
    got = ev.retime(vs, {n: {"so": f"{n}.so", "entry": "e"} for n in names}, "fwd+bwd", whole=True)
    first, second = FakeWorker.made
    assert [(j["kind"], j.get("name")) for j in first.jobs] == [("check", "good"), ("check", "other"),
                                                                ("check", "last"), ("retime", None)]
    assert [(j["kind"], j.get("name")) for j in second.jobs] == [("check", "bad"), ("check", "crash"),
                                                                 ("retime", None)]
    for w in (first, second):  # every finalist on every GPU, side by side, each GPU with half the repetitions
        assert [k["name"] for k in w.jobs[-1]["kernels"]] == ["good", "other", "last"]
        assert w.jobs[-1]["timing"] == {"min_reps": RETIME_TIMING["min_reps"] // 2,
                                        "budget_ms": RETIME_TIMING["budget_ms"] / 2}
    assert got["bad"]["failed"] == "wrong result: max" and got["crash"]["failed"].startswith("crash")
    assert got["last"] == {"fwd": {"median_us": 1.5}}  # the two GPUs' medians (1 and 2 µs), pooled
    ev.close()


def test_re_timings_on_several_gpus_pool_into_one():
    def t(median, spread, least, reps, graphed=True):
        return {"median_us": median, "spread_us": spread, "min_us": least, "reps": reps, "graphed": graphed}

    got = evaluate.pooled([{"a": {"fwd": t(10.0, 0.5, 9.0, 200), "bwd": t(20.0, 1.0, 19.0, 200), "extra_round": True},
                            "b": {"fwd": t(12.0, 0.2, 11.5, 200, False)}},
                           {"a": {"fwd": t(11.0, 0.3, 9.5, 100), "bwd": t(22.0, 2.0, 20.0, 100)},
                            "torch": {"bwd": t(30.0, 1.0, 29.0, 100)}},
                           {}])  # a GPU whose worker failed: nothing from it
    assert got["a"] == {"fwd": t(10.5, 0.5, 9.0, 300), "bwd": t(21.0, 2.0, 19.0, 300), "extra_round": True}
    assert got["b"] == {"fwd": t(12.0, 0.2, 11.5, 200, False)}  # timed by one GPU alone: its own
    assert got["torch"] == {"bwd": t(30.0, 1.0, 29.0, 100)}
    assert evaluate.pooled([]) == {}


def test_a_search_builds_only_what_its_problem_runs(fakes, monkeypatch):
    from tuner.build import binding
    from tuner.build import compile as build

    asked, started = [], []
    monkeypatch.setattr(binding, "library", lambda family: pytest.fail("a search waited for the binding"))
    monkeypatch.setattr(binding, "build_in_background", started.append)
    monkeypatch.setattr(build, "build", lambda variants, arch, jobs=None, focus=None, on_ready=None: asked.append(focus) or [])
    ev = evaluate.LiveEvaluator("H100", giou.Problem(reduction="sum"), "fwd+bwd")
    ev.prepare([])
    ev.prepare([])  # the binding's build started once, in the background; the focus every time
    ev.prepare([], whole=True)  # finalists, as the export builds them
    assert asked == [{"only": "sum"}, {"only": "sum"}, None]
    assert started == ["giou"]
