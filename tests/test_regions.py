"""Serve by measurement (tuner.deploy.regions): the shapes the export's check times around and
between the tuned problems, who serves each from recorded ratios, and what the op binds there."""

import pytest

from tuner.deploy import binaries, export, regions, serving
from tuner.families import cross_entropy, embedding_bag, rms_norm


def _entry(space, problem, served="variant"):
    v = next(iter(space))
    return {"problem": problem, "variant": v.name, "params": v.as_dict(), "served_by": served}


def test_the_grid_is_each_problem_four_times_smaller_and_larger_along_each_size_and_between_two():
    one = rms_norm.Problem().__dict__
    two = {**one, "rows": 64, "width": 1024}
    points = regions.grid("rms_norm", [_entry(rms_norm.space(), one), _entry(rms_norm.space(), two)])
    shapes = [(p["problem"]["rows"], p["problem"]["width"]) for p in points]
    assert len(shapes) == len(set(shapes)) == 9
    assert {(1024, 4096), (16384, 4096), (4096, 1024), (4096, 16384)} <= set(shapes)  # around the first
    assert {(16, 1024), (256, 1024), (64, 256), (64, 4096)} <= set(shapes)  # around the second
    assert (512, 2048) in shapes  # between them
    assert (4096, 4096) not in shapes and (64, 1024) not in shapes  # the tuned problems decide themselves
    near = {(p["problem"]["rows"], p["problem"]["width"]): p["near"] for p in points}  # whose variant it measures
    assert all(near[s] == export.problem_key(one) for s in ((1024, 4096), (16384, 4096), (4096, 1024), (4096, 16384)))
    assert all(near[s] == export.problem_key(two) for s in ((16, 1024), (256, 1024), (64, 256), (64, 4096)))
    assert all((p["problem"]["x"], p["problem"]["weight"]) == ("bfloat16", "bfloat16") for p in points)


def test_no_grid_where_variants_serve_every_shape_or_torch_won_the_problem():
    rms = rms_norm.Problem().__dict__
    assert regions.grid("rms_norm", [_entry(rms_norm.space(), rms, "torch")]) == []
    mixed = {**rms, "weight": "float32"}  # torch's op is unfused: variants serve the pair everywhere
    assert regions.grid("rms_norm", [_entry(rms_norm.space(), mixed)]) == []
    ce = cross_entropy.Problem().__dict__
    assert regions.grid("cross_entropy", [_entry(cross_entropy.space(), ce)]) == []


def test_the_grid_keeps_kinds_apart_and_changes_only_the_key_s_sizes():
    """EmbeddingBag's key is (dim, mean bag size, bags), kept by mode, the count of bags loose: a
    problem per mode gets its own shapes, and the table's rows stay the tuned problem's."""
    space = embedding_bag.space()
    sum_ = {**embedding_bag.Problem().__dict__, "mode": "sum"}
    mean = {**sum_, "mode": "mean", "dim": 64}
    points = regions.grid("embedding_bag", [_entry(space, sum_), _entry(space, mean)])
    assert len(points) == 2 * (regions.MOST + 8)  # no midpoint between two modes; 8 more for the loose size
    for p in points:
        tuned = sum_ if p["problem"]["mode"] == "sum" else mean
        assert p["near"] == export.problem_key(tuned)
        assert {k for k in tuned if p["problem"][k] != tuned[k]} <= {"dim", "bag_size", "bags"}
    # torch's path is guarded: below the tuned problem a grid to 16x smaller, where small calls
    # are bound by the host; above it, each size 4x larger; the nearest of them first
    sizes = [(p["problem"]["dim"], p["problem"]["bag_size"], p["problem"]["bags"]) for p in points
             if p["problem"]["mode"] == "sum"]
    shapes = {(d, n) for d, n, _ in sizes}
    assert shapes == {(32, 150), (8, 150), (128, 38), (128, 9), (32, 38), (32, 9), (8, 38), (8, 9),
                      (512, 150), (128, 600), (128, 150)}
    # the count of bags only grows (4x and 16x), beside the tuned sizes and the smaller ones: a call
    # with many short bags is measured where it runs, and no shape has over 16x the tuned entries
    assert {b for *_, b in sizes} == {2048, 8192, 32768}
    assert (32, 38, 8192) in sizes and (32, 38, 32768) in sizes and (128, 150, 32768) in sizes
    assert sorted(s for s in sizes if s[0] > 128 or s[1] > 150) == [(128, 600, 2048), (512, 150, 2048)]


