"""The problems a real training run asks of the tuned families, recorded while it runs.

    import tuner
    with tuner.capture("shapes.json") as cap:   # no change to the model's code
        for _ in range(3):
            train_step()
    cap.problems                                # what the file holds, with each problem's share

A search tunes a problem (a family's `Problem`: sizes and dtypes); which problems matter is what
the training run calls, how often and for how long. While the block runs, a TorchFunctionMode sees
every torch function call of this thread and passes it through unchanged. The calls a family
replaces are read from its declaration (`tuner::rms_norm`, the tuned op; the torch function its
`functional` stands in for, through its op.py's `served`: `declared_calls`), or named in its
`tuner/families/<name>/capture.py`: `CALLS` maps a qualified name (`torch.nn.functional.cross_entropy`
for linear cross-entropy, which reads the LM head from the logits' autograd graph) to
`problem_of(args, kwargs)`, the Problem's fields, or None for a call outside what the family tunes.
Per problem the file holds its calls and their total time.

Custom ops reach the mode: in this torch a call of `torch.ops.<ns>.<op>` (the packet or an
overload) goes through torch function handling, so the tuned ops are recorded as
`<ns>::<op>`. A plain Python function that does not call `handle_torch_function` is invisible as
itself (only the torch calls inside it are seen): torchvision's generalized_box_iou_loss is one.
Calls inside a torch.compile'd model are not recorded (none were, in this torch): capture with
the model eager. Only the thread that entered the block is seen.

The time is the forward call's alone (the backward's kernels are launched by autograd, not through
torch functions): on CUDA a pair of CUDA events around the call, read once they have completed (no
sync per call; one at the end), on CPU time.perf_counter. Calls inside a CUDA graph capture are
counted with no time (events cannot be timed there). Where the GPU waits for the host (short
kernels), the events measure the host's launch of the call rather than the kernel, and the mode
adds a few microseconds of host time to every torch call: use the times to rank problems, not as
a benchmark (tuner bench times kernels).

The file is written at the end of the block, also when the block raises (the calls so far; the
exception goes on), through a temporary file and a rename, so it is whole or not there. Its folder
is checked on entry, so a bad path fails before training, not after. Reading the file back
(`tuner.deploy.captured.read`) needs no torch.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from tuner import families
from tuner.deploy.captured import FORMAT, with_shares, write_json
from tuner.errors import ProblemError, SpaceError, TunerError
from tuner.version import __version__

DRAIN_AT = 1024  # CUDA event pairs waiting before the completed ones are read (keeps long runs small)


def dtype_of(tensor: torch.Tensor) -> str:
    """A tensor's dtype as problems name it ('bfloat16', 'int64')."""
    return str(tensor.dtype).removeprefix("torch.")


def qualified_name(func: Any) -> str:
    """What CALLS names a call by: 'tuner::rms_norm' for a custom op called through its packet
    or an overload, '<module>.<qualname>' for anything else ('torch.nn.functional.rms_norm')."""
    if isinstance(func, torch._ops.OpOverload):
        return func._schema.name
    if isinstance(func, torch._ops.OpOverloadPacket):
        return func._qualified_op_name
    return f"{getattr(func, '__module__', None)}.{getattr(func, '__qualname__', None)}"


def _mappings() -> dict[str, list[tuple[str, Callable]]]:
    """Qualified name -> (family, problem_of) of every installed family: its capture.py's CALLS,
    and a declared op's own calls (`tuner::<op>`, read by its declaration)."""
    calls: dict[str, list[tuple[str, Callable]]] = {}
    for name in families.names():
        found = dict(declared_calls(name))
        try:
            found.update(families.part(name, "capture").CALLS)
        except SpaceError:  # the family has no capture.py: it replaces no torch function
            pass
        for op, problem_of in found.items():
            calls.setdefault(op, []).append((name, problem_of))
    return calls


def declared_calls(family: str) -> dict[str, Callable]:
    """`tuner::<op>` -> problem_of, for a family that declares its op: the call's problem
    (tuner.opspec.problem) as the family's Problem names it (a tensor's dtype field by its
    `dtype_fields` name), the fields that only shape its inputs at their defaults, as the family's
    `captured(problem)` has it where it has one (None: not a problem to tune). And where the op
    declares the torch function it stands in for (its `functional`) and its op.py says which of those
    calls it takes (`served(*args, **kwargs)`: the op's arguments, or None), that function's
    calls (`torch.nn.functional.<name>`) by the same problem."""
    import dataclasses

    from tuner import opspec

    fam = families.get(family)
    op = getattr(fam, "OP_DECLARATION", None)
    if op is None:
        return {}
    fields, renamed = {f.name: f.default for f in dataclasses.fields(fam.Problem)}, getattr(fam.Problem, "dtype_fields", {})
    captured = getattr(fam, "captured", lambda problem: problem)  # the family's word on a call's problem

    def problem_of(args, kwargs) -> dict | None:
        found = opspec.problem(op, opspec.bind(op, args, kwargs), fields)
        if found is None:
            return None
        found = {renamed.get(k, k): v for k, v in found.items()}
        return captured({n: found.get(n, default) for n, default in fields.items()})

    calls = {f"tuner::{op.name}": problem_of}
    served = getattr(families.part(family, "op"), "served", None) if op.functional is not None else None
    if served is not None:
        def functional_problem(args, kwargs) -> dict | None:
            call = served(*args, **kwargs)
            return None if call is None else problem_of(call, {})

        calls[f"torch.nn.functional.{op.functional.signature.split('(', 1)[0]}"] = functional_problem
    return calls


