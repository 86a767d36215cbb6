"""A tuned op that travels: the export's wheel in a virtual environment that has torch and not
tuner, and `tuner.load` of the export in a fresh home and cache, both with stand-ins for nvcc,
the C++ compilers and ninja first on PATH that fail (and leave a mark) if anything runs them."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tuner import families, runtime
from tuner.cli import main as cli
from tuner.deploy import export
from tuner.deploy import wheel as wheels
from tuner.errors import TunerError
from tuner.families import embedding_bag as eb
from tuner.families import giou
from tuner.families import rms_norm

from test_search import REAL
import references

TOOLS = ("nvcc", "cc", "c++", "gcc", "g++", "ninja", "clang", "clang++")
GPU = {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}


@pytest.fixture(scope="module")
def giou_export(tmp_path_factory):
    """`tuner search --simulate` then `tuner export-best --gpu H100 --wheel DIR`, as a user runs them."""
    home = tmp_path_factory.mktemp("home")
    old = os.environ.get("TUNER_HOME")
    os.environ["TUNER_HOME"] = str(home)
    try:
        assert cli.main(["search", "--gpu", "H100", "--simulate", str(REAL), "--trials", "25", "--sampler",
                         "random", "--quiet"]) == 0
        assert cli.main(["export-best", "--gpu", "H100", "--wheel", str(home / "wheels")]) == 0
    finally:
        os.environ.pop("TUNER_HOME") if old is None else os.environ.__setitem__("TUNER_HOME", old)
    (whl,) = (home / "wheels").glob("tuned_giou_h100-*.whl")
    return home / "exports" / "giou-H100", whl


@pytest.fixture(scope="module")
def eb_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("eb")
    winners = [{"variant": eb.space("float32", "int64").variant(
        validation="hoisted", mapping="warp", vec=4, unroll=2, block_size=128, staging="direct", backward="atomic"),
        "problem": eb.Problem(rows=1000, dim=64, bags=32, bag_size=8).__dict__}]
    export.write(out / "export", winners, GPU)
    return out / "export", wheels.pack(out / "export", out / "wheels", export.read(out / "export"), gpu_label="H100")


@pytest.fixture(scope="module")
def rms_export(tmp_path_factory):
    """A declared op's export (RMSNorm: its C++ rendered from the declaration) and its wheel."""
    out = tmp_path_factory.mktemp("rms")
    winners = [{"variant": rms_norm.space("float32", "float32").variant(
        threads_per_row=32, block_size=128, vec=4, unroll=1, rstd="saved", grad_weight="atomic", bwd_blocks=8,
        walk="blocks"), "problem": rms_norm.Problem(rows=64, width=512, x="float32", weight="float32").__dict__}]
    export.write(out / "export", winners, GPU)
    return out / "export", wheels.pack(out / "export", out / "wheels", export.read(out / "export"), gpu_label="H100")


@pytest.fixture(scope="module")
def lce_export(tmp_path_factory):
    """An export whose variants link cuBLAS (linear cross-entropy's declared `libraries`) and its wheel."""
    from tuner.families import linear_cross_entropy as lce

    out = tmp_path_factory.mktemp("lce")
    winners = [{"variant": lce.space("float32").variant(chunk_rows=256, threads_per_row=256, vec=4, first_read="normal",
                                                        reread="in_order"),
                "problem": lce.Problem(tokens=512, width=64, vocab=1000, hidden="float32").__dict__}]
    export.write(out / "export", winners, GPU)
    return out / "export", wheels.pack(out / "export", out / "wheels", export.read(out / "export"), gpu_label="H100")


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    """A folder of stand-ins for every compiler tool; each appends its name to `ran` and fails."""
    folder = tmp_path_factory.mktemp("standins")
    mark = folder / "ran"
    for tool in TOOLS:
        path = folder / tool
        path.write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {mark}\nexit 1\n")
        path.chmod(0o755)
    return folder, mark