def test_a_shape_between_two_problems_names_the_variant_the_binding_runs_there():
    """The binding takes the first of equally near tuned problems (tuner_op.h's nearest, within
    1e-12), which is the variant the export's check times at a midpoint: the grid names that one,
    not whichever float noise in the logs makes nearer."""
    import itertools

    space = rms_norm.space()
    v1, v2 = itertools.islice(iter(space), 2)
    base = rms_norm.Problem().__dict__
    a, b = {**base, "rows": 64, "width": 256}, {**base, "rows": 64, "width": 4096}
    entries = [{"problem": a, "variant": v1.name, "params": v1.as_dict(), "served_by": "variant"},
               {"problem": b, "variant": v2.name, "params": v2.as_dict(), "served_by": "variant"}]
    middle, = (p for p in regions.grid("rms_norm", entries) if (p["problem"]["rows"], p["problem"]["width"]) == (64, 1024))
    assert middle["near"] == export.problem_key(a)
    measured = [{**middle, "served_by": "variant", "checked": {}}]
    bind, = (x for x in binaries.bound(rms_norm, rms_norm.op.OP, entries, measured) if x["problem"] == middle["problem"])
    assert bind["variant"] == v1.name


def test_a_problem_the_check_gave_to_torch_keeps_its_variant_where_it_won_around_it():
    """The check times a tuned problem and the shapes around it with its variant; where torch's op
    wins the problem itself but the variant wins around it, the shapes around keep the variant."""
    p = rms_norm.Problem().__dict__
    entries = [_entry(rms_norm.space(), p)]
    around = regions.grid("rms_norm", entries)
    ratios = {export.problem_key(r["problem"]): {"fwd wall": 0.5} for r in around}
    checked = export.with_checks(entries, {export.problem_key(p): {"fwd wall": 1.2, "fwd+bwd wall": 1.1}})
    assert checked[0]["served_by"] == "torch"
    binds = binaries.bound(rms_norm, rms_norm.op.OP, checked, regions.decide(around, ratios, export.SLOWER))
    mine = [b for b in binds if (b["problem"]["x"], b["problem"]["weight"]) == ("bfloat16", "bfloat16")]
    assert mine[0] == {"problem": p, "served_by": "torch"}
    assert len(mine) == 1 + len(around) and all(b["variant"] == entries[0]["variant"] for b in mine[1:])


def test_the_grid_leaves_out_every_tuned_problem_s_shape_and_the_first_of_two_studies_serves():
    """A shape on a problem torch's op won in the search is that problem's to decide (its bind comes
    first), so it is not measured; of two entries of one problem (two studies), the first is the one
    the binding runs, at the problem and around it."""
    import itertools

    base = rms_norm.Problem().__dict__
    won = {**base, "rows": 1024}  # a quarter of the default's rows: on its grid
    points = regions.grid("rms_norm", [_entry(rms_norm.space(), base), _entry(rms_norm.space(), won, "torch")])
    assert points and all(p["problem"]["rows"] != 1024 or p["problem"]["width"] != 4096 for p in points)
    v1, v2 = itertools.islice(iter(rms_norm.space()), 2)
    twice = [{"problem": base, "variant": v.name, "params": v.as_dict(), "served_by": "variant"} for v in (v1, v2)]
    around = regions.grid("rms_norm", twice)
    measured = regions.decide(around, {export.problem_key(r["problem"]): {"fwd wall": 0.5} for r in around},
                              export.SLOWER)
    binds = binaries.bound(rms_norm, rms_norm.op.OP, twice, measured)
    assert {b["variant"] for b in binds if b["problem"] in [r["problem"] for r in around]} == {v1.name}


