"""A call's timed repetitions captured in one CUDA graph and replayed (tuner.measure.timing's
search timing), and what a failed capture leaves behind in torch, mended."""

from __future__ import annotations

from typing import Callable


class _Graphs:
    """This process's capture stream, shared by every graph `capture` makes. Each graph
    has a memory pool of its own, freed with it: a pool shared with a freed graph fails the next
    capture, and leaves torch's CUDA generator unusable ("Offset increment outside graph capture")."""

    stream = None
    spoiled = False  # a capture failed in this process (`spoiled()`)


def spoiled() -> bool:
    """Whether a capture failed in this process. torch's `capture_end` then raises before it ends
    the graph's memory pool's routing, so the caching allocator keeps a capture it believes under
    way (a later `empty_cache` asserts, freed blocks are not recycled across streams): the
    worker replaces such a process after the job (tuner/measure/worker.py) and times the rest
    without graphs."""
    return _Graphs.spoiled


def capture(fn: Callable[[], object], flush: Callable[[], object], chunk: int) -> tuple | None:
    """(graph, events): `chunk` repetitions of `fn`, each after an L2 flush, captured in one
    graph with events recorded as its nodes; None where `fn` cannot be captured (it synchronizes,
    or reads a result on the host): the caller times it directly."""
    import torch

    if _Graphs.spoiled:  # the process is replaced after this job: not another capture in it
        return None
    try:
        events = [(torch.cuda.Event(enable_timing=True, external=True),
                   torch.cuda.Event(enable_timing=True, external=True)) for _ in range(chunk)]
    except TypeError:  # a torch without events in graphs
        return None
    if _Graphs.stream is None:
        _Graphs.stream = torch.cuda.Stream()
    stream, graph = _Graphs.stream, torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    # Not `torch.cuda.graph`: it collects garbage and empties the allocator's cache on entry, tens
    # of ms a variant. "thread_local": another thread's CUDA calls do not spoil the capture.
    with torch.cuda.stream(stream):
        try:
            graph.capture_begin(capture_error_mode="thread_local")
        except TypeError:  # a torch without the capture's modes
            return None
        except RuntimeError:
            _end_failed_capture(None, stream)
            return None
        try:
            for start, end in events:
                flush()
                start.record(stream)
                fn()
                end.record(stream)
        except BaseException as exc:  # the capture ends either way: the stream must not stay in it
            _end_failed_capture(graph, stream)
            if isinstance(exc, Exception):  # timed directly instead, which raises a real error again
                return None
            raise
        try:
            graph.capture_end()
        except RuntimeError:
            _end_failed_capture(None, stream)
            return None
    torch.cuda.current_stream().wait_stream(stream)
    return graph, events


def replay(captured: tuple, reps: int) -> list[float]:
    """At least `reps` timings in µs from replays of a captured chunk (`capture`): whole chunks,
    each one's repetitions all kept (they ran on the GPU either way)."""
    graph, events = captured
    samples: list[float] = []
    while len(samples) < reps:
        graph.replay()
        events[-1][1].synchronize()
        samples += [s.elapsed_time(e) * 1000.0 for s, e in events]
    return samples


def _end_failed_capture(graph, stream) -> None:
    """End a capture that failed (a call that synchronizes invalidates it), and mend what torch's
    `capture_end` leaves behind when it raises: the CUDA generator still counting its offsets for
    a graph, so that every later random tensor fails ("Offset increment outside graph capture").
    A capture of one tiny kernel, ended cleanly, ends the generator's capture too."""
    import torch

    _Graphs.spoiled = True
    if graph is not None:
        try:
            graph.capture_end()
        except RuntimeError:
            pass
    mend = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        try:
            mend.capture_begin(capture_error_mode="thread_local")
        except (RuntimeError, TypeError):
            return
        try:
            torch.cuda._sleep(1)
        finally:
            try:
                mend.capture_end()
            except RuntimeError:
                pass
    torch.cuda.current_stream().wait_stream(stream)
