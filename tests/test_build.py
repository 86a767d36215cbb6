"""Compiling variants with nvcc: runs on any machine with the CUDA toolkit, no GPU needed."""

import json
import os
import re
import stat

import pytest

from tuner.build import compile as build
from tuner.build import units
from tuner.build import render
from tuner.build import toolkit
from tuner.errors import BuildError
from tuner import families
from tuner.families import giou


def test_every_variant_renders_with_its_own_source():
    sources = {}
    for space in giou.all_spaces():
        for v in space:
            src = render.render(v)
            assert v.name in src
            sources[v.name] = hash(src)
    assert len(set(sources.values())) == len(sources)  # no two variants render alike


# Every value of every dimension for the H100; for the L4 (sm_89) a few of them: GIoU's template has no
# code of its own for an architecture, so another one differs in ptxas alone (a minute of the CI's cores).
@pytest.mark.parametrize("arch,count", [("sm_89", 4), ("sm_90", None)])
def test_covering_set_compiles_and_is_never_rebuilt(arch, count, tuner_home, fresh_cache):
    cover = giou.covering_set()[:count]
    first = build.build(cover, arch)
    failed = [f"{b.variant.name}: {b.error}" for b in first if not b.ok]
    assert not failed, "\n".join(failed)
    assert not any(b.cached for b in first)
    for b in first:
        assert b.so.exists() and b.registers.get("forward_mean", 0) > 0 and b.registers.get("backward_mean", 0) > 0
        assert b.compile_s > 0
        meta = json.loads(b.file(".json").read_text())
        assert meta["name"] == b.variant.name and meta["arch"] == arch
        assert b.file(".cu").read_text() == render.render(b.variant)
    second = build.build(cover, arch)
    assert all(b.cached and b.ok for b in second)
    assert [b.key for b in second] == [b.key for b in first]


def test_kernel_validation_placement_changes_the_code(tuner_home, fresh_cache):
    base = giou.space().variant(boxes_per_thread=4, padding="branch", validation="none", block_size=256,
                                loads="vector", reduction="atomic", backward="recompute")
    placements = [base.replace(validation=v) for v in ("none", "inline", "hoisted", "kernel")]
    results = build.build(placements, "sm_90")
    assert all(b.ok for b in results)
    assert "validate" in results[3].registers  # its own launch
    assert len({b.key for b in results}) == 4


def test_compile_error_is_data_naming_the_variant(tuner_home, fresh_cache, monkeypatch):
    v = giou.covering_set()[0]
    monkeypatch.setattr(build, "render", lambda variant, focus=None: render.render(variant, focus) + "\nthis is not C++;\n")
    (b,) = build.build([v], "sm_90")
    assert not b.ok and b.so is None
    assert "error" in b.error and "this is not C++" in b.error
    # The failure is remembered: the same source is not compiled again.
    (again,) = build.build([v], "sm_90")
    assert again.cached and not again.ok


def test_template_error_names_the_variant(monkeypatch):
    v = giou.covering_set()[0]
    monkeypatch.setattr(giou, "render_context", lambda variant: {}, raising=False)
    with pytest.raises(BuildError, match=v.name.replace(".", r"\.")):
        render.render(v)
    (b,) = build.build([v], "sm_90")
    assert not b.ok and "template" in b.error


def test_content_key_covers_arch_and_source():
    v = giou.covering_set()[0]
    src = render.render(v)
    assert build.content_key(v, src, "sm_89") != build.content_key(v, src, "sm_90")
    assert build.content_key(v, src + " ", "sm_90") != build.content_key(v, src, "sm_90")
    # a search's builds leave the host code unoptimized, an export's optimize it: two binaries
    assert build.content_key(v, src, "sm_90", serving=True) != build.content_key(v, src, "sm_90")
    assert build.flags("sm_90")[0] == "-O0" and build.flags("sm_90", serving=True)[0] == "-O3"


def test_an_export_builds_its_binaries_with_optimized_host_code(monkeypatch, tmp_path):
    """The launchers of an export's variants are on the op's call path (a search's are timed on the
    GPU alone): binaries.build_variants asks for them optimized."""
    from tuner.deploy import binaries

    asked = {}

    def fake_build(variants, arch, **kwargs):
        asked.update(kwargs)
        return [build.Build(v, arch, "k", ok=True, so=tmp_path / "v.so") for v in variants]

    monkeypatch.setattr(build, "build", fake_build)
    v = giou.covering_set()[0]
    binaries.build_variants(families.get("giou"), [{"variant": v.name, "params": v.as_dict()}], "sm_90")
    assert asked["serving"] is True


