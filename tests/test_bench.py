"""The benchmark's own parts on CPU: its eager implementations are right, its report is written."""

import pytest
import torch

from tuner.report import bench
from tuner.families import giou


@pytest.mark.parametrize("pred,target", [("float32", "uint8"), ("bfloat16", "float32")])
def test_the_articles_losses_match_the_reference(pred, target):
    """GIoU's bench rows of what the article's users run (all but its CUDA kernel run on CPU)."""
    p, t, n = giou.make_inputs(16, 32, pred, target, "article", seed=4)
    want = giou.reference(p, t, n)
    rows = giou.bench_rows({"batch": 16, "slots": 32, "pred": pred, "target": target}, (p, t, n, "mean", 1e-7))
    assert list(rows) == ["article loop", "article concat", "torchvision + mask"]
    for name in ("article loop", "article concat", "torchvision + mask"):
        assert giou.check("loss", rows[name](p, t, n, "mean", 1e-7), want, 1e-4)[0], name
    assert "article loop" not in giou.bench_rows({"batch": 2048, "slots": 4, "pred": pred, "target": target},
                                                 giou.make_inputs(2048, 4, pred, target, seed=1) + ("mean", 1e-7))


def test_a_declared_variant_row_is_a_variant_of_the_problem_s_space():
    """GIoU's `BENCH_VARIANTS` row (the article's CUDA kernel): its parameters name one variant of
    each dtype pair's space (a constraint or a dimension renamed would refuse them here), built
    only when the row is first called (on a GPU)."""
    from tuner.report import declared

    for pred, target in (("bfloat16", "uint8"), ("float32", "float32")):
        problem = {**giou.Problem().__dict__, "pred": pred, "target": target}
        rows = declared.variant_rows("giou", problem)
        assert list(rows) == ["simple CUDA kernel"] and callable(rows["simple CUDA kernel"])
        params, scalars, _ = giou.BENCH_VARIANTS["simple CUDA kernel"]
        assert giou.space_for(problem).variant(**params).as_dict()["reduction"] == "atomic"
        assert scalars == {"reduction": "none"}
    assert declared.variant_rows("rms_norm", {}) == {}  # a family without any


def test_a_floor_of_gpu_time_alone_is_compared_in_gpu_time(tmp_path):
    """A floor with no wall time (bytes over bandwidth, a read timed by the profiler) gets a
    column of GPU-time ratios; the wall-time ratios stay as they were."""
    config = {"weight": "float32", "bag_size": 150}
    rows = [{"impl": "floor: gathered rows at 3.0 TB/s", **config, "fwd_kernel_us": 50.0},
            {"impl": "tuned op", **config, "fwd_wall_us": 80.0, "fwd_kernel_us": 60.0, "fwd_bwd_wall_us": 900.0,
             "fwd_bwd_kernel_us": 700.0},
            {"impl": "anchor: torch", **config, "fwd_wall_us": 160.0, "fwd_kernel_us": 120.0}]
    md = bench.markdown(rows)
    assert ("| fwd wall / tuned | fwd+bwd wall / tuned | fwd kernel / gathered rows at 3.0 TB/s | "
            "fwd wall / torch |") in md
    assert "| tuned op | 80.0 | 60.0 | 900.0 | 700.0 | 1.00x | 1.00x | 1.20x | 0.50x |" in md
    assert "| anchor: torch | 160.0 | 120.0 | - | - | 2.00x | - | 2.40x | 1.00x |" in md


