"""CPU-side pieces of the worker and the measurement log."""

import json

import pytest

from tuner.store import records
from tuner.measure.child import classify

TORCH_SUFFIX = ("\nCUDA kernel errors might be asynchronously reported at some other API call.\n"
                "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


@pytest.mark.parametrize("message,reason", [
    ("AcceleratorError: CUDA error: an illegal memory access was encountered" + TORCH_SUFFIX, "illegal address"),
    ("AcceleratorError: CUDA error: device-side assert triggered" + TORCH_SUFFIX, "device-side assert"),
    ("RuntimeError: giou_loss: variant x failed to launch: invalid argument", "launch error"),
    ("RuntimeError: CUDA error: too many resources requested for launch", "launch error"),
    ("RuntimeError: CUDA error: unspecified launch failure", "launch error"),
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 15.66 GiB. GPU 0 has a total capacity of 79.18 GiB",
     "out of memory"),
    ("ValueError: something of our own", None),
])
def test_cuda_errors_are_classified_by_their_own_text(message, reason):
    assert classify(message) == reason


@pytest.mark.filterwarnings("ignore::tuner.store.records.RecordDamageWarning")  # the cut line, on purpose
def test_a_line_cut_by_a_kill_is_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    records.append(path, {"variant": "a", "x": 1})
    records.append(path, {"variant": "b", "x": 2})
    with open(path, "a") as f:
        f.write(json.dumps({"variant": "c"})[:7])  # the kill came mid-write
    assert [r["variant"] for r in records.read(path)] == ["a", "b"]
    records.append(path, {"variant": "d"})  # appending after the cut line still works
    assert [r["variant"] for r in records.read(path)][-1] == "d"