PTXAS = """\
ptxas info    : Compiling entry function '_ZN12_GLOBAL__N_119giou_forward_kernelILi1EEEv13TunerGiouArgs' for 'sm_90'
ptxas info    : Function properties for _ZN12_GLOBAL__N_119giou_forward_kernelILi1EEEv13TunerGiouArgs
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 33 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_ZN12_GLOBAL__N_120giou_backward_kernelILi1EEEv21TunerGiouBackwardArgs' for 'sm_90'
ptxas info    : Function properties for _ZN12_GLOBAL__N_120giou_backward_kernelILi1EEEv21TunerGiouBackwardArgs
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""


def test_parse_ptxas():
    info = build.parse_ptxas(PTXAS, giou.KERNEL_ARGS)
    assert info["registers"] == {"forward_mean": 40, "backward_mean": 32}
    assert build.parse_ptxas(PTXAS)["registers"] == {"forward_1": 40, "backward_1": 32}  # a family without names
    assert info["spill_bytes"] == 8 and info["smem_bytes"] == 33 and info["stack_bytes"] == 8


def test_toolkit_found_through_a_wrapper_script(tmp_path, monkeypatch):
    real = toolkit.cuda_home()
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real}/bin/nvcc "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    toolkit.cuda_home.cache_clear()
    try:
        assert toolkit.cuda_home() == real
        assert (toolkit.cuda_home() / "include" / "cuda_runtime.h").exists()
    finally:
        toolkit.cuda_home.cache_clear()


def test_cuda_home_is_honoured(monkeypatch):
    real = toolkit.cuda_home()
    monkeypatch.setenv("CUDA_HOME", str(real))
    toolkit.cuda_home.cache_clear()
    try:
        assert toolkit.cuda_home() == real
    finally:
        toolkit.cuda_home.cache_clear()


def test_device_assert_variants_compile(tuner_home, fresh_cache):
    base = giou.covering_set()[2]
    v = giou.space(base["pred"], base["target"], device_assert=True).variant(
        **{d.name: base[d.name] for d in giou.DIMS})
    assert v.name.endswith(".device_assert")
    assert "assert(bad == 0" in render.render(v) and "assert(" not in render.render(base)
    (b,) = build.build([v], "sm_90")
    assert b.ok, b.error


def test_cli_build_failure_names_the_variant_and_exits_non_zero(tuner_home, fresh_cache, monkeypatch, capsys):
    from tuner.cli import main as cli

    monkeypatch.setattr(build, "render", lambda variant, focus=None: render.render(variant, focus) + "\n#error planted\n")
    assert cli.main(["build", "--gpu", "L4", "--limit", "1"]) == 1
    err = capsys.readouterr().err
    assert "FAILED giou.bfloat16.uint8." in err and "#error planted" in err
    assert "1 failed" in err


def test_cli_variants_json_count(capsys):
    from tuner.cli import main as cli

    assert cli.main(["variants", "--gpu", "L4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["arch"] == "sm_89" and data["count"] == 1136 == len(data["variants"])
    assert cli.main(["variants", "--gpu", "V1000"]) == 2  # a usage error (docs/cli.md)
    assert "unknown GPU 'V1000'" in capsys.readouterr().err


def test_cli_variants_honours_limit_in_json_and_shows_values_as_they_are(capsys):
    from tuner.cli import main as cli

    assert cli.main(["variants", "--gpu", "H100", "--json", "--limit", "5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["count"] == 1136 and len(data["variants"]) == 5
    assert cli.main(["variants", "--family", "embedding_bag", "--gpu", "H100", "--limit", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, rows = lines[1].split(), [line.split() for line in lines[2:]]
    split = [row[header.index("split")] for row in rows]
    assert set(split) == {"off", "32", "64"}  # no NaN for "off", no 32.0 for 32
    assert "NaN" not in "\n".join(lines) and ".0 " not in "\n".join(lines)


def test_batch_folders_of_killed_builds_are_removed(tuner_home, fresh_cache):
    import time

    out = build.arch_dir("sm_90")
    old, young = out / ".batch-old", out / ".batch-young"
    for d in (old, young):
        d.mkdir(parents=True)
    past = time.time() - build.STALE_BATCH_S - 60
    os.utime(old, (past, past))
    build.build([], "sm_90")
    assert not old.exists() and young.exists()


def test_a_unit_of_several_variants_gives_each_the_code_it_gets_alone(tuner_home, fresh_cache, tmp_path):
    import ctypes

    cover = giou.covering_set()[:4]
    together = build.build(cover, "sm_90", jobs=1)
    assert {b.unit_size for b in together} == {4} and len({b.so for b in together}) == 1
    alone = build.build(cover, "sm_90", jobs=len(cover), root=tmp_path)  # a core each: a unit each
    assert {b.unit_size for b in alone} == {1}
    for t, a in zip(together, alone):
        assert t.key == a.key and t.registers == a.registers and t.spill_bytes == a.spill_bytes
        assert t.smem_bytes == a.smem_bytes and t.registers.get("forward_mean")
        assert b"tuner_giou_vtable_" + t.key.encode() in t.so.read_bytes()
        assert a.entry is None and t.entry == f"tuner_giou_vtable_{t.key}"
        assert "tuner_variant_" not in a.file(".log").read_text()
        assert t.file(".log").read_text().count("Compiling entry function") == sum(
            1 for k in a.registers if k.startswith(("forward", "backward", "validate")))
    # each variant's table is found in the unit's library (dlopen needs no GPU)
    lib = ctypes.CDLL(str(together[0].so))
    assert all(getattr(lib, b.entry) for b in together)
    # cached per variant, with the unit's library
    again = build.build(cover, "sm_90", jobs=1)
    assert all(b.cached and b.so == together[0].so and b.entry == t.entry for b, t in zip(again, together))


def _plant_an_error(monkeypatch, bad: str) -> None:
    """The variant named `bad` renders with an #error: its unit fails to compile."""
    def planted(variant, focus=None):
        return render.render(variant, focus) + ("\n#error planted\n" if variant.name == bad else "")

    monkeypatch.setattr(build, "render", planted)


