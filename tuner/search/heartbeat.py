"""A searcher's heartbeat in a shared study, and its watch over the other searchers' (who they
are: tuner/store/searchers.py)."""

from __future__ import annotations

from typing import Any

from tuner.store import study as studies
from tuner.store.searchers import owner

HEARTBEAT_S = 5  # each searcher beats this often, in the study
GRACE_S = 15  # a searcher whose beat has not changed for this long is dead: its trials run again


class Heartbeat:
    """This searcher's pulse in the study, and its watch over the others'.

    Every HEARTBEAT_S a thread counts up this searcher's beat (a study system attribute named
    after its owner tag: one write, however many trials it runs) and reads the others'. A
    searcher whose beat has not moved for GRACE_S on this host's clock (no clock is compared
    across hosts) is dead or cut off: its running trials are failed as interrupted and queued
    again, to be run by whichever searcher asks next. Trials left running without an owner
    (a kill between Optuna's ask and the owner's record) are treated the same after GRACE_S.
    Optuna's own heartbeats (RDB storages only) write once per running trial per beat: a
    searcher keeps a few hundred trials in flight while it compiles."""

    def __init__(self, study, st):
        import threading

        self.study, self.storage = study, st
        self._study_id = st.get_study_id_from_name(study.study_name)
        self._me = owner()
        self._count = 0
        self._seen: dict[str, tuple[Any, float]] = {}  # owner -> (its beat, when it last moved here)
        self._stop = threading.Event()
        self._beat()
        # Two threads: failing a dead searcher's hundreds of trials takes seconds, and this
        # searcher's own beat must not wait for that.
        self._threads = [threading.Thread(target=self._every, args=(work,), name=f"tuner-{name}", daemon=True)
                         for name, work in (("heartbeat", self._beat), ("watch", self.watch))]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def key(tag: str) -> str:
        return f"tuner:beat:{tag}"

    def _beat(self) -> None:
        self._count += 1
        self.storage.set_study_system_attr(self._study_id, self.key(self._me), self._count)

    def _every(self, work) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                work()
            except Exception:  # noqa: BLE001 - a lost connection must not kill the search; retried next beat
                pass

    def watch(self, now: float | None = None) -> list[int]:
        """Fail and queue again the running trials of searchers that stopped beating; their numbers."""
        import time

        from optuna.trial import TrialState

        now = time.monotonic() if now is None else now
        beats = self.storage.get_study_system_attrs(self._study_id)
        dead: list[Any] = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            tag = t.user_attrs.get("owner")
            if tag == self._me:
                continue
            beat = beats.get(self.key(tag)) if tag else ("no owner", t.number)
            name = tag or f"#{t.number}"
            last, moved = self._seen.get(name, (None, now))
            if beat != last or name not in self._seen:
                self._seen[name] = (beat, now)
            elif now - moved > GRACE_S:
                dead.append(t)
        failed = []
        for t in dead:
            tag = t.user_attrs.get("owner", "its searcher, which never recorded itself")
            if studies.fail(self.study, self.storage, t, f"the searcher that ran it ({tag}) stopped beating for {GRACE_S} s"):
                failed.append(t.number)
        return failed

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
