"""EmbeddingBag variants on the GPU: forward and backward in every mode, weight and index dtype
against the float64 reference and torch, the PR's distributions, padding_idx, per_sample_weights,
empty bags, and bad indices and offsets reported (never read out of bounds)."""

import pytest

import oploader
import references

from tuner.families import embedding_bag as eb

pytestmark = pytest.mark.gpu

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


class Bag:
    """A built variant, called with F.embedding_bag's arguments through the search's kernel of the
    declared op (tuner/measure/declared.py): the op's arguments, outputs and memory as the op gives them."""

    def __init__(self, so, name: str, entry: str | None):
        from tuner.measure.declared import DeclaredKernel

        self.kernel = DeclaredKernel(eb.FAMILY, so, name, entry)

    def prepare(self, w, idx, offs=None, mode="mean", psw=None, padding_idx=None, out=None):
        """(call, saved): the forward on these tensors, into `out` where given."""
        values = {"weight": w, "indices": idx, "offsets": offs, "mode": mode, "per_sample_weights": psw,
                  "include_last_offset": False, "padding_idx": padding_idx}
        call, outs = self.kernel.prepare(values, into=None if out is None else {"out": out})
        return call, {"values": values, "outs": outs}

    def forward(self, *args, **kwargs):
        """(out, max_indices or None, bag_count), bad input kept in the error word (`take_errors`)."""
        call, saved = self.prepare(*args, **kwargs)
        call()
        outs = saved["outs"]
        return outs["out"], outs["max_indices"] if saved["values"]["mode"] == "max" else None, outs["bag_count"]

    def backward(self, saved, grad, *, psw_grad: bool = False):
        """(grad_weight, grad_per_sample_weights or None) for the output gradient `grad`."""
        values, outs = saved["values"], saved["outs"]
        into = {} if psw_grad else {"per_sample_weights": grad.new_empty(0)}  # empty: not wanted
        call, gx = self.kernel.prepare_backward({"out": grad}, values, {n: outs[n] for n in ("max_indices", "bag_count")},
                                                into=into)
        call()
        return gx["weight"], gx["per_sample_weights"] if psw_grad and values["per_sample_weights"] is not None else None

    def take_errors(self) -> int:
        return self.kernel.take_errors()


def check_case(bag: Bag, p, mode: str, seed: int, padding: bool = False) -> tuple[float, str]:
    """(worst relative error, what failed or ""): the search's own check of the problem at `mode`,
    with ids equal to padding_idx (-1) where `padding`."""
    from tuner.measure.declared import Evaluation

    ev = Evaluation(eb.FAMILY)
    problem = {**vars(p), "mode": mode, **({"padding_idx": -1} if padding else {})}
    errors, failed = ev.run_case(bag.kernel, ev._case(problem, seed))
    return max(errors.values()), failed


def grad_close(got, want, weight: str) -> bool:
    """A gradient within the family's tolerance of the float64 one (norm-wise, as the search checks)."""
    import torch

    from tuner.measure import accuracy

    return accuracy.check("grad", got, want, eb.TOLERANCE[weight], getattr(torch, weight))[0]


@pytest.fixture(scope="module")
def kernels(shared_home):
    from tuner import gpus
    from tuner.build import compile as build

    import random

    spread = [v for s in eb.all_spaces() for v in s]
    # and a block per bag split over the entries (dims 40/48 need fewer lanes than the block has)
    split = [eb.space(w, "int64").variant(validation="inline", mapping="block", split=None, vec=vec, unroll=4,
                                          block_size=256, staging=staging, backward="sorted")
             for w in ("float32", "bfloat16") for vec in (1, 4) for staging in ("direct", "shared")]
    variants = list(dict.fromkeys(eb.covering_set() + random.Random(0).sample(spread, 18) + split + _chunked()))
    built = build.build(variants, gpus.attached().arch)
    assert all(b.ok for b in built), [b.error for b in built if not b.ok][:1]
    return [(b.variant, Bag(b.so, b.variant.name, b.entry)) for b in built]


def _chunked():
    """Variants that cut bags into chunks: every weight dtype, both index dtypes, warps and subwarps,
    both stagings, every validation, both chunk sizes, both backwards."""
    out = []
    for i, (w, index) in enumerate([("float32", "int64"), ("float32", "int32"), ("float16", "int64"),
                                    ("bfloat16", "int32")]):
        for j, (mapping, staging) in enumerate([("warp", "shared"), ("warp", "direct"), ("subwarp", "direct"),
                                               ("subwarp", "shared")]):
            vec = {"float32": 4, "float16": 8, "bfloat16": 2}[w] if mapping == "warp" else 1
            out.append(eb.space(w, index).variant(
                validation=("none", "inline", "hoisted", "kernel")[(i + j) % 4], mapping=mapping,
                split=(32, 64)[(i + j) % 2], vec=vec, unroll=(8, 4, 2, 1)[j], block_size=(128, 256)[i % 2],
                staging=staging, backward="atomic" if w == "float32" and j % 2 == 0 else "sorted"))
    return out