def test_who_serves_a_shape_is_read_from_its_ratios_for_each_kind_of_call():
    """Calls without a gradient are the forward's cells' to decide, training calls forward+backward's:
    torch's op serves a kind where the op was slower in one of its cells or has no time there, and
    the whole shape where it lost both."""
    points = regions.grid("rms_norm", [_entry(rms_norm.space(), rms_norm.Problem().__dict__)])
    keys = [export.problem_key(p["problem"]) for p in points]
    ratios = {keys[0]: {"fwd wall": 0.8, "fwd GPU": 0.7, "fwd+bwd wall": 0.9, "fwd+bwd GPU": 0.6},
              keys[1]: {"fwd wall": 1.04, "fwd GPU": 0.7, "fwd+bwd wall": 0.9, "fwd+bwd GPU": 0.6},
              keys[2]: {"fwd wall": 0.9, "fwd GPU": 0.8, "fwd+bwd wall": 0.9, "fwd+bwd GPU": None},
              keys[3]: {"fwd wall": 1.2, "fwd GPU": 0.8, "fwd+bwd wall": 0.9, "fwd+bwd GPU": 1.1}}
    decided = regions.decide(points, ratios, export.SLOWER)
    assert len(decided) == 4  # the fifth was not measured
    assert [(r["served_by"], r.get("torch_serves")) for r in decided] == [
        ("variant", None), ("variant", "inference"), ("variant", "training"), ("torch", None)]
    assert decided[1]["checked"] == ratios[keys[1]]
    binds = binaries.bound(rms_norm, rms_norm.op.OP, [_entry(rms_norm.space(), rms_norm.Problem().__dict__)], decided)
    mine = {export.problem_key(b["problem"]): b for b in binds}
    assert [mine[k].get("torch_serves") for k in keys[:3]] == [None, "inference", "training"]
    assert mine[keys[3]] == {"problem": points[3]["problem"], "served_by": "torch"}
    words = binaries.serving(rms_norm, rms_norm.op.OP, [_entry(rms_norm.space(), rms_norm.Problem().__dict__)],
                             decided)["bfloat16/bfloat16"]
    assert "variants serve 3, torch's op 1" in words and "(inference)" in words and "(training)" in words


def test_a_tuned_problem_s_check_gives_torch_s_op_the_kind_of_call_it_won():
    base = rms_norm.Problem().__dict__
    entry = _entry(rms_norm.space(), base)
    key = export.problem_key(base)
    forward_lost = {"fwd wall": 1.3, "fwd GPU": 0.9, "fwd+bwd wall": 0.8, "fwd+bwd GPU": 0.7}
    (w,) = export.with_checks([entry], {key: forward_lost})
    assert (w["served_by"], w["torch_serves"], w["checked"]) == ("variant", "inference", forward_lost)
    (again,) = export.with_checks([w], {key: {cell: 0.9 for cell in forward_lost}})  # a later check won both
    assert again["served_by"] == "variant" and "torch_serves" not in again
    (both,) = export.with_checks([entry], {key: {cell: 1.1 for cell in forward_lost}})
    assert both["served_by"] == "torch" and "torch_serves" not in both
    # an op that cannot serve the kinds apart (no saves: a training call's forward chooses again) gives
    # torch's op the problem where it lost either; a winner its search gave to torch's op stays torch's
    (whole,) = export.with_checks([entry], {key: forward_lost}, apart=False)
    assert whole["served_by"] == "torch" and "torch_serves" not in whole
    lost, won = _entry(rms_norm.space(), base, "torch"), entry
    assert [w["served_by"] for w in export.with_checks([lost, won], {key: forward_lost})] == ["torch", "variant"]
    assert regions.kinds_apart("rms_norm") and regions.verdict({"fwd wall": 0.9}) == {
        "served_by": "variant", "torch_serves": "training"}  # a kind with no time was not shown won
    (bind,) = [b for b in binaries.bound(rms_norm, rms_norm.op.OP, [w]) if b["problem"] == base]
    assert bind["variant"] == entry["variant"] and bind["torch_serves"] == "inference"


