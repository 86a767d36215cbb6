"""`tuner export-best --wheel DIR`: an export as a pip-installable wheel that needs torch alone.

The wheel holds one package, `tuned_<family>_<gpu>` (PKG below):

    PKG/__init__.py                    importing it registers the family's op in torch.ops.tuner
    PKG/runtime.py, PKG/entries.py     copies of tuner/runtime.py and entries.py
    PKG/declare.py, PKG/opspec.py,     copies of tuner's: a declared op's Python side
    PKG/declare_terms.py, PKG/declare_check.py, PKG/expression.py
    PKG/families/<family>/op.py        copies of the family's op side (op.py, spec.py): the
    PKG/families/<family>/spec.py      CPU reference, fake, checks, how winners are staged
    PKG/export/                        the export as `export-best` wrote it (manifest, binaries,
                                       sources)

Its one requirement is the torch its binaries were built for (`torch==<version>`), and it is
tagged for the Python and platform they were built on. A wheel is a zip with a fixed layout
(PEP 427), written here directly.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path

from tuner import families
from tuner.version import __version__
from tuner.errors import TunerError

OP_FILES = ("op.py", "spec.py")  # a family's op side: torch alone (tuner/families/<name>/)
CORE_FILES = ("runtime.py", "entries.py", "declare.py", "declare_terms.py", "declare_check.py", "expression.py", "opspec.py")  # what op.py may import of tuner (torch alone)


def package_name(manifest: dict, gpu_label: str | None = None) -> str:
    """tuned_<family>_<gpu>, lower case, e.g. tuned_<family>_h100."""
    gpu = gpu_label or manifest["gpu"].get("gpu_name") or manifest.get("arch") or "gpu"
    return re.sub(r"[^a-z0-9]+", "_", f"tuned_{manifest['family']}_{gpu}".lower()).strip("_")


def pack(export_dir: Path, out_dir: Path, manifest: dict, name: str | None = None, gpu_label: str | None = None
         ) -> Path:
    """Write the wheel of an export into `out_dir` (its package `name`, by default
    tuned_<family>_<gpu_label>); returns its path. `manifest`: the export's (tuner.deploy.export.read
    gives it, its binaries checked; export-best hands down the one it has just written)."""
    export_dir = Path(export_dir)
    built = manifest.get("binaries")
    if not built:
        raise TunerError(f"{export_dir} holds no binaries (exported with sources only); export it again "
                         "without --sources-only to make a wheel")
    name = name or package_name(manifest, gpu_label)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise TunerError(f"{name!r} is not a Python package name")
    family = manifest["family"]
    identity = built["identity"]
    version = f"{__version__}+{manifest['checksum'][:12]}"
    torch_public = identity["torch"].split("+")[0]
    py = "cp" + identity["python"].replace(".", "")
    platform = identity["platform"].replace("-", "_").replace(".", "_")
    files: dict[str, bytes] = {
        f"{name}/__init__.py": _init(name, manifest).encode(),
        **{f"{name}/{f}": (Path(__file__).parent.parent / f).read_bytes() for f in CORE_FILES},
        f"{name}/families/__init__.py": b"",
        f"{name}/families/{family}/__init__.py": b"",
    }
    op_dir = Path(families.part(family, "op").__file__).parent
    for f in OP_FILES:
        files[f"{name}/families/{family}/{f}"] = (op_dir / f).read_bytes()
    for path in sorted(export_dir.iterdir()):
        if path.is_file():
            files[f"{name}/export/{path.name}"] = path.read_bytes()
    dist = f"{name}-{version}.dist-info"
    files[f"{dist}/METADATA"] = "\n".join([
        "Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
        f"Summary: {_summary(manifest)}", f"Requires-Python: =={identity['python']}.*",
        f"Requires-Dist: torch=={torch_public}", "", ""]).encode()
    files[f"{dist}/WHEEL"] = "\n".join([
        "Wheel-Version: 1.0", f"Generator: tuner {__version__}", "Root-Is-Purelib: false",
        f"Tag: {py}-{py}-{platform}", "", ""]).encode()
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()]
    files[f"{dist}/RECORD"] = ("\n".join(record + [f"{dist}/RECORD,,"]) + "\n").encode()

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{name}-{version}-{py}-{py}-{platform}.whl"
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))  # the same export, the same wheel
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    tmp.replace(wheel)
    return wheel


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _summary(manifest: dict) -> str:
    b = manifest["binaries"]["identity"]
    return (f"{manifest['family']} tuned by tuner for {manifest['gpu'].get('gpu_name')} ({manifest.get('arch')}), "
            f"built for torch {b['torch']} (CUDA {b['cuda']})")


def _init(name: str, manifest: dict) -> str:
    family = manifest["family"]
    op = families.part(family, "op").OP
    extras = "".join(f"{k} = _family.OP.extras[{k!r}]\n" for k in op.extras)
    return f'''"""{_summary(manifest)}.

Importing this package registers `torch.ops.tuner.{op.op}`: CUDA and Autograd kernels in C++
calling the tuned variants, the float64 reference on CPU, a fake implementation for
torch.compile. It needs torch alone; on a torch, CUDA, Python or GPU it was not built for,
the import fails and says what differs.
"""

from pathlib import Path as _Path

from . import runtime as _runtime
from .families.{family} import op as _family

KernelInputError = _runtime.KernelInputError
set_validate = _runtime.set_validate
check_errors = _runtime.check_errors
EXPORT = _Path(__file__).parent / "export"


def load(validate="async", baseline=True):
    """Bind the export's winners (again), e.g. with validate="sync"; returns the op. baseline=False:
    the nearest variant serves every call of a tuned dtype pair, even where torch's op was faster."""
    return _runtime.load_export(EXPORT, _family.OP, validate=validate, baseline=baseline)


{op.op} = load()
{extras}'''
