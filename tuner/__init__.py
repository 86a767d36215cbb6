"""tuner: explore, verify and time CUDA kernel variants of PyTorch ops, and export the best."""

from __future__ import annotations

from tuner.version import __version__  # noqa: F401 (tuner.__version__)


def load(directory=None, **kwargs):
    """Load a tuned artifact and return its family's op (see tuner.deploy.load)."""
    from tuner import gpus
    from tuner.deploy import load as deploy

    gpu = kwargs.get("gpu")
    if directory is None and isinstance(gpu, str) and gpu.lower() == "auto":
        gpus.attached(asked=f"tuner.load(gpu={gpu!r})")  # where none is attached, say so naming the call
    return deploy.load(directory, **kwargs)


def set_validate(mode: str) -> None:
    """How kernel-found bad input is reported by the loaded ops (see tuner.runtime)."""
    from tuner import runtime

    runtime.set_validate(mode)


def check_errors() -> None:
    """Raise for bad input seen by calls made with validate='deferred' (see tuner.runtime)."""
    from tuner import runtime

    runtime.check_errors()


def capture(path):
    """Record the shapes the families' ops are called with while a block runs, into `path`
    (see tuner.deploy.capturing): `with tuner.capture("shapes.json"): train_steps()`."""
    from tuner.deploy.capturing import Capture

    return Capture(path)


def patch(model, *exports, **kwargs):
    """Hand the model's modules that a loaded export serves (nn.RMSNorm, transformers' Llama-style
    RMSNorm, nn.EmbeddingBag, ...) to the tuned ops; returns what it changed, with undo() (see
    tuner.deploy.patching): `tuner.patch(model, "exports/rms_norm-H100")`."""
    from tuner.deploy.patching import patch

    return patch(model, *exports, **kwargs)
