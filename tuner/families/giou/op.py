"""The GIoU family's op: an exported artifact's winners bound to `torch.ops.tuner.giou_loss`.

The op lives in C++ (templates/giou/giou_op.cpp, part of the binding built once per
torch/CUDA version), as pytorch/extension-cpp does it: its schema, its CUDA kernels,
its autograd (a `torch::autograd::Function` calling the backward kernel) and its
input checks, so that an eager call is one dispatcher hop and runs no Python:

    tuner::giou_loss(pred, target, num_boxes=None, reduction="mean", eps=1e-7) -> Tensor
        CUDA and Autograd kernels in C++; the Autograd kernel calls the two below
    tuner::giou_loss_forward(pred, target, num_boxes, reduction, eps) -> (loss, count, saved_grad)
    tuner::giou_loss_backward(grad, pred, target, num_boxes, count, saved_grad, reduction, eps) -> grad_pred

This module builds an artifact's variants for the attached GPU and binds them once
(each call then picks, in C++, the winner of its dtype pair nearest to its shape), and
registers what may stay in Python because it is off the CUDA path: the CPU
implementation (the float64 reference) and the fake implementation for torch.compile.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

from tuner import build, gpus
from tuner.errors import KernelInputError, TunerError
from tuner.families import giou
from tuner.variant import Variant

NAMESPACE = "tuner"
# How bad input found by a kernel reaches the host; the codes are the binding's.
VALIDATE = {"deferred": 0, "sync": 1, "async": 2}


@dataclass
class Entry:
    problem: dict
    variant: Variant
    source: str | None       # the artifact's source; None: rendered from the template
    tuned_for: str = ""      # set when the parameters were tuned for another dtype pair


class TunedGiou:
    """The winners of an artifact and what is bound for each dtype pair."""

    def __init__(self, directory: Path | None, manifest: dict | None, validate: str = "async",
                 fallback: str = "rebuild"):
        if validate not in VALIDATE:
            raise TunerError(f"validate must be one of {tuple(VALIDATE)}: 'async' raises on a later call without "
                             "syncing, 'sync' raises at once (a sync per call), 'deferred' at check_errors()")
        if fallback not in ("rebuild", "reference"):
            raise TunerError("fallback must be 'rebuild' or 'reference'")
        self.directory, self.manifest = directory, manifest
        self.validate = validate
        self.fallback = fallback
        self.entries: list[Entry] = []
        if manifest is not None:
            for e in manifest["entries"]:
                self.entries.append(Entry(e["problem"], Variant.of(giou.FAMILY, e["params"]),
                                          (Path(directory) / e["source"]).read_text()))
        self.kernels: list = []  # the loaded variants; the bound C tables point into them
        self.use_reference = False

    @functools.cached_property
    def bindings(self) -> dict[tuple[str, str], list[Entry]]:
        """Per dtype pair, the winners the op chooses from by shape, in order: the pair's tuned
        entries, or for an untuned pair every entry's parameters rendered for it."""
        out = {}
        for pred in giou.PRED_DTYPES:
            for target in giou.TARGET_DTYPES:
                same = [e for e in self.entries if (e.problem["pred"], e.problem["target"]) == (pred, target)]
                out[(pred, target)] = same or [
                    Entry(e.problem, giou.space(pred, target).nearest({d.name: e.variant[d.name] for d in giou.DIMS}),
                          None, f"{e.problem['pred']}/{e.problem['target']}")
                    for e in self.entries]
        return out

    def choose(self, pred_dtype: str, target_dtype: str, batch: int, slots: int) -> Entry:
        """The winner a call runs: nearest tuned shape in log distance, the first of equals
        (the rule templates/giou/giou_op.cpp applies per call)."""
        candidates = self.bindings[(pred_dtype, target_dtype)]
        if not candidates:
            raise TunerError("the artifact holds no tuned variant")

        def distance(e: Entry) -> float:
            p = e.problem
            return abs(math.log(max(batch, 1) / p["batch"])) + abs(math.log(max(slots, 1) / p["slots"]))

        return min(candidates, key=distance)

    def saves(self, pred_dtype: str, target_dtype: str) -> bool:
        """Whether the forward returns a saved gradient ([B, S, 4]) for this dtype pair: when any of
        its winners saves one (the C++ forward allocates by the same rule)."""
        return any(e.variant["backward"] == "fused" for e in self.bindings.get((pred_dtype, target_dtype), []))

    def bind(self, arch: str) -> None:
        """Build every bound variant for `arch` (one parallel batch, cached) and hand the C
        tables to the op."""
        from tuner import binding
        from tuner.families.giou.kernel import GiouKernel

        ops = binding.load("giou")
        if not self.use_reference:
            table = self.bindings
            unique = {e.variant.name: e for entries in table.values() for e in entries}
            sources = {name: e.source for name, e in unique.items() if e.source is not None}
            built = {b.variant.name: b for b in build.build([e.variant for e in unique.values()], arch,
                                                             sources=sources)}
            failed = [b for b in built.values() if not b.ok]
            if failed:
                raise TunerError(f"giou_loss: building {failed[0].variant.name} for {arch} failed:\n"
                                 f"{failed[0].error}")
            kernels = {name: GiouKernel(b.so, name, b.entry) for name, b in built.items()}
            for entries in table.values():
                for e in entries:
                    ops.stage(kernels[e.variant.name].address, e.problem["batch"], e.problem["slots"], e.tuned_for)
            self.kernels = list(kernels.values())
        ops.publish(self.use_reference)
        ops.set_check(VALIDATE[self.validate])