def test_a_bad_variant_in_a_unit_costs_its_neighbours_a_retry_not_their_result(tuner_home, fresh_cache, monkeypatch):
    cover = giou.covering_set()[:3]
    _plant_an_error(monkeypatch, cover[1].name)
    results = build.build(cover, "sm_90", jobs=1)
    assert [b.ok for b in results] == [True, False, True]
    assert "#error planted" in results[1].error and results[1].unit_size == 1
    assert results[0].unit_size == results[2].unit_size == 1 and results[0].so != results[2].so


def test_unit_source_keeps_variants_apart():
    a = '#include <stdint.h>\n#include "x.h"\n#define WIDTH 4\nextern "C" int tuner_t_vtable();\n'
    b = '#include <stdint.h>\nint f();\n'
    text = units.unit_source([("k1", a), ("k2", b)], "tuner_t_vtable")
    assert text.splitlines().count("#include <stdint.h>") == 1 and text.index('#include "x.h"') < text.index("namespace tuner_variant")
    assert "namespace tuner_variant_k1 {" in text and "namespace tuner_variant_k2 {" in text
    assert "#define tuner_t_vtable tuner_t_vtable_k1" in text
    # a macro of the first variant is gone before the second
    assert text.index("#undef WIDTH") < text.index("namespace tuner_variant_k2")


def test_units_are_spread_over_the_cores():
    first = giou.covering_set()[0]
    todo = {f"k{i}": (first, "") for i in range(40)}
    assert [len(u) for u in units.plan_units(todo, 16)] == [3] * 13 + [1]
    assert [len(u) for u in units.plan_units(todo, 2)] == [16, 16, 8]
    assert [len(u) for u in units.plan_units(dict(list(todo.items())[:3]), 16)] == [1, 1, 1]


