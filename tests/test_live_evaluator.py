"""LiveEvaluator's wiring without a GPU: a worker per device, jobs routed by slot, checks of
the devices (the GPU suite runs the real thing)."""

import pytest

from tuner import evaluate, gpus, worker
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

    def __init__(self, index, timeout, log_path=None):
        self.index, self.log_path, self.jobs, self.restarts, self.closed = index, log_path, [], index, False
        self.killed = 0
        self.spawned = False
        FakeWorker.made.append(self)

    def spawn(self):
        self.spawned = True

    def evaluate(self, job, on_probe=None):
        self.jobs.append(job)
        if job["kind"] == "retime":
            return {"status": "ok", "timings": {"v": {"fwd": {"median_us": 1.0}}}}
        return {"status": "ok", "probe_answer": on_probe({"fwd": {"median_us": 1.0}}) if on_probe else None}

    def close(self):
        self.closed = True


@pytest.fixture
def fakes(monkeypatch):
    names = {}
    monkeypatch.setattr(gpus, "attached_for", lambda gpu, index=0: FakeAttached(index))
    monkeypatch.setattr(gpus, "attached", lambda index=0: FakeAttached(index, names.get(index, H100)))
    monkeypatch.setattr(worker, "Worker", FakeWorker)
    FakeWorker.made = []
    return names


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
        evaluate.LiveEvaluator("H100", giou.Problem(), "fwd+bwd", devices=[0, 1])


def test_device_lists():
    assert gpus.device_indices(None) == [0]
    assert gpus.device_indices("0, 3") == [0, 3]
    for bad in ("", "a", "1,1", "-1"):
        with pytest.raises(GpuError):
            gpus.device_indices(bad)
