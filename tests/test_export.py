"""Export and load on CPU: manifest round trip, hash checks, dispatch, the CPU implementation."""

import json

import pytest
import torch

import tuner
from tuner import search
from tuner.deploy import binaries
from tuner.deploy import export
from tuner.errors import TunerError
from tuner.families import giou

from test_search import REAL, _cfg
import references


@pytest.fixture
def artifact(tuner_home):
    report = search.run(_cfg(REAL, trials=25, sampler="random"))
    return export.export([report.study_name], tuner_home / "art"), report


def test_manifest_round_trip(artifact):
    out, report = artifact
    manifest = export.read(out)
    (entry,) = manifest["entries"]
    assert entry["variant"] == report.winner["variant"]
    assert entry["problem"]["pred"] == "bfloat16" and entry["problem"]["batch"] == 1024
    assert manifest["gpu"]["gpu_name"] == "NVIDIA H100 80GB HBM3" and manifest["arch"] == "sm_90"
    assert entry["timings_us"]["fwd"]["median_us"] > 0 and "spread_us" in entry["timings_us"]["bwd"]
    assert entry["verification"]["loss_error"] is not None
    assert entry["study"] == report.study_name
    assert (out / entry["source"]).read_text().startswith(f"// {entry['variant']}")


def test_edited_source_is_refused(artifact):
    out, _ = artifact
    src = out / export.read(out)["entries"][0]["source"]
    src.write_text(src.read_text().replace("1.f - (", "2.f - ("))
    with pytest.raises(TunerError, match="edited"):
        export.read(out)


def test_edited_manifest_is_refused(artifact):
    out, _ = artifact
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["entries"][0]["objective_us"] = 0.001
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TunerError, match="checksum"):
        export.read(out)


@pytest.mark.parametrize("forge, message", [
    (lambda m: m["entries"][0].pop("source"), "an entry's source None is not a file of the export"),
    (lambda m: m["entries"][0].update(source="/etc/hostname"), "'/etc/hostname' is not a file of the export"),
    (lambda m: m["entries"][0].update(source="../art/manifest.json"), "is not a file of the export"),
    (lambda m: m.pop("header_sha256"), "do not match the hash in manifest.json"),
    (lambda m: m.update(entries=[]), "its entries are not a list of tuned problems"),
])
def test_a_manifest_edited_and_its_checksum_made_again_is_refused_with_why(artifact, forge, message):
    """The checksum is no signature: a manifest edited and summed again still gets a clear refusal,
    never a KeyError, nor a source read from outside the export's folder."""
    out, _ = artifact
    manifest = json.loads((out / "manifest.json").read_text())
    forge(manifest)
    manifest["checksum"] = export.manifest_checksum(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TunerError, match=message):
        export.read(out)


def test_a_manifest_nested_past_python_s_stack_is_not_json(artifact):
    out, _ = artifact
    (out / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TunerError, match="is not valid JSON: nested too deeply"):
        export.read(out)


def test_load_names_what_is_wrong_with_its_arguments(tuner_home):
    with pytest.raises(TunerError, match="got gpu=3"):
        tuner.load(gpu=3)
    with pytest.raises(TunerError, match="family='nope': no such family; installed: .*giou"):
        tuner.load(gpu="H100", family="nope")


def test_a_study_without_a_re_timed_winner_is_exported_with_a_warning(artifact):
    """A search stopped before its finalists (Ctrl-C, a kill) leaves its best trial as the search
    timed it: exported, and said aloud, with what finishes it."""
    from tuner.store import study

    _, report = artifact
    st = study.load(report.study_name)
    st.set_user_attr("winner", None)
    with pytest.warns(UserWarning, match="has no re-timed winner .* run the same `tuner search` again"):
        (winner,), _ = export.winners_of([st])
    assert winner["retimed"] is False