_state: TunedGiou | None = None


def load_op(directory: Path, manifest: dict, *, validate: str = "async", fallback: str = "rebuild"):
    """Bind a checked artifact of this family (see tuner.runtime.load) to `torch.ops.tuner.giou_loss`;
    returns the op.

    The artifact's variants are built for the attached GPU here (cached on disk), for every
    dtype pair: an untuned pair gets the nearest problem's parameters and a warning on first use.
    An artifact tuned for another architecture is rebuilt for the attached one, with a warning,
    or, with `fallback="reference"`, served by the float64 reference instead.

    Bad input that the kernel's validation finds (num_boxes outside [0, S], non-finite
    target boxes) raises KernelInputError: with validate="async" (default) on a later
    call, as soon as the kernel's flag has landed in host memory, without a sync or a
    copy; with "sync" in the call itself (a sync per call); with "deferred" at
    `tuner.check_errors()`. On CPU the reference checks the same things and raises at once.
    """
    global _state
    import torch

    state = TunedGiou(directory, manifest, validate, fallback)
    from tuner import binding

    binding.load("giou")  # defines the op and its C++ kernels
    _register_python()
    if torch.cuda.is_available():
        attached = gpus.attached()
        if manifest.get("arch") != attached.arch:
            tuned = f"{directory} was tuned for {manifest.get('arch')} ({manifest['gpu'].get('gpu_name')})"
            if fallback == "reference":
                state.use_reference = True
                warnings.warn(f"{tuned} but this GPU is {attached.name} ({attached.arch}): using the reference",
                              stacklevel=2)
            else:
                warnings.warn(f"{tuned} but this GPU is {attached.name} ({attached.arch}): building its variants "
                              f"for {attached.arch}; timings may differ, tune on this GPU for the best", stacklevel=2)
        state.bind(attached.arch)
    _state = state
    return torch.ops.tuner.giou_loss


def set_validate(mode: str) -> None:
    """Switch how kernel-found bad input is reported (see `load_op`) without loading again."""
    if _state is None:
        raise TunerError("no artifact is loaded; call tuner.load(...) first")
    if mode not in VALIDATE:
        raise TunerError(f"validate must be one of {tuple(VALIDATE)}")
    _state.validate = mode
    from tuner import binding

    binding.load("giou").set_check(VALIDATE[mode])


def check_errors() -> None:
    """Raise KernelInputError if an earlier call saw bad input not yet reported (syncs)."""
    import torch

    if _state is None or not torch.cuda.is_available():
        return
    from tuner import binding

    bits = int(binding.load("giou").take_errors())
    if bits:
        raise KernelInputError("giou_loss: invalid input in an earlier call: " +
                               binding.load("giou").describe_errors(bits))


# ----------------------------------------------- the Python side: CPU and fake

_registered = False
_LIBS: list = []  # keeps the torch.library.Library objects alive


