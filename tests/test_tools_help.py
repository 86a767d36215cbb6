"""Every script in tools/ answers --help with its usage and does nothing else: no export, no
search, no file (a flag taken for an output folder ran a real export before)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
SCRIPTS = sorted(p for p in TOOLS.iterdir() if p.suffix in (".py", ".sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_tool_answers_help_and_does_nothing_else(script, tmp_path):
    runner = [sys.executable] if script.suffix == ".py" else ["bash"]
    proc = subprocess.run([*runner, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                            "TUNER_HOME": str(tmp_path / "home"),
                                            "TUNER_CACHE": str(tmp_path / "cache")} | _python_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() and "Traceback" not in proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []


def _python_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "VIRTUAL_ENV", "LD_LIBRARY"))}