def test_the_runtime_stages_the_calls_a_variant_serves_only_where_torch_s_op_serves_the_others(monkeypatch):
    """A binding built before the `serves` argument still loads an export without it."""
    import ctypes

    from tuner import runtime

    staged = []

    class Ops:
        def stage(self, *args):
            staged.append(args)

    monkeypatch.setattr(runtime, "table", lambda *a: 7)
    monkeypatch.setattr(ctypes, "CDLL", lambda path: path)
    problem = rms_norm.Problem().__dict__
    binds = [{"problem": problem, "variant": "v", "library": "lib", "entry": "e", **kind}
             for kind in ({}, {"torch_serves": "inference"}, {"torch_serves": "training"})]
    runtime.stage(rms_norm.op.OP, Ops(), binds, {"lib": "lib.so"})
    assert [len(a) for a in staged] == [5, 6, 6]
    # loaded with baseline=False (the check's own timing, comparisons): every variant serves both kinds
    torch_s = {"problem": problem, "served_by": "torch"}
    assert runtime.staged(binds + [torch_s], True) == binds + [torch_s]
    assert runtime.staged(binds + [torch_s], False) == [binds[0]] * 3
    assert [a[5] for a in staged[1:]] == [runtime.SERVES["training"], runtime.SERVES["inference"]]


def test_a_variant_is_weighed_against_the_op_s_own_path_to_torch_where_measured():
    """Who serves is decided against what a call pays where torch's op serves it (the guard and
    torch's op), where the rows hold that; against torch's bare op where they do not."""
    from tuner.report import bench

    cells = {"fwd_wall_us": 10.0, "fwd_kernel_us": 2.0, "fwd_bwd_wall_us": 30.0, "fwd_bwd_kernel_us": 8.0}
    rows = [{"impl": "tuned op", "rows": 64, **cells},
            {"impl": "anchor: torch rms_norm", "rows": 64, **{k: v * 0.9 for k, v in cells.items()}},
            {"impl": bench.TORCH_SERVING, "rows": 64, **{k: v * 1.25 for k, v in cells.items()}}]
    against = bench.serving_against(rows, "anchor: torch rms_norm")
    assert against == bench.TORCH_SERVING
    (_, ratios), = bench.ratios(rows, against)
    assert all(r == pytest.approx(0.8) for r in ratios.values())
    assert bench.serving_against(rows[:2], "anchor: torch rms_norm") == "anchor: torch rms_norm"


def test_a_verdict_for_torch_is_the_median_of_three_timings():
    """One noisy wall time does not give a shape to torch's op: each cell is the median of three
    timings, and a cell missing from any of them stays missing."""
    runs = [{"fwd wall": 1.3, "fwd gpu": 0.8, "fwd+bwd wall": 0.9, "fwd+bwd gpu": None},
            {"fwd wall": 0.9, "fwd gpu": 0.7, "fwd+bwd wall": 1.1, "fwd+bwd gpu": 0.6},
            {"fwd wall": 0.95, "fwd gpu": 0.9, "fwd+bwd wall": 1.05, "fwd+bwd gpu": 0.6}]
    assert serving.steadied(runs) == {"fwd wall": 0.95, "fwd gpu": 0.8, "fwd+bwd wall": 1.05, "fwd+bwd gpu": None}


