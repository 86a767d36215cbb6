"""Load an exported artifact and serve `torch.ops.tuner.giou_loss` from it.

Following pytorch/extension-cpp: the op has a schema, a CUDA implementation that
launches on the current stream, a CPU implementation (the reference, so the same
code runs on CPU), a fake implementation for torch.compile, and autograd through
the hand-written backward kernel. Three ops are defined:

    tuner::giou_loss(pred, target, num_boxes=None, reduction="mean", eps=1e-7) -> Tensor
        what users call; composite: it calls giou_loss_forward and returns the loss
    tuner::giou_loss_forward(...) -> (loss, count, saved_grad)     autograd lives here
    tuner::giou_loss_backward(grad, pred, target, num_boxes, count, saved_grad, ...) -> grad_pred
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from tuner import build, gpus
from tuner import export as artifacts
from tuner.errors import KernelInputError, TunerError
from tuner.families import giou
from tuner.render import header_text
from tuner.variant import Variant

NAMESPACE = "tuner"
VALIDATE = ("async", "sync", "deferred")
_RED = {name: i for i, name in enumerate(giou.REDUCTIONS)}


@dataclass
class Entry:
    problem: dict
    variant: Variant
    source: str


class TunedGiou:
    """The winners of an artifact, built for the attached GPU, dispatched by dtype pair and shape."""

    def __init__(self, directory: Path | None, manifest: dict | None, validate: str = "async",
                 fallback: str = "rebuild"):
        if validate not in VALIDATE:
            raise TunerError(f"validate must be one of {VALIDATE}: 'async' raises on a later call without "
                             "syncing, 'sync' raises at once (a sync per call), 'deferred' at check_errors()")
        if fallback not in ("rebuild", "reference"):
            raise TunerError("fallback must be 'rebuild' or 'reference'")
        self.directory, self.manifest = directory, manifest
        self.validate = validate
        self.fallback = fallback
        self.entries = []
        if manifest is not None:
            for e in manifest["entries"]:
                self.entries.append(Entry(e["problem"], Variant.of(giou.FAMILY, e["params"]),
                                          (Path(directory) / e["source"]).read_text()))
        self._kernels: dict[tuple, object] = {}
        self._lock = threading.Lock()
        self.use_reference = False
        self.arch: str | None = None
        self.warned: set[str] = set()

    # ------------------------------------------------------------ dispatch

    def choose(self, pred_dtype: str, target_dtype: str, batch: int, slots: int) -> tuple[Variant, str | None]:
        """The tuned variant for a problem: same dtype pair and the nearest shape (log distance);
        for an untuned dtype pair, the nearest problem's parameters rendered for this pair."""
        if not self.entries:
            raise TunerError("the artifact holds no tuned variant")

        def distance(e: Entry) -> float:
            p = e.problem
            return abs(math.log(max(batch, 1) / p["batch"])) + abs(math.log(max(slots, 1) / p["slots"]))

        same = [e for e in self.entries if (e.problem["pred"], e.problem["target"]) == (pred_dtype, target_dtype)]
        if same:
            best = min(same, key=distance)
            return best.variant, best.source
        best = min(self.entries, key=distance)
        key = f"{pred_dtype}/{target_dtype}"
        if key not in self.warned:
            self.warned.add(key)
            warnings.warn(f"giou_loss: no variant was tuned for pred {pred_dtype} and target {target_dtype}; "
                          f"using the parameters tuned for {best.problem['pred']}/{best.problem['target']}",
                          stacklevel=4)
        variant = giou.space(pred_dtype, target_dtype).nearest(
            {d.name: best.variant[d.name] for d in giou.DIMS})
        return variant, None

    def kernel(self, pred, target):
        """The compiled kernel for these inputs (built on first use, then cached on disk)."""
        from tuner.kernel import GiouKernel

        pred_dtype = str(pred.dtype).removeprefix("torch.")
        target_dtype = str(target.dtype).removeprefix("torch.")
        variant, source = self.choose(pred_dtype, target_dtype, pred.shape[0], pred.shape[1])
        key = (variant.name, pred.device.index)
        k = self._kernels.get(key)
        if k is not None:
            return k
        with self._lock:
            if key in self._kernels:
                return self._kernels[key]
            arch = gpus.attached(pred.device.index or 0).arch
            sources = {variant.name: source} if source is not None else None
            (b,) = build.build([variant], arch, sources=sources)
            if not b.ok:
                raise TunerError(f"giou_loss: building {variant.name} for {arch} failed:\n{b.error}")
            k = GiouKernel(b.so, variant.name)
            self._kernels[key] = k
            return k


