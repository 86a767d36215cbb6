// tuner::rms_norm, the user's op (schema, checks, autograd); the winners' table, validate modes and control ops come
// from templates/common/tuner_op.h. Its baseline is torch's at::rms_norm (F.rms_norm), which
// serves every call that no variant was tuned to beat.
#include "rms_norm_abi.h"
#include "tuner_op.h"

namespace tuner_rms_norm {
namespace {

using namespace tuner_op;
constexpr std::initializer_list<at::ScalarType> kDtypes = {at::kFloat, at::kHalf, at::kBFloat16};

int pair_of(const TunerRmsNormVtable* vt) {
  const int x = index_of(vt->x_dtype, kDtypes), w = index_of(vt->weight_dtype, kDtypes);
  return x < 0 || w < 0 ? -1 : x * 3 + w;
}

Op<TunerRmsNormVtable> op("rms_norm", TUNER_RMS_NORM_ABI, 9, pair_of, nullptr, 0, 8, /*baseline=*/true);

int64_t rows_of_shape(const at::Tensor& x) {
  int64_t rows = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) rows *= x.size(i);
  return rows;
}

void check_shapes(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "rms_norm: x must have at least one dimension");
  TORCH_CHECK_VALUE(weight.dim() == 1 && weight.size(0) == x.size(-1), "rms_norm: weight must have shape [",
                    text(x.size(-1)), "] (x's last dimension), got ", text(weight.sizes()));
  TORCH_CHECK_VALUE(weight.device() == x.device(), "rms_norm: x is on ", x.device(), " but weight is on ",
                    weight.device());
}

void check_inputs(const at::Tensor& x, const at::Tensor& weight) {
  check_shapes(x, weight);
  TORCH_CHECK_TYPE(index_of(x.scalar_type(), kDtypes) >= 0, "rms_norm: x must be float32, float16 or bfloat16, got ",
                   dtype_name(x.scalar_type()));
  TORCH_CHECK_TYPE(index_of(weight.scalar_type(), kDtypes) >= 0,
                   "rms_norm: weight must be float32, float16 or bfloat16, got ", dtype_name(weight.scalar_type()));
}

void check_call(const TunerRmsNormVtable* vt, const at::Tensor& x, const at::Tensor& weight) {
  check_inputs(x, weight);
  TORCH_CHECK(x.is_cuda() && x.is_contiguous() && weight.is_contiguous(), "rms_norm: contiguous CUDA tensors needed");
  TORCH_CHECK(pair_of(vt) == index_of(x.scalar_type(), kDtypes) * 3 + index_of(weight.scalar_type(), kDtypes),
              "rms_norm: variant ", vt->name, " takes x ", vt->x_dtype, " and weight ", vt->weight_dtype);
}

void check_like(const char* what, const at::Tensor& t, const at::Tensor& like, at::ScalarType dtype) {
  TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == dtype && t.is_contiguous() && t.device() == like.device(),
              "rms_norm: ", what, " must be a contiguous ", dtype_name(dtype), " tensor of ", text(like.numel()),
              " elements on ", like.device());
}

void run_forward(const TunerRmsNormVtable* vt, const at::Tensor& x, const at::Tensor& weight, double eps,
                 const at::Tensor& y, const at::Tensor& rstd) {
  check_call(vt, x, weight);
  check_like("y", y, x, x.scalar_type());
  TORCH_CHECK(rstd.numel() == rows_of_shape(x) && rstd.scalar_type() == at::kFloat, "rms_norm: rstd must be [rows] float32");
  c10::cuda::CUDAGuard guard(x.device());
  const TunerRmsNormArgs a{x.data_ptr(), weight.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(), rows_of_shape(x),
                           x.size(-1), static_cast<float>(eps)};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  op.launch(vt, [&] { return vt->forward(&a, stream); });
}

void run_backward(const TunerRmsNormVtable* vt, const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& rstd, double eps, const at::Tensor& grad_x, const at::Tensor& grad_weight,
                  const at::Tensor& scratch) {
  check_call(vt, x, weight);
  check_like("grad", grad, x, x.scalar_type());
  if (grad_x.numel()) check_like("grad_x", grad_x, x, x.scalar_type());
  if (grad_weight.numel()) check_like("grad_weight", grad_weight, weight, weight.scalar_type());
  const int64_t rows = rows_of_shape(x), width = x.size(-1);
  TORCH_CHECK(!vt->saves_rstd || rstd.numel() == rows, "rms_norm: variant ", vt->name, " needs the forward's rstd");
  // (a frozen weight wants no gradient: the kernels leave the scratch alone then)
  TORCH_CHECK(scratch.scalar_type() == at::kFloat &&
                  (grad_weight.numel() == 0 || scratch.numel() >= vt->scratch_floats(rows, width)),
              "rms_norm: scratch too small");
  c10::cuda::CUDAGuard guard(x.device());
  const TunerRmsNormBackwardArgs a{grad.data_ptr(), x.data_ptr(), weight.data_ptr(),
                                   vt->saves_rstd ? rstd.data_ptr<float>() : nullptr,
                                   grad_x.numel() ? grad_x.data_ptr() : nullptr,
                                   grad_weight.numel() ? grad_weight.data_ptr() : nullptr,
                                   scratch.data_ptr<float>(), rows, width, static_cast<float>(eps)};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  op.launch(vt, [&] { return vt->backward(&a, stream); }, " backward");
}