def test_an_export_that_fails_leaves_nothing_and_keeps_the_one_before(artifact, monkeypatch):
    """Written beside its folder and moved in at the end: a compile that fails (or Ctrl-C) leaves
    no half-written export, and an earlier export in that folder stays whole."""
    out, report = artifact
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    winners, gpu = export.gather([report.study_name])

    def failing(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(binaries, "write", failing)
    for folder in (out, out.parent / "fresh"):
        with pytest.raises(KeyboardInterrupt):
            export.write(folder, winners, gpu, binaries=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["art", "studies"]  # no "fresh", no staging folder


def test_a_staging_folder_a_killed_export_left_is_removed_by_the_next(tmp_path):
    """SIGKILL runs no `finally`: the staging folder of a process of this host that is gone is
    removed by the next staging beside it; a live process's (another export running) is kept."""
    import re
    import subprocess
    import sys

    from tuner import owners, paths

    gone = subprocess.run([sys.executable, "-c", "from tuner import owners; print(owners.owner())"],
                          capture_output=True, text=True).stdout.strip()
    host = re.sub(r"[^A-Za-z0-9-]", "_", owners.host())
    dead = tmp_path / f".giou-H100.{host}.{'.'.join(gone.rsplit('/', 2)[1:])}.abc123"
    live = tmp_path / f".giou-H100.{host}.{'.'.join(owners.owner().rsplit('/', 2)[1:])}.def456"
    other = tmp_path / ".giou-H100.k2x9q"  # not named by a host and process: left alone
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "manifest.json").write_text("{}")
    with paths.staged(tmp_path / "giou-H100") as staging:
        (staging / "manifest.json").write_text("{}")
    assert not dead.exists() and live.exists() and other.exists()
    assert (tmp_path / "giou-H100" / "manifest.json").exists()


def test_export_best_refuses_an_unwritable_wheel_folder_before_compiling(artifact, monkeypatch):
    from tuner.deploy import best
    from tuner.store import study

    out, report = artifact
    monkeypatch.setattr(export, "write", lambda *a, **k: pytest.fail("wrote before the check"))
    blocker = out.parent / "a-file"
    blocker.write_text("")
    with pytest.raises(TunerError, match="--wheel .*a-file/w: cannot be written"):
        best.export_best("H100", [study.load(report.study_name)], out, wheel=blocker / "w")


def test_a_damaged_export_is_one_clear_error(artifact, tmp_path):
    """Damage a copy of an export each way a disk or a hand can: tuner.load says what is wrong, as
    the project's error, never a Python error of its reading (AttributeError, IsADirectoryError, ...)."""
    import shutil

    from tuner import runtime

    out, _ = artifact
    manifest = json.loads((out / export.MANIFEST).read_text())
    so = next(p.name for p in out.iterdir() if p.name.startswith("giou-unit-") or
              (p.suffix == ".so" and not p.name.startswith("tuner_")))
    source = manifest["entries"][0]["source"]

    def rewritten(**change):  # a manifest edited and its checksum made again to match
        edited = {**manifest, **change}
        edited["checksum"] = runtime.manifest_checksum(edited)
        return json.dumps(edited)

    damages = {
        "a list": lambda d: (d / export.MANIFEST).write_text("[1, 2]"),
        "null": lambda d: (d / export.MANIFEST).write_text("null"),
        "manifest a folder": lambda d: ((d / export.MANIFEST).unlink(), (d / export.MANIFEST).mkdir()),
        "a library a folder": lambda d: ((d / so).unlink(), (d / so).mkdir()),
        "a source a folder": lambda d: ((d / source).unlink(), (d / source).mkdir()),
        "a source not UTF-8": lambda d: (d / source).write_bytes(b"\xff\xfe" * 10),
        "entries null": lambda d: (d / export.MANIFEST).write_text(rewritten(entries=None)),
        "entries a word": lambda d: (d / export.MANIFEST).write_text(rewritten(entries="x")),
        "binaries a word": lambda d: (d / export.MANIFEST).write_text(rewritten(binaries="x")),
        "binaries without identity": lambda d: (d / export.MANIFEST).write_text(
            rewritten(binaries={k: v for k, v in manifest["binaries"].items() if k != "identity"})),
    }
    for what, damage in damages.items():
        copy = tmp_path / what.replace(" ", "-")
        shutil.copytree(out, copy)
        damage(copy)
        with pytest.raises(TunerError) as caught:
            tuner.load(copy)
        assert str(caught.value).strip() and "\n" not in str(caught.value).strip(), what
    (tmp_path / "a-file").write_text("")
    with pytest.raises(TunerError, match="is not a tuned export"):
        tuner.load(tmp_path / "a-file")


def test_not_an_artifact(tmp_path):
    with pytest.raises(TunerError, match="no manifest.json"):
        export.read(tmp_path)


def test_study_without_a_verified_trial_is_an_error(tuner_home, tmp_path):
    failing = tmp_path / "fail.jsonl"
    failing.write_text("".join(json.dumps({**r, "status": "fail", "reason": "wrong result"}) + "\n"
                               for r in map(json.loads, REAL.read_text().splitlines()[:40])))
    report = search.run(_cfg(failing, trials=5, sampler="random"))
    with pytest.raises(TunerError, match="no verified trial"):
        export.export([report.study_name], tmp_path / "out")


def _entry(pred, target, batch, slots, **params):
    base = {"boxes_per_thread": 2, "padding": "branch", "validation": "hoisted", "block_size": 256,
            "loads": "vector", "reduction": "atomic", "backward": "recompute", **params}
    v = giou.space(pred, target).variant(**base)
    return {"problem": {"pred": pred, "target": target, "batch": batch, "slots": slots}, "variant": v.name,
            "params": v.as_dict()}


def _bound(family: str, entries: list[dict]) -> list[dict]:
    from tuner import families

    return binaries.bound(families.get(family), families.part(family, "op").OP, entries)


def _serving(family: str, entries: list[dict]) -> dict[str, str]:
    from tuner import families

    return binaries.serving(families.get(family), families.part(family, "op").OP, entries)


def test_every_dtype_pair_is_bound():
    """Tuned pairs bind their winners; an untuned pair the nearest problem's parameters rendered for
    it, marked with the pair they were tuned for."""
    entries = [_entry("bfloat16", "uint8", 1024, 256, block_size=512),
               _entry("bfloat16", "uint8", 64, 256, block_size=128),
               _entry("float32", "float32", 1024, 256, block_size=64)]
    bound = _bound("giou", entries)
    pairs = {}
    for b in bound:
        pairs.setdefault((b["params"]["pred"], b["params"]["target"]), []).append(b)
    assert len(pairs) == 12
    assert [b["params"]["block_size"] for b in pairs[("bfloat16", "uint8")]] == [512, 128]
    assert [b["params"]["block_size"] for b in pairs[("float32", "float32")]] == [64]
    untuned = pairs[("float16", "uint8")]
    assert [b["params"]["block_size"] for b in untuned] == [512, 128, 64]
    assert [b["tuned_for"] for b in untuned] == ["bfloat16/uint8", "bfloat16/uint8", "float32/float32"]
    assert all(b["tuned_for"] == "" for b in pairs[("bfloat16", "uint8")])


def test_pairs_torch_does_not_fuse_are_bound_with_the_tuned_parameters():
    """RMSNorm: an untuned pair whose weight dtype differs from x's (torch's unfused path) binds the
    tuned parameters rendered for it, even where torch's fused op won the tuned problem; an untuned
    pair of one dtype stays torch's. Cross-entropy: torch's op is never fused, every pair is bound."""
    from tuner.families import cross_entropy, rms_norm

    def entry(space, problem, served="variant"):
        v = next(iter(space))
        return {"problem": problem, "variant": v.name, "params": v.as_dict(), "served_by": served}

    rms = [entry(rms_norm.space(), rms_norm.Problem().__dict__),
           entry(rms_norm.space(), {**rms_norm.Problem().__dict__, "rows": 64}, "torch")]
    bound = _bound("rms_norm", rms)
    pairs = {}
    for b in bound:
        pairs.setdefault((b["problem"]["x"], b["problem"]["weight"]), []).append(b)
    assert set(pairs) == {("bfloat16", "bfloat16")} | {(x, w) for x in rms_norm.DTYPES for w in rms_norm.DTYPES
                                                        if x != w}
    assert [b.get("served_by") for b in pairs[("bfloat16", "bfloat16")]] == [None, "torch"]
    for pair in (("float16", "float32"), ("bfloat16", "float32")):
        assert all(b["tuned_for"] == "bfloat16/bfloat16" and b["params"]["x"] == pair[0] for b in pairs[pair])
        assert len(pairs[pair]) == 2  # the problem torch's fused op won too: its unfused one would not
    ce = cross_entropy.space()
    bound = _bound("cross_entropy", [entry(ce, cross_entropy.Problem().__dict__)])
    assert sorted(b["params"]["logits"] for b in bound) == sorted(cross_entropy.DTYPES)
    # the manifest's words for it, per pair
    said = _serving("rms_norm", rms)
    assert said["bfloat16/bfloat16"] == ("variants within 4x of their tuned problems, torch's op farther; torch's op "
                                         "near 64 x 4096, where it was faster")
    assert said["bfloat16/float32"] == ("variants at every shape (torch's op is unfused here); parameters tuned for "
                                        "bfloat16/bfloat16")
    assert said["float16/float16"] == "torch's op (no variant was tuned for this pair)"
    assert set(_serving("cross_entropy", [entry(ce, cross_entropy.Problem().__dict__)]).values()) == {
        "variants at every shape (torch's op is unfused here)",
        "variants at every shape (torch's op is unfused here); parameters tuned for bfloat16"}


def test_a_joined_winner_is_exported_and_its_nearest_point_taken_by_halves(tmp_path):
    """A winner joining one variant's forward to another's backward (EmbeddingBag, bfloat16):
    its source holds both; the nearest point of another dtype pair is each half's, joined (what an
    untuned pair binds)."""
    from tuner.families import embedding_bag
    from tuner.variant import Variant

    by_name = embedding_bag.space("bfloat16").by_name()
    joined = Variant.joined(by_name["embedding_bag.bfloat16.int64.kernel.block.8.1.b256.direct.sorted"],
                            by_name["embedding_bag.bfloat16.int64.none.subwarp.split32.8.1.b128.shared.sorted"])
    problem = embedding_bag.Problem(weight="bfloat16").__dict__
    out = export.write(tmp_path / "eb", [{"variant": joined, "problem": problem}], {"arch": "sm_90"}, binaries=False)
    entry, = export.read(out)["entries"]
    assert entry["variant"] == joined.name and entry["params"] == joined.as_dict()
    source = (out / entry["source"]).read_text()
    assert source.count("embedding_bag.bfloat16.int64.kernel.block.8.1.b256.direct.sorted") >= 2
    bound = _bound("embedding_bag", [entry])
    # the modes no search tuned bind the tuned one's variant; an untuned pair its halves' nearest points, joined
    assert [(b["variant"], b["problem"]["mode"]) for b in bound if b["problem"]["weight"] == "bfloat16"
            and b["problem"]["index"] == "int64"] == [(joined.name, m) for m in ("sum", "mean", "max")]
    assert {b["variant"] for b in bound if b["problem"]["weight"] == "float32" and b["problem"]["index"] == "int64"} \
        == {binaries._nearest(embedding_bag.space("float32"), joined).name}
    # each half moved to its nearest valid point (float32: 8 elements per load is over 16 bytes there)
    assert binaries._nearest(embedding_bag.space("float32"), joined).name == (
        "embedding_bag.float32.int64.kernel.block.1.1.b256.direct."
        "sorted.bwd.float32.int64.none.subwarp.split32.1.1.b128.shared.sorted")


def test_a_rendering_for_an_untuned_pair_that_fails_to_build_is_left_to_torch_s_op(tmp_path, monkeypatch, capsys):
    """An export builds the tuned parameters rendered for EmbeddingBag's untuned pairs, which no
    search built: one that fails to compile leaves its pair's calls to torch's op (with a word why),
    not the whole export; a tuned winner that fails still fails the export."""
    from tuner.build import compile as build
    from tuner.build import render
    from tuner.families import embedding_bag

    def planted(variant, focus=None):  # 16-bit renderings do not compile
        text = render.render(variant, focus)
        return text + "\n#error planted\n" if ".float16." in variant.name else text

    monkeypatch.setattr(build, "render", planted)
    v = embedding_bag.space("float32", "int64").variant(validation="hoisted", mapping="warp", vec=4, unroll=2,
                                                        block_size=128, staging="direct", backward="atomic")
    problem = embedding_bag.Problem(rows=1000, dim=64, bags=32, bag_size=8).__dict__
    gpu = {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}
    out = export.write(tmp_path / "eb", [{"variant": v, "problem": problem}], gpu)
    bound = export.read(out)["binaries"]["bound"]
    assert "failed to build for sm_90: torch's op serves those calls" in capsys.readouterr().err
    half = [b for b in bound if b["problem"]["weight"] == "float16"]
    assert half and all(b.get("served_by") == "torch" and "library" not in b for b in half)
    assert all("library" in b for b in bound if b["problem"]["weight"] != "float16")
    serving = export.read(out)["serving"]  # the manifest's words say what was built
    assert serving["float16/int64"] == serving["float16/int32"] == \
        "torch's op (the parameters rendered for this pair failed to build)"
    assert serving["bfloat16/int64"].startswith("variants within 4x")
    with pytest.raises(TunerError, match="building embedding_bag.float16"):
        export.write(tmp_path / "eb16", [{"variant": embedding_bag.space("float16", "int64").variant(
            **{**v.as_dict(), "weight": "float16", "backward": "sorted"}), "problem": {**problem, "weight": "float16"}}], gpu)


def test_cpu_implementation_equals_the_reference(artifact):
    out, _ = artifact
    op = tuner.load(out)
    assert isinstance(op, torch._ops.OpOverloadPacket) and str(op) == "tuner.giou_loss"
    for reduction in ("mean", "sum", "none"):
        p, t, n = giou.make_inputs(6, 9, "float32", "uint8", "uniform")
        leaf = p.clone().requires_grad_(True)
        loss = op(leaf, t, n, reduction)
        want, want_grad = references.with_grad(giou, p, t, n, reduction)
        assert loss.dtype == torch.float32
        assert torch.allclose(loss.double(), want, rtol=1e-6, atol=1e-6)
        loss.backward(torch.ones_like(loss))
        assert torch.allclose(leaf.grad.double(), want_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bad,message", [
    (lambda p, t, n: (p[0], t[0], n), r"pred must have shape \[B, S, 4\]"),
    (lambda p, t, n: (p, t[:, :3], n), r"target must have shape \[4, 5, 4\] \(batch, slots, 4\), got \[4, 3, 4\]"),
    (lambda p, t, n: (p[..., :3], t[..., :3], n), r"pred must have shape \[B, S, 4\]"),
    (lambda p, t, n: (p, t, n.float()), "num_boxes must be an integer tensor, got torch.float32"),
    (lambda p, t, n: (p, t, n[:2]), r"num_boxes must have shape \[4\] \(batch\), got \[2\]"),
])
def test_bad_input_gets_a_clear_error(artifact, bad, message):
    out, _ = artifact
    op = tuner.load(out)
    p, t, n = giou.make_inputs(4, 5, "float32", "uint8")
    with pytest.raises((ValueError, TypeError), match=message):
        op(*bad(p, t, n))
    with pytest.raises(ValueError, match="reduction"):
        op(p, t, n, "max")
    assert torch.isfinite(op(p, t, n))  # the next valid call works