def test_staggered_units_grow_so_that_they_end_one_after_another():
    first = giou.covering_set()[0]
    todo = {f"k{i}": (first, "") for i in range(128)}
    sizes = [len(u) for u in units.plan_units(todo, 16, staggered=True)]
    assert sum(sizes) == 128 and len(sizes) == 16 and sizes == sorted(sizes)
    assert sizes[0] <= 4 and sizes[-1] >= 12 and max(sizes) <= units.MAX_PER_UNIT
    assert [len(u) for u in units.plan_units(todo, 16)] == [8] * 16  # even, where nothing waits on a unit
    for n, jobs in ((168, 16), (200, 16), (64, 16), (8, 2)):  # a spread kept within MAX_PER_UNIT and 2
        got = units.staggered_sizes(n, jobs)
        assert sum(got) == n and len(got) == jobs and min(got) >= 2 and max(got) <= units.MAX_PER_UNIT, got
    assert units.staggered_sizes(32, 16) is None and units.staggered_sizes(600, 16) is None  # no room: even


def test_each_unit_is_handed_on_as_soon_as_it_is_built(tuner_home, fresh_cache, monkeypatch):
    cover = giou.covering_set()[:5]
    _plant_an_error(monkeypatch, cover[4].name)
    handed: list[list] = []
    results = build.build(cover, "sm_90", jobs=2, on_ready=lambda builds: handed.append(builds))
    assert [len(u) for u in handed] == [3]  # units of 3 and 2: the second failed, and is not handed on
    assert all(b.ok for b in handed[0]) and [b.variant.name for b in handed[0]] == [v.name for v in cover[:3]]
    assert [b.ok for b in results] == [True, True, True, True, False]  # its good variant built again alone
    assert [b.key for b in results[:3]] == [b.key for b in handed[0]] and results[0].so == handed[0][0].so


def test_the_cached_builds_are_handed_on_before_the_rest_compile(tuner_home, fresh_cache):
    """A later search's batch is mostly built already: the GPU takes those while the new ones
    compile, not once the batch's last unit has ended."""
    cover = giou.covering_set()[:4]
    build.build(cover[:2], "sm_90", jobs=1)
    handed: list[list] = []
    results = build.build(cover, "sm_90", jobs=2, on_ready=lambda builds: handed.append(builds))
    assert [[b.variant.name for b in h] for h in handed][0] == [v.name for v in cover[:2]]
    assert all(b.cached for b in handed[0]) and not any(b.cached for h in handed[1:] for b in h)
    assert sorted(b.variant.name for h in handed for b in h) == sorted(v.name for v in cover)
    assert [b.cached for b in results] == [True, True, False, False]
    handed.clear()
    build.build(cover, "sm_90", jobs=2, on_ready=lambda builds: handed.append(builds))
    assert handed == []  # all cached: the result is the whole answer, as before


def test_a_search_compiles_only_the_kernels_its_problem_runs(tuner_home, fresh_cache):
    """A GIoU search renders its problem's reduction alone: a third of the kernels, each the
    same code as in the full variant, which an export builds. They are cached apart."""
    from tuner.families import embedding_bag

    v = giou.covering_set()[0]
    full, focused = (build.build([v], "sm_90", jobs=1, focus=f)[0]
                     for f in (None, giou.search_focus(giou.Problem().__dict__)))
    assert full.ok and focused.ok and full.key != focused.key
    assert set(full.registers) == {f"{k}_{r}" for k in ("forward", "backward") for r in ("none", "mean", "sum")}
    assert focused.registers == {k: full.registers[k] for k in ("forward_mean", "backward_mean")}
    source = render.render(v, {"only": "sum"})
    assert "giou_forward_kernel<RED_SUM>" in source and "giou_forward_kernel<RED_MEAN>" not in source

    # EmbeddingBag's search builds its mode's forward alone; its finalists are built whole
    v = embedding_bag.covering_set()[0]
    focus = embedding_bag.search_focus(embedding_bag.Problem(mode="max").__dict__)
    assert focus == {"only": "max"} and embedding_bag.FINALISTS_WHOLE
    focused = render.render(v, focus)
    assert "embedding_bag_forward_kernel<TUNER_EB_MAX>" in focused
    assert "embedding_bag_forward_kernel<TUNER_EB_SUM>" not in focused
    assert all(f"embedding_bag_forward_kernel<TUNER_EB_{m}>" in render.render(v) for m in ("SUM", "MEAN", "MAX"))


