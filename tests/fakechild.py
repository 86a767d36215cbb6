"""A worker child without CUDA, for tests of how the parent survives its deaths. Its jobs say
what to do: answer, or die by a signal (once, when `once` names a file that marks it done)."""

import os
import signal


def main(conn, device_index, log_path=None):
    conn.send({"ready": True, "pid": os.getpid()})
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        die = job.get("die")
        if die and not (job.get("once") and os.path.exists(job["once"])):
            if job.get("once"):
                open(job["once"], "w").close()
            os.kill(os.getpid(), getattr(signal, die))
        answer = {"status": "ok", "name": job["name"], "pid": os.getpid(), "graph": job.get("graph", True)}
        if job.get("spoil"):  # as a child whose graph capture failed: it answers, then ends
            conn.send({**answer, "restart": True})
            return
        conn.send(answer)
