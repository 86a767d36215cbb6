"""The boundary between tuner's core and its families, held by a family that lives in tests/:
`scale_add` (out = alpha * x + y) goes through variants, build, a simulated search, export-best
and load without any edit to tuner. If core starts to assume something of GIoU, this fails."""

import json
from pathlib import Path

import pytest
import torch

from tuner import families
from tuner.cli import main as cli

HERE = Path(__file__).parent / "families"


@pytest.fixture
def scale_add(tuner_home):
    families.add_path(HERE)
    return families.get("scale_add")


def _records(path, fam, gpu_name="NVIDIA H100 80GB HBM3"):
    """A measurement log like a search's, one record per variant: faster with more work per thread."""
    space = fam.space()
    gpu = {"gpu_name": gpu_name, "arch": "sm_90", "torch": torch.__version__, "cuda": "13.0"}
    with open(path, "w") as f:
        for v in space:
            fwd = 10.0 / v["items"] + v["block_size"] / 1000
            f.write(json.dumps({
                "problem": fam.Problem().key(), "variant": v.name, "params": space.tuned(v), "gpu": gpu,
                "status": "ok", "compile_s": 1.0, "fwd": {"median_us": fwd, "spread_us": 0.1},
                "bwd": {"median_us": fwd, "spread_us": 0.1}, "loss_error": 0.0, "grad_error": 0.0,
                "regs_fwd": 10, "regs_bwd": 10, "spill_bytes": 0}) + "\n")
    return path