def test_load_without_a_path_or_gpu_is_an_error():
    with pytest.raises(TunerError, match="artifact folder or gpu"):
        tuner.load()


def test_cli_export_best(artifact, tuner_home):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "tuner", "export-best", "--gpu", "H100"], capture_output=True,
                       text=True, env={**__import__("os").environ, "TUNER_HOME": str(tuner_home)})
    assert r.returncode == 0, r.stderr
    assert "exported 1 tuned problem" in r.stdout
    assert (tuner_home / "exports" / "giou-H100" / "manifest.json").exists()
    r = subprocess.run([sys.executable, "-m", "tuner", "export-best", "--gpu", "L4"], capture_output=True,
                       text=True, env={**__import__("os").environ, "TUNER_HOME": str(tuner_home)})
    assert r.returncode == 1 and "no studies for L4" in r.stderr


@pytest.mark.parametrize("family, says", [
    ("giou", "other shapes and dtype pairs run the nearest tuned problem's parameters"),
    ("rms_norm", "dtype pairs and shapes far from every tuned problem are served by torch's op"),
    ("embedding_bag", "shapes far from every tuned problem of their dtype pair are served by torch's op; "
                      "untuned dtype pairs run the nearest tuned problem's parameters"),
    ("cross_entropy", "torch's op is unfused for every dtype pair")])
def test_export_best_says_what_serves_calls_near_no_tuned_problem(family, says):
    """GIoU's baseline serves only the problems where it won (no reach, untuned pairs bound to the
    nearest parameters); EmbeddingBag's far shapes too (its untuned pairs bound to the nearest
    parameters); RMSNorm's untuned pairs and far shapes, but its pairs torch does not fuse, and
    every cross-entropy pair, run variants."""
    from tuner import families
    from tuner.cli.studies import elsewhere

    said = elsewhere(families.part(family, "op").OP, [s.fixed for s in families.get(family).all_spaces()])
    assert said.startswith(says)
    assert ("bfloat16/float32" in said) == (family == "rms_norm")