_state: TunedGiou | None = None


def load(directory: str | Path | None = None, *, gpu: str | None = None, validate: str = "async",
         fallback: str = "rebuild"):
    """Load a tuned artifact and register `torch.ops.tuner.giou_loss`; returns the op.

    `load("DIR")` loads an exported folder; `load(gpu="auto")` (or `gpu="H100"`) finds
    the default export of that GPU under $TUNER_HOME/exports. An artifact tuned for
    another architecture is rebuilt for the attached one, with a warning, or, with
    `fallback="reference"`, served by the float64 reference instead.

    Bad input that the kernel's validation finds (num_boxes outside [0, S], non-finite
    target boxes) raises KernelInputError: with validate="async" (default) on a later
    call, as soon as a copy of the error word has landed, without ever syncing; with
    "sync" in the call itself (a sync per call); with "deferred" at `tuner.check_errors()`.
    """
    global _state
    if directory is None:
        if gpu is None:
            raise TunerError("tuner.load needs an artifact folder or gpu=... (e.g. gpu='auto')")
        label = gpu
        if gpu.lower() == "auto":
            label = gpus.short_name(gpus.attached())
        directory = artifacts.default_dir(label)
    directory = Path(directory)
    manifest = artifacts.read(directory)
    if manifest["header_sha256"] != artifacts.sha256(header_text(giou.FAMILY)):
        raise TunerError(f"{directory} was exported by a tuner with another kernel ABI; export it again")
    state = TunedGiou(directory, manifest, validate, fallback)
    import torch

    if torch.cuda.is_available():
        attached = gpus.attached()
        if manifest.get("arch") != attached.arch:
            if fallback == "reference":
                state.use_reference = True
                warnings.warn(f"{directory} was tuned for {manifest.get('arch')} ({manifest['gpu'].get('gpu_name')}) "
                              f"but this GPU is {attached.name} ({attached.arch}): using the reference", stacklevel=2)
            else:
                warnings.warn(f"{directory} was tuned for {manifest.get('arch')} ({manifest['gpu'].get('gpu_name')}) "
                              f"but this GPU is {attached.name} ({attached.arch}): building its variants for "
                              f"{attached.arch}; timings may differ, tune on this GPU for the best", stacklevel=2)
    _state = state
    _register()
    return torch.ops.tuner.giou_loss


def check_errors() -> None:
    """Raise KernelInputError if an earlier call saw bad input not yet reported (syncs)."""
    import torch

    if _state is None or not torch.cuda.is_available():
        return
    from tuner import binding

    bits = int(binding.load().take_errors())
    if bits:
        raise KernelInputError("giou_loss: invalid input in an earlier call: " +
                               binding.load().describe_errors(bits))


# --------------------------------------------------------------- the ops

_registered = False


def _check_inputs(pred, target, num_boxes, reduction: int) -> None:
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
        if num_boxes.shape != (pred.shape[0],):
            raise ValueError(f"giou_loss: num_boxes must have shape [B] = [{pred.shape[0]}], "
                             f"got {list(num_boxes.shape)}")
    if reduction not in (0, 1, 2):
        raise ValueError(f"giou_loss: reduction must be one of {giou.REDUCTIONS}")


def _forward_cuda(pred, target, num_boxes, reduction: int, eps: float):
    import torch

    _check_inputs(pred, target, num_boxes, reduction)
    if _state is None:
        raise TunerError("giou_loss: no artifact is loaded; call tuner.load(...) first")
    if _state.use_reference:
        return _forward_cpu(pred, target, num_boxes, reduction, eps)
    kernel = _state.kernel(pred, target)
    saved = pred.new_empty(_saved_shape(pred, target), dtype=torch.float32)
    check = _state.validate
    if check == "sync" and torch.cuda.is_current_stream_capturing():
        check = "deferred"  # a sync cannot be captured
    loss, count, saved = kernel.forward(pred, target, num_boxes, giou.REDUCTIONS[reduction], eps,
                                        check=check, saved_grad=saved)
    return loss, count, saved


def _saved_shape(pred, target) -> tuple:
    """[B, S, 4] when the variant these inputs dispatch to saves its gradient in the forward, else
    [0]; the fake implementation asks the same question, so shapes agree under torch.compile."""
    if _state is None or _state.use_reference or not _state.entries:
        return (0,)
    variant, _ = _state.choose(str(pred.dtype).removeprefix("torch."), str(target.dtype).removeprefix("torch."),
                               pred.shape[0], pred.shape[1])
    return (pred.shape[0], pred.shape[1], 4) if variant["backward"] == "fused" else (0,)