def _long_bags(p, device="cuda", seed=0):
    """Inputs with bags of every length a chunked variant treats apart: empty, shorter than a chunk,
    a chunk and one more, many chunks, and one longer than the chunks its call plans for (its
    last chunk takes the rest), with ids of the problem's distribution."""
    import torch

    g = torch.Generator().manual_seed(seed)
    sizes = torch.tensor([0, 1, 31, 32, 33, 64, 65, 300, 0, 3000, 129, 7] + [150] * 20)
    n = int(sizes.sum())
    ids = torch.randint(0, p.rows, (n,), generator=g)
    if p.distribution == "one_hot":
        ids = torch.where(torch.rand(n, generator=g) < 0.5, ids[:1].expand(n), ids)
    dtype = getattr(torch, p.weight)
    w = torch.randn(p.rows, p.dim, generator=g).to(dtype)
    offs = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)[:-1]])
    psw = (torch.rand(n, generator=g) + 0.5).to(dtype)
    index = getattr(torch, p.index)
    return w.to(device), ids.to(index).to(device), offs.to(index).to(device), psw.to(device)


def _close(got, want, dtype):
    import torch

    err = float((got.double() - want).abs().max()) if got.numel() else 0.0
    scale = float(want.abs().max()) if want.numel() else 1.0
    return err <= TOL[dtype] * max(scale, 1.0), err


@pytest.mark.parametrize("mode", eb.MODES)
def test_every_variant_matches_the_reference_forward_and_backward(kernels, mode):
    for v, k in kernels:
        for dist in eb.DISTRIBUTIONS:
            p = eb.Problem(rows=3000, dim=40 if v["vec"] != 8 else 48, bags=67, bag_size=9, mode=mode,
                           weight=v["weight"], index=v["index"], distribution=dist)
            err, failed = check_case(k, p, mode, seed=11, padding=dist == "multi_hot")
            assert not failed, f"{v.name} {mode} {dist}: {failed} error {err}"
            assert k.take_errors() == 0, v.name


@pytest.mark.parametrize("mode", eb.MODES)
def test_chunked_bags_match_the_reference(kernels, mode):
    """Long bags cut into chunks (and the search's own check on bags of up to 300 ids): forward,
    backward, per_sample_weights, padding_idx, empty bags, a bag longer than the planned chunks."""
    import torch

    from tuner.measure.accuracy import relative_error

    for v, k in kernels:
        if v["split"] is None:
            continue
        for dist in ("random", "one_hot"):
            p = eb.Problem(rows=4000, dim=40 if v["vec"] != 8 else 48, bags=64, bag_size=600, mode=mode,
                           weight=v["weight"], index=v["index"], distribution=dist)
            err, failed = check_case(k, p, mode, seed=3, padding=dist == "one_hot")
            assert not failed, f"{v.name} {mode} {dist}: {failed} error {err}"
            w, idx, offs, psw = _long_bags(p, seed=5)
            psw = psw if mode == "sum" else None
            for pad in (None, int(idx[40])):
                out = torch.full((offs.numel(), p.dim), float("nan"), dtype=w.dtype, device="cuda")
                call, saved = k.prepare(w, idx, offs, mode, psw, padding_idx=pad, out=out)
                call()
                want, _ = eb.reference(w, idx, offs, mode, psw, padding_idx=pad)
                assert relative_error(out, want) <= TOL[v["weight"]], (v.name, mode, dist, pad)
                g = torch.randn(offs.numel(), p.dim, device="cuda").to(w.dtype)
                grad_w, grad_psw = k.backward(saved, g, psw_grad=psw is not None)
                want_w, want_psw = references.embedding_bag_backward(w, idx, offs, mode, psw, g, padding_idx=pad)
                assert grad_close(grad_w, want_w, v["weight"]), (v.name, mode, pad)
                if psw is not None:
                    assert grad_close(grad_psw, want_psw, v["weight"]), v.name
            assert k.take_errors() == 0, v.name


def test_chunked_bags_are_deterministic_and_leave_the_counters_zeroed(kernels):
    """Two runs give the same bits (partials added in chunk order, whichever chunk ends last), and
    each run writes every bag into a NaN-filled output: a counter left non-zero by one run would
    leave the next run's bags unwritten."""
    import torch

    for v, k in kernels:
        if v["split"] is None:
            continue
        p = eb.Problem(rows=3000, dim=64, bags=40, bag_size=500, weight=v["weight"], index=v["index"])
        w, idx, offs, psw = _long_bags(p, seed=8)
        for mode in eb.MODES:
            runs = []
            for _ in range(3):
                out = torch.full((offs.numel(), p.dim), float("nan"), dtype=w.dtype, device="cuda")
                _, maxi, count = k.forward(w, idx, offs, mode, psw if mode == "sum" else None, out=out)
                runs.append((out.clone(), None if maxi is None else maxi.clone(), count.clone()))
            for again in runs[1:]:
                assert torch.equal(runs[0][0], again[0]) and not again[0].isnan().any(), (v.name, mode)
                if mode == "max":
                    assert torch.equal(runs[0][1], again[1]), v.name
                if mode == "mean":
                    assert torch.equal(runs[0][2], again[2]), v.name


