"""The torch binding of the GIoU family: built once per torch/CUDA version with cpp_extension."""

from __future__ import annotations

import functools
import hashlib
import os

from tuner import paths, toolkit
from tuner.build import torch_version
from tuner.families import giou
from tuner.render import header_text, templates_dir


def _key() -> str:
    import torch

    source = "".join((templates_dir(giou.FAMILY) / f).read_text() for f in giou.BINDING + giou.BINDING_HEADERS)
    source += header_text(giou.FAMILY)
    h = hashlib.sha256(f"{source}\0{torch_version()}\0{torch.version.cuda}\0{toolkit.nvcc_version()}".encode())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def load(verbose: bool = False):
    """Build (first time only) and load the binding; returns `torch.ops.tuner_giou`.

    Loading it also defines `tuner::giou_loss` and its CUDA and Autograd kernels.

    The build includes torch/extension.h and so takes about a minute; it is shared
    by every variant and cached under variants/_binding/<hash>/.
    """
    import torch

    key = _key()
    name = f"tuner_giou_binding_{key}"
    build_dir = paths.variants_dir() / "_binding" / key
    built = build_dir / f"{name}.so"
    if built.exists():  # built before: load it without asking ninja (keeps a cached start under 2 s)
        torch.ops.load_library(str(built))
        return torch.ops.tuner_giou

    toolkit.export_cuda_home()
    if not torch.cuda.is_available():
        # The binding holds no device code, but cpp_extension insists on an arch
        # list when it cannot read one off a GPU (e.g. building on a CPU machine).
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = str(toolkit.cuda_home())  # in case it was imported before we set it
    build_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=name,
        sources=[str(templates_dir(giou.FAMILY) / f) for f in giou.BINDING],
        extra_include_paths=[str(templates_dir(giou.FAMILY))],
        extra_cflags=["-O2"],
        build_directory=str(build_dir),
        with_cuda=True,
        is_python_module=False,
        verbose=verbose,
    )
    return torch.ops.tuner_giou
