"""tuner's version (the same as pyproject.toml's), below every module that records it."""

__version__ = "0.1.0"
