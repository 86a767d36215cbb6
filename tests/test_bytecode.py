"""`paths.keep_bytecode`: bytecode in the cache only where torch has none beside its sources."""

import importlib.util
import sys
import types

import pytest

from tuner import paths


@pytest.fixture
def interpreter(monkeypatch, tmp_path):
    """The interpreter's bytecode settings, restored after the test; a cache of the test's own."""
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setenv("TUNER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TUNER_BYTECODE", raising=False)
    return tmp_path


def _torch_at(monkeypatch, folder, with_bytecode: bool):
    source = folder / "torch" / "__init__.py"
    source.parent.mkdir(parents=True)
    source.write_text("")
    if with_bytecode:
        cached = importlib.util.cache_from_source(str(source))
        (folder / "torch" / "__pycache__").mkdir()
        open(cached, "wb").close()
    spec = types.SimpleNamespace(origin=str(source))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "torch" else None)


def test_a_torch_without_bytecode_gets_a_prefix_in_the_cache(interpreter, monkeypatch):
    _torch_at(monkeypatch, interpreter, with_bytecode=False)
    assert paths.keep_bytecode()
    assert sys.pycache_prefix == str(interpreter / "cache" / "bytecode")
    assert not sys.dont_write_bytecode


def test_a_torch_with_bytecode_is_left_alone(interpreter, monkeypatch):
    _torch_at(monkeypatch, interpreter, with_bytecode=True)
    assert not paths.keep_bytecode()
    assert sys.pycache_prefix is None and sys.dont_write_bytecode


def test_turned_off_or_a_prefix_already_set(interpreter, monkeypatch):
    _torch_at(monkeypatch, interpreter, with_bytecode=False)
    monkeypatch.setenv("TUNER_BYTECODE", "0")
    assert not paths.keep_bytecode() and sys.pycache_prefix is None
    monkeypatch.delenv("TUNER_BYTECODE")
    monkeypatch.setattr(sys, "pycache_prefix", str(interpreter / "mine"))
    assert not paths.keep_bytecode() and sys.pycache_prefix == str(interpreter / "mine")
