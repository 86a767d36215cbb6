"""tuner: explore, verify and time CUDA kernel variants of PyTorch ops, and export the best."""

from __future__ import annotations

__version__ = "0.1.0"


def load(directory=None, **kwargs):
    """Load a tuned artifact and return its family's op (see tuner.runtime.load)."""
    from tuner import runtime

    return runtime.load(directory, **kwargs)


def check_errors() -> None:
    """Raise for bad input seen by calls made with validate='deferred' (see tuner.runtime)."""
    from tuner import runtime

    runtime.check_errors()
