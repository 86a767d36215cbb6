"""tuner: explore, verify and time CUDA kernel variants of PyTorch ops, and export the best."""

from __future__ import annotations

__version__ = "0.1.0"
