import pytest

from tuner import gpus
from tuner.errors import GpuError


@pytest.mark.parametrize("name,arch", [("L4", "sm_89"), ("A10G", "sm_86"), ("a10", "sm_86"), ("A100", "sm_80"),
                                       ("H100", "sm_90"), ("H200", "sm_90"), ("H20", "sm_90"), ("T4", "sm_75"),
                                       ("RTX 4090", "sm_89"), ("rtx-4090", "sm_89"), ("B200", "sm_100")])
def test_names_map_to_architectures(name, arch):
    assert gpus.arch_of(name) == arch


def test_arch_overrides_gpu():
    assert gpus.resolve("L4", "sm_90") == "sm_90"
    with pytest.raises(GpuError, match="sm_XX|form"):
        gpus.resolve(None, "90")


def test_unknown_gpu_lists_known_names():
    with pytest.raises(GpuError, match="L4"):
        gpus.arch_of("V1000")


def _fake(name):
    a = gpus.Attached.__new__(gpus.Attached)
    a.name = name
    return a


def test_matching_attached_names():
    h100 = _fake("NVIDIA H100 80GB HBM3")
    assert h100.matches("H100") and h100.matches("auto") and not h100.matches("L4")
    assert not _fake("NVIDIA H200").matches("H20")
    assert _fake("NVIDIA H20").matches("H20")
    assert _fake("NVIDIA GeForce RTX 4090").matches("RTX 4090")


def test_short_name():
    assert gpus.short_name(_fake("NVIDIA H100 80GB HBM3")) == "H100"
    assert gpus.short_name(_fake("NVIDIA GeForce RTX 4090")) == "RTX4090"
    assert gpus.short_name(_fake("Some New GPU")) == "Some New GPU"


def test_search_without_a_gpu_names_what_was_asked():
    """On a machine without a GPU, `tuner search --gpu NAME` says why it cannot run, naming the GPU."""
    import subprocess
    import sys

    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    r = subprocess.run([sys.executable, "-m", "tuner", "search", "--gpu", "L4", "--trials", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "--gpu L4" in r.stderr and "--simulate" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "tuner", "search", "--gpu", "H10", "--trials", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown GPU 'H10'" in r.stderr and "H100" in r.stderr, r.stderr  # a usage error


def test_what_a_worker_says_of_its_gpu_unpickles_without_torch(monkeypatch):
    """The worker's hello carries Attached.describe(); torch's version as torch's TorchVersion would
    make the search's process import torch to unpickle it (seconds, its GPU waiting)."""
    import pickle
    import pickletools
    import types

    import torch

    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                                  L2_cache_size=50 << 20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    said = pickle.dumps(gpus.Attached(0).describe(driver=""))
    assert not any(op.name in ("GLOBAL", "STACK_GLOBAL") for op, _, _ in pickletools.genops(said))  # plain values
    assert pickle.loads(said)["torch"] == torch.__version__
