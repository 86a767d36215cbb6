"""A real PostgreSQL server for tests: a throwaway cluster on a loopback port.

The server refuses to run as root, so as root it runs as the `postgres` user. Tests that use
it skip, saying why, where no server binaries (initdb, pg_ctl) or no psycopg are installed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def _bindir() -> Path | None:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    except OSError:
        pass
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self):
        pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'tuner[postgres]'")
        self.bindir = _bindir()
        if self.bindir is None:
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
        self.as_user: list[str] = []
        self.folder = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                pytest.skip("PostgreSQL refuses root and there is no runuser to start it as postgres")
            self.as_user = [runuser, "-u", "postgres", "--"]
            shutil.chown(self.folder, "postgres")
        self.port = _free_port()
        self.data = self.folder / "data"
        self._run("initdb", "-D", str(self.data), "-U", "tuner", "--auth=trust", "-E", "UTF8")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        self.url = f"postgresql+psycopg://tuner@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        out = subprocess.run([*self.as_user, str(self.bindir / tool), *args], capture_output=True, text=True,
                             timeout=120)
        if out.returncode:
            log = self.folder / "log"
            raise RuntimeError(f"{tool} failed: {out.stdout}{out.stderr}{log.read_text() if log.exists() else ''}")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