// ------------------------------------------------------------------ the op

using Pair2 = std::tuple<at::Tensor, at::Tensor>;

int pair_of_call(const at::Tensor& x, const at::Tensor& weight) {
  return index_of(x.scalar_type(), kDtypes) * 3 + index_of(weight.scalar_type(), kDtypes);
}

// What the user's op replaces: F.rms_norm over the last dimension (torch keeps x's dtype).
at::Tensor baseline(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  return at::rms_norm(x, {x.size(-1)}, weight, eps).to(x.scalar_type());
}

// A call no variant takes, which torch's op serves as F.rms_norm would: no weight, or x or the
// weight in another dtype (float64, complex). Shapes and devices are checked first, with the
// op's messages; torch refuses what it does not have.
bool outside_variants(const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  if (weight.has_value()) check_shapes(x, *weight);
  else TORCH_CHECK_VALUE(x.dim() >= 1, "rms_norm: x must have at least one dimension");
  return !weight.has_value() || index_of(x.scalar_type(), kDtypes) < 0 || index_of(weight->scalar_type(), kDtypes) < 0;
}

// Whether torch's op serves this call: a CUDA call of concrete shape (a graph traced with
// symbolic shapes runs the variants) whose nearest tuned problem is served by the baseline,
// or none is near.
bool serves_baseline(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.is_cuda() || symbolic(x)) return false;
  check_inputs(x, weight);
  return op.serves_baseline(pair_of_call(x, weight), {rows_of_shape(x), x.size(-1)}, 0, [&] {
    return "x " + dtype_name(x.scalar_type()) + " and weight " + dtype_name(weight.scalar_type());
  });
}

// The variant nearest a call below the autograd kernel; nullptr for a pair with none (torch's
// kernels then serve it: forward_cuda and backward_cuda compute with ATen).
const TunerRmsNormVtable* variant_for(const at::Tensor& x, const at::Tensor& weight) {
  return op.variant(*op.bound(), pair_of_call(x, weight), {rows_of_shape(x), x.size(-1)}, 0);
}

// The backward in ATen from the saved 1/rms r: gw = sum_rows(dy * x * r), and
// gx = r * (dy * w - x * r * mean(dy * w * x * r)) over each row.
Pair2 baseline_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& rstd,
                        bool x_grad, bool weight_grad) {
  const int64_t width = x.size(-1);
  const at::Tensor xf = x.reshape({-1, width}).to(at::kFloat), dy = grad.reshape({-1, width}).to(at::kFloat);
  const at::Tensor r = rstd.reshape({-1, 1}).to(at::kFloat), n = xf * r;
  at::Tensor gx = at::empty({0}, x.options()), gw = at::empty({0}, weight.options());
  if (weight_grad) gw = (dy * n).sum(0).to(weight.scalar_type());
  if (x_grad) {
    const at::Tensor g = dy * weight.to(at::kFloat);
    gx = (r * (g - n * (g * n).mean(-1, true))).to(x.scalar_type()).reshape(x.sizes());
  }
  return {gx, gw};
}

Pair2 forward_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_inputs(x, weight);
  if (op.bound()->reference) return OnCpu<Pair2(const at::Tensor&, const at::Tensor&, double)>::call(
      "tuner::rms_norm_forward", x.device(), x, weight, eps);
  const TunerRmsNormVtable* vt = variant_for(x, weight);
  if (vt == nullptr)
    return {baseline(x, weight, eps), at::rsqrt(x.to(at::kFloat).pow(2).mean(-1) + eps).reshape({rows_of_shape(x)})};
  const at::Tensor xc = ready(x, 16), wc = ready(weight, 16);
  at::Tensor y = at::empty_like(xc), rstd = at::empty({rows_of_shape(x)}, x.options().dtype(at::kFloat));
  run_forward(vt, xc, wc, eps, y, rstd);
  return {y, rstd};
}

