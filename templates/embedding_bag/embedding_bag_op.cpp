// The torch side of the EmbeddingBag family, compiled once per torch/CUDA version: the
// user's op, tuner::embedding_bag, on the call path of a native op:
// schema, checks, CUDA and Autograd kernels in C++. The winners bound at tuner.load, the
// nearest-problem choice, workspaces, validate modes and control ops come from
// templates/common/tuner_op.h; CPU and fake implementations are registered from Python
// (tuner/families/embedding_bag/op.py). Its baseline is torch's own embedding_bag, which
// serves every call that no variant was tuned to beat.
#include "embedding_bag_abi.h"
#include "tuner_op.h"

namespace tuner_embedding_bag {
namespace {

using namespace tuner_op;

constexpr std::initializer_list<at::ScalarType> kWeights = {at::kFloat, at::kHalf, at::kBFloat16};
constexpr std::initializer_list<at::ScalarType> kIndices = {at::kLong, at::kInt};

std::string error_text(int64_t bits) {
  std::string out;
  if (bits & TUNER_EB_BAD_INDEX) out += "an index is outside [0, num_embeddings)";
  if (bits & TUNER_EB_BAD_OFFSET) out += std::string(out.empty() ? "" : "; ") + "offsets decrease or fall outside [0, len(indices)]";
  return out;
}

int pair_of(const TunerEmbeddingBagVtable* vt) {
  const int w = index_of(vt->weight_dtype, kWeights), i = index_of(vt->index_dtype, kIndices);
  return w < 0 || i < 0 ? -1 : w * 2 + i;
}

// Workspace word 0 holds the error bits; words 1.. are the split variants' arrival counters.
Op<TunerEmbeddingBagVtable> op("embedding_bag", TUNER_EMBEDDING_BAG_ABI, 6, pair_of, error_text, 0,
                               TUNER_EB_ERROR_BITS, /*baseline=*/true);

// ------------------------------------------------------------------ calling a variant

bool has(const at::Tensor& t) { return t.defined() && t.numel() > 0; }

// How the entries split into bags: offsets (bags of them, or bags + 1 with the end), or a
// fixed bag length (2-D indices; offsets undefined).
struct Bags {
  at::Tensor offsets;
  int64_t count = 0, length = -1;
  bool offsets_end = true;
};

Bags with_end(const at::Tensor& offsets) { return Bags{offsets, offsets.numel() - 1, -1, true}; }

// What every call of a variant needs to hold: the variant's dtypes, contiguous inputs on
// one device (indices are read as their numel() entries in order: 1-D, or 2-D with a bag
// length), offsets with the end; the weight aligned for the variant's loads.
void check_call(const TunerEmbeddingBagVtable* vt, const at::Tensor& weight, const at::Tensor& indices,
                const Bags& bags) {
  TORCH_CHECK(weight.is_cuda() && weight.dim() == 2 && weight.is_contiguous(),
              "embedding_bag: weight must be a contiguous 2-D CUDA tensor");
  TORCH_CHECK(std::strcmp(c10::toString(weight.scalar_type()), vt->weight_dtype) == 0, "embedding_bag: variant ",
              vt->name, " takes weight of dtype ", vt->weight_dtype, ", got ", dtype_name(weight.scalar_type()));
  TORCH_CHECK(bags.length < 0 || indices.numel() == bags.count * bags.length,
              "embedding_bag: 2-D indices must hold bags * bag_length entries");
  for (const at::Tensor* t : {&indices, &bags.offsets}) {
    if (t == &bags.offsets && bags.length >= 0) continue;
    TORCH_CHECK(t->device() == weight.device() && (t->dim() == 1 || (t == &indices && bags.length >= 0)) &&
                    t->is_contiguous() &&
                    std::strcmp(c10::toString(t->scalar_type()), vt->index_dtype) == 0,
                "embedding_bag: variant ", vt->name, " takes contiguous 1-D indices and offsets of dtype ",
                vt->index_dtype, " on ", weight.device());
  }
  TORCH_CHECK(bags.count >= 0 && (bags.length >= 0 || bags.offsets.numel() == bags.count + (bags.offsets_end ? 1 : 0)),
              "embedding_bag: offsets must hold one entry per bag (and the end with include_last_offset)");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(weight.data_ptr()) % (vt->vec * weight.element_size()) == 0,
              "embedding_bag: weight must be aligned to ", text(vt->vec * weight.element_size()), " bytes for variant ",
              vt->name);
}

// Groups per bag for a variant that cuts bags into chunks of `chunk` entries: enough for bags
// up to twice the mean length (the PR's bag sizes are uniform in [0, 2 * mean]) or, for 2-D
// indices, for the bag length; a longer bag's last chunk takes the rest. Chosen from sizes the
// host has, so that a call never waits for the device.
int64_t splits(int64_t chunk, int64_t bags, int64_t n, int64_t length) {
  const int64_t longest = length >= 0 ? length : 2 * n / bags + 1;
  return std::max<int64_t>(1, std::min<int64_t>((longest + chunk - 1) / chunk, 4096));
}

void run_forward(const TunerEmbeddingBagVtable* vt, const at::Tensor& weight, const at::Tensor& indices,
                 const Bags& b, int64_t mode, const std::optional<at::Tensor>& psw, int64_t padding_idx,
                 const at::Tensor& out, const at::Tensor& max_indices, const at::Tensor& bag_count, int64_t check) {
  check_call(vt, weight, indices, b);
  const int64_t bags = b.count, dim = weight.size(1);
  TORCH_CHECK(mode >= 0 && mode <= 2, "embedding_bag: mode code must be 0 (sum), 1 (mean) or 2 (max)");
  TORCH_CHECK(out.scalar_type() == weight.scalar_type() && out.is_contiguous() && out.device() == weight.device() &&
                  out.numel() == bags * dim,
              "embedding_bag: out must be a contiguous [bags, dim] tensor of weight's dtype");
  TORCH_CHECK(mode != TUNER_EB_MAX || !has(max_indices) ||
                  (max_indices.scalar_type() == at::kLong && max_indices.numel() == bags * dim &&
                   max_indices.is_contiguous()),
              "embedding_bag: max_indices must be a contiguous int64 [bags, dim] tensor (or empty: not wanted)");
  TORCH_CHECK(!has(bag_count) || (bag_count.scalar_type() == at::kFloat && bag_count.numel() == bags),
              "embedding_bag: bag_count must be a float32 tensor of bags elements");
  if (psw.has_value()) {
    TORCH_CHECK(psw->scalar_type() == weight.scalar_type() && psw->numel() == indices.numel() && psw->is_contiguous() &&
                    psw->device() == weight.device(),
                "embedding_bag: per_sample_weights must be contiguous, of weight's dtype, one per index");
  }
  c10::cuda::CUDAGuard guard(weight.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TunerEmbeddingBagArgs a{};
  a.splits = 1;
  at::Tensor scratch;
  if (vt->split > 0 && bags > 0) a.splits = splits(vt->split, bags, indices.numel(), b.length);
  if (a.splits > 1) {
    // One allocation for the chunks' partials: sums (float), then counts and, for max, rows (int64).
    const int64_t slots = bags * a.splits, sums = (slots * dim * 4 + 15) / 16 * 16;
    scratch = at::empty({sums + slots * 8 + (mode == TUNER_EB_MAX ? slots * dim * 8 : 0)},
                        weight.options().dtype(at::kByte));
    auto* base = static_cast<char*>(scratch.data_ptr());
    a.partials = reinterpret_cast<float*>(base);
    a.partial_counts = reinterpret_cast<long long*>(base + sums);
    a.partial_args = mode == TUNER_EB_MAX ? reinterpret_cast<long long*>(base + sums + slots * 8) : nullptr;
  }
  Workspace& ws = op.workspaces.get(static_cast<int>(weight.get_device()), stream, a.splits > 1 ? 1 + bags : 1);
  if (a.splits > 1) a.arrivals = ws.words + 1;
  a.weight = weight.data_ptr();
  a.indices = indices.data_ptr();
  a.offsets = b.length >= 0 ? nullptr : b.offsets.data_ptr();
  a.bag_length = b.length;
  a.offsets_end = b.offsets_end;
  a.per_sample_weights = psw.has_value() ? psw->data_ptr() : nullptr;
  a.out = out.data_ptr();
  a.max_indices = mode == TUNER_EB_MAX && has(max_indices) ? static_cast<long long*>(max_indices.data_ptr()) : nullptr;
  a.bag_count = has(bag_count) ? bag_count.data_ptr<float>() : nullptr;
  a.rows = weight.size(0);
  a.dim = dim;
  a.bags = bags;
  a.n = indices.numel();
  a.mode = static_cast<int>(mode);
  a.padding_idx = padding_idx;
  a.error_word = ws.words;
  a.error_flags = ws.flags_device;
  op.launch(vt, vt->validates, check, ws, stream, [&] { return vt->forward(&a, stream); });
}

// grad_weight must be zeroed by the caller (the search reuses one buffer and leaves it);
// an empty grad_weight or grad_psw is a gradient not wanted.
void run_backward(const TunerEmbeddingBagVtable* vt, const at::Tensor& grad, const at::Tensor& weight,
                  const at::Tensor& indices, const Bags& b, int64_t mode,
                  const std::optional<at::Tensor>& psw, int64_t padding_idx, const at::Tensor& max_indices,
                  const at::Tensor& bag_count, const at::Tensor& grad_weight, const at::Tensor& grad_psw) {
  check_call(vt, weight, indices, b);
  const int64_t bags = b.count, dim = weight.size(1), n = indices.numel();
  TORCH_CHECK(grad.scalar_type() == weight.scalar_type() && grad.is_contiguous() && grad.numel() == bags * dim &&
                  reinterpret_cast<uintptr_t>(grad.data_ptr()) % (vt->vec * grad.element_size()) == 0,
              "embedding_bag: grad must be a contiguous, aligned [bags, dim] tensor of weight's dtype");
  TORCH_CHECK(!has(grad_weight) || (grad_weight.sizes() == weight.sizes() && grad_weight.is_contiguous() &&
                                     grad_weight.scalar_type() == weight.scalar_type()),
              "embedding_bag: grad_weight must be a contiguous tensor like weight (or empty: not wanted)");
  TORCH_CHECK(mode != TUNER_EB_MAX || max_indices.numel() == bags * dim, "embedding_bag: max needs max_indices");
  TORCH_CHECK(mode != TUNER_EB_MEAN || (bag_count.scalar_type() == at::kFloat && bag_count.numel() == bags),
              "embedding_bag: mean needs the forward's bag_count");
  TORCH_CHECK(!has(grad_psw) || (psw.has_value() && grad_psw.numel() == n && grad_psw.is_contiguous() &&
                                 grad_psw.scalar_type() == weight.scalar_type()),
              "embedding_bag: grad_per_sample_weights must be like per_sample_weights");
  c10::cuda::CUDAGuard guard(weight.device());
  TunerEmbeddingBagBackwardArgs a{};
  at::Tensor sorted, order, bag_of, partials;
  if (vt->sorted && n > 0 && has(grad_weight)) {
    std::tie(sorted, order) = at::sort(indices.view(-1).to(at::kLong), /*stable=*/true, 0, false);
    bag_of = at::full({n}, -1, indices.options().dtype(at::kLong));  // entries before the first offset: no bag
    partials = at::empty({(n + vt->piece - 1) / vt->piece, dim}, weight.options().dtype(at::kFloat));
    a.sorted_rows = static_cast<long long*>(sorted.data_ptr());
    a.order = static_cast<long long*>(order.data_ptr());
    a.bag_of = static_cast<long long*>(bag_of.data_ptr());
    a.partials = partials.data_ptr<float>();
  }
  a.grad_out = grad.data_ptr();
  a.weight = weight.data_ptr();
  a.indices = indices.data_ptr();
  a.offsets = b.length >= 0 ? nullptr : b.offsets.data_ptr();
  a.bag_length = b.length;
  a.offsets_end = b.offsets_end;
  a.per_sample_weights = psw.has_value() ? psw->data_ptr() : nullptr;
  a.max_indices = mode == TUNER_EB_MAX ? static_cast<long long*>(max_indices.data_ptr()) : nullptr;
  a.bag_count = mode == TUNER_EB_MEAN ? bag_count.data_ptr<float>() : nullptr;
  a.grad_weight = has(grad_weight) ? grad_weight.data_ptr() : nullptr;
  a.grad_per_sample_weights = has(grad_psw) ? grad_psw.data_ptr() : nullptr;
  a.rows = weight.size(0);
  a.dim = dim;
  a.bags = bags;
  a.n = n;
  a.mode = static_cast<int>(mode);
  a.padding_idx = padding_idx;
  const int rc = vt->backward(&a, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(rc == 0, "embedding_bag: variant ", vt->name, " backward failed to launch: ",
              cudaGetErrorString(static_cast<cudaError_t>(rc)));
}

// ------------------------------------------------------------------ the op's winners

// What serves a call: the variant nearest in dim and mean bag size, a tuned mode of its own
// preferred (`vt`, whatever the baseline would serve: what the ops below the autograd kernel
// run), and whether the baseline serves it instead (tuner_op.h's choose). A thread's last
// choice is kept with the table it came from (held, so that a table published later is never
// mistaken for it): a call of the same dtypes, dim, mean bag size and mode, the usual case in a
// training loop, takes it without comparing the winners again.
struct Choice {
  const TunerEmbeddingBagVtable* vt = nullptr;  // nullptr: the pair has no variant
  bool baseline = false;
};

// `index`: the dtype the kernels read indices in (int64 where indices and offsets differ, as torch
// promotes), so that the choice made before normalizing is the one the variant's path makes.
Choice choose(const std::shared_ptr<const Table<TunerEmbeddingBagVtable>>& t, const at::Tensor& weight,
              at::ScalarType index, int64_t entries, int64_t bags, int64_t mode) {
  struct Last {
    std::shared_ptr<const Table<TunerEmbeddingBagVtable>> table;
    int pair = -1;
    int64_t dim = 0, per_bag = 0, mode = -1;
    Choice choice;
  };
  thread_local Last last;
  const int pair = index_of(weight.scalar_type(), kWeights) * 2 + index_of(index, kIndices);
  const int64_t dim = weight.size(1), per_bag = entries / std::max<int64_t>(bags, 1);
  if (last.table == t && last.pair == pair && last.dim == dim && last.per_bag == per_bag && last.mode == mode)
    return last.choice;
  const auto& w = op.choose(*t, pair, {dim, per_bag}, mode, [&] {
    return "weight " + dtype_name(weight.scalar_type()) + " and indices " + dtype_name(index);
  });
  const Choice c{op.variant(*t, pair, {dim, per_bag}, mode), w.baseline()};
  last = Last{t, pair, dim, per_bag, mode, c};
  return c;
}

const TunerEmbeddingBagVtable* variant(const Choice& c, const at::Tensor& weight, const at::Tensor& indices) {
  TORCH_CHECK(c.vt != nullptr, "embedding_bag: the loaded export has no variant for weight ",
              dtype_name(weight.scalar_type()), " and indices ", dtype_name(indices.scalar_type()),
              "; tune one (tuner search --family embedding_bag --weight ...) and export again");
  return c.vt;
}

// ------------------------------------------------------------------ the op

int64_t mode_code(c10::string_view mode) {
  if (mode == "sum") return TUNER_EB_SUM;
  if (mode == "mean") return TUNER_EB_MEAN;
  if (mode == "max") return TUNER_EB_MAX;
  TORCH_CHECK_VALUE(false, "embedding_bag: mode must be one of ('sum', 'mean', 'max'), got '", std::string(mode), "'");
}

// torch.nn.functional.embedding_bag's arguments as the kernels take them: contiguous indices
// (2-D ones as they are: the kernels read numel() entries in order), bags from the offsets as
// given (of indices' dtype; int64 for both where they differ, as torch promotes) or from 2-D
// indices' row length, padding_idx >= 0 or -1. No kernel is launched for this, and for the
// usual inputs (contiguous, of one dtype) no op is called either: a call's host time is the
// op's. The checks and messages of the Python implementations (op.py).
struct Normal {
  at::Tensor indices;
  Bags bags;
  int64_t padding_idx;
};

// t contiguous and of dtype, converted only when it is not.
at::Tensor as(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t.contiguous() : t.to(dtype).contiguous();
}

Normal normalize(const at::Tensor& weight, const at::Tensor& indices, const std::optional<at::Tensor>& offsets,
                 int64_t mode, const std::optional<at::Tensor>& psw, bool include_last_offset,
                 std::optional<int64_t> padding_idx) {
  TORCH_CHECK_VALUE(weight.dim() == 2, "embedding_bag: weight must be 2-D [num_embeddings, dim], got ",
                    text(weight.sizes()));
  TORCH_CHECK_TYPE(index_of(weight.scalar_type(), kWeights) >= 0, "embedding_bag: weight must be float32, float16 or "
                   "bfloat16, got ", dtype_name(weight.scalar_type()));
  TORCH_CHECK_TYPE(index_of(indices.scalar_type(), kIndices) >= 0, "embedding_bag: indices must be int32 or int64, got ",
                   dtype_name(indices.scalar_type()));
  TORCH_CHECK_VALUE(indices.device() == weight.device(), "embedding_bag: indices are on ", indices.device(),
                    " but weight is on ", weight.device());
  const int64_t rows = weight.size(0);
  int64_t pad = -1;
  if (padding_idx.has_value()) {
    TORCH_CHECK_VALUE(*padding_idx >= -rows && *padding_idx < rows, "embedding_bag: padding_idx must be within "
                      "[-num_embeddings, num_embeddings) = [", text(-rows), ", ", text(rows), "), got ",
                      text(*padding_idx));
    pad = *padding_idx < 0 ? *padding_idx + rows : *padding_idx;
  }
  if (psw.has_value()) {
    TORCH_CHECK_VALUE(mode == TUNER_EB_SUM, "embedding_bag: per_sample_weights are only supported for mode='sum'");
    TORCH_CHECK_VALUE(psw->sizes() == indices.sizes(), "embedding_bag: per_sample_weights ", text(psw->sizes()),
                      " must have the shape of indices ", text(indices.sizes()));
    TORCH_CHECK_TYPE(psw->scalar_type() == weight.scalar_type(), "embedding_bag: per_sample_weights must have "
                     "weight's dtype ", dtype_name(weight.scalar_type()), ", got ", dtype_name(psw->scalar_type()));
    TORCH_CHECK_VALUE(psw->device() == weight.device(), "embedding_bag: per_sample_weights are on ", psw->device(),
                      " but weight is on ", weight.device());
  }
  if (indices.dim() == 2) {
    TORCH_CHECK_VALUE(!offsets.has_value(), "embedding_bag: offsets must be None when indices are 2-D");
    return {indices.contiguous(), Bags{at::Tensor(), indices.size(0), indices.size(1), false}, pad};
  }
  TORCH_CHECK_VALUE(indices.dim() == 1, "embedding_bag: indices must be 1-D (with offsets) or 2-D, got ",
                    text(indices.sizes()));
  TORCH_CHECK_VALUE(offsets.has_value(), "embedding_bag: offsets are required when indices are 1-D");
  const at::Tensor& o = *offsets;
  TORCH_CHECK_TYPE(index_of(o.scalar_type(), kIndices) >= 0, "embedding_bag: offsets must be int32 or int64, got ",
                   dtype_name(o.scalar_type()));
  TORCH_CHECK_VALUE(o.dim() == 1, "embedding_bag: offsets must be 1-D, got ", text(o.sizes()));
  TORCH_CHECK_VALUE(o.device() == weight.device(), "embedding_bag: offsets are on ", o.device(), " but weight is on ",
                    weight.device());
  TORCH_CHECK_VALUE(!include_last_offset || o.numel() >= 1,
                    "embedding_bag: include_last_offset needs at least one offset");
  const auto dtype = indices.scalar_type() == o.scalar_type() ? o.scalar_type() : at::kLong;  // as torch promotes
  return {as(indices, dtype), Bags{as(o, dtype), o.numel() - (include_last_offset ? 1 : 0), -1, include_last_offset},
          pad};
}


using ForwardOut = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Opt = std::optional<at::Tensor>;

// The forward and backward take the user's arguments as given (the Autograd kernel also
// runs on symbolic shapes under torch.compile, where nothing may be normalized); each
// normalizes on the tensors it runs on.
using BackwardOut = std::tuple<at::Tensor, at::Tensor>;
using ForwardSig = ForwardOut(const at::Tensor&, const at::Tensor&, const Opt&, int64_t, const Opt&, bool,
                              std::optional<int64_t>);
using BackwardSig = BackwardOut(const at::Tensor&, const at::Tensor&, const at::Tensor&, const Opt&, int64_t,
                                const Opt&, bool, std::optional<int64_t>, const at::Tensor&, const at::Tensor&, bool,
                                bool);
using OpSig = at::Tensor(const at::Tensor&, const at::Tensor&, const Opt&, c10::string_view, const Opt&, bool,
                         std::optional<int64_t>);

// per_sample_weights as the kernels read them: numel() entries in the order of indices' (of any shape).
Opt flat(const Opt& psw) {
  if (!psw.has_value()) return std::nullopt;
  return psw->contiguous();
}

// (out, max_indices, bag_count) for the backward; with `save` false only out is made (nothing
// else is allocated, and max does not write the rows it chose).
ForwardOut forward_cuda(const at::Tensor& weight, const at::Tensor& indices, const Opt& offsets, int64_t mode,
                        const Opt& psw, bool include_last_offset, std::optional<int64_t> padding_idx, bool save) {
  TORCH_CHECK_VALUE(mode >= 0 && mode <= 2, "embedding_bag: mode code must be 0, 1 or 2");
  const Normal a = normalize(weight, indices, offsets, mode, psw, include_last_offset, padding_idx);
  const auto t = op.bound();
  if (t->reference) return OnCpu<ForwardSig>::call("tuner::embedding_bag_forward", weight.device(), weight, indices,
                                                   offsets, mode, psw, include_last_offset, padding_idx);
  const int64_t bags = a.bags.count, dim = weight.size(1);
  const Choice c = choose(t, weight, a.indices.scalar_type(), a.indices.numel(), bags, mode);
  const TunerEmbeddingBagVtable* vt = variant(c, weight, a.indices);
  const at::Tensor wt = ready(weight, vt->vec * weight.element_size());
  at::Tensor out = at::empty({bags, dim}, weight.options());
  at::Tensor maxi, count;
  if (save) {
    maxi = at::empty({mode == TUNER_EB_MAX ? bags : 0, dim}, weight.options().dtype(at::kLong));
    count = at::empty({mode == TUNER_EB_MEAN ? bags : 0}, weight.options().dtype(at::kFloat));
  }
  run_forward(vt, wt, a.indices, a.bags, mode, flat(psw), a.padding_idx, out, maxi, count, op.check());
  return {out, maxi, count};
}

ForwardOut embedding_bag_forward_cuda(const at::Tensor& weight, const at::Tensor& indices, const Opt& offsets,
                                      int64_t mode, const Opt& psw, bool include_last_offset,
                                      std::optional<int64_t> padding_idx) {
  return forward_cuda(weight, indices, offsets, mode, psw, include_last_offset, padding_idx, /*save=*/true);
}

// ------------------------------------------------------------------ the baseline

// What the op replaces: torch's embedding_bag, as F.embedding_bag calls it (no max_norm or
// scale_grad_by_freq, sparse=False; 2-D indices flat, with an offset every bag length).
at::Tensor baseline(const at::Tensor& weight, const Normal& a, int64_t mode, const Opt& psw) {
  at::Tensor indices = a.indices, offsets = a.bags.offsets;
  Opt weights = psw;
  if (a.bags.length >= 0) {
    offsets = at::arange(0, indices.numel(), a.bags.length, indices.options());
    indices = indices.reshape(-1);
    if (psw.has_value()) weights = psw->reshape(-1);
  }
  // no padding is nullopt: torch reads a padding_idx of -1 as the last row, as Python's indexing would
  const std::optional<int64_t> padding = a.padding_idx >= 0 ? std::optional<int64_t>(a.padding_idx) : std::nullopt;
  return std::get<0>(at::embedding_bag(weight, indices, offsets, false, mode, false, weights, a.bags.offsets_end,
                                       padding));
}

// The baseline's result where it serves this call, else nothing (a variant does). A graph traced
// with symbolic shapes runs the variants; 2-D indices of no entries too (torch has no offsets for
// them). torch has no bfloat16 backward of max or of per_sample_weights: a call that wants one runs
// the nearest variant, or, in a pair with none, torch's op in float32.
std::optional<at::Tensor> served_by_baseline(const at::Tensor& weight, const at::Tensor& indices, const Opt& offsets,
                                             int64_t mode, const Opt& psw, bool include_last_offset,
                                             std::optional<int64_t> padding_idx, bool grad) {
  if (!weight.is_cuda() || symbolic(weight) || symbolic(indices) || (offsets.has_value() && symbolic(*offsets)))
    return std::nullopt;
  const auto t = op.bound_or_null();
  if (t == nullptr || t->reference || weight.dim() != 2 || index_of(weight.scalar_type(), kWeights) < 0 ||
      index_of(indices.scalar_type(), kIndices) < 0)
    return std::nullopt;  // the variant's path says what is wrong
  // The choice from the arguments as given (normalized only for the baseline: a variant's call
  // pays for that once, in its own path).
  int64_t bags = 0;
  if (indices.dim() == 2 && indices.size(1) > 0) {
    bags = indices.size(0);
  } else if (indices.dim() == 1 && offsets.has_value() && offsets->dim() == 1) {
    bags = offsets->numel() - (include_last_offset ? 1 : 0);
  } else {
    return std::nullopt;
  }
  const at::ScalarType index =
      offsets.has_value() && offsets->scalar_type() != indices.scalar_type() ? at::kLong : indices.scalar_type();
  const Choice c = choose(t, weight, index, indices.numel(), bags, mode);
  if (!c.baseline) return std::nullopt;
  const Normal a = normalize(weight, indices, offsets, mode, psw, include_last_offset, padding_idx);
  if (grad && weight.scalar_type() == at::kBFloat16 && (mode == TUNER_EB_MAX || psw.has_value())) {
    if (c.vt != nullptr) return std::nullopt;
    const Opt wide = psw.has_value() ? Opt(psw->to(at::kFloat)) : std::nullopt;
    return baseline(weight.to(at::kFloat), a, mode, wide).to(weight.scalar_type());
  }
  return baseline(weight, a, mode, psw);
}

at::Tensor embedding_bag_cuda(const at::Tensor& weight, const at::Tensor& indices, const Opt& offsets,
                              c10::string_view mode, const Opt& psw, bool include_last_offset,
                              std::optional<int64_t> padding_idx) {
  if (auto out = served_by_baseline(weight, indices, offsets, mode_code(mode), psw, include_last_offset, padding_idx,
                                    false))
    return *out;
  return std::get<0>(

      forward_cuda(weight, indices, offsets, mode_code(mode), psw, include_last_offset, padding_idx, /*save=*/false));
}

// (d weight or empty, d per_sample_weights shaped like them or empty).
BackwardOut embedding_bag_backward_cuda(const at::Tensor& grad, const at::Tensor& weight, const at::Tensor& indices,
                                        const Opt& offsets, int64_t mode, const Opt& psw, bool include_last_offset,
                                        std::optional<int64_t> padding_idx, const at::Tensor& max_indices,
                                        const at::Tensor& bag_count, bool weight_grad, bool psw_grad) {
  const Normal a = normalize(weight, indices, offsets, mode, psw, include_last_offset, padding_idx);
  const auto t = op.bound();
  if (t->reference) return OnCpu<BackwardSig>::call("tuner::embedding_bag_backward", weight.device(), grad, weight,
                                                    indices, offsets, mode, psw, include_last_offset, padding_idx,
                                                    max_indices, bag_count, weight_grad, psw_grad);
  const Choice c = choose(t, weight, a.indices.scalar_type(), a.indices.numel(), a.bags.count, mode);  // the forward's
  const auto* vt = variant(c, weight, a.indices);
  const int64_t alignment = vt->vec * weight.element_size();
  const at::Tensor wt = ready(weight, alignment);
  const at::Tensor g = ready(grad.to(weight.scalar_type()), alignment);
  at::Tensor grad_weight = weight_grad ? at::zeros(weight.sizes(), weight.options()) : at::empty({0}, weight.options());
  const bool psw_wanted = psw_grad && psw.has_value();
  at::Tensor grad_psw = at::empty({psw_wanted ? a.indices.numel() : 0}, weight.options());
  if (weight_grad || psw_wanted)
    run_backward(vt, g, wt, a.indices, a.bags, mode, flat(psw), a.padding_idx, max_indices, bag_count,
                 grad_weight, grad_psw);
  if (psw_wanted) grad_psw = grad_psw.view(psw->sizes());
  return {grad_weight, grad_psw};
}

// ------------------------------------------------------------------ autograd

// The ops below the Autograd kernel, each looked up once, here (Call<> of tuner_op.h finds an op
// by its name on every call: a lock and a map lookup, paid by every eager call).
const c10::TypedOperatorHandle<OpSig>& plain_op() {
  static const auto h = c10::Dispatcher::singleton().findSchemaOrThrow("tuner::embedding_bag", "").typed<OpSig>();
  return h;
}
const c10::TypedOperatorHandle<ForwardSig>& forward_op() {
  static const auto h =
      c10::Dispatcher::singleton().findSchemaOrThrow("tuner::embedding_bag_forward", "").typed<ForwardSig>();
  return h;
}
const c10::TypedOperatorHandle<BackwardSig>& backward_op() {
  static const auto h =
      c10::Dispatcher::singleton().findSchemaOrThrow("tuner::embedding_bag_backward", "").typed<BackwardSig>();
  return h;
}

class EmbeddingBag : public torch::autograd::Function<EmbeddingBag> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& indices,
                            const Opt& offsets, int64_t mode, const Opt& psw, bool include_last_offset,
                            std::optional<int64_t> padding_idx) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, maxi, count] = forward_op().call(weight, indices, offsets, mode, psw, include_last_offset, padding_idx);
    ctx->save_for_backward({weight, indices, offsets.value_or(at::Tensor()), psw.value_or(at::Tensor()), maxi, count});
    // needs_input_grad counts the tensor arguments given: weight, indices, offsets if any, psw.
    ctx->saved_data["psw_edge"] = int64_t(offsets.has_value() && offsets->defined() ? 3 : 2);
    ctx->saved_data["mode"] = mode;
    ctx->saved_data["include_last_offset"] = include_last_offset;
    ctx->saved_data["padding_idx"] = padding_idx.has_value() ? c10::IValue(*padding_idx) : c10::IValue();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    at::Tensor grad_weight, grad_psw;
    const bool weight_grad = ctx->needs_input_grad(0);
    const bool psw_grad = s[3].defined() && ctx->needs_input_grad(ctx->saved_data["psw_edge"].toInt());
    if (grads[0].defined() && (weight_grad || psw_grad)) {
      const auto opt = [](const at::Tensor& t) { return t.defined() ? Opt(t) : std::nullopt; };
      const auto& pad = ctx->saved_data["padding_idx"];
      std::tie(grad_weight, grad_psw) = backward_op().call(
          grads[0].contiguous(), s[0], s[1], opt(s[2]), ctx->saved_data["mode"].toInt(), opt(s[3]),
          ctx->saved_data["include_last_offset"].toBool(),
          pad.isNone() ? std::nullopt : std::optional<int64_t>(pad.toInt()), s[4], s[5], weight_grad, psw_grad);
      if (!weight_grad) grad_weight = at::Tensor();
      if (!psw_grad) grad_psw = at::Tensor();
    }
    return {grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), grad_psw, at::Tensor(), at::Tensor()};
  }
};

