"""The tuned ops as drop-ins, on the GPU: RMSNorm with a trained, frozen or absent weight in every
dtype pair; PyTorch's own OpInfo samples and error inputs of F.rms_norm and F.embedding_bag
through the tuned ops' F signatures, every dtype, forward and backward, against torch's op, with
opcheck where the tuned op serves; and `tuner.patch` on a Llama-style model (transformers' own
where it is installed) and a DLRM-style model, trained a few steps beside an unpatched copy,
with frozen norm weights in one run. The exports here are loaded with baseline=False, so that
their variants serve every call of their dtype pairs (not torch's op)."""

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

import tuner
from tuner import gpus, opspec, runtime
from tuner.deploy import export
import tuner.functional as TF
from tuner.families import embedding_bag as eb
from tuner.families import giou, rms_norm
from tuner.variant import Variant

pytestmark = pytest.mark.gpu
PAIRS = list(itertools.product(rms_norm.DTYPES, rms_norm.DTYPES))
# relative (norm) error of the tuned op against torch's op, each computing in its own way
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.complex64: 1e-5, torch.complex128: 1e-10,
       torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(scope="module")
def rms(shared_home, tmp_path_factory):
    """Variants for every dtype pair, so that each pair is served by one."""
    params = dict(threads_per_row=256, block_size=256, vec=8, unroll=2, rstd="saved", grad_weight="partials",
                  bwd_blocks=2, walk="resident")
    winners = [{"variant": rms_norm.space(x, w).nearest(params), "problem": rms_norm.Problem(4096, 4096, x, w).__dict__}
               for x, w in PAIRS]
    return tuner.load(export.write(tmp_path_factory.mktemp("rms"), winners, gpus.attached().describe()),
                      baseline=False)


@pytest.fixture(scope="module")
def bag(shared_home, tmp_path_factory):
    """Variants for every weight dtype with int64 indices (int32 pairs: the same parameters rendered for them)."""
    winners = []
    for weight in eb.WEIGHT_DTYPES:
        params = {"weight": weight, "index": "int64", "validation": "hoisted", "mapping": "warp", "split": None,
                  "vec": 4, "unroll": 4, "block_size": 128, "staging": "shared", "backward": "sorted"}
        winners.append({"variant": Variant.of(eb.FAMILY, params), "problem": eb.Problem(weight=weight).__dict__})
    return tuner.load(export.write(tmp_path_factory.mktemp("bag"), winners, gpus.attached().describe()),
                      baseline=False)


def _close(got, want, dtype, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    if got.numel() == 0:
        return
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)), f"{what}: non-finite elements differ"
    g, w = got[finite].to(torch.complex128 if got.is_complex() else torch.float64), want[finite].to(
        torch.complex128 if want.is_complex() else torch.float64)
    # relative to the norm, with a floor (a gradient that is 0 in exact arithmetic is rounding's)
    err = float((g - w).detach().norm() / (w.detach().norm() + 1e-3 * w.numel() ** 0.5))
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} over {TOL[dtype]}"


# ------------------------------------------------------------ frozen and absent weights

@pytest.mark.parametrize("x_dtype,w_dtype", PAIRS)
@pytest.mark.parametrize("weight", ["trained", "frozen", "none"])
def test_rms_norm_weight_trained_frozen_or_absent(rms, x_dtype, w_dtype, weight):
    assert torch.ops.tuner_rms_norm.served([300, 1024], getattr(torch, x_dtype), getattr(torch, w_dtype)) != "torch"
    x, w = rms_norm.make_inputs(300, 1024, x_dtype, w_dtype, seed=3)
    x.requires_grad_()
    w.requires_grad_(weight == "trained")
    y = rms(x, None if weight == "none" else w, 1e-6)
    g = torch.randn_like(y)
    wants = (x, w) if weight == "trained" else (x,)
    grads = torch.autograd.grad(y, wants, g)
    ref_w = torch.ones(1024, device="cuda", dtype=torch.float64) if weight == "none" else w.detach()
    want_y = rms_norm.reference(x.detach(), ref_w)
    want_gx, want_gw = opspec.reference_gradients(rms_norm.OP_DECLARATION, rms_norm.reference, (x.detach(), ref_w), g)
    _close(y.double(), want_y, x.dtype, "y")
    _close(grads[0].double(), want_gx, x.dtype, "grad x")
    if weight == "trained":
        _close(grads[1].double(), want_gw, w.dtype, "grad weight")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_default_eps_is_torch_s(rms, dtype):
    """nn.RMSNorm's eps=None: torch computes 16-bit x in float32 and takes float32's epsilon."""
    norm = torch.nn.RMSNorm(1024, device="cuda", dtype=dtype)
    x = torch.randn(256, 1024, device="cuda", dtype=dtype) * 1e-3  # small rows, where eps shows
    want = norm(x)
    with tuner.patch(norm):
        _close(norm(x).double(), want.double(), dtype, "y")