def _check_inputs(pred, target, num_boxes) -> None:
    """The C++ kernels' checks and messages (templates/giou/giou_op.cpp), for the CPU and fake paths."""
    import torch

    if pred.dim() != 3 or pred.shape[-1] != 4:
        raise ValueError(f"giou_loss: pred must have shape [B, S, 4], got {list(pred.shape)}")
    if target.shape != pred.shape:
        raise ValueError(f"giou_loss: target {list(target.shape)} must have pred's shape {list(pred.shape)}")
    if str(pred.dtype).removeprefix("torch.") not in giou.PRED_DTYPES:
        raise TypeError(f"giou_loss: pred must be float32, float16 or bfloat16, got {pred.dtype}")
    if str(target.dtype).removeprefix("torch.") not in giou.TARGET_DTYPES:
        raise TypeError(f"giou_loss: target must be uint8, float16, bfloat16 or float32, got {target.dtype}")
    if target.device != pred.device:
        raise ValueError(f"giou_loss: pred is on {pred.device} but target is on {target.device}")
    if num_boxes is not None:
        if num_boxes.device != pred.device:
            raise ValueError(f"giou_loss: num_boxes is on {num_boxes.device} but pred is on {pred.device}")
        if num_boxes.dtype.is_floating_point or num_boxes.dtype == torch.bool or num_boxes.is_complex():
            raise TypeError(f"giou_loss: num_boxes must be an integer tensor, got {num_boxes.dtype}")
        if num_boxes.dim() != 1 or num_boxes.shape[0] != pred.shape[0]:
            raise ValueError(f"giou_loss: num_boxes must have shape [B] = [{pred.shape[0]}], "
                             f"got {list(num_boxes.shape)}")


def _check_values(target, num_boxes) -> None:
    """What a validating kernel reports, checked at once on CPU (where it costs no sync)."""
    import torch

    S = target.shape[1]
    if num_boxes is not None and num_boxes.numel() and bool(((num_boxes < 0) | (num_boxes > S)).any()):
        raise KernelInputError("giou_loss: invalid input: num_boxes has a value outside [0, S]")
    if target.dtype.is_floating_point:
        valid = giou.valid_mask(target, num_boxes)
        if bool((~torch.isfinite(target).all(-1) & valid).any()):
            raise KernelInputError("giou_loss: invalid input: a valid target box has a non-finite coordinate")


def _saved_shape(pred, target) -> tuple:
    pair = (str(pred.dtype).removeprefix("torch."), str(target.dtype).removeprefix("torch."))
    if _state is None or not _state.saves(*pair):
        return (0,)
    return (pred.shape[0], pred.shape[1], 4)


def _forward_cpu(pred, target, num_boxes, reduction: int, eps: float):
    import torch

    _check_inputs(pred, target, num_boxes)
    _check_values(target, num_boxes)
    loss = giou.reference(pred, target, num_boxes, giou.REDUCTIONS[reduction], eps).to(torch.float32)
    count = giou.valid_mask(target, num_boxes).sum().to(torch.float32)
    # The reference recomputes in backward; a saved gradient is only shaped like the kernel's.
    return loss, count, torch.zeros(_saved_shape(pred, target), dtype=torch.float32, device=pred.device)


def _loss_cpu(pred, target, num_boxes=None, reduction="mean", eps=giou.DEFAULT_EPS):
    return _forward_cpu(pred, target, num_boxes, _reduction_code(reduction), eps)[0]


def _backward_cpu(grad, pred, target, num_boxes, count, saved, reduction: int, eps: float):
    _, g = giou.reference_with_grad(pred, target, num_boxes, giou.REDUCTIONS[reduction], eps, grad_out=grad)
    return g.to(pred.dtype).contiguous()


def _reduction_code(reduction: str) -> int:
    if reduction not in giou.REDUCTIONS:
        raise ValueError(f"giou_loss: reduction must be one of {giou.REDUCTIONS}, got {reduction!r}")
    return giou.REDUCTIONS.index(reduction)


def _forward_fake(pred, target, num_boxes, reduction: int, eps: float):
    import torch

    _check_inputs(pred, target, num_boxes)
    B, S = pred.shape[0], pred.shape[1]
    f32 = torch.float32
    loss = pred.new_empty((B, S) if reduction == 0 else (), dtype=f32)
    return loss, pred.new_empty((), dtype=f32), pred.new_empty(_saved_shape(pred, target), dtype=f32)


def _loss_fake(pred, target, num_boxes=None, reduction="mean", eps=giou.DEFAULT_EPS):
    return _forward_fake(pred, target, num_boxes, _reduction_code(reduction), eps)[0]


def _register_python() -> None:
    """CPU and fake implementations of the C++-defined ops, once per process."""
    global _registered
    if _registered:
        return
    import torch

    lib = torch.library.Library(NAMESPACE, "IMPL")
    _LIBS.append(lib)
    ops = {"giou_loss": (_loss_cpu, _loss_fake),
           "giou_loss_forward": (_forward_cpu, _forward_fake),
           "giou_loss_backward": (_backward_cpu, lambda grad, pred, *rest: pred.new_empty(pred.shape))}
    for name, (cpu, fake) in ops.items():
        qualified = f"{NAMESPACE}::{name}"
        torch.library.impl(qualified, "CPU", lib=lib)(cpu)
        torch.library.register_fake(qualified, lib=lib)(fake)
    _registered = True
