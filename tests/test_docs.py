"""The documentation site: a strict build, the generated CLI reference, and the code blocks that
the pages mark as runnable without a GPU.

The convention: a fenced block directly after the line `<!-- ci: run -->` runs here (the comment
shows neither on the site nor on GitHub). `sh` blocks run in bash from the repository's root, with
`tuner` being this checkout's; `python` blocks run in a scratch folder. Each page's blocks share one
fresh TUNER_HOME and build cache, in page order, so a later block can read what an earlier one made;
the cache's torch bindings are the run's (built once a run, conftest.py: a minute of a core each).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARK = "<!-- ci: run -->"
BLOCK = re.compile(r"^" + re.escape(MARK) + r"\n```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)


def runnable(page: Path) -> list[tuple[str, str]]:
    """(language, code) of each block of a page marked to run in CI."""
    return BLOCK.findall(page.read_text())


def test_build_is_strict_and_clean(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "WARNING" not in run.stderr, run.stderr  # strict fails on warnings; this also names them
    page = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "tuner export-best" in page and "cli-reference" not in page  # the marker was replaced


def test_cli_reference_names_every_option():
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    from tuner import families
    from tuner.cli import main as cli

    page = cli_reference.reference()
    for family in families.names():
        commands = cli.parser(family).commands.choices
        for name, sub in commands.items():
            assert f"## tuner {name}\n" in page
            for action in sub._actions:
                if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                    continue  # hidden from --help, so from the page too
                for option in action.option_strings:
                    assert f"`{option}`" in page, (family, name, option)


def test_every_mark_has_its_block():
    for page in DOCS.rglob("*.md"):
        marks = page.read_text().splitlines().count(MARK)  # the mark on a line of its own
        assert marks == len(runnable(page)), f"{page}: {MARK} not directly before a fence"
        assert {lang for lang, _ in runnable(page)} <= {"sh", "python"}, page
    assert runnable(DOCS / "getting-started.md")


@pytest.mark.parametrize("page", sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
                                        if runnable(p)))
def test_page_blocks_run(page, tmp_path):
    home, scratch, bin_dir = tmp_path / "home", tmp_path / "scratch", tmp_path / "bin"
    for folder in (home, scratch, bin_dir):
        folder.mkdir()
    # `tuner` is this checkout's, whatever an installed entry point points at
    (bin_dir / "tuner").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tuner "$@"\n')
    (bin_dir / "tuner").chmod(0o755)
    # the run's torch bindings (what they are built from is in their key): variants build fresh
    bindings = Path(os.environ["TUNER_CACHE"]) / "variants" / "_binding"
    bindings.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache" / "variants").mkdir(parents=True)
    (tmp_path / "cache" / "variants" / "_binding").symlink_to(bindings, target_is_directory=True)
    env = {**os.environ, "TUNER_HOME": str(home), "TUNER_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for lang, code in runnable(DOCS / page):
        if lang == "sh":
            argv, cwd = ["bash", "-euo", "pipefail", "-c", code], ROOT
        else:
            argv, cwd = [sys.executable, "-c", code], scratch
        # a block may wait for the run's build of a torch binding (a minute or more on a busy 2-core
        # machine): the limit only catches a hang
        run = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"{page}:\n{code}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