at::Tensor rms_norm_cuda(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  if (outside_variants(x, weight) || serves_baseline(x, *weight)) return baseline(x, weight, eps);
  return std::get<0>(forward_cuda(x, *weight, eps));
}

Pair2 backward_cuda(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& rstd,
                    double eps, bool x_grad, bool weight_grad) {
  check_inputs(x, weight);
  if (op.bound()->reference)
    return OnCpu<Pair2(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, bool, bool)>::
        call("tuner::rms_norm_backward", x.device(), grad, x, weight, rstd, eps, x_grad, weight_grad);
  const TunerRmsNormVtable* vt = variant_for(x, weight);
  if (vt == nullptr) return baseline_backward(grad, x, weight, rstd, x_grad, weight_grad);
  const at::Tensor xc = ready(x, 16), wc = ready(weight, 16), g = ready(grad.to(x.scalar_type()), 16);
  at::Tensor gx = x_grad ? at::empty_like(xc) : at::empty({0}, x.options());
  at::Tensor gw = weight_grad ? at::empty_like(wc) : at::empty({0}, weight.options());
  at::Tensor scratch = at::empty({weight_grad ? vt->scratch_floats(rows_of_shape(x), x.size(-1)) : 1},
                                 x.options().dtype(at::kFloat));
  if (x_grad || weight_grad) run_backward(vt, g, xc, wc, rstd.contiguous(), eps, gx, gw, scratch);
  return {gx, gw};
}

class RmsNorm : public torch::autograd::Function<RmsNorm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, rstd] = Call<Pair2(const at::Tensor&, const at::Tensor&, double)>::call("tuner::rms_norm_forward", x,
                                                                                    weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const bool gx = ctx->needs_input_grad(0), gw = ctx->needs_input_grad(1);
    at::Tensor dx, dw;
    if (grads[0].defined() && (gx || gw)) {
      std::tie(dx, dw) = Call<Pair2(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                    bool, bool)>::call("tuner::rms_norm_backward", grads[0], s[0], s[1], s[2],
                                                       ctx->saved_data["eps"].toDouble(), gx, gw);
    }
    return {gx ? dx : at::Tensor(), gw ? dw : at::Tensor(), at::Tensor()};
  }
};

at::Tensor rms_norm_autograd(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  // torch's autograd and kernels where a variant does not serve (a call no variant takes, on any device)
  if (outside_variants(x, weight) || (x.is_cuda() && serves_baseline(x, *weight))) return baseline(x, weight, eps);
  if (!(at::GradMode::is_enabled() && (x.requires_grad() || (weight.has_value() && weight->requires_grad())))) {
    at::AutoDispatchBelowADInplaceOrView below;
    return Call<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, double)>::call("tuner::rms_norm", x,
                                                                                              weight, eps);
  }
  return RmsNorm::apply(x, *weight, eps);
}

// Who serves a CUDA call of these sizes and dtypes in the live table: a variant's name, or
// "torch" (what tests and `tuner show`-like tools ask; no tensor needed).
std::string served(int64_t rows, int64_t width, at::ScalarType x, at::ScalarType weight) {
  const auto t = op.bound();
  const int xi = index_of(x, kDtypes), wi = index_of(weight, kDtypes);
  const auto& w = op.choose(*t, xi < 0 || wi < 0 ? -1 : xi * 3 + wi, {rows, width}, 0,
                            [&] { return "x " + dtype_name(x) + " and weight " + dtype_name(weight); });
  return w.baseline() ? "torch" : w.vt->name;
}

}  // namespace
}  // namespace tuner_rms_norm

TORCH_LIBRARY_FRAGMENT(tuner, m) {
  m.def("rms_norm(Tensor x, Tensor? weight, float eps=1e-06) -> Tensor");
  m.def("rms_norm_forward(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor rstd, float eps, bool x_grad, "
        "bool weight_grad) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tuner, CUDA, m) {
  m.impl("rms_norm", &tuner_rms_norm::rms_norm_cuda);
  m.impl("rms_norm_forward", &tuner_rms_norm::forward_cuda);
  m.impl("rms_norm_backward", &tuner_rms_norm::backward_cuda);
}

TORCH_LIBRARY_IMPL(tuner, Autograd, m) { m.impl("rms_norm", &tuner_rms_norm::rms_norm_autograd); }

TUNER_OP_CONTROL(tuner_rms_norm, tuner_rms_norm::op)

TORCH_LIBRARY_FRAGMENT(tuner_rms_norm, m) {
  m.def("served(int rows, int width, ScalarType x, ScalarType weight) -> str", &tuner_rms_norm::served);
}