def test_report_files(tmp_path):
    rows = []
    for impl, f, fb in [("tuned op", 5.0, 12.0), ("padded eager", 300.0, 2000.0),
                        ("floor: one kernel launch", 4.0, None), ("floor: x.sum().backward()", None, 100.0),
                        ("anchor: F.mse_loss (native op)", 10.0, 24.0)]:
        row = {"impl": impl, "pred": "bfloat16", "target": "uint8", "B": 1024, "S": 256}
        if f:
            row.update(fwd_wall_us=f, fwd_kernel_us=f / 2)
        if fb:
            row.update(fwd_bwd_wall_us=fb, fwd_bwd_kernel_us=fb / 2)
        rows.append(row)
    bench.write(rows, tmp_path, size="B")
    md = (tmp_path / "bench.md").read_text()
    assert "| padded eager | 300.0 |" in md and "60.00x" in md  # 300 / 5
    assert ("| fwd wall / tuned | fwd+bwd wall / tuned | fwd wall / one kernel launch | "
            "fwd+bwd wall / x.sum().backward() | fwd wall / F.mse_loss (native op) | "
            "fwd+bwd wall / F.mse_loss (native op) |") in md
    assert "| tuned op | 5.0 | 2.5 | 12.0 | 6.0 | 1.00x | 1.00x | 1.25x | 0.12x | 0.50x | 0.50x |" in md
    assert "forward **tuned op**, forward+backward **tuned op**" in md
    assert "**pred=bfloat16, target=uint8, S=256: forward+backward wall µs per call (GPU kernel µs)**" in md
    assert "| tuned op | 12.0 (6.0) |" in md and "| floor: one kernel launch | 4.0 (2.0) |" in md
    assert (tmp_path / "bench.csv").read_text().startswith("impl,pred,target,B,S")
    assert bench.read(tmp_path / "bench.csv") == rows
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_captured_problems_count_the_cells_slower_than_torch(tmp_path):
    """Tuned / torch per problem in the four cells; a cell counts as slower above 1.02x, and a
    time that is missing counts as slower (nothing shows it is not)."""
    def row(impl, rows, fwd_gpu, fwd_bwd_gpu, fwd_wall, fwd_bwd_wall=None):
        r = {"impl": impl, "x": "bfloat16", "rows": rows, "fwd_kernel_us": fwd_gpu, "fwd_bwd_kernel_us": fwd_bwd_gpu,
             "fwd_wall_us": fwd_wall}
        if fwd_bwd_wall is not None:
            r["fwd_bwd_wall_us"] = fwd_bwd_wall
        return r

    torch_name = "anchor: torch F.rms_norm"
    rows = [row("tuned op", 4096, 10.0, 30.0, 20.0, 50.0), row(torch_name, 4096, 20.0, 29.0, 19.8, 50.0),
            row("tuned op", 128, 5.0, 12.0, 9.0), row(torch_name, 128, 4.0, 12.0, 9.0, 40.0)]
    got = bench.ratios(rows, torch_name)
    assert [config for config, _ in got] == [{"x": "bfloat16", "rows": 4096}, {"x": "bfloat16", "rows": 128}]
    assert got[0][1] == pytest.approx({"fwd GPU": 0.5, "fwd+bwd GPU": 30 / 29, "fwd wall": 20 / 19.8,
                                       "fwd+bwd wall": 1.0})
    assert got[1][1]["fwd GPU"] == 1.25 and got[1][1]["fwd+bwd wall"] is None
    lines = bench.against(rows, torch_name)
    # 30/29 = 1.034 is slower, 20/19.8 = 1.010 is within 2%; 5/4 and the missing time are slower
    assert lines == ["x=bfloat16, rows=4096: tuned/torch fwd GPU 0.50x, fwd+bwd GPU 1.03x*, fwd wall 1.01x, "
                     "fwd+bwd wall 1.00x",
                     "x=bfloat16, rows=128: tuned/torch fwd GPU 1.25x*, fwd+bwd GPU 1.00x, fwd wall 1.00x, "
                     "fwd+bwd wall -*",
                     "slower than torch at 3 of 8"]
    bench.write_against(rows, tmp_path, torch_name)
    md = (tmp_path / "bench.md").read_text()
    assert "**slower than torch at 3 of 8**" in md and "- x=bfloat16, rows=128: tuned/torch fwd GPU 1.25x*" in md
    assert "| anchor: torch F.rms_norm | 19.8 | 20.0 | 50.0 | 29.0 |" in md
    assert bench.read(tmp_path / "bench.csv") == rows


