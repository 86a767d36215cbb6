"""How a worker's parent handles the deaths of its child, with a child that needs no GPU."""

import fakechild
from tuner.measure.worker import Worker


def _worker():
    return Worker(0, timeout=30, start_timeout=60, target=fakechild.main)


def test_a_child_killed_from_outside_is_replaced_and_the_variant_run_again(tmp_path):
    with _worker() as w:
        first = w.evaluate({"name": "a"})
        again = w.evaluate({"name": "b", "die": "SIGKILL", "once": str(tmp_path / "b")})
        assert first["status"] == again["status"] == "ok"
        assert again["pid"] != first["pid"]  # a fresh child answered
        assert (w.restarts, w.killed) == (1, 1)
        assert w.evaluate({"name": "c", "die": "SIGTERM", "once": str(tmp_path / "c")})["status"] == "ok"


def test_a_variant_whose_child_is_killed_twice_fails_as_a_crash():
    with _worker() as w:
        result = w.evaluate({"name": "a", "die": "SIGKILL"})
        assert result["status"] == "fail" and result["reason"] == "crash" and "killed" not in result
        assert "SIGKILL" in result["message"] and "twice" in result["message"]
        assert w.evaluate({"name": "b"})["status"] == "ok"


def test_a_child_that_crashes_by_itself_is_not_given_a_second_run(tmp_path):
    with _worker() as w:
        result = w.evaluate({"name": "a", "die": "SIGSEGV", "once": str(tmp_path / "a")})
        assert result["status"] == "fail" and result["reason"] == "crash"
        assert (w.restarts, w.killed) == (1, 0)


def test_a_child_spawned_ahead_answers_the_first_job_and_is_replaced_like_any_other(tmp_path):
    with _worker() as w:
        w.spawn()  # as a live search does, beside its first compiles
        first = w.evaluate({"name": "a"})
        assert first["status"] == "ok" and w.restarts == 0
        again = w.evaluate({"name": "b", "die": "SIGKILL", "once": str(tmp_path / "b")})
        assert again["status"] == "ok" and again["pid"] != first["pid"] and w.killed == 1


def test_the_warm_up_is_answered_before_the_first_job_and_a_child_it_kills_is_replaced(tmp_path):
    """A live search's workers run a warm-up first (input sets, answers), unasked, while the first
    variants compile; its reply never stands in for a job's, and a warm-up that kills its child
    costs no variant anything."""
    warm = {"kind": "warm", "name": "warm-up"}
    with Worker(0, timeout=30, start_timeout=60, target=fakechild.main, warm=warm) as w:
        w.spawn()
        assert w.evaluate({"name": "a"})["name"] == "a"
        assert w.evaluate({"name": "b"})["name"] == "b"
    dying = {"kind": "warm", "name": "warm-up", "die": "SIGKILL", "once": str(tmp_path / "w")}
    with Worker(0, timeout=30, start_timeout=60, target=fakechild.main, warm=dying) as w:
        w.spawn()
        first = w.evaluate({"name": "a"})
        assert first["status"] == "ok" and first["name"] == "a" and w.restarts == 0


def test_a_child_started_ahead_is_taken_over_by_the_worker_of_its_settings():
    """`tuner search` starts its worker's child before Optuna is imported; the search's Worker
    takes that child over (its warm-up reply pending), and one of other settings starts its own."""
    from tuner.measure import worker

    warm = {"kind": "warm", "name": "warm-up"}
    worker.spawn_ahead(0, None, warm, target=fakechild.main)
    (proc, _), = worker._AHEAD.values()
    with Worker(0, timeout=30, start_timeout=60, target=fakechild.main, warm=warm) as w:
        w.spawn()
        assert not worker._AHEAD and w._proc is proc
        assert w.evaluate({"name": "a"})["pid"] == proc.pid
    worker.spawn_ahead(1, None, warm, target=fakechild.main)
    with Worker(0, timeout=30, start_timeout=60, target=fakechild.main, warm=warm) as w:
        w.spawn()
        assert w._proc is not worker._AHEAD[(1, None, fakechild.main, w._settings()[3])][0]
    (proc, _), = worker._AHEAD.values()
    worker.discard_ahead()
    assert not worker._AHEAD and not proc.is_alive()


def test_a_child_whose_graph_capture_failed_is_replaced_and_graphs_are_left_off():
    """timing.spoiled: the job's result stands, the child ends after it, and the next child times
    without graphs (a family whose calls cannot be captured costs one restart, not one a variant)."""
    with _worker() as w:
        first = w.evaluate({"name": "a", "spoil": True})
        assert first["status"] == "ok" and "restart" not in first and first["graph"] is True
        second = w.evaluate({"name": "b"})
        assert second["status"] == "ok" and second["pid"] != first["pid"] and second["graph"] is False
        assert (w.restarts, w.killed) == (1, 0) and not w.graphs