class Capture(TorchFunctionMode):
    """The mode; `tuner.capture(path)` makes one. See the module's docstring."""

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self.path = Path(path)
        self._calls: dict[str, list[tuple[str, Callable]]] = {}
        self._found: dict[tuple, dict] = {}  # (family, problem's items) -> its entry in the file
        self._pending: deque = deque()  # (entries, start, end, device) of CUDA calls not read yet

    def __enter__(self) -> Capture:
        folder = self.path.parent
        if not folder.is_dir():
            raise TunerError(f"capture file {self.path}: folder {folder} does not exist")
        if self.path.is_dir() or not os.access(folder, os.W_OK):
            raise TunerError(f"capture file {self.path} cannot be written")
        self._calls, self._found, self._pending = _mappings(), {}, deque()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)  # off the mode stack first: nothing below is seen
        try:
            self._read_events(wait=True)
        finally:  # a GPU that failed in the block fails its sync too: the counts are written still
            write_json(self.path, {"format": FORMAT, "tuner": __version__, "torch": torch.__version__,
                                    "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                                    "problems": self._sorted()})

    @property
    def problems(self) -> list[dict]:
        """The problems so far, as `read` returns them (CUDA times complete after the block)."""
        return with_shares(self._sorted())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = qualified_name(func)
        if name not in self._calls:
            return func(*args, **kwargs)
        # Our own reads of shapes and devices stay out of every mode and subclass (this one is
        # off the stack while its __torch_function__ runs; DisableTorchFunction hides them from
        # the modes below too), so a mode beside this one sees the run as it is without it.
        with torch._C.DisableTorchFunction():
            device = next((a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
            on_gpu = device is not None and device.type == "cuda"
            events = None  # on a GPU under graph capture: counted, not timed
            if on_gpu and not torch.cuda.is_current_stream_capturing():
                stream = torch.cuda.current_stream(device)
                events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                events[0].record(stream)
            began = time.perf_counter()
        result = func(*args, **kwargs)
        with torch._C.DisableTorchFunction():
            took_us = (time.perf_counter() - began) * 1e6
            if events:
                events[1].record(stream)
            entries = self._record(name, args, kwargs)
            if entries and events:
                self._pending.append((entries, *events, device))
                if len(self._pending) >= DRAIN_AT:
                    self._read_events(wait=False)
            elif not on_gpu:
                for entry in entries:
                    entry["time_us"] += took_us
        return result

    def _record(self, name: str, args: tuple, kwargs: dict) -> list[dict]:
        """Count the call for each family that tunes it; their entries, to add its time to."""
        entries = []
        for family, problem_of in self._calls[name]:
            problem = problem_of(args, kwargs)
            if problem is None:
                continue
            ident = (family, tuple(problem.items()))
            entry = self._found.get(ident)
            if entry is None:
                try:
                    key = families.get(family).Problem(**problem).key()
                except ProblemError:  # a call no search could tune (a table of 2**31 rows): the user's call goes on
                    continue
                entry = self._found[ident] = {"family": family, "problem": problem, "key": key,
                                              "calls": 0, "time_us": 0.0, "ops": {}}
            entry["calls"] += 1
            entry["ops"][name] = entry["ops"].get(name, 0) + 1
            entries.append(entry)
        return entries

    def _read_events(self, wait: bool) -> None:
        """Add the times of CUDA calls whose events completed (all of them, after one synchronize
        per device, when `wait`)."""
        if wait:
            for device in {d for *_, d in self._pending}:
                torch.cuda.synchronize(device)
        while self._pending and (wait or self._pending[0][2].query()):
            entries, start, end, _ = self._pending.popleft()
            for entry in entries:
                entry["time_us"] += start.elapsed_time(end) * 1e3

    def _sorted(self) -> list[dict]:
        rows = [{**e, "time_us": round(e["time_us"], 3), "ops": dict(e["ops"])} for e in self._found.values()]
        return sorted(rows, key=lambda e: (-e["time_us"], -e["calls"], e["family"], e["key"]))
