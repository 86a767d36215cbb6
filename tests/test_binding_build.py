"""The family's torch binding is built beside a search, in a process of its own, and whoever
needs it next (the export, `tuner.load`) waits for that build instead of starting another; a
killed build leaves nothing that blocks the next one."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tuner.build import binding


def test_a_build_killed_before_leaves_no_lock_that_blocks_the_next(fresh_cache, monkeypatch):
    path = binding._library_path("rms_norm")
    path.parent.mkdir(parents=True)
    (path.parent / "lock").write_text("")  # cpp_extension's lock file, left by a killed build
    path.write_bytes(b"half")  # and the library it was linking
    assert binding.built("rms_norm") is None
    built = []
    monkeypatch.setattr(binding, "_build", lambda family, p, verbose: built.append(family) or p.write_bytes(b"so"))
    assert binding.library("rms_norm") == path and built == ["rms_norm"] and path.read_bytes() == b"so"
    assert not (path.parent / "lock").exists() and binding.built("rms_norm") == path
    assert binding.library("rms_norm") == path and built == ["rms_norm"]  # built: nothing to do


HOLDER = """
import sys, time
from tuner.build import binding
path = binding._library_path("rms_norm")
with binding._building(path.parent):
    print("holding", flush=True)
    time.sleep(float(sys.argv[1]))
    path.write_bytes(b"so")
    binding._done(path).touch()
"""


def test_a_second_builder_waits_for_the_build_under_way(fresh_cache, monkeypatch):
    monkeypatch.setattr(binding, "_build", lambda *a: pytest.fail("built a second time"))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        started = time.monotonic()
        path = binding.library("rms_norm")
        assert path.read_bytes() == b"so" and time.monotonic() - started > 1.0
    finally:
        holder.wait(60)


def test_the_lock_ends_with_a_killed_builder(fresh_cache, monkeypatch):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "600"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    holder.kill()
    holder.wait(60)
    monkeypatch.setattr(binding, "_build", lambda family, p, verbose: p.write_bytes(b"mine"))
    assert binding.library("rms_norm").read_bytes() == b"mine"


# A family whose binding is a hand-written op over torch's ATen headers alone: a real build (about 25 s
# of a core on the CI machine, where a family's full binding takes a minute), found as a family outside
# tuner is (TUNER_FAMILY_PATH), also by the builder's own process.
PROBE = """#include <ATen/ATen.h>
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(tuner, m) { m.def("binding_probe(Tensor x) -> Tensor"); }
"""


@pytest.fixture
def binding_probe(tmp_path, monkeypatch):
    from tuner import families

    folder = tmp_path / "families" / "binding_probe"
    (folder / "templates").mkdir(parents=True)
    (folder / "__init__.py").write_text('"""A family with a binding alone."""\nfrom pathlib import Path\n\n'
                                        'TEMPLATES = Path(__file__).parent / "templates"\n')
    (folder / "templates" / "binding_probe_op.cpp").write_text(PROBE)
    monkeypatch.setattr(families, "__path__", list(families.__path__))  # the family is gone after the test
    monkeypatch.setenv(families.ENV_PATH, "")
    families.add_path(folder.parent)
    return "binding_probe"


def test_the_background_build_makes_the_binding_that_load_uses(fresh_cache, binding_probe):
    """For real: the process a search starts builds the binding while this process asks for it
    and waits, instead of building it again."""
    proc = binding.build_in_background(binding_probe)
    assert proc is not None
    path = binding._library_path(binding_probe)
    deadline = time.monotonic() + 60
    while not (path.parent / "tuner.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the builder has started (importing torch first)
    time.sleep(1.0)
    assert proc.poll() is None, (path.parent / "build.log").read_text()[-2000:]
    assert binding.library(binding_probe) == path and path.exists()
    assert proc.wait(600) == 0, (path.parent / "build.log").read_text()[-2000:]
    assert binding.build_in_background(binding_probe) is None  # built: nothing started
    assert "No CUDA runtime is found" not in (path.parent / "build.log").read_text()  # torch's, on a CPU machine