def test_frozen_weight_under_compile_and_in_a_module(rms):
    norm = torch.nn.RMSNorm(2048, eps=1e-6, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 2048, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    # a loss whose gradient is not rounding noise: the sum of squares of a normalized row is its
    # width whatever x is (its gradient cancels to ~0), a weighted sum is not
    c = torch.randn(64, 2048, device="cuda", generator=g)

    def loss(x):
        return (norm(x).float() * c).sum()

    want = torch.autograd.grad(loss(x), x)[0]
    with tuner.patch(norm) as patched:
        assert patched.modules == [("", "rms_norm")]
        got = torch.autograd.grad(loss(x), x)[0]
        compiled = torch.compile(loss, fullgraph=True)
        got_compiled = torch.autograd.grad(compiled(x), x)[0]
    assert "forward" not in norm.__dict__
    _close(got.float(), want.float(), torch.bfloat16, "grad x")
    _close(got_compiled.float(), want.float(), torch.bfloat16, "grad x, compiled")


def test_functional_form_decides_in_the_binding(rms, monkeypatch):
    """TF.rms_norm's calls the op takes are decided and sent in the binding's C++: with the Python
    form's way to the op gone, such a call still runs the op (its very answer), and one the op does
    not take (float64) is F.rms_norm's."""
    x, w = rms_norm.make_inputs(64, 2048, "bfloat16", "float32", seed=5)
    want = rms(x, w, 1e-6)
    monkeypatch.setattr(runtime, "entry", lambda op: pytest.fail("the Python form decided a call the op takes"))
    torch.testing.assert_close(TF.rms_norm(x, (2048,), w, 1e-6), want, rtol=0, atol=0)
    torch.testing.assert_close(TF.rms_norm(x, [2048], weight=w), rms(x, w, torch.finfo(torch.float32).eps),
                               rtol=0, atol=0)
    xd, wd = x.double(), w.double()
    torch.testing.assert_close(TF.rms_norm(xd, (2048,), wd, 1e-6), F.rms_norm(xd, (2048,), wd, 1e-6))


def test_embedding_bag_functional_form_decides_in_the_binding(bag, monkeypatch):
    """As RMSNorm's: TF.embedding_bag's calls the op takes never run the Python form; max_norm's is torch's."""
    table = torch.randn(1000, 64, device="cuda")
    ids = torch.randint(0, 1000, (400,), device="cuda")
    offsets = torch.arange(0, 400, 20, device="cuda")
    psw = torch.rand(400, device="cuda")
    want = bag(table, ids, offsets, "sum", psw)
    monkeypatch.setattr(runtime, "entry", lambda op: pytest.fail("the Python form decided a call the op takes"))
    torch.testing.assert_close(TF.embedding_bag(ids, table, offsets, mode="sum", per_sample_weights=psw), want,
                               rtol=0, atol=0)
    torch.testing.assert_close(TF.embedding_bag(ids, table.clone(), offsets, max_norm=1.0),
                               F.embedding_bag(ids, table.clone(), offsets, max_norm=1.0))


def test_calls_torch_refuses_get_torch_s_errors_from_both_forms(rms, bag):
    """A weight on another device than x, and a padding_idx outside the table or a mode torch does
    not know, go to torch's function from the binding's C++ form and from the Python form: its
    errors (a RuntimeError for the device and the padding_idx), as code catching torch's expects."""
    from tuner import entries

    x, w = rms_norm.make_inputs(64, 2048, "bfloat16", "bfloat16", seed=5)
    for form in (TF.rms_norm, entries._python_forms["rms_norm"]):
        with pytest.raises(RuntimeError):
            form(x, (2048,), w.cpu())
    table = torch.randn(10, 64, device="cuda")
    ids = torch.randint(0, 10, (40,), device="cuda")
    offsets = torch.arange(0, 40, 8, device="cuda")
    for form in (TF.embedding_bag, entries._python_forms["embedding_bag"]):
        for pad in (10, -11):
            with pytest.raises(RuntimeError, match="padding_idx must be within the number of embeddings"):
                form(ids, table, offsets, padding_idx=pad)
        torch.testing.assert_close(form(ids, table, offsets, padding_idx=-10), F.embedding_bag(ids, table, offsets,
                                                                                                padding_idx=-10))
        with pytest.raises(ValueError, match="mode has to be one of sum, mean or max"):
            form(ids, table, offsets, mode="avg")


# ------------------------------------------------------------ PyTorch's OpInfo samples

def _opinfo(name):
    pytest.importorskip("expecttest")  # torch.testing._internal needs it
    from torch.testing._internal.common_methods_invocations import op_db

    return next(o for o in op_db if o.name == name and o.variant_test_name == "")


def _leaves(sample):
    """A fresh copy of a sample's tensors per call (max_norm renormalizes the table in place)."""
    def fresh(t):
        return t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
    return fresh(sample.input), [fresh(a) for a in sample.args], {k: fresh(v) for k, v in sample.kwargs.items()}


def _run(fn, sample, seed):
    x, args, kwargs = _leaves(sample)
    out = fn(x, args, kwargs)
    wanted = [t for t in [x, *args, *kwargs.values()] if isinstance(t, torch.Tensor) and t.requires_grad]
    if not (out.requires_grad and wanted and out.numel()):
        return out, []
    g = torch.randn(out.shape, generator=torch.Generator("cuda").manual_seed(seed), device="cuda", dtype=out.dtype)
    return out, torch.autograd.grad(out, wanted, g, allow_unused=True)


def _samples_match(opinfo, tuned, torch_op):
    dtypes = sorted(opinfo.supported_dtypes("cuda"), key=str)
    count = 0
    for dtype in dtypes:
        grad = opinfo.supports_autograd and dtype in opinfo.supported_backward_dtypes("cuda")
        for i, sample in enumerate(opinfo.sample_inputs("cuda", dtype, requires_grad=grad)):
            got, got_grads = _run(tuned, sample, i)
            want, want_grads = _run(torch_op, sample, i)
            what = f"{opinfo.name} {dtype} sample {i}"
            _close(got, want, dtype, what)
            assert len(got_grads) == len(want_grads)
            for a, b in zip(got_grads, want_grads):
                assert (a is None) == (b is None), what
                if a is not None:
                    _close(a, b, dtype, f"{what}, gradient")
            count += 1
    for e in opinfo.error_inputs("cuda") if opinfo.error_inputs_func is not None else ():
        x, args, kwargs = _leaves(e.sample_input)
        with pytest.raises(e.error_type, match=e.error_regex):
            tuned(x, args, kwargs)
    return count, len(dtypes)


def test_rms_norm_opinfo_samples_and_errors(rms):
    opinfo = _opinfo("nn.functional.rms_norm")
    count, dtypes = _samples_match(opinfo, lambda x, a, k: TF.rms_norm(x, *a, **k),
                                   lambda x, a, k: opinfo.op(x, *a, **k))
    assert count >= 6 * dtypes
    for sample in opinfo.sample_inputs("cuda", torch.bfloat16, requires_grad=True):  # where the op serves
        x, (shape, *rest), kwargs = _leaves(sample)
        if len(shape) == 1 and x.numel():
            weight = rest[0] if rest else kwargs.get("weight")
            torch.library.opcheck(torch.ops.tuner.rms_norm, (x, weight, kwargs.get("eps", 1e-6)))


def test_embedding_bag_opinfo_samples(bag):
    opinfo = _opinfo("nn.functional.embedding_bag")
    count, dtypes = _samples_match(opinfo, lambda w, a, k: TF.embedding_bag(a[0], w, *a[1:], **k),
                                   lambda w, a, k: opinfo.op(w, *a, **k))
    assert count >= 20 * dtypes
    for sample in opinfo.sample_inputs("cuda", torch.float32, requires_grad=True):
        w, (indices,), kwargs = _leaves(sample)
        if kwargs.get("max_norm") is None and not kwargs.get("scale_grad_by_freq") and not kwargs.get("sparse"):
            torch.library.opcheck(torch.ops.tuner.embedding_bag, (
                w, indices, kwargs.get("offsets"), kwargs.get("mode", "mean"), kwargs.get("per_sample_weights"),
                kwargs.get("include_last_offset", False), kwargs.get("padding_idx")))


# ------------------------------------------------------------ torchvision's GIoU loss

@pytest.fixture(scope="module")
def box_loss(shared_home, tmp_path_factory):
    """One bfloat16/uint8 winner: its parameters serve every dtype pair (GIoU's export)."""
    variant = giou.space("bfloat16", "uint8").variant(
        boxes_per_thread=2, padding="branch", validation="hoisted", block_size=256, loads="vector",
        reduction="atomic", backward="recompute")
    return tuner.load(export.write(tmp_path_factory.mktemp("giou"), [{"variant": variant,
                      "problem": giou.Problem().__dict__}], gpus.attached().describe()), baseline=False)


def _boxes(n, dtype, seed):
    g = torch.Generator("cuda").manual_seed(seed)
    corner = torch.rand(n, 2, device="cuda", generator=g) * 200
    side = torch.rand(n, 2, device="cuda", generator=g) * 50 + 1
    return torch.cat([corner, corner + side], -1).to(dtype).reshape(*(() if n == 1 else (n,)), 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("n", [1, 37, 5000])
def test_torchvision_giou_loss_forms(box_loss, dtype, reduction, n):
    tv = pytest.importorskip("torchvision.ops")
    pred, target = _boxes(n, dtype, 0), _boxes(n, dtype, 1)
    pred = (pred + torch.randn_like(pred) * 10).requires_grad_()
    for eps in (1e-7, 1e-3):
        got = TF.generalized_box_iou_loss(pred, target, reduction, eps)
        ref = pred.detach().double().requires_grad_()  # torchvision's math in float64
        want = tv.generalized_box_iou_loss(ref, target.double(), reduction, eps)
        assert got.dtype == torch.float32 and got.shape == want.shape  # torchvision's dtype for these
        _close(got.double(), want.detach(), dtype, f"loss {reduction} eps {eps}")
        g = torch.randn_like(want)
        (got_grad,) = torch.autograd.grad(got, pred, g.float())
        (want_grad,) = torch.autograd.grad(want, ref, g)
        _close(got_grad.double(), want_grad, dtype, f"gradient {reduction} eps {eps}")


def test_giou_loss_first_called_under_inference_mode_then_trained(box_loss):
    pred, target = _boxes(513, torch.bfloat16, 5), _boxes(513, torch.bfloat16, 6)
    with torch.inference_mode():  # e.g. a sanity check of validation before training
        TF.generalized_box_iou_loss(pred, target, "mean")
    leaf = pred.clone().requires_grad_()
    (grad,) = torch.autograd.grad(TF.generalized_box_iou_loss(leaf, target, "mean"), leaf)
    assert bool(torch.isfinite(grad).all())


def test_torchvision_giou_loss_other_forms_are_torchvision_s(box_loss):
    tv = pytest.importorskip("torchvision.ops")
    a, b = _boxes(64, torch.float32, 2).requires_grad_(), _boxes(64, torch.float32, 3).requires_grad_()
    got = TF.generalized_box_iou_loss(a, b, "sum")  # both sides want gradients: torchvision's way
    want = tv.generalized_box_iou_loss(a, b, "sum")
    torch.testing.assert_close(got, want)
    for x, y in zip(torch.autograd.grad(got, (a, b)), torch.autograd.grad(want, (a, b))):
        torch.testing.assert_close(x, y)
    ints = _boxes(64, torch.float32, 4).round().to(torch.int64)
    torch.testing.assert_close(TF.generalized_box_iou_loss(ints, ints.flip(0), "mean"),
                               tv.generalized_box_iou_loss(ints, ints.flip(0), "mean"))
    with pytest.raises(ValueError, match="Invalid Value for arg 'reduction'"):
        TF.generalized_box_iou_loss(a, b, "max")


# ------------------------------------------------------------ tuner.patch on models

def _train(model, batches, steps: int = 4, lr: float = 1e-2):
    """Losses of a few SGD steps, and the first step's gradients by parameter name (taken where
    both models still have the same weights)."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses, grads = [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(*batches[step % len(batches)])
        loss.backward()
        losses.append(float(loss))
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
    return losses, grads


def _same_training(model, batches, dtype, serve, expected):
    patched_model = copy.deepcopy(model)
    patched = tuner.patch(patched_model)
    assert sorted({f for _, f in patched.modules}) == serve and len(patched.modules) == expected, patched.modules
    want_losses, want_grads = _train(model, batches)
    got_losses, got_grads = _train(patched_model, batches)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(want_losses), rtol=tol, atol=tol)
    assert got_grads.keys() == want_grads.keys()
    for name in want_grads:
        _close(got_grads[name].float(), want_grads[name].float(), torch.float32 if dtype == torch.float32
               else torch.bfloat16, f"gradient of {name}")
    patched.undo()
    assert all("forward" not in m.__dict__ for m in patched_model.modules())


class Block(torch.nn.Module):
    """A Llama-style block: pre-norm attention and a gated MLP, nn.RMSNorm before each."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = torch.nn.RMSNorm(hidden, eps=1e-6), torch.nn.RMSNorm(hidden, eps=1e-6)
        self.qkv, self.out = torch.nn.Linear(hidden, 3 * hidden, bias=False), torch.nn.Linear(hidden, hidden, bias=False)
        self.gate_up = torch.nn.Linear(hidden, 8 * hidden // 3 * 2, bias=False)
        self.down = torch.nn.Linear(8 * hidden // 3, hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class TinyLlama(torch.nn.Module):
    def __init__(self, vocab=512, hidden=256, layers=2, heads=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.blocks = torch.nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-6)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _ids(vocab, batch=4, seq=128, n=2):
    g = torch.Generator("cuda").manual_seed(0)
    return [(torch.randint(0, vocab, (batch, seq), device="cuda", generator=g),) for _ in range(n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("frozen_norms", [False, True])
def test_patched_llama_style_model_trains_as_unpatched(rms, dtype, frozen_norms):
    torch.manual_seed(0)
    model = TinyLlama().to("cuda", dtype)
    if frozen_norms:  # adapter fine-tuning: the norms' weights stay as they are
        for m in model.modules():
            if isinstance(m, torch.nn.RMSNorm):
                m.weight.requires_grad_(False)
    _same_training(model, _ids(512), dtype, ["rms_norm"], expected=5)


@pytest.mark.parametrize("frozen_norms", [False, True])
def test_patched_transformers_llama_trains_as_unpatched(rms, frozen_norms):
    transformers = pytest.importorskip("transformers")

    class Wrapped(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, labels=ids).loss

    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    model = Wrapped(transformers.LlamaForCausalLM(config)).to("cuda", torch.bfloat16)
    if frozen_norms:
        for n, p in model.named_parameters():
            p.requires_grad_("norm" not in n)
    _same_training(model, _ids(512), torch.bfloat16, ["rms_norm"], expected=5)


class Dlrm(torch.nn.Module):
    """DLRM-style: tables of several sizes and modes (one with scale_grad_by_freq, which torch's
    op serves), their bags concatenated into an MLP."""

    def __init__(self, dtype):
        super().__init__()
        self.tables = torch.nn.ModuleList([
            torch.nn.EmbeddingBag(100_000, 64, mode="sum", dtype=dtype),
            torch.nn.EmbeddingBag(20_000, 64, mode="mean", dtype=dtype),
            torch.nn.EmbeddingBag(5_000, 64, mode="max", dtype=dtype),
            torch.nn.EmbeddingBag(1_000, 64, mode="sum", scale_grad_by_freq=True, dtype=dtype)])
        self.mlp = torch.nn.Sequential(torch.nn.Linear(4 * 64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))

    def forward(self, lookups, target):
        bags = torch.cat([t(ids, offs).float() for t, (ids, offs) in zip(self.tables, lookups)], -1)
        return F.binary_cross_entropy_with_logits(self.mlp(bags).squeeze(-1), target)


def test_patched_dlrm_style_model_trains_as_unpatched(bag):
    g = torch.Generator("cuda").manual_seed(1)
    batches = []
    for _ in range(2):
        lookups = []
        for rows in (100_000, 20_000, 5_000, 1_000):
            lengths = torch.randint(1, 20, (256,), device="cuda", generator=g)
            offsets = torch.cumsum(lengths, 0) - lengths
            lookups.append((torch.randint(0, rows, (int(lengths.sum()),), device="cuda", generator=g), offsets))
        batches.append((lookups, torch.randint(0, 2, (256,), device="cuda", generator=g).float()))
    torch.manual_seed(0)
    model = Dlrm(torch.float32).cuda()
    _same_training(model, batches, torch.float32, ["embedding_bag"], expected=4)