def test_chunked_bags_report_bad_input_in_any_chunk(kernels):
    import torch

    for v, k in kernels:
        if v["split"] is None:
            continue
        p = eb.Problem(rows=100, dim=16, bags=12, bag_size=300, weight=v["weight"], index=v["index"])
        w, idx, offs, _ = _long_bags(p, seed=4)
        bad = idx.clone()
        bad[int(offs[9]) + 2000] = 10**6  # the 3000-id bag's last chunk
        k.forward(w, bad, offs, "sum")
        torch.cuda.synchronize()
        assert (k.take_errors() & 1) == (0 if v["validation"] == "none" else 1), v.name
        wrong = offs.clone()
        wrong[10] = 10**6
        k.forward(w, idx, wrong, "max")
        torch.cuda.synchronize()
        assert (k.take_errors() & 2) == (0 if v["validation"] == "none" else 2), v.name
        out, _, _ = k.forward(w, idx, offs, "sum")  # good input again: nothing reported, every bag written
        torch.cuda.synchronize()
        assert k.take_errors() == 0 and not out.isnan().any(), v.name


def _sliced():
    """Variants whose groups have more lanes than a row needs, so that they gather as slices: 16-bit
    rows of 128 with 16-byte loads (a warp: 2 slices; a block of 256: 16), float32 rows of 64 with
    8 lanes of a subwarp and 4 elements each (1 slice, the control) and of a warp (2); whole bags
    in order and longest first (every bag gathered in exactly one of the grid's passes)."""
    out = []
    for w, vec in (("float16", 8), ("bfloat16", 8), ("float32", 4)):
        for mapping, split, block in (("warp", None, 128), ("warp", 64, 64), ("subwarp", 32, 128), ("block", None, 256)):
            for staging in ("direct", "shared"):
                out.append(eb.space(w, "int64").variant(
                    validation="inline", mapping=mapping, split=split, vec=vec, unroll=2 if staging == "shared" else 4,
                    block_size=block, staging=staging, backward="sorted",
                    order="longest" if split is None and (staging == "shared") == (w == "float32") else None))
    return out


def test_slices_keep_entry_order_in_ties_and_sum_exactly(shared_home):
    """Weights of five integer values (ties everywhere, sums exact in float32) on bags of every
    length: each sliced variant gives the reference's sums, means and counts, and for max the row
    of the first maximum in entry order, which a slice combined out of order would not."""
    import torch

    from tuner import gpus
    from tuner.build import compile as build
    built = build.build(_sliced(), gpus.attached().arch)
    assert all(b.ok for b in built), [b.error for b in built if not b.ok][:1]
    for b in built:
        v, k = b.variant, Bag(b.so, b.variant.name, b.entry)
        dim = 64 if v["weight"] == "float32" else 128
        p = eb.Problem(rows=500, dim=dim, bags=32, bag_size=300, weight=v["weight"], index=v["index"])
        w, idx, offs, _ = _long_bags(p, seed=9)
        w = torch.randint(-2, 3, w.shape, generator=torch.Generator().manual_seed(9)).to(w.dtype).cuda()
        for mode in eb.MODES:
            nan = torch.full((offs.numel(), dim), float("nan"), dtype=w.dtype, device="cuda")
            out, maxi, count = k.forward(w, idx, offs, mode, out=nan)  # a bag left out stays NaN
            want, want_rows = eb.reference(w, idx, offs, mode)
            if mode == "mean":  # a float32 quotient, rounded again to 16 bits: within a rounding
                assert _close(out, want, v["weight"])[0], (v.name, mode)
                sizes = offs.diff(append=offs.new_tensor([idx.numel()]))
                assert torch.equal(count.long(), sizes.long()), v.name
            else:
                assert torch.equal(out, want.to(out.dtype)), (v.name, mode)
            if mode == "max":
                assert torch.equal(maxi, want_rows.long()), v.name
        if v["order"] == "longest":  # bags long enough for the grid's passes: the search's own check
            for mode in eb.MODES:
                q = eb.Problem(rows=3000, dim=dim, bags=67, bag_size=150, mode=mode, weight=v["weight"], index=v["index"])
                err, failed = check_case(k, q, mode, seed=2, padding=True)
                assert not failed, (v.name, mode, failed, err)
        assert k.take_errors() == 0, v.name


