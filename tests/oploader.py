"""How the op tests load an export: through `tuner.load` (default), or with TUNER_TEST_OP=wheel
through the export's wheel, installed into a folder of its own and imported as a user without
tuner would (its own copy of the runtime, its own KernelInputError). The same tests then run
against both."""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODE = os.environ.get("TUNER_TEST_OP", "tuner")
_count = itertools.count()
_current = {}  # family -> the runtime module that bound it last


def load(out, validate: str = "async", baseline: bool = True):
    """The op of export `out`, loaded the way this test run checks."""
    import tuner
    from tuner.deploy import export
    from tuner import runtime as tuner_runtime

    family = export.read(out)["family"]
    if MODE != "wheel":
        op = tuner.load(out, validate=validate, baseline=baseline)
        _current[family] = tuner_runtime
        return op
    from tuner.deploy import wheel

    name = f"tuned_test_{next(_count)}"
    folder = Path(tempfile.mkdtemp(prefix="wheel-"))
    whl = wheel.pack(out, folder, export.read(out), name=name)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(folder / "site"), str(whl)], check=True, timeout=300)
    sys.path.insert(0, str(folder / "site"))
    package = importlib.import_module(name)
    _current[family] = package.runtime
    return package.load(validate, baseline)


def runtime(family: str = "giou"):
    """The runtime module (tuner's, or the wheel's copy) that bound the family's op last."""
    if family not in _current:
        from tuner import runtime as tuner_runtime

        return tuner_runtime
    return _current[family]


def kernel_input_error(family: str = "giou"):
    return runtime(family).KernelInputError


def chosen(pred: str, target: str, batch: int, slots: int) -> dict:
    """The GIoU winner a call of this shape runs (the C++ choice), with its params."""
    import torch

    state = runtime("giou").loaded("giou")
    name = torch.ops.tuner_giou.served([batch, slots], getattr(torch, pred), getattr(torch, target))
    return next(b for b in state.bound if b["variant"] == name)