def test_a_family_outside_tuner_goes_end_to_end(scale_add, tuner_home, fresh_cache, capsys):
    import tuner

    assert "scale_add" in families.names()
    assert cli.main(["variants", "--family", "scale_add", "--arch", "sm_90", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["count"] == len(scale_add.space()) == 8  # 3 x 3 less the one over 512 per block

    assert cli.main(["build", "--family", "scale_add", "--arch", "sm_90", "--limit", "2", "--json"]) == 0
    built = json.loads(capsys.readouterr().out)["builds"]
    assert len(built) == 2 and all(b["ok"] for b in built)
    assert all(b["name"].startswith("scale_add.") for b in built)
    assert len(list((fresh_cache / "variants" / "sm_90").glob("scale_add-*.so"))) == 2

    log = _records(tuner_home / "scale_add.jsonl", scale_add)
    assert cli.main(["search", "--family", "scale_add", "--gpu", "H100", "--simulate", str(log),
                     "--sampler", "grid", "--trials", "8", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "study scale_add-H100-N1048576-fwd+bwd" in out

    assert cli.main(["export-best", "--family", "scale_add", "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert "\nn=1048576 alpha=-1.5: scale_add.b64.4 (fwd+bwd" in out  # its sizes and scalar, as listings describe them
    artifact = tuner_home / "exports" / "scale_add-H100"
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["family"] == "scale_add"
    assert manifest["entries"][0]["params"] == {"block_size": 64, "items": 4}  # the fastest recorded
    assert (artifact / "scale_add_abi.h").is_file()

    op = tuner.load(artifact)
    assert isinstance(op, torch._ops.OpOverloadPacket) and str(op) == "tuner.scale_add"
    assert tuner.load(gpu="H100", family="scale_add") is op
    x, y = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(op(x, y, 2.5), 2.5 * x + y)
    # its calls go to the binding's own entry, not through the packet's generic parsing; the
    # packet's parts are the op's (its schema, its overloads)
    from tuner import entries

    called, real = [], entries._entries["scale_add"]
    assert real is not torch.ops.tuner.scale_add
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(entries._entries, "scale_add", lambda *a, **k: called.append(1) or real(*a, **k))
        torch.testing.assert_close(op(x, y, alpha=2.5), 2.5 * x + y)
    assert called == [1] and op.default._schema == torch.ops.tuner.scale_add.default._schema
    # The op is native: schema, CUDA and Autograd kernels from the C++ rendered from the family's
    # declaration (on the core's tuner_op.h machinery), CPU and fake from the runtime.
    dump = torch._C._dispatch_dump("tuner::scale_add")
    kernels = {line.split(":")[0].strip(): line for line in dump.splitlines() if "registered at" in line}
    assert "scale_add_op.cpp" in kernels["CUDA"] and "scale_add_op.cpp" in kernels["Autograd[alias]"]
    assert "runtime.py" in kernels["CPU"]
    assert "registered at" in torch._C._dispatch_dump("tuner::scale_add_backward")
    x.requires_grad_(), y.requires_grad_()
    gx, gy = torch.autograd.grad(op(x, y, 2.5).sum(), (x, y))  # the backward op, on the CPU
    torch.testing.assert_close(gx, torch.full_like(x, 2.5))
    torch.testing.assert_close(gy, torch.ones_like(y))
    (gy,) = torch.autograd.grad(op(x.detach(), y, 2.5).sum(), (y,))  # x wants no gradient
    torch.testing.assert_close(gy, torch.ones_like(y))
    torch.library.opcheck(op, (x.detach(), y.detach(), 2.5))
    with pytest.raises(ValueError, match="scale_add: y must have x's shape"):
        op(x.detach(), torch.randn(999), 1.0)
    # outside the variants' float32: served by the baseline, torch's autograd and all
    xd, yd = x.detach().double().requires_grad_(), y.detach().double()
    torch.testing.assert_close(op(xd, yd, 3.0), 3.0 * xd + yd)
    (gx,) = torch.autograd.grad(op(xd, yd, 3.0).sum(), (xd,))
    torch.testing.assert_close(gx, torch.full_like(xd, 3.0))
    with pytest.raises(ValueError, match="scale_add: y must have x's shape"):  # shapes hold for torch's too
        op(xd, torch.randn(999, dtype=torch.float64), 1.0)


def test_a_family_leaves_its_file_names_to_convention(scale_add, tmp_path):
    """scale_add declares none of them: they follow from its name and the files it has."""
    assert (scale_add.TEMPLATE, scale_add.HEADERS, scale_add.ENTRY, scale_add.BINDING, scale_add.OPS_NAMESPACE,
            scale_add.FAULTS) == ("scale_add.cu.j2", ("scale_add_abi.h",), "tuner_scale_add_vtable", (),
                                  "tuner_scale_add", ())  # its op is declared: no C++ of its own
    assert families.get("giou").FAULTS[:2] == ("compile", "oob")  # what a family declares stands
    bare = families.conventions("bare", tmp_path)  # no ABI header, no op: no table, no binding
    assert bare["HEADERS"] == () and bare["ENTRY"] is None and bare["BINDING"] == ()


def test_an_unknown_family_is_named_with_the_known_ones(tuner_home, capsys):
    with pytest.raises(SystemExit):
        cli.main(["variants", "--family", "nope", "--arch", "sm_90"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_family_outside_tuner_runs_its_winner_on_the_gpu(scale_add, tuner_home):
    import tuner
    from tuner import gpus
    from tuner.deploy import export

    v = scale_add.space().variant(block_size=128, items=2)
    out = export.write(tuner_home / "artifact", [{"variant": v, "problem": scale_add.Problem(4096).__dict__}],
                       gpus.attached().describe())
    op = tuner.load(out)
    assert torch.ops.tuner_scale_add.served([100_003]) == v.name  # who serves a call of that size
    x, y = torch.randn(100_003, device="cuda"), torch.randn(100_003, device="cuda")
    torch.testing.assert_close(op(x, y, -1.5), -1.5 * x + y)
    x.requires_grad_()
    (gx,) = torch.autograd.grad(op(x, y, -1.5).sum(), (x,))
    torch.testing.assert_close(gx, torch.full_like(x, -1.5))
    torch.library.opcheck(op, (x.detach(), y, -1.5))


@pytest.mark.gpu
def test_a_declared_family_is_searched_on_the_gpu_with_no_evaluation_of_its_own(scale_add, tuner_home, capsys):
    """The worker checks each variant against the float64 reference and times it against the
    declared torch op, from the declaration alone (tuner/measure/declared.py)."""
    from tuner.cli import main as cli

    assert cli.main(["search", "--family", "scale_add", "--gpu", "auto", "--n", "100003", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "8 variants compiled, verified and timed or pruned" in out and "0 failed" in out, out


def test_every_family_in_the_tree_is_packaged():
    """A non-editable `pip install` ships only the packages pyproject.toml lists."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11 and later")

    from tuner import families

    root = Path(__file__).resolve().parent.parent
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    in_tree = [p.name for p in (root / "tuner" / "families").iterdir() if (p / "__init__.py").exists()]
    assert in_tree and all(f"tuner.families.{name}" in listed for name in in_tree), (in_tree, listed)
    assert set(in_tree) <= set(families.names())


@pytest.fixture
def bags_sum(tuner_home):
    families.add_path(HERE)
    return families.get("bags_sum")


@pytest.mark.gpu
def test_embedding_bag_s_declared_parts_run_through_the_rendered_op_and_a_search(bags_sum, tuner_home, capsys):
    """The rendered CUDA path of a declared op with per-entry weights that take a gradient where
    given (and the table's gradient after them where not), max mode's saved winners, an optional
    padding_idx in both passes, the memory each pass's variant asks of the call, the entries sorted
    for a backward that reads them so, and winners kept by mode, against float64; then a search that checks its variants from the declaration alone."""
    import tuner
    from tuner import gpus
    from tuner.deploy import export

    # the atomic backward tuned at max, the sorted one (the op sorts the entries first) at sum; the
    # search below checks all four variants at max
    v = bags_sum.space().variant(block_size=128, backward="atomic")
    at_sum = bags_sum.space().variant(block_size=64, backward="sorted")
    winners = [{"variant": v, "problem": bags_sum.Problem().__dict__},  # tuned at max
               {"variant": at_sum, "problem": bags_sum.Problem(mode="sum").__dict__}]
    op = tuner.load(export.write(tuner_home / "artifact", winners, gpus.attached().describe()))
    # A call's mode picks its winner: kind 1 (max) the one tuned at max, 0 (sum) the other.
    assert torch.ops.tuner_bags_sum.served([300, 9, 40, 500], 1) == v.name
    assert torch.ops.tuner_bags_sum.served([300, 9, 40, 500], 0) == at_sum.name
    indices, scale, weight = bags_sum.make_inputs(300, 9, 40, 500, seed=1)
    grad = torch.randn(300, 40, device="cuda")
    for mode in ("sum", "max"):
        for given in (None, scale):
            for pad in (None, -3, int(indices[0, 0])):
                for frozen in (False, True):
                    if frozen and given is None:
                        continue
                    w = weight.clone().requires_grad_(not frozen)
                    s = None if given is None else given.clone().requires_grad_()
                    got = op(indices, s, mode, w, pad)
                    w64 = weight.double().requires_grad_(not frozen)
                    s64 = None if given is None else given.double().requires_grad_()
                    want = bags_sum.reference(indices, s64, mode, w64, pad)
                    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5)
                    leaves = [x for x in (w, s) if x is not None and x.requires_grad]
                    leaves64 = [x for x in (w64, s64) if x is not None and x.requires_grad]
                    for a, b in zip(torch.autograd.grad(got, leaves, grad),
                                    torch.autograd.grad(want, leaves64, grad.double())):
                        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
    torch.library.opcheck(op, (indices, scale.requires_grad_(), "max", weight.requires_grad_(), -3))
    assert cli.main(["search", "--family", "bags_sum", "--gpu", "auto", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "4 variants compiled, verified and timed or pruned" in out and "0 failed" in out, out