def test_an_anchor_whose_package_is_missing_is_left_out_with_the_package_named(capsys):
    import types

    from tuner.report.declared import _anchors

    def anchors():
        import liger_kernel_that_is_not_installed  # noqa: F401

    assert _anchors(types.SimpleNamespace(anchors=anchors)) == {}
    assert "liger_kernel_that_is_not_installed is not installed (pip install 'tuner[bench]')" in capsys.readouterr().out
    assert _anchors(types.SimpleNamespace()) == {}
    assert list(_anchors(types.SimpleNamespace(anchors=lambda: {"x": len}))) == ["x"]


def test_least_bytes_is_the_inputs_and_output_then_the_gradient_inputs_and_their_gradients():
    """RMSNorm's floor without a floor_bytes of its own: x and y once forward (2 x, plus the weight);
    dy, x, dx (and the weight and its gradient) backward: 5 x."""
    import torch

    from tuner.report.declared import least_bytes

    x = torch.randn(64, 32, dtype=torch.bfloat16).requires_grad_()
    w = torch.randn(32).requires_grad_()
    once, weight = 64 * 32 * 2, 32 * 4
    assert least_bytes((x, w, 1e-6), torch.randn(64, 32, dtype=torch.bfloat16)) == (2 * once + weight,
                                                                                   5 * once + 3 * weight)
    frozen = w.detach()  # no gradient to write
    assert least_bytes((x, frozen, 1e-6), torch.randn(64, 32, dtype=torch.bfloat16))[1] == 5 * once + 2 * weight


def test_a_declared_bench_runs_each_dtype_tuple_at_each_shape_and_names_what_varies():
    """`--shapes` x `--dtypes` (one dtype sets every dtype field); the rows' columns are the dtypes, the
    sizes the problems have and any other field that varies (EmbeddingBag's modes); the summary runs
    across the size with the most values."""
    from tuner.errors import TunerError
    from tuner.families import embedding_bag, rms_norm
    from tuner.report import declared

    got = declared.problems("giou", ((64, 256), (1024, 16)), (("bfloat16", "uint8"), ("float32",)))
    assert [(p["batch"], p["slots"], p["pred"], p["target"]) for p in got] == [
        (64, 256, "bfloat16", "uint8"), (1024, 16, "bfloat16", "uint8"), (64, 256, "float32", "float32"),
        (1024, 16, "float32", "float32")]
    assert all(p["distribution"] == "article" and p["reduction"] == "mean" for p in got)  # the Problem's defaults
    assert declared._configs(giou, giou.OP_DECLARATION, got) == (["pred", "target", "batch", "slots"], "batch")
    shapes = declared.problems("rms_norm", rms_norm.BENCH_SHAPES, ("bfloat16",))
    assert declared._configs(rms_norm, rms_norm.OP_DECLARATION, shapes) == (["x", "weight", "rows", "width"], "rows")
    eb = [{**embedding_bag.Problem().__dict__, **p} for p in embedding_bag.BENCH_PROBLEMS]
    keys, size = declared._configs(embedding_bag, embedding_bag.OP_DECLARATION, eb)
    assert keys[:6] == ["weight", "index", "rows", "dim", "bags", "bag_size"] and size == "bag_size"
    assert {"mode", "distribution"} <= set(keys[6:]) and "per_sample_weights" not in keys  # False in every one
    with pytest.raises(TunerError, match="gives 3 sizes, giou has 2"):
        declared.problems("giou", ((1, 2, 3),), ("float32",))