def test_atomic_backward_merges_a_hot_id(kernels):
    """One id in nearly every entry (windows of 32 equal ids, and mixed ones): the merged atomics
    add the same gradient as the reference."""
    import torch

    for v, k in kernels:
        if v["backward"] != "atomic":
            continue
        p = eb.Problem(rows=500, dim=40 if v["vec"] != 8 else 48, bags=50, bag_size=100, weight=v["weight"],
                       index=v["index"], distribution="one_hot")
        w, idx, offs, psw = eb.make_inputs(**vars(p), seed=6, device="cuda", per_sample_weights=True)
        idx[: idx.numel() // 3] = 7
        g = torch.randn(p.bags, p.dim, device="cuda").to(w.dtype)
        for mode, s in (("sum", psw), ("sum", None), ("mean", None)):
            call, saved = k.prepare(w, idx, offs, mode, s)
            call()
            grad_w, _ = k.backward(saved, g)
            want_w, _ = references.embedding_bag_backward(w, idx, offs, mode, s, g)
            assert grad_close(grad_w, want_w, v["weight"]), (v.name, mode)


@pytest.mark.parametrize("weight", eb.WEIGHT_DTYPES)
def test_reference_on_the_gpu_equals_the_reference_on_the_cpu(weight):
    """The search's checks compute the reference on the GPU: same answers as on the CPU, and they
    stay on the GPU."""
    import torch

    p = eb.Problem(rows=300, dim=24, bags=40, bag_size=6, weight=weight, distribution="one_hot")
    for mode in eb.MODES:
        w, idx, offs, psw = eb.make_inputs(**vars(p), seed=3, per_sample_weights=mode == "sum")
        g = torch.randn(p.bags, p.dim, generator=torch.Generator().manual_seed(3)).to(w.dtype)
        for pad in (None, int(idx[0])):
            cpu = (*eb.reference(w, idx, offs, mode, psw, padding_idx=pad),
                   *references.embedding_bag_backward(w, idx, offs, mode, psw, g, padding_idx=pad))
            cw, ci, co, cp, cg = (t.cuda() if t is not None else None for t in (w, idx, offs, psw, g))
            gpu = (*eb.reference(cw, ci, co, mode, cp, padding_idx=pad),
                   *references.embedding_bag_backward(cw, ci, co, mode, cp, cg, padding_idx=pad))
            for want, got in zip(cpu, gpu):
                assert (want is None) == (got is None)
                if want is not None:
                    assert got.device.type == "cuda"
                    torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12)


def test_sorted_backward_is_deterministic(kernels):
    import torch

    for v, k in kernels:
        if v["backward"] != "sorted":
            continue
        p = eb.Problem(rows=2000, dim=64, bags=64, bag_size=40, weight=v["weight"], index=v["index"],
                       distribution="one_hot")
        w, idx, offs, _ = eb.make_inputs(**vars(p), seed=5, device="cuda")
        g = torch.randn(p.bags, p.dim, device="cuda").to(w.dtype)
        call, saved = k.prepare(w, idx, offs, "mean")
        call()
        first, _ = k.backward(saved, g)
        for _ in range(3):
            again, _ = k.backward(saved, g)
            assert torch.equal(first, again), v.name


def test_padding_idx_2d_indices_and_a_dim_not_a_multiple_of_vec(kernels):
    import torch
    import torch.nn.functional as F

    for v, k in kernels[:12]:
        p = eb.Problem(rows=500, dim=37, bags=20, bag_size=5, weight=v["weight"], index=v["index"],
                       distribution="one_hot")
        w, idx, offs, _ = eb.make_inputs(**vars(p), seed=2, device="cuda")
        pad = int(idx[0])
        for mode in eb.MODES:
            got, _, _ = k.forward(w, idx, offs, mode, padding_idx=pad)
            want = F.embedding_bag(idx.cpu().long(), w.cpu().double(), offs.cpu().long(), mode=mode, padding_idx=pad)
            assert _close(got.cpu(), want, v["weight"])[0], (v.name, mode)
        grid = idx[:36].reshape(6, 6)
        got, _, _ = k.forward(w, grid, None, "sum")
        assert _close(got.cpu(), F.embedding_bag(grid.cpu().long(), w.cpu().double(), mode="sum"), v["weight"])[0]
        torch.cuda.synchronize()