def _env(standins, **extra):
    folder, _ = standins
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "TUNER_HOME", "TUNER_CACHE",
                                                           "PYTHONPATH", "CXX", "CC")}
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A virtual environment with torch (this one's, through a .pth file) and not tuner."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    python = root / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "torch_from_host.pth").write_text(str(Path(torch.__file__).parent.parent) + "\n")
    return python


CHILD = r"""
import json, sys, time
t0 = time.time()
import torch
import {pkg} as tuned
ready = time.time() - t0
# what importing the wheel pulled in (torch's own opcheck and compile import jinja2 later)
heavy = sorted(m for m in ("tuner", "optuna", "pandas", "matplotlib", "jinja2") if m in sys.modules)
op = getattr(torch.ops.tuner, {op!r})
{calls}
torch.save(result, sys.argv[1])
heavy += sorted(m for m in ("tuner", "optuna", "pandas", "matplotlib") if m in sys.modules)
try:
    import tuner  # noqa: F401
    has_tuner = True
except ImportError:
    has_tuner = False
print(json.dumps({{"ready_s": ready, "heavy": heavy, "has_tuner": has_tuner, "file": tuned.__file__}}))
"""

GIOU_CALLS = r"""
g = torch.Generator().manual_seed(3)
from tuned_giou_h100.families.giou import spec
B, S = 6, 9
tgt = torch.randint(0, 200, (B, S, 2), generator=g).float()
tgt = torch.cat([tgt, tgt + torch.randint(1, 50, (B, S, 2), generator=g)], -1)
pred = (tgt + torch.randn(B, S, 4, generator=g) * 5).requires_grad_()
n = torch.randint(0, S + 1, (B,), generator=g)
loss = op(pred, tgt.to(torch.uint8), n, "mean")
loss.backward()
torch.library.opcheck(op.default, (pred.detach().requires_grad_(), tgt.to(torch.uint8), n, "sum", 1e-7))
try:
    n2 = n.clone(); n2[0] = S + 4
    op(pred, tgt.to(torch.uint8), n2)
    raised = None
except tuned.KernelInputError as exc:
    raised = str(exc)
result = {"pred": pred.detach(), "target": tgt.to(torch.uint8), "n": n, "loss": loss.detach(), "grad": pred.grad,
          "raised": raised}
"""

EB_CALLS = r"""
g = torch.Generator().manual_seed(4)
w = torch.randn(50, 16, generator=g).requires_grad_()
idx = torch.randint(0, 50, (40,), generator=g)
offs = torch.tensor([0, 5, 5, 17, 30])
out = op(w, idx, offs, "mean")
out.square().sum().backward()
torch.library.opcheck(op.default, (w.detach().requires_grad_(), idx, offs, "sum", None, False, None))
f_out = tuned.F_embedding_bag(idx, w.detach(), offs, mode="max")
result = {"w": w.detach(), "idx": idx, "offs": offs, "out": out.detach(), "grad": w.grad, "f_out": f_out}
"""

RMS_CALLS = r"""
g = torch.Generator().manual_seed(5)
x = torch.randn(2, 7, 64, generator=g).requires_grad_()
w = (1 + 0.1 * torch.randn(64, generator=g)).requires_grad_()
y = op(x, w, 1e-5)
y.square().sum().backward()
torch.library.opcheck(op.default, (x.detach().requires_grad_(), w.detach(), 1e-5))
no_weight = op(x.detach(), None, 1e-5)
result = {"x": x.detach(), "w": w.detach(), "y": y.detach(), "gx": x.grad, "gw": w.grad, "no_weight": no_weight}
"""


LCE_CALLS = r"""
g = torch.Generator().manual_seed(6)
h = torch.randn(9, 16, generator=g).requires_grad_()
w = (torch.randn(21, 16, generator=g) * 0.5).requires_grad_()
t = torch.randint(0, 21, (9,), generator=g)
t[2] = -100
loss = op(h, w, t, -100, 0.1, "mean")
loss.backward()
torch.library.opcheck(op.default, (h.detach().requires_grad_(), w.detach().requires_grad_(), t, -100, 0.0, "sum"))
result = {"h": h.detach(), "w": w.detach(), "t": t, "loss": loss.detach(), "gh": h.grad, "gw": w.grad}
"""


def _install_and_run(venv, whl, standins, tmp_path, pkg, op, calls):
    folder, mark = standins
    env = _env(standins)
    # This pip installs into the venv; the wheel's requirement (torch) must be met there, from no index.
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv), "install", "-q", "--no-index", str(whl)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(pkg=pkg, op=op, calls=calls))
    r = subprocess.run([str(venv), str(script), str(tmp_path / "out.pt")], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert not mark.exists(), f"a compiler tool ran: {mark.read_text()}"
    assert report["heavy"] == [] and not report["has_tuner"], report
    assert str(Path(report["file"]).parent.parent).startswith(str(venv.parent.parent))
    print(f"{pkg}: ready {report['ready_s']:.2f} s from `import torch`; wheel {whl.stat().st_size / 1e6:.2f} MB")
    return torch.load(tmp_path / "out.pt")


def test_giou_wheel_needs_torch_alone(giou_export, venv, standins, tmp_path):
    _, whl = giou_export
    got = _install_and_run(venv, whl, standins, tmp_path, "tuned_giou_h100", "giou_loss", GIOU_CALLS)
    loss, grad = references.with_grad(giou, got["pred"], got["target"], got["n"], "mean")
    assert torch.allclose(got["loss"].double(), loss, rtol=1e-5, atol=1e-6)
    assert torch.allclose(got["grad"].double(), grad, rtol=1e-4, atol=1e-6)
    assert got["raised"] and "num_boxes" in got["raised"]


def test_embedding_bag_wheel_needs_torch_alone(eb_export, venv, standins, tmp_path):
    _, whl = eb_export
    assert whl.name.startswith("tuned_embedding_bag_h100-")
    got = _install_and_run(venv, whl, standins, tmp_path, "tuned_embedding_bag_h100", "embedding_bag", EB_CALLS)
    want, _ = eb.reference(got["w"], got["idx"], got["offs"], "mean")
    assert torch.allclose(got["out"].double(), want, rtol=1e-5, atol=1e-6)
    grad, _ = references.embedding_bag_backward(got["w"], got["idx"], got["offs"], "mean", None, 2 * want)
    assert torch.allclose(got["grad"].double(), grad, rtol=1e-4, atol=1e-5)
    assert torch.allclose(got["f_out"].double(), eb.reference(got["w"], got["idx"], got["offs"], "max")[0])


def test_wheel_metadata(giou_export):
    import zipfile

    export_dir, whl = giou_export
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    torch_public = torch.__version__.split("+")[0]
    assert [line for line in meta.splitlines() if line.startswith("Requires-Dist")] == \
        [f"Requires-Dist: torch=={torch_public}"]
    manifest = export.read(export_dir)
    for name in [manifest["binaries"]["binding"]["file"], *manifest["binaries"]["libraries"], "manifest.json"]:
        assert f"tuned_giou_h100/export/{name}" in names
    assert "tuned_giou_h100/runtime.py" in names and "tuned_giou_h100/families/giou/op.py" in names
    assert not any(n.startswith("tuner/") for n in names)


LOAD = r"""
import sys, time
t0 = time.time()
import torch, tuner
op = tuner.load(sys.argv[1])
from tuner.families import giou
p, t, n = giou.make_inputs(4, 8, "float32", "uint8")
p.requires_grad_()
op(p, t, n).backward()
print(round(time.time() - t0, 2))
"""


def test_load_needs_no_toolchain_where_the_binaries_fit(giou_export, standins, tmp_path):
    export_dir, _ = giou_export
    folder, mark = standins
    env = _env(standins, TUNER_HOME=str(tmp_path / "home"), TUNER_CACHE=str(tmp_path / "cache"))
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-c", LOAD, str(export_dir)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    wall = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    assert not mark.exists(), f"a compiler tool ran: {mark.read_text()}"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "home").exists()  # nothing was built
    print(f"tuner.load + first call: {wall:.1f} s in a fresh process (inside: {r.stdout.strip()} s)")
    assert wall < 60  # the 10 s on an idle CI machine; this margin holds on 2 busy cores


def test_an_edited_binary_is_refused(giou_export, tmp_path):
    import shutil

    export_dir, _ = giou_export
    copy = tmp_path / "copy"
    shutil.copytree(export_dir, copy)
    lib = next(iter(export.read(copy)["binaries"]["libraries"]))
    data = bytearray((copy / lib).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / lib).write_bytes(bytes(data))
    with pytest.raises(TunerError, match="edited after export"):
        export.read(copy)
    with pytest.raises(RuntimeError, match="edited after export"):
        runtime.read_manifest(copy)


def test_another_setup_is_built_from_sources_or_refused_clearly(giou_export, standins, tmp_path, monkeypatch):
    """Where the identity differs: one warning and a build from sources with a toolchain; without
    one, an error naming what differs and the two ways out."""
    import tuner
    from tuner.deploy import load as deploy

    export_dir, _ = giou_export
    real = runtime.identity()
    monkeypatch.setattr(runtime, "identity", lambda: {**real, "torch": "9.9.9"})
    with pytest.warns(UserWarning, match=r"torch 9\.9\.9 here.*building it from its sources"):
        assert str(tuner.load(export_dir)) == "tuner.giou_loss"
    monkeypatch.setattr(deploy.binaries, "toolchain_missing", lambda: "no CUDA toolkit found")
    with pytest.raises(TunerError, match=r"torch 9\.9\.9 here, .* in the export.*Export it again.*install a CUDA"):
        tuner.load(export_dir)
    with pytest.raises(ImportError, match=r"torch 9\.9\.9 here.*Export it again"):
        runtime.load_export(export_dir, families.part("giou", "op").OP)


def test_binaries_of_an_older_op_protocol_are_not_bound(giou_export):
    """An export records the op protocol its binding speaks (templates/common/tuner_op.h's control
    ops); binaries of an older tuner, without it, count as another setup (built from sources)."""
    export_dir, _ = giou_export
    built = runtime.read_manifest(export_dir)["binaries"]["identity"]
    assert built["op_protocol"] == runtime.OP_PROTOCOL
    older = {k: v for k, v in built.items() if k != "op_protocol"}
    assert runtime.differences(older, None) == [f"op_protocol {runtime.OP_PROTOCOL} here, None in the export"]


def test_a_declared_op_s_wheel_needs_torch_alone(rms_export, venv, standins, tmp_path):
    """The wheel carries the declaration's Python side (declare.py, opspec.py): CPU kernels from
    the reference, gradients by autograd in float64, torch's op for a call without a weight."""
    _, whl = rms_export
    got = _install_and_run(venv, whl, standins, tmp_path, "tuned_rms_norm_h100", "rms_norm", RMS_CALLS)
    x64, w64 = got["x"].double().requires_grad_(), got["w"].double().requires_grad_()
    want = rms_norm.reference(x64, w64, 1e-5)
    gx, gw = torch.autograd.grad(want.square().sum(), (x64, w64))
    torch.testing.assert_close(got["y"].double(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["gx"].double(), gx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["gw"].double(), gw, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["no_weight"], torch.nn.functional.rms_norm(got["x"], (64,), None, 1e-5))


def test_a_wheel_whose_variants_link_cublas_needs_torch_alone(lce_export, venv, standins, tmp_path):
    """Linear cross-entropy's variants link the cuBLAS of the NVIDIA wheel torch runs on: its wheel
    installs and loads with torch alone (no toolkit, no compiler), and its CPU kernels are the float64
    reference's, both gradients by autograd."""
    _, whl = lce_export
    got = _install_and_run(venv, whl, standins, tmp_path, "tuned_linear_cross_entropy_h100", "linear_cross_entropy",
                           LCE_CALLS)
    h64, w64 = got["h"].double().requires_grad_(), got["w"].double().requires_grad_()
    want = torch.nn.functional.cross_entropy(h64 @ w64.T, got["t"], label_smoothing=0.1)
    gh, gw = torch.autograd.grad(want, (h64, w64))
    torch.testing.assert_close(got["loss"].double(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["gh"].double(), gh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got["gw"].double(), gw, rtol=1e-4, atol=1e-6)