def test_bench_dtypes_are_refused_before_a_gpu_is_looked_for():
    import argparse

    from tuner.cli.target import _dtype_list

    parse = _dtype_list({"pred": ("float32", "bfloat16"), "target": ("uint8", "float32")})
    assert parse("bfloat16/uint8,float32") == (("bfloat16", "uint8"), ("float32", "float32"))
    for bad, says in (("bfloat16", "bfloat16 is no target dtype"), ("uint8/uint8", "uint8 is no pred dtype"),
                      ("a/b/c", "expected pred/target dtypes"), ("", "expected pred/target dtypes")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            parse(bad)


def test_bench_shapes_are_parsed_for_the_family_s_number_of_sizes():
    """`--shapes` of a family of one size is `1024,4096`, of three `1x2x3`; a shape of another
    length is a usage error."""
    import argparse

    from tuner.cli import args as cli_args

    one, three = cli_args.shapes_of(("n",)), cli_args.shapes_of(("rows", "dim", "bags"))
    assert one("1024,4096") == ((1024,), (4096,)) and three("1x2x3") == ((1, 2, 3),)
    with pytest.raises(argparse.ArgumentTypeError, match="expected N shapes such as 4096,8192"):
        one("1024x2")
    with pytest.raises(argparse.ArgumentTypeError, match="expected ROWSxDIMxBAGS shapes"):
        three("1x2")


def test_the_host_floors_are_a_launch_and_autograd_on_a_leaf_shaped_as_the_first_input():
    """BENCH_HOST_FLOORS (GIoU's): one kernel launch timed as a forward, `x.sum().backward()` on a
    leaf of the first floating-point input's shape as a forward+backward, and F.mse_loss on two
    float32 tensors of that shape in both; none for other families."""
    import types

    from tuner.report import declared

    p, t, n = giou.make_inputs(4, 8, "bfloat16", "uint8", seed=1)
    floors = declared._host_floors(giou, (t, p, n, "mean", 1e-7))
    assert list(floors) == ["floor: one kernel launch", "floor: x.sum().backward()", "anchor: F.mse_loss (native op)"]
    launch, none = floors["floor: one kernel launch"]
    assert none is None and launch().tolist() == [1.0]
    nothing, backward = floors["floor: x.sum().backward()"]
    assert nothing is None
    backward()
    leaf = backward.__closure__[0].cell_contents
    assert leaf.shape == p.shape and leaf.dtype == torch.float32 and (leaf.grad == 1).all()
    mse, mse_both = floors["anchor: F.mse_loss (native op)"]
    cells = dict(zip(mse.__code__.co_freevars, (c.cell_contents for c in mse.__closure__)))
    x, y = cells["x"], cells["y"]
    assert x.shape == y.shape == p.shape and x.dtype == torch.float32 and not x.equal(y)
    assert torch.allclose(mse(), ((x.double() - y.double()) ** 2).mean().float())
    mse_both()
    leaf_x = dict(zip(mse_both.__code__.co_freevars, (c.cell_contents for c in mse_both.__closure__)))["leaf_x"]
    assert torch.allclose(leaf_x.grad, 2 * (x - y) / x.numel())
    assert declared._host_floors(types.SimpleNamespace(), (p, t, n)) == {}


def test_the_read_floor_reads_the_forward_s_bytes_in_the_first_floating_input_s_dtype():
    """BENCH_READ_FLOOR (EmbeddingBag's): a streaming read of as many bytes as the forward must move,
    in the table's dtype, summed in float32."""
    from tuner.families import embedding_bag as eb
    from tuner.report import declared

    inputs = eb.make_inputs(rows=64, dim=8, bags=5, bag_size=3, weight="bfloat16", seed=1)
    fwd, _ = eb.floor_bytes({}, inputs)
    read = declared.read_floor(fwd, inputs)
    data = read.__closure__[0].cell_contents
    assert data.dtype == torch.bfloat16 and data.numel() * 2 == fwd == inputs[1].numel() * 8 * 2
    assert read().dtype == torch.float32 and bool(read().isfinite())