def test_bad_indices_and_offsets_are_reported_not_read(kernels):
    import torch

    for v, k in kernels:
        p = eb.Problem(rows=100, dim=16, bags=8, bag_size=4, weight=v["weight"], index=v["index"])
        w, idx, offs, _ = eb.make_inputs(**vars(p), seed=4, device="cuda")
        bad = idx.clone()
        bad[len(bad) // 2] = 10**6
        k.forward(w, bad, offs, "sum")
        torch.cuda.synchronize()
        bits = k.take_errors()
        if v["validation"] == "none":
            assert bits == 0
        else:
            assert bits & 1, v.name
        wrong = offs.clone()
        wrong[3] = 10**6
        k.forward(w, idx, wrong, "mean")
        torch.cuda.synchronize()
        bits = k.take_errors()
        assert (bits & 2) if v["validation"] != "none" else bits == 0, v.name
    k.forward(w, idx, offs, "sum")  # the context is alive
    torch.cuda.synchronize()


# ------------------------------------------------------------------ the op

@pytest.fixture(scope="module")
def op(shared_home, tmp_path_factory):
    """tuner.load of an artifact with winners per dtype pair: an atomic one for float32, for bfloat16
    a block-per-bag forward joined to a sorted backward of another variant (`Variant.joined`), and
    one that cuts bags into chunks for float16; the int32 pairs are torch's. Loaded with
    baseline=False, so that the variants serve every shape and mode of their pairs."""
    import tuner
    from tuner import gpus
    from tuner.deploy import export
    from tuner.variant import Variant

    winners = []
    for weight, backward, validation, split in (("float32", "atomic", "hoisted", None),
                                                ("bfloat16", "sorted", "inline", None),
                                                ("float16", "sorted", "inline", 32)):
        params = {"weight": weight, "index": "int64", "validation": validation, "mapping": "warp", "split": split,
                  "vec": 4, "unroll": 4, "block_size": 128, "staging": "shared", "backward": backward}
        problem = eb.Problem(weight=weight, mode="mean").__dict__
        variant = Variant.of(eb.FAMILY, params)
        if weight == "bfloat16":
            variant = Variant.joined(variant.replace(mapping="block", vec=8, unroll=1, block_size=256,
                                                     staging="direct"), variant)
        winners.append({"variant": variant, "problem": problem})
    out = export.write(tmp_path_factory.mktemp("eb-artifact"), winners, gpus.attached().describe())
    return oploader.load(out, validate="sync", baseline=False)


@pytest.mark.parametrize("weight", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("index", ["int64", "int32"])
def test_op_forward_and_backward_match_torch(op, weight, index):
    import warnings

    import torch
    import torch.nn.functional as F

    p = eb.Problem(rows=4000, dim=64, bags=50, bag_size=12, weight=weight, index=index, distribution="multi_hot")
    w, idx, offs, psw = eb.make_inputs(**vars(p), seed=9, device="cuda", per_sample_weights=True)
    tol = dict(atol=TOL[weight] * 4, rtol=TOL[weight] * 4)
    for mode in eb.MODES:
        for kwargs in ({}, {"include_last_offset": True}, {"padding_idx": int(idx[1])}):
            offsets = torch.cat([offs, offs.new_tensor([idx.numel()])]) if kwargs.get("include_last_offset") else offs
            s = psw.clone().requires_grad_() if mode == "sum" else None
            s2 = psw.clone().requires_grad_() if mode == "sum" else None
            a, b = w.clone().requires_grad_(), w.clone().requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # untuned pairs warn once
                got = op(a, idx, offsets, mode, s, **kwargs)
            want = F.embedding_bag(idx, b, offsets, mode=mode, per_sample_weights=s2, **kwargs)
            torch.testing.assert_close(got, want, **tol)
            g = torch.randn_like(want)
            got.backward(g)
            if weight == "bfloat16":  # torch has no CUDA bfloat16 backward for max or per_sample_weights
                want_w, want_psw = references.embedding_bag_backward(w, idx, offsets, mode, psw if s is not None else None, g,
                                                         **kwargs)
                torch.testing.assert_close(a.grad.double(), want_w, **tol)  # the reference stays on the GPU
                if s is not None:
                    torch.testing.assert_close(s.grad.double(), want_psw, **tol)
                continue
            want.backward(g)
            if weight == "float16":  # torch's float16 max backward adds with 16-bit atomics, in whatever order
                # they land: two runs of it differ by a few units in the last place of the row's largest sum
                torch.testing.assert_close(a.grad, b.grad, rtol=tol["rtol"], atol=tol["atol"] * float(b.grad.abs().max()))
            else:
                torch.testing.assert_close(a.grad, b.grad, **tol)
            if s is not None:
                torch.testing.assert_close(s.grad, s2.grad, **tol)


def test_op_2d_indices_empty_bags_and_errors(op):
    import torch
    import torch.nn.functional as F

    KernelInputError = oploader.kernel_input_error("embedding_bag")

    w = torch.randn(100, 16, device="cuda")
    grid = torch.randint(0, 100, (7, 5), device="cuda")
    torch.testing.assert_close(op(w, grid, None, "max"), F.embedding_bag(grid, w, mode="max"))
    idx = torch.randint(0, 100, (10,), device="cuda")
    offs = torch.tensor([0, 0, 4, 4, 10], device="cuda")  # empty bags, and the last one
    for mode in eb.MODES:
        torch.testing.assert_close(op(w, idx, offs, mode), F.embedding_bag(idx, w, offs, mode=mode))
    with pytest.raises(KernelInputError, match="outside"):
        op(w, idx.clone().fill_(100), offs, "sum")
    with pytest.raises(KernelInputError, match="offsets"):
        op(w, idx, torch.tensor([0, 5, 3], device="cuda"), "sum")
    with pytest.raises(ValueError, match="per_sample_weights"):
        op(w, idx, offs, "mean", torch.ones(10, device="cuda"))
    from tuner.families.embedding_bag.op import embedding_bag

    for other in ({"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True}):  # torch's function serves
        torch.testing.assert_close(embedding_bag(idx, w.clone(), offs, **other),
                                   F.embedding_bag(idx, w.clone(), offs, **other))
    torch.testing.assert_close(op(w, idx, offs, "sum"), F.embedding_bag(idx, w, offs, mode="sum"))  # alive


def test_float16_max_gradient_is_rounded_once_where_torch_s_adds_in_16_bits(op):
    """PyTorch's OpInfo found the float16 `max` weight gradient (2-D non-contiguous indices) at its
    tolerance's edge against torch's: torch adds a row's gradients with 16-bit atomics, rounding at
    each add, where the variant adds in float32 and rounds once. So the variant's gradient is within
    a unit in the last place of float64's everywhere (and no farther from it than torch's)."""
    import torch
    import torch.nn.functional as F

    for seed in range(6):
        g = torch.Generator(device="cuda").manual_seed(seed)
        rows, dim = (10, 5) if seed % 2 else (50, 37)
        w = torch.randn(rows, dim, device="cuda", generator=g).half()
        idx = torch.randint(0, rows, (6, 4), device="cuda", generator=g).t()  # 4 bags of 6, not contiguous
        go = torch.randn(idx.shape[0], dim, device="cuda", generator=g).half()
        a, b, c = w.clone().requires_grad_(), w.clone().requires_grad_(), w.double().requires_grad_()
        op(a, idx, None, "max").backward(go)
        F.embedding_bag(idx, b, mode="max").backward(go)
        from tuner.families.embedding_bag.op import reference

        reference(c, idx, None, "max").backward(go.double())
        mine, torch_s = (a.grad.double() - c.grad).abs(), (b.grad.double() - c.grad).abs()
        assert bool((mine <= 2.0 ** -10 * c.grad.abs() + 6e-8).all()), float(mine.max())
        assert float(mine.max()) <= float(torch_s.max())


def test_op_opcheck_and_compile(op):
    import torch
    import torch.nn.functional as F

    w = torch.randn(300, 32, device="cuda", requires_grad=True)
    idx = torch.randint(0, 300, (90,), device="cuda")
    offs = torch.arange(0, 90, 9, device="cuda")
    for mode in eb.MODES:
        torch.library.opcheck(torch.ops.tuner.embedding_bag.default, (w, idx, offs, mode, None, False, None))

    def step(weight, i, o):
        return op(weight, i, o, "mean").square().sum()

    compiled = torch.compile(step, fullgraph=True)
    a = w.detach().clone().requires_grad_()
    compiled(a, idx, offs).backward()
    b = w.detach().clone().requires_grad_()
    F.embedding_bag(idx, b, offs, mode="mean").square().sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_op_chunked_long_bags_autograd_and_cuda_graphs(op):
    """The float16 winner cuts bags into chunks: long bags through the op (autograd, 2-D indices,
    include_last_offset, padding_idx), and replays of a CUDA graph that captured it (its scratch
    from the graph's pool, its counters from the stream's workspace) give the eager result."""
    import torch

    p = eb.Problem(rows=3000, dim=64, bags=32, bag_size=300, weight="float16")
    w, idx, offs, psw = _long_bags(p, seed=12)
    tol = dict(atol=TOL["float16"] * 8, rtol=TOL["float16"] * 8)
    for mode in eb.MODES:
        for kwargs in ({}, {"include_last_offset": True}, {"padding_idx": int(idx[3])}):
            offsets = torch.cat([offs, offs.new_tensor([idx.numel()])]) if kwargs.get("include_last_offset") else offs
            s = psw.clone().requires_grad_() if mode == "sum" else None
            a = w.clone().requires_grad_()
            got = op(a, idx, offsets, mode, s, **kwargs)
            want, _ = eb.reference(w, idx, offsets, mode, psw if s is not None else None, **kwargs)
            torch.testing.assert_close(got.double(), want, **tol)
            g = torch.randn_like(got)
            got.backward(g)
            want_w, want_psw = references.embedding_bag_backward(w, idx, offsets, mode, psw if s is not None else None, g,
                                                     **kwargs)
            torch.testing.assert_close(a.grad.double(), want_w, **tol)
            if s is not None:
                torch.testing.assert_close(s.grad.double(), want_psw, **tol)
    grid = idx[: 16 * 400].reshape(16, 400)  # 2-D: chunks planned from the row length
    for mode in eb.MODES:
        torch.testing.assert_close(op(w, grid, None, mode).double(), eb.reference(w, grid, None, mode)[0], **tol)
    with torch.no_grad():
        eager = op(w, idx, offs, "max")
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            op(w, idx, offs, "max")  # warm-up on the capture stream
            with torch.cuda.graph(graph, stream=stream):
                captured = op(w, idx, offs, "max")
        torch.cuda.current_stream().wait_stream(stream)
        for _ in range(3):
            captured.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(captured, eager)


@pytest.mark.parametrize("weight", ["float32", "float16"])
def test_op_call_allocates_only_its_output(op, weight):
    """Without grad a call makes its output and nothing else for the usual forms (1-D indices with
    offsets of their dtype, include_last_offset, 2-D indices; max keeps no chosen rows) beside the
    chunks' scratch of a chunked winner on long bags; and it gives the same bits every time."""
    import torch

    p = eb.Problem(rows=2000, dim=64, bags=64, bag_size=10, weight=weight)
    w, idx, offs, psw = eb.make_inputs(**vars(p), seed=3, device="cuda", per_sample_weights=True)
    w.requires_grad_()  # as in training: the Autograd kernel runs, with grad disabled
    ends = torch.cat([offs, offs.new_tensor([idx.numel()])])
    grid, pad = idx[: 60 * 10].reshape(60, 10), int(idx[0])
    calls = [lambda m: op(w, idx, offs, m), lambda m: op(w, idx, ends, m, None, True), lambda m: op(w, grid, None, m),
             lambda m: op(w, idx, offs, "sum", psw) if m == "sum" else op(w, idx, offs, m, None, False, pad)]
    stats = torch.cuda.memory_stats
    with torch.no_grad():
        for mode in eb.MODES:
            for call in calls:
                first = call(mode)
                before = stats()["allocation.all.allocated"]
                again = call(mode)
                assert stats()["allocation.all.allocated"] - before == 1, (weight, mode)
                assert torch.equal(first, again)


def test_a_search_builds_its_mode_and_checks_its_finalists_whole(shared_home):
    """A search builds and checks only its problem's mode (another mode refuses to launch from
    that build); its finalists are built whole and pass the check of every mode before one wins."""
    from tuner import gpus, search
    from tuner.build import compile as build
    from tuner.store import study
    from tuner.measure.declared import Evaluation

    problem = eb.Problem(rows=50_000, bags=512, bag_size=20, mode="max")
    v = eb.covering_set()[0]
    focused, whole = (build.build([v], gpus.attached().arch, focus=f)[0]
                      for f in (eb.search_focus(problem.__dict__), None))
    ev = Evaluation(eb.FAMILY)
    assert ev.check(ev.load(focused.so, v.name, focused.entry), problem.__dict__)["ok"]
    assert ev.check(ev.load(whole.so, v.name, whole.entry), problem.__dict__, whole=True)["ok"]
    with pytest.raises(RuntimeError, match="failed to launch"):
        ev.check(ev.load(focused.so, v.name, focused.entry), problem.__dict__, whole=True)

    report = search.run(search.SearchConfig(gpu="auto", problem=problem, trials=12, progress=False, seed=0,
                                            top_k=3))
    # the top 3, and the best forward joined to the best backward where the search's times call for it
    single = [r for r in report.retimed if "halves" not in r]
    assert report.evaluated >= 6 and report.winner and len(single) == 3 and len(report.retimed) - len(single) <= 1
    assert "rejected" not in study.load(report.study_name).user_attrs


def _peak_bandwidth() -> float:
    """Bytes a second the attached GPU's memory peaks at: its clock (DDR: two transfers a cycle)
    times its bus width, as CUDA's device properties give them."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return 2 * props.memory_clock_rate * 1e3 * props.memory_bus_width / 8


def test_bench_rows_hold_both_floors_beside_the_tuned_op_and_torch(shared_home, tmp_path):
    """`tuner bench --family embedding_bag` on a small configuration: both floors, then the tuned op
    and torch, each checked against the other first; the measured read is no faster than the GPU's
    memory allows (an H100's 3.35 TB/s, an H200's 4.8), and the bandwidth floor is the gathered bytes
    at 3.0 TB/s."""
    from tuner import gpus
    from tuner.deploy import export
    from tuner.report import declared
    from tuner.variant import Variant

    params = {"weight": "float32", "index": "int64", "validation": "hoisted", "mapping": "warp", "split": 64,
              "vec": 4, "unroll": 4, "block_size": 128, "staging": "shared", "backward": "atomic"}
    out = export.write(tmp_path / "artifact", [{"variant": Variant.of(eb.FAMILY, params),
                                                "problem": eb.Problem().__dict__}], gpus.attached().describe())
    p = eb.Problem(rows=200_000, dim=128, bags=512, bag_size=150)
    rows = declared.bench_at(eb.FAMILY, out, [{**vars(p), "per_sample_weights": False}])
    assert [r["impl"] for r in rows] == ["floor: HBM at 3.0 TB/s", "floor: a read of as many bytes",
                                         declared.TUNED, declared.torch_name(eb.FAMILY)]
    ids = eb.make_inputs(**vars(p), seed=0, device="cuda")[1].numel()  # as the bench draws them
    moved = ids * p.dim * 4
    assert rows[0]["fwd_kernel_us"] == pytest.approx(moved / 3.0e6)
    assert moved / (_peak_bandwidth() / 1e6) < rows[1]["fwd_kernel_us"] < 100 * moved / 3.0e6
    assert all(r["fwd_kernel_us"] > 0 and r["fwd_bwd_kernel_us"] > 0 for r in rows[2:])


def test_bad_input_where_torch_serves_is_refused_and_the_process_goes_on(shared_home, tmp_path_factory):
    """Where torch's op serves a call (int32 indices: no variant was tuned for them here; a 1000 x 32
    table far from the tuned problem), a bad index or offset is refused as a variant refuses it, in
    each validate mode, and never reaches torch's device-side assert, which would end the process's
    CUDA context; good calls give torch's results through the guard's copy."""
    import torch
    import torch.nn.functional as F

    from tuner import gpus
    from tuner.deploy import export
    from tuner.variant import Variant

    params = {"weight": "float32", "index": "int64", "validation": "hoisted", "mapping": "warp", "split": None,
              "vec": 4, "unroll": 4, "block_size": 128, "staging": "shared", "backward": "atomic"}
    out = export.write(tmp_path_factory.mktemp("eb-torch-serves"),
                       [{"variant": Variant.of(eb.FAMILY, params), "problem": eb.Problem(weight="float32").__dict__}],
                       gpus.attached().describe())
    op = oploader.load(out, validate="sync")
    rt = oploader.runtime("embedding_bag")
    KernelInputError = rt.KernelInputError
    if oploader.MODE != "wheel":
        assert torch.ops.tuner_embedding_bag.served([1000, 32, 8, 8, 64, -1], torch.float32, torch.int32, 0) == "torch"
    w = torch.randn(1000, 32, device="cuda")
    for dtype in (torch.int32, torch.int64):
        idx = torch.randint(0, 1000, (64,), device="cuda", dtype=dtype)
        offs = torch.arange(0, 64, 8, device="cuda", dtype=dtype)
        for mode in eb.MODES:
            torch.testing.assert_close(op(w, idx, offs, mode), F.embedding_bag(idx, w, offs, mode=mode))
        high, low = idx.clone(), idx.clone()
        high[5], low[0] = 1000, -1
        rt.set_validate("sync")
        for bad in (high, low):
            with pytest.raises(KernelInputError, match="outside"):
                op(w, bad, offs, "sum")
            with pytest.raises(KernelInputError, match="outside"):
                op(w.clone().requires_grad_(), bad, offs, "mean").sum().backward()
        for offsets in ([0, 9, 3], [0, 65]):  # decreasing; beyond the entries
            with pytest.raises(KernelInputError, match="offsets"):
                op(w, idx, torch.tensor(offsets, device="cuda", dtype=dtype), "sum")
        rt.set_validate("async")
        for mode in ("max", "sum"):  # torch's op runs (on offsets put in order: it asserts they never decrease)
            for bad in ((high, offs), (idx, torch.tensor([0, 9, 3, 70], device="cuda", dtype=dtype))):
                op(w, *bad, mode)  # returns; the next call raises
                torch.cuda.synchronize()
                with pytest.raises(KernelInputError, match="earlier call"):
                    op(w, idx, offs, "sum")
        rt.set_validate("deferred")
        op(w, low.view(8, 8), None, "sum")
        with pytest.raises(KernelInputError, match="outside"):
            rt.check_errors()
        op(w, idx, torch.tensor([5, 2, 2, 64], device="cuda", dtype=dtype), "max")
        with pytest.raises(KernelInputError, match="offsets"):
            rt.check_errors()
        rt.set_validate("sync")
        torch.testing.assert_close(op(w, idx, offs, "sum"), F.embedding_bag(idx, w, offs, mode="sum"))
    if oploader.MODE != "wheel":  # the op's own path to torch's op, guard and all: what the export's checks time
        path = rt.torch_path("embedding_bag")
        idx, offs = torch.randint(0, 1000, (64,), device="cuda"), torch.arange(0, 64, 8, device="cuda")
        torch.testing.assert_close(path(w, idx, offs, "max"), F.embedding_bag(idx, w, offs, mode="max"))
        idx[3] = 1000
        with pytest.raises(KernelInputError, match="outside"):
            path(w, idx, offs, "sum")
    torch.cuda.synchronize()  # the context is alive
    assert float(torch.ones(3, device="cuda").sum()) == 3.0


def test_an_export_tuned_at_bags_of_no_entries_loads_and_serves(shared_home, tmp_path):
    """`--bag-size 0` is a problem a search takes: its key's mean bag of 0 is bound as a call's
    sizes are compared (at least 1), not refused when the export is loaded."""
    import torch
    import torch.nn.functional as F

    from tuner import gpus
    from tuner.deploy import export
    from tuner.variant import Variant

    params = {"weight": "float32", "index": "int64", "validation": "hoisted", "mapping": "warp", "split": None,
              "vec": 4, "unroll": 2, "block_size": 128, "staging": "direct", "backward": "atomic"}
    out = export.write(tmp_path / "eb0", [{"variant": Variant.of(eb.FAMILY, params),
                                           "problem": eb.Problem(rows=1000, dim=64, bags=32, bag_size=0).__dict__}],
                       gpus.attached().describe())
    op = oploader.load(out)
    w, i, o, _ = eb.make_inputs(1000, 64, 32, 3, device="cuda", seed=1)
    for mode in eb.MODES:
        torch.testing.assert_close(op(w, i, o, mode), F.embedding_bag(i, w, o, mode=mode))