@pytest.mark.parametrize("family, size, widths", [
    ("rms_norm", "width", (4096, 4097, 64, 1 << 16)), ("cross_entropy", "vocab", (32000, 32001, 7, 128256))])
def test_a_norm_or_loss_search_builds_the_kernels_its_size_runs(family, size, widths, tuner_home, fresh_cache):
    """RMSNorm's and cross-entropy's searches build the kernels of their problem's width (vocabulary)
    alone: one vector width and tail, one row walk or backward; a variant built that way names 3
    kernels, and refuses a call at another width (the GPU tests call it); the finalists are built
    whole and checked at the odd sizes too (`FINALISTS_WHOLE`, the check's odd sizes off for a search)."""
    from tuner.measure import declared

    module = families.get(family)
    assert module.FINALISTS_WHOLE and module.FOCUS_RUNS_ODD_SIZES is False
    space = list(module.space_for(module.Problem().__dict__))
    variants = [space[i * len(space) // 6] for i in range(6)]
    for width in widths:
        focus = module.search_focus({**module.Problem().__dict__, size: width})
        for v in variants:
            source = render.render(v, focus)
            assert "cudaErrorNotSupported" in source
            whole = render.render(v)
            assert source != whole
    built = build.build(variants[:2], "sm_90", jobs=1, focus=module.search_focus(module.Problem().__dict__))
    assert all(b.ok and len(b.registers) == 3 for b in built), [b.registers for b in built]

    # a search's check runs the problem's sizes alone; a finalist's (whole), the odd sizes too
    ev = declared.Evaluation(family)
    seen: list = []
    ev.cases.get = lambda key, make: key
    ev.run_case = lambda kernel, case: (seen.append(dict(case)), ({"loss_error": 0.0, "grad_error": 0.0}, ""))[1]
    problem = module.Problem().__dict__
    for whole in (False, True):
        seen.clear()
        assert ev.check(None, problem, whole=whole)["ok"]
        assert len(seen) == (1 + len(module.ODD_SIZES) if whole else 1)
        assert seen[0][size] == problem[size]


def test_a_joined_variant_takes_its_forward_and_its_backward_from_two_variants(tuner_home, fresh_cache):
    """EmbeddingBag's joined table (templates/embedding_bag/embedding_bag_joined.cu.j2): built alone
    and in a unit with another joined variant and a plain one; what the op prepares for a
    forward (split, validates) comes from the forward half, for a backward (the sorted indices)
    from the backward half. The tables are read from the libraries (no GPU needed to load them)."""
    import ctypes

    from tuner.families import embedding_bag
    from tuner.variant import Variant

    by_name = embedding_bag.space("bfloat16").by_name()
    block = by_name["embedding_bag.bfloat16.int64.kernel.block.8.1.b256.direct.sorted"]
    split = by_name["embedding_bag.bfloat16.int64.none.subwarp.split32.8.1.b128.shared.sorted"]
    joined, back = Variant.joined(block, split), Variant.joined(split, block)
    source = render.render(joined)  # each half without the other half's kernels
    for mode in ("SUM", "MEAN", "MAX"):
        assert source.count(f"embedding_bag_forward_kernel<TUNER_EB_{mode}><<<") == 1
    assert source.count("embedding_bag_segment_backward_kernel<<<") == 1
    assert source.count("__global__ void embedding_bag_psw_backward_kernel") == 1
    with pytest.raises(ValueError, match="two plain variants"):
        Variant.joined(joined, block)
    from tuner.families import rms_norm  # its `bwd_blocks` dimension is no joined variant's half

    assert all(v.halves() is None for v in rms_norm.covering_set())

    class Table(ctypes.Structure):  # the head of the table rendered from the declaration
        _fields_ = [("abi", ctypes.c_int), ("name", ctypes.c_char_p), ("weight_dtype", ctypes.c_char_p),
                    ("indices_dtype", ctypes.c_char_p), ("validates", ctypes.c_int), ("split", ctypes.c_int),
                    ("sorts", ctypes.c_int)]

    def table(b):
        fn = getattr(ctypes.CDLL(str(b.so)), b.entry or families.get("embedding_bag").ENTRY)
        fn.restype = ctypes.POINTER(Table)
        t = fn().contents
        return t.name.decode(), t.validates, t.sorts, t.split

    alone = build.build([joined], "sm_90", jobs=1, root=tuner_home / "alone")
    unit = build.build([joined, back, block], "sm_90", jobs=1)
    assert all(b.ok for b in alone + unit), [b.error for b in alone + unit]
    assert unit[0].unit_size == 3 and alone[0].unit_size == 1
    assert table(alone[0]) == table(unit[0]) == (joined.name, 1, 1, 0)  # block's forward validates, no split
    assert table(unit[1]) == (back.name, 0, 1, 32)
    assert table(unit[2]) == (block.name, 1, 1, 0)


def _fake_nvcc(tmp_path, monkeypatch, body: str):
    """An nvcc that logs its start and end in tmp_path/calls and writes its -o output after `body`."""
    calls = tmp_path / "calls"
    fake = tmp_path / "fake-nvcc"
    fake.write_text("#!/bin/sh\n"
                    'out=""; prev=""\nfor a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'
                    f'echo "start $$ $(date +%s.%N)" >> {calls}\n{body}\n: > "$out"\n'
                    f'echo "end $$ $(date +%s.%N)" >> {calls}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(toolkit, "nvcc", lambda: fake)
    monkeypatch.setattr(toolkit, "nvcc_version", lambda: "fake")
    return calls


def test_builds_side_by_side_share_one_queue_of_compilers(tuner_home, fresh_cache, tmp_path, monkeypatch):
    """A search builds its next batch while the last one's units end: the two share the cores (as many
    compilers at once as jobs), rather than each running its own `jobs`."""
    import threading

    calls = _fake_nvcc(tmp_path, monkeypatch, "sleep 1")
    cover = giou.covering_set()[:8]
    results: list = []
    threads = [threading.Thread(target=lambda part=part: results.extend(build.build(part, "sm_90", jobs=2)))
               for part in (cover[:4], cover[4:])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(b.ok for b in results)
    events = sorted((float(t), kind) for kind, _, t in (line.split() for line in calls.read_text().splitlines()))
    running = most = 0
    for _, kind in events:
        running += 1 if kind == "start" else -1
        most = max(most, running)
    assert sum(kind == "start" for _, kind in events) == 4  # units of 2
    assert most == 2


def test_an_interrupted_build_ends_its_compilers(tuner_home, fresh_cache, tmp_path, monkeypatch):
    import time

    # the first compiler ends at once; the others would run a minute
    calls = _fake_nvcc(tmp_path, monkeypatch, f'mkdir {tmp_path}/first 2>/dev/null || sleep 60')

    def stop(builds):  # once the other two have started
        deadline = time.monotonic() + 20
        while calls.read_text().count("start") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        build.build(giou.covering_set()[:3], "sm_90", jobs=3, on_ready=stop)
    assert time.monotonic() - started < 30
    pids = [int(line.split()[1]) for line in calls.read_text().splitlines() if line.startswith("start")]
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)


def test_a_forked_child_compiles_with_a_queue_of_its_own():
    """A child forked after the parent compiled has none of the parent's queue threads: its builds
    get a queue of their own rather than waiting forever on the parent's."""
    q = build.queue_for(2)
    assert q.submit(lambda: 1).result() == 1
    pid = os.fork()
    if pid == 0:  # the child: no assertion may raise past here
        try:
            mine = build.queue_for(2)
            os._exit(0 if mine is not q and mine.submit(lambda: 2).result(timeout=30) == 2 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("family", ["giou", "rms_norm", "cross_entropy", "embedding_bag"])
def test_a_16_bit_variant_includes_none_of_cuda_s_16_bit_headers(family):
    """A unit's host passes parse every header in full (cuda_bf16.h and cuda_fp16.h cost ~0.8 s of a
    core a unit, a third of a search's first batch): the kernels' 16-bit types are their own
    (templates/common/half.cuh.j2). Linear cross-entropy's cuBLAS header brings CUDA's in; it is left out."""
    fam = families.get(family)
    spaces = [s for s in fam.all_spaces() if {"float16", "bfloat16"} & set(s.fixed.values())]
    assert spaces
    for space in spaces:
        source = render.render(next(iter(space)))
        assert "tuner_bfloat16" in source and not re.search(r"#\s*include\s*<cuda_(fp16|bf16)\.h>", source), space.fixed