def _forward_cpu(pred, target, num_boxes, reduction: int, eps: float):
    import torch

    _check_inputs(pred, target, num_boxes, reduction)
    loss = giou.reference(pred, target, num_boxes, giou.REDUCTIONS[reduction], eps).to(torch.float32)
    count = giou.valid_mask(target, num_boxes).sum().to(torch.float32)
    # The reference recomputes in backward; a saved gradient is only shaped like the kernel's.
    return loss, count, torch.zeros(_saved_shape(pred, target), dtype=torch.float32, device=pred.device)


def _forward_fake(pred, target, num_boxes, reduction: int, eps: float):
    B, S = pred.shape[0], pred.shape[1]
    loss = pred.new_empty((B, S) if reduction == 0 else (), dtype=_f32())
    return loss, pred.new_empty((), dtype=_f32()), pred.new_empty(_saved_shape(pred, target), dtype=_f32())


def _f32():
    import torch

    return torch.float32


def _backward_cuda(grad, pred, target, num_boxes, count, saved, reduction: int, eps: float):
    if _state is None or _state.use_reference:
        return _backward_cpu(grad, pred, target, num_boxes, count, saved, reduction, eps)
    kernel = _state.kernel(pred, target)
    return kernel.backward(grad, pred, target, num_boxes, count, saved, giou.REDUCTIONS[reduction], eps)


def _backward_cpu(grad, pred, target, num_boxes, count, saved, reduction: int, eps: float):
    _, g = giou.reference_with_grad(pred, target, num_boxes, giou.REDUCTIONS[reduction], eps, grad_out=grad)
    return g.to(pred.dtype)


def _register() -> None:
    global _registered
    if _registered:
        return
    import torch

    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    _LIBS.append(lib)
    lib.define("giou_loss_forward(Tensor pred, Tensor target, Tensor? num_boxes, int reduction, float eps) "
               "-> (Tensor, Tensor, Tensor)")
    lib.define("giou_loss_backward(Tensor grad, Tensor pred, Tensor target, Tensor? num_boxes, Tensor count, "
               "Tensor saved_grad, int reduction, float eps) -> Tensor")
    lib.define("giou_loss(Tensor pred, Tensor target, Tensor? num_boxes=None, str reduction=\"mean\", "
               "float eps=1e-07) -> Tensor")
    fwd, bwd = f"{NAMESPACE}::giou_loss_forward", f"{NAMESPACE}::giou_loss_backward"
    torch.library.impl(fwd, "CUDA", lib=lib)(_forward_cuda)
    torch.library.impl(fwd, "CPU", lib=lib)(_forward_cpu)
    torch.library.register_fake(fwd, lib=lib)(_forward_fake)
    torch.library.impl(bwd, "CUDA", lib=lib)(_backward_cuda)
    torch.library.impl(bwd, "CPU", lib=lib)(_backward_cpu)
    torch.library.register_fake(bwd, lib=lib)(lambda grad, pred, *rest: torch.empty_like(pred))

    def setup_context(ctx, inputs, output):
        pred, target, num_boxes, reduction, eps = inputs
        _, count, saved = output
        ctx.save_for_backward(pred, target, num_boxes, count, saved)
        ctx.reduction, ctx.eps = reduction, eps
        ctx.mark_non_differentiable(count, saved)

    def backward(ctx, grad_loss, _grad_count, _grad_saved):
        pred, target, num_boxes, count, saved = ctx.saved_tensors
        grad = torch.ops.tuner.giou_loss_backward(grad_loss.to(torch.float32).contiguous(), pred, target,
                                                  num_boxes, count, saved, ctx.reduction, ctx.eps)
        return grad, None, None, None, None

    torch.library.register_autograd(fwd, backward, setup_context=setup_context, lib=lib)

    def giou_loss(pred, target, num_boxes=None, reduction="mean", eps=1e-7):
        if reduction not in _RED:
            raise ValueError(f"giou_loss: reduction must be one of {giou.REDUCTIONS}, got {reduction!r}")
        if num_boxes is not None and num_boxes.dtype in (torch.int8, torch.uint8, torch.int16, torch.int32):
            num_boxes = num_boxes.to(torch.int64)  # other dtypes reach the checks and get a clear error
        return torch.ops.tuner.giou_loss_forward(pred, target, num_boxes, _RED[reduction], eps)[0]

    torch.library.impl(f"{NAMESPACE}::giou_loss", "CompositeImplicitAutograd", lib=lib)(giou_loss)
    _registered = True


_LIBS: list = []  # keeps the torch.library.Library objects alive