at::Tensor embedding_bag_autograd(const at::Tensor& weight, const at::Tensor& indices, const Opt& offsets,
                                  c10::string_view mode, const Opt& psw, bool include_last_offset,
                                  std::optional<int64_t> padding_idx) {
  const bool wants = weight.requires_grad() || (psw.has_value() && psw->requires_grad());
  const bool grad = at::GradMode::is_enabled() && wants;
  if (auto out = served_by_baseline(weight, indices, offsets, mode_code(mode), psw, include_last_offset, padding_idx,
                                    grad))
    return *out;  // torch's autograd, torch's kernels
  if (!grad) {  // no graph: the plain forward, nothing saved
    at::AutoDispatchBelowADInplaceOrView below;
    return plain_op().call(weight, indices, offsets, mode, psw, include_last_offset, padding_idx);
  }
  return EmbeddingBag::apply(weight, indices, offsets, mode_code(mode), psw, include_last_offset, padding_idx);
}

}  // namespace
}  // namespace tuner_embedding_bag

TORCH_LIBRARY_FRAGMENT(tuner, m) {
  m.def("embedding_bag(Tensor weight, Tensor indices, Tensor? offsets=None, str mode=\"mean\", "
        "Tensor? per_sample_weights=None, bool include_last_offset=False, int? padding_idx=None) -> Tensor");
  m.def("embedding_bag_forward(Tensor weight, Tensor indices, Tensor? offsets, int mode, "
        "Tensor? per_sample_weights, bool include_last_offset, int? padding_idx) -> (Tensor, Tensor, Tensor)");
  m.def("embedding_bag_backward(Tensor grad, Tensor weight, Tensor indices, Tensor? offsets, int mode, "
        "Tensor? per_sample_weights, bool include_last_offset, int? padding_idx, Tensor max_indices, "
        "Tensor bag_count, bool weight_grad, bool per_sample_weights_grad) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tuner, CUDA, m) {
  m.impl("embedding_bag", &tuner_embedding_bag::embedding_bag_cuda);
  m.impl("embedding_bag_forward", &tuner_embedding_bag::embedding_bag_forward_cuda);
  m.impl("embedding_bag_backward", &tuner_embedding_bag::embedding_bag_backward_cuda);
}

TORCH_LIBRARY_IMPL(tuner, Autograd, m) {
  m.impl("embedding_bag", &tuner_embedding_bag::embedding_bag_autograd);
}

TUNER_OP_CONTROL(tuner_embedding_bag, tuner_embedding_bag::op)