def test_the_op_binds_the_measured_shapes_and_the_manifest_says_so(tmp_path):
    """A shape a variant won binds the tuned problem's variant again at that shape; one torch won
    binds torch's op there; the manifest keeps them (`regions`) and says so in its words."""
    problem = rms_norm.Problem().__dict__
    space = rms_norm.space()
    entries = [_entry(space, problem)]
    points = regions.grid("rms_norm", entries)
    decided = [{**p, "served_by": who, "checked": {}} for p, who in zip(points, ("variant", "torch", "variant", "torch"))]
    from tuner.families.rms_norm import op

    bound = [b for b in binaries.bound(rms_norm, op.OP, entries, decided)
             if (b["problem"]["x"], b["problem"]["weight"]) == ("bfloat16", "bfloat16")]
    assert [b.get("served_by", "variant") for b in bound] == ["variant", "variant", "torch", "variant", "torch"]
    assert bound[1]["variant"] == bound[0]["variant"] and bound[1]["problem"] == points[0]["problem"]
    assert bound[2]["problem"] == points[1]["problem"] and "variant" not in bound[2]

    winners = [{"variant": space.variant(**entries[0]["params"]), "problem": problem}]
    out = export.write(tmp_path / "exp", winners, {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"},
                       binaries=False, regions=decided)
    manifest = export.read(out)
    assert manifest["regions"] == decided
    assert "measured at 4 shapes around them: variants serve 2, torch's op 2" in manifest["serving"]["bfloat16/bfloat16"]


def test_a_mode_no_search_tuned_is_bound_as_the_tuned_mode_and_the_manifest_says_so(tmp_path):
    """EmbeddingBag's export binds a mode no search tuned in a pair as the pair's tuned mode: each of
    its binds again (variants and torch's, tuned problems and measured shapes) with the mode changed,
    so that a call of that mode runs the variant where the tuned mode's did, not torch's op behind its
    guard; a mode a search tuned (even one torch won) keeps its own, and a family without kinds is
    bound as before."""
    from tuner.families.embedding_bag import op

    space = embedding_bag.space("float32", "int64")
    tuned = _entry(space, embedding_bag.Problem(mode="sum").__dict__)
    points = regions.grid("embedding_bag", [tuned])[:2]
    decided = [{**p, "served_by": who, "checked": {}} for p, who in zip(points, ("variant", "torch"))]
    bound = [b for b in binaries.bound(embedding_bag, op.OP, [tuned], decided)
             if (b["problem"]["weight"], b["problem"]["index"]) == ("float32", "int64")]
    by_mode = {m: [b for b in bound if b["problem"]["mode"] == m] for m in embedding_bag.MODES}
    assert [b.get("served_by", "variant") for b in by_mode["sum"]] == ["variant", "variant", "torch"]
    for mode in ("mean", "max"):
        assert [{**b, "problem": {**b["problem"], "mode": "sum"}} for b in by_mode[mode]] == \
            [{**b, "served_as": "sum"} for b in by_mode["sum"]]
        assert [op.OP.shape(b["problem"]) for b in by_mode[mode]] == \
            [(op.OP.shape(b["problem"])[0], embedding_bag.MODES.index(mode)) for b in by_mode["sum"]]

    torch_won_max = {**_entry(space, embedding_bag.Problem(mode="max").__dict__), "served_by": "torch"}
    del torch_won_max["variant"]
    modes = [(b["problem"]["mode"], b.get("served_as")) for b in binaries.bound(embedding_bag, op.OP,
                                                                               [tuned, torch_won_max])
             if (b["problem"]["weight"], b["problem"]["index"]) == ("float32", "int64")]
    assert modes == [("sum", None), ("max", None), ("mean", "sum")]
    from tuner.families.rms_norm import op as rms_norm_op

    plain = binaries.bound(rms_norm, rms_norm_op.OP, [_entry(rms_norm.space(), rms_norm.Problem().__dict__)])
    assert plain and not any("served_as" in b for b in plain)

    winners = [{"variant": space.variant(**tuned["params"]), "problem": tuned["problem"]}]
    manifest = export.read(export.write(tmp_path / "exp", winners, {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"},
                                        binaries=False, regions=decided))
    assert "mode max, mean (no search tuned them) as sum's" in manifest["serving"]["float32/int64"]
    assert manifest["serving"]["float16/int64"].endswith("as sum's; parameters tuned for float32/int64")


def test_an_untuned_dtype_pair_of_embedding_bag_is_bound_as_the_tuned_pair_at_its_shapes_and_verdicts():
    """A dtype pair no search tuned binds the tuned pair's parameters rendered for its dtypes (the
    nearest valid point: 16-bit weights take the sorted backward) at the tuned problems and at every
    measured shape, torch's op where the tuned pair's verdict was torch's, each mode as the tuned one."""
    from tuner.families.embedding_bag import op

    space = embedding_bag.space("float32", "int64")
    tuned = _entry(space, embedding_bag.Problem(mode="sum").__dict__)
    points = regions.grid("embedding_bag", [tuned])[:2]
    decided = [{**p, "served_by": who, "checked": {}} for p, who in zip(points, ("variant", "torch"))]
    bound = binaries.bound(embedding_bag, op.OP, [tuned], decided)
    pairs = {(w, i) for w in embedding_bag.WEIGHT_DTYPES for i in embedding_bag.INDEX_DTYPES}
    assert {(b["problem"]["weight"], b["problem"]["index"]) for b in bound} == pairs
    for w, i in pairs:
        mine = [b for b in bound if (b["problem"]["weight"], b["problem"]["index"]) == (w, i)]
        assert len(mine) == 3 * 3  # the tuned problem and two measured shapes, in each mode
        sizes = [({k: b["problem"][k] for k in ("dim", "bag_size", "mode")}, b.get("served_by", "variant"))
                 for b in mine]
        assert sizes[:3] == [({k: p["problem"][k] for k in ("dim", "bag_size", "mode")}, who)
                             for p, who in ((tuned, "variant"), *zip(decided, ("variant", "torch")))]
        variants = {b["variant"] for b in mine if "variant" in b}
        assert len(variants) == 1 and f"embedding_bag.{w}.{i}." in variants.pop()
        if (w, i) != ("float32", "int64"):
            assert all(b["tuned_for"] == "float32/int64" for b in mine if "variant" in b)
            if w != "float32":  # float atomics are float32's alone: the nearest point's backward is sorted
                assert all(b["params"]["backward"] == "sorted" for b in mine if "variant" in b)


def test_an_h100_export_s_recorded_check_is_decided_again_as_it_was():
    """From the ratios an H100 export's check recorded around EmbeddingBag's default problem
    (tests/data/h100-eb-default-check.json; docs/benchmarks.md, EmbeddingBag's many short bags): the
    grid is the 24 shapes it measured, each decided and bound as that export did. At dim 32, 8,192
    bags of 9 the forward lost its GPU cell (1.65x) and won its wall cell (0.46x): torch's op takes the
    calls without a gradient there, the variant keeps training calls (0.39-0.64x)."""
    import json
    from pathlib import Path

    from tuner.families.embedding_bag import op

    data = json.loads((Path(__file__).parent / "data" / "h100-eb-default-check.json").read_text())
    tuned, recorded = data["tuned"], data["regions"]
    key = export.problem_key
    points = regions.grid("embedding_bag", [{"problem": tuned["problem"], "served_by": "variant"}])
    assert sorted(key(p["problem"]) for p in points) == sorted(key(r["problem"]) for r in recorded)
    assert {p["near"] for p in points} == {key(tuned["problem"])}
    apart = regions.kinds_apart("embedding_bag")
    decided = regions.decide(points, {key(r["problem"]): r["checked"] for r in recorded}, export.SLOWER, apart)
    verdicts = {key(r["problem"]): (r["served_by"], r.get("torch_serves")) for r in decided}
    assert verdicts == {key(r["problem"]): (r["served_by"], r.get("torch_serves")) for r in recorded}
    short = key({**tuned["problem"], "dim": 32, "bag_size": 9, "bags": 8192})
    assert verdicts.pop(short) == ("variant", "inference")
    assert set(verdicts.values()) == {("variant", None)}
    winner = {k: tuned[k] for k in ("problem", "variant", "params", "served_by")}
    (checked,) = export.with_checks([winner], {key(tuned["problem"]): tuned["checked"]}, apart)
    assert checked["served_by"] == "variant" and "torch_serves" not in checked
    binds = {key(b["problem"]): b for b in binaries.bound(embedding_bag, op.OP, [winner], decided)
             if b["problem"].get("weight") == "float32" and b["problem"].get("index") == "int64"}
    assert binds[short]["variant"] == tuned["variant"] and binds[short]["torch_serves"] == "inference"


def test_an_untuned_pair_takes_one_tuned_pair_the_nearest_in_dtypes():
    """With several tuned pairs, an untuned pair is bound as one of them: the one sharing its weight
    dtype, else its index dtype (the first such): two pairs' verdicts at one shape never meet, and
    the manifest's words name the pair whose measurements it took."""
    from tuner.families.embedding_bag import op

    tuned = [_entry(embedding_bag.space(w, "int64"), embedding_bag.Problem(weight=w, mode="sum").__dict__)
             for w in ("float32", "bfloat16")]
    points = regions.grid("embedding_bag", tuned)
    decided = [{**p, "served_by": "torch" if i % 3 == 0 else "variant", "checked": {}} for i, p in enumerate(points)]
    bound = binaries.bound(embedding_bag, op.OP, tuned, decided)
    for (w, i), source in {("bfloat16", "int32"): "bfloat16/int64", ("float32", "int32"): "float32/int64",
                           ("float16", "int64"): "float32/int64", ("float16", "int32"): "float32/int64"}.items():
        mine = [b for b in bound if (b["problem"]["weight"], b["problem"]["index"]) == (w, i) and b["problem"]["mode"] == "sum"]
        assert {b["tuned_for"] for b in mine if "variant" in b} == {source}
        theirs = [r for r in decided if f"{r['problem']['weight']}/{r['problem']['index']}" == source]
        assert [b.get("served_by", "variant") for b in mine[1:]] == [r["served_by"] for r in theirs]
        said = binaries.serving(embedding_bag, op.OP, tuned, decided)[f"{w}/{i}"]
        assert f"shapes around them of {source}: variants serve" in said and said.endswith(f"parameters tuned for {source}")


@pytest.mark.gpu
def test_measured_shapes_decide_who_serves_a_call(tmp_path, shared_home):
    """On the GPU: the op timed against torch's op around an RMSNorm problem, and the loaded op serves
    each measured shape (and a call next to it) as the measurement said."""
    import torch

    import oploader

    from tuner import gpus

    space = rms_norm.space()
    problem = rms_norm.Problem(rows=2048, width=2048).__dict__
    v = space.variant(threads_per_row=256, block_size=256, vec=8, unroll=2, rstd="saved", grad_weight="partials",
                      bwd_blocks=2, walk="resident")
    winners = [{"variant": v, "problem": problem}]
    out = export.write(tmp_path / "exp", winners, gpus.attached().describe())
    points = regions.grid("rms_norm", [{"problem": problem, "served_by": "variant"}])
    decided = regions.decide(points, serving.measure(out, points), export.SLOWER)
    assert len(decided) == 4 and all(len(r["checked"]) == 4 for r in decided)
    out = export.write(tmp_path / "exp", winners, gpus.attached().describe(), regions=decided)
    oploader.load(out)
    for r in decided:
        rows, width = r["problem"]["rows"], r["problem"]["width"]
        for near in ((rows, width), (rows + rows // 8, width)):
            for grad, kind in ((False, "inference"), (True, "training")):
                who = torch.ops.tuner_rms_norm.served(list(near), torch.bfloat16, torch.bfloat16, grad)
                assert (who == "torch") == (r["served_by"] == "torch" or r.get("torch_serves") == kind), (near, r)


def test_export_best_lists_each_measured_shape_and_who_serves_it():
    from tuner.cli import studies
    from tuner.cli.target import cli_part

    one = rms_norm.Problem().__dict__
    points = regions.grid("rms_norm", [_entry(rms_norm.space(), one)])[:2]
    keys = [binaries.problem_key(p["problem"]) for p in points]
    measured = regions.decide(points, {keys[0]: {"fwd wall": 0.8, "fwd+bwd GPU": 0.9},
                                       keys[1]: {"fwd wall": 1.3, "fwd+bwd GPU": None}}, export.SLOWER)
    lines = studies.region_lines(measured, cli_part("rms_norm").describe)
    assert lines[0].startswith("measured around them (2 shapes")
    first, second = (points[i]["problem"] for i in (0, 1))
    assert lines[1] == f"  bfloat16/bfloat16 rows={first['rows']} width={first['width']}: a variant (op / torch's op at most 0.90x, fwd+bwd GPU)"
    assert lines[2] == f"  bfloat16/bfloat16 rows={second['rows']} width={second['width']}: torch's op (op / torch's op at most 1.30x, fwd wall; 1 cell(s) not timed)"
    assert studies.region_lines([], str) == []
    one_kind = studies.region_lines([{**measured[0], "torch_serves": "inference"}], str)[1]
    assert ": a variant for training calls, torch's op for inference calls (op / torch's op" in one_kind
    winner = {"variant": "v1", "served_by": "variant", "torch_serves": "training", "objective": "fwd+bwd",
              "objective_us": 12.0}
    assert studies._served(winner) == "v1 for inference calls, torch's op for training calls (fwd+bwd 12.00 us)"
    assert studies._served({**winner, "torch_serves": None}) == "v1 (fwd+bwd 12.00 us)"


def test_show_export_reads_back_each_problem_the_measured_shapes_and_each_pair_s_word(tmp_path, capsys):
    """`tuner show --export DIR`: what export-best printed, from the manifest alone (no GPU, no
    study), and what serves each dtype pair; a study's options beside it are refused."""
    from tuner.cli.main import main

    problem = rms_norm.Problem().__dict__
    space = rms_norm.space()
    entries = [_entry(space, problem)]
    points = regions.grid("rms_norm", entries)[:2]
    decided = [{**p, "served_by": who, "checked": {"fwd wall": r}} for p, who, r in zip(points, ("variant", "torch"),
                                                                                         (0.7, 1.2))]
    winners = [{"variant": space.variant(**entries[0]["params"]), "problem": problem}]
    out = export.write(tmp_path / "exp", winners, {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"},
                       binaries=False, regions=decided)
    assert main(["show", "--export", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"bfloat16/bfloat16 rows={problem['rows']} width={problem['width']}: "
                               f"{entries[0]['variant']}")
    assert lines[1].startswith("measured around them (2 shapes")
    assert lines[2].endswith(": a variant (op / torch's op at most 0.70x, fwd wall)")
    assert lines[3].endswith(": torch's op (op / torch's op at most 1.20x, fwd wall)")
    assert lines[4] == f"exported 1 tuned problem(s) for NVIDIA H100 80GB HBM3 to {out}"
    pairs = lines[lines.index("each dtype pair, at shapes near no tuned or measured one:") + 1:]
    assert len(pairs) == len(rms_norm.all_spaces())
    assert next(p for p in pairs if p.startswith("  bfloat16/bfloat16: ")).endswith(
        export.read(out)["serving"]["bfloat16/bfloat16"])

    assert main(["show", "--export", str(out), "--batch", "8"]) == 2  # a usage error
    assert "--batch names a study" in capsys.readouterr().err
    assert main(["show", "--export", str(out), "--family", "giou"]) == 1
    assert "holds the rms_norm family, not giou" in capsys.readouterr().err
    assert main(["show", "--export", str(tmp_path / "none")]) == 1
    assert "is not a tuned export" in capsys.readouterr().err


def test_list_names_the_exports_under_the_home_and_one_it_cannot_load(tmp_path, monkeypatch, capsys):
    from tuner.cli.main import main

    monkeypatch.setenv("TUNER_HOME", str(tmp_path))
    problem, space = rms_norm.Problem().__dict__, rms_norm.space()
    winners = [{"variant": next(iter(space)), "problem": problem}]
    gpu = {"gpu_name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}
    good = export.write(export.default_dir("H100", "rms_norm"), winners, gpu, binaries=False)
    bad = export.write(export.default_dir("L4", "rms_norm"), winners, gpu, binaries=False)
    edited = (bad / export.MANIFEST).read_text().replace("H100 80GB HBM3", "L4")
    assert "L4" in edited
    (bad / export.MANIFEST).write_text(edited)  # its checksum no longer holds
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no studies in ")
    rows = out.split("(`tuner show --export NAME` prints one):\n")[1].splitlines()
    assert rows[0].split() == ["export", "family", "gpu", "problems", "by", "torch", "binaries"]
    assert rows[1].split()[:2] == [good.name, "rms_norm"] and rows[1].split()[-4:] == ["1", "0", "sources", "only"]
    assert rows[2].split()[0] == bad.name and "not loadable" in rows[2]
    assert not (tmp_path / "studies").exists()  # listing wrote nothing
    monkeypatch.chdir(tmp_path)  # the name alone: no such folder here, one under the exports
    assert main(["show", "--export", good.name]) == 0
    assert f"to {good}" in capsys.readouterr().out


def test_a_check_that_outlasts_its_time_limit_leaves_the_export_unchecked_with_why(monkeypatch, tmp_path):
    import subprocess

    def slow(*args, timeout=None, **kwargs):
        raise subprocess.TimeoutExpired(args[0], timeout)

    monkeypatch.setattr(subprocess, "run", slow)
    with pytest.raises(RuntimeError, match="took over 5 s"):  # best._checked says it and keeps the search's choice
        serving.measure(tmp_path, [{"problem": rms_norm.Problem().__dict__}], timeout=5)
