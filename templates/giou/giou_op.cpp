// tuner::giou_loss, the user's op, on the call path of a native PyTorch op: schema,
// checks, CUDA kernels and autograd in C++ (pytorch/extension-cpp's pattern), so an eager
// call is one dispatcher hop and runs no Python. The winners bound at tuner.load, the
// nearest-shape choice, validate modes and control ops come from templates/common/tuner_op.h;
// the CPU (float64 reference) and fake implementations from Python (tuner/runtime.py). Its
// baseline is the eager GIoU loss (torchvision's formula in ATen ops, float32), which serves
// every call that no variant was tuned to beat.
#include "giou_binding.h"

namespace tuner_giou {

constexpr std::initializer_list<at::ScalarType> kPreds = {at::kFloat, at::kHalf, at::kBFloat16};
constexpr std::initializer_list<at::ScalarType> kTargets = {at::kByte, at::kHalf, at::kBFloat16, at::kFloat};

int pair_of(const TunerGiouVtable* vt) {
  const int p = index_of(vt->pred_dtype, kPreds), q = index_of(vt->target_dtype, kTargets);
  return p < 0 || q < 0 ? -1 : p * 4 + q;
}

namespace {

int pair_of(const at::Tensor& pred, const at::Tensor& target) {
  return index_of(pred.scalar_type(), kPreds) * 4 + index_of(target.scalar_type(), kTargets);
}

// The variant nearest a call of the forward and backward ops (whatever the baseline would serve).
const TunerGiouVtable* choose(const Table<TunerGiouVtable>& t, const at::Tensor& pred, const at::Tensor& target) {
  const TunerGiouVtable* vt = op.variant(t, pair_of(pred, target), {pred.size(0), pred.size(1)}, 0);
  TORCH_CHECK(vt != nullptr, "giou_loss: the loaded export has no variant for pred ", dtype_name(pred.scalar_type()),
              " and target ", dtype_name(target.scalar_type()), "; tune one (tuner search --pred ... --target ...)");
  return vt;
}

// The forward returns a saved gradient [B, S, 4] when some winner of its dtype pair saves one.
bool saves(const Table<TunerGiouVtable>& t, int pair) {
  for (const auto& w : t.pairs[pair].winners)
    if (!w.baseline() && w.vt->saves_grad) return true;
  return false;
}

int64_t reduction_code(c10::string_view reduction) {
  if (reduction == "none") return 0;
  if (reduction == "mean") return 1;
  if (reduction == "sum") return 2;
  TORCH_CHECK_VALUE(false, "giou_loss: reduction must be one of ('none', 'mean', 'sum'), got '",
                    std::string(reduction), "'");
}

// The checks and messages of the Python CPU implementation (tuner/runtime.py).
void check_inputs(const at::Tensor& pred, const at::Tensor& target, const std::optional<at::Tensor>& num_boxes) {
  TORCH_CHECK_VALUE(pred.dim() == 3 && pred.size(2) == 4, "giou_loss: pred must have shape [B, S, 4], got ",
                    text(pred.sizes()));
  TORCH_CHECK_VALUE(target.sizes() == pred.sizes(), "giou_loss: target ", text(target.sizes()),
                    " must have pred's shape ", text(pred.sizes()));
  TORCH_CHECK_TYPE(index_of(pred.scalar_type(), kPreds) >= 0, "giou_loss: pred must be float32, float16 or bfloat16, got ",
                   dtype_name(pred.scalar_type()));
  TORCH_CHECK_TYPE(index_of(target.scalar_type(), kTargets) >= 0,
                   "giou_loss: target must be uint8, float16, bfloat16 or float32, got ",
                   dtype_name(target.scalar_type()));
  TORCH_CHECK_VALUE(target.device() == pred.device(), "giou_loss: pred is on ", pred.device(), " but target is on ",
                    target.device());
  if (num_boxes.has_value()) {
    const auto& n = *num_boxes;
    TORCH_CHECK_VALUE(n.device() == pred.device(), "giou_loss: num_boxes is on ", n.device(), " but pred is on ",
                      pred.device());
    TORCH_CHECK_TYPE(at::isIntegralType(n.scalar_type(), /*includeBool=*/false),
                     "giou_loss: num_boxes must be an integer tensor, got ", dtype_name(n.scalar_type()));
    TORCH_CHECK_VALUE(n.dim() == 1 && n.size(0) == pred.size(0), "giou_loss: num_boxes must have shape [B] = [",
                      text(pred.size(0)), "], got ", text(n.sizes()));
  }
}

std::optional<at::Tensor> counts(const std::optional<at::Tensor>& num_boxes) {
  if (!num_boxes.has_value()) return std::nullopt;
  return num_boxes->to(at::kLong).contiguous();
}

using Forward = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using ForwardSig = Forward(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t, double);
using BackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&, int64_t, double);
using LossSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                           double);

// ------------------------------------------------------------------ CUDA kernels

// The forward: (loss, count, saved_grad); with `save` false, saved_grad is not made.
Forward forward_cuda(const at::Tensor& pred, const at::Tensor& target, const std::optional<at::Tensor>& num_boxes,
                     int64_t reduction, double eps, bool save) {
  check_inputs(pred, target, num_boxes);
  const auto t = op.bound();
  if (t->reference) return OnCpu<ForwardSig>::call("tuner::giou_loss_forward", pred.device(), pred, target, num_boxes,
                                                   reduction, eps);
  const int pair = pair_of(pred, target);
  const TunerGiouVtable* vt = choose(*t, pred, target);
  const at::Tensor p = ready(pred, vt->alignment), tg = ready(target, vt->alignment);
  const auto n = counts(num_boxes);
  const auto f32 = pred.options().dtype(at::kFloat);
  at::Tensor loss = reduction == 0 ? at::empty({pred.size(0), pred.size(1)}, f32) : at::empty({}, f32);
  at::Tensor count = at::empty({}, f32);
  at::Tensor saved;
  if (save) saved = saves(*t, pair) ? at::empty({pred.size(0), pred.size(1), 4}, f32) : at::empty({0}, f32);
  run_forward(vt, p, tg, n, reduction, eps, loss, count, save && vt->saves_grad ? &saved : nullptr, op.check());
  return {loss, count, saved};
}

Forward giou_loss_forward_cuda(const at::Tensor& pred, const at::Tensor& target,
                               const std::optional<at::Tensor>& num_boxes, int64_t reduction, double eps) {
  TORCH_CHECK_VALUE(reduction >= 0 && reduction <= 2, "giou_loss: reduction code must be 0, 1 or 2");
  return forward_cuda(pred, target, num_boxes, reduction, eps, /*save=*/true);
}

// ------------------------------------------------------------------ the baseline

// What the op replaces: the GIoU loss as eager PyTorch computes it, torchvision's elementwise
// formula in float32 (spec.py's `eager`), padding slots replaced by a unit box before the math and
// counts clamped to [0, S]. It validates nothing: torch's composite would not.
at::Tensor baseline(const at::Tensor& pred, const at::Tensor& target, const std::optional<at::Tensor>& num_boxes,
                    int64_t reduction, double eps) {
  const int64_t S = pred.size(1);
  const auto f32 = pred.options().dtype(at::kFloat);
  const at::Tensor valid =
      num_boxes.has_value()
          ? at::arange(S, pred.options().dtype(at::kLong)).unsqueeze(0) < num_boxes->to(at::kLong).clamp(0, S).unsqueeze(1)
          : target.select(-1, 3) > 0;
  const at::Tensor unit = (at::arange(4, f32) >= 2).to(at::kFloat), v4 = valid.unsqueeze(-1);
  const at::Tensor p = at::where(v4, pred.to(at::kFloat), unit), t = at::where(v4, target.to(at::kFloat), unit);
  const auto c = [](const at::Tensor& b, int64_t i) { return b.select(-1, i); };
  const at::Tensor x1 = c(p, 0), y1 = c(p, 1), x2 = c(p, 2), y2 = c(p, 3);
  const at::Tensor x1g = c(t, 0), y1g = c(t, 1), x2g = c(t, 2), y2g = c(t, 3);
  const at::Tensor xk1 = at::maximum(x1, x1g), yk1 = at::maximum(y1, y1g);
  const at::Tensor xk2 = at::minimum(x2, x2g), yk2 = at::minimum(y2, y2g);
  const at::Tensor inter = at::where((yk2 > yk1) & (xk2 > xk1), (xk2 - xk1) * (yk2 - yk1), at::zeros_like(x1));
  const at::Tensor uni = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter;
  const at::Tensor iou = inter / (uni + eps);
  const at::Tensor area = (at::maximum(x2, x2g) - at::minimum(x1, x1g)) * (at::maximum(y2, y2g) - at::minimum(y1, y1g));
  const at::Tensor loss = at::where(valid, 1 - (iou - (area - uni) / (area + eps)), at::zeros_like(x1));
  if (reduction == 0) return loss;
  if (reduction == 2) return loss.sum();
  return loss.sum() / valid.sum().clamp_min(1).to(at::kFloat);
}

// Whether the baseline serves this call: a CUDA call of concrete shape (a graph traced with
// symbolic shapes runs the variants) whose nearest tuned problem it serves, or none is near.
bool serves_baseline(const at::Tensor& pred, const at::Tensor& target, const std::optional<at::Tensor>& num_boxes) {
  if (!pred.is_cuda() || symbolic(pred)) return false;
  check_inputs(pred, target, num_boxes);
  return op.serves_baseline(pair_of(pred, target), {pred.size(0), pred.size(1)}, 0, [&] {
    return "pred " + dtype_name(pred.scalar_type()) + " and target " + dtype_name(target.scalar_type());
  });
}

at::Tensor giou_loss_cuda(const at::Tensor& pred, const at::Tensor& target, const std::optional<at::Tensor>& num_boxes,
                          c10::string_view reduction, double eps) {
  if (serves_baseline(pred, target, num_boxes)) return baseline(pred, target, num_boxes, reduction_code(reduction), eps);
  return std::get<0>(forward_cuda(pred, target, num_boxes, reduction_code(reduction), eps, /*save=*/false));
}

at::Tensor giou_loss_backward_cuda(const at::Tensor& grad, const at::Tensor& pred, const at::Tensor& target,
                                   const std::optional<at::Tensor>& num_boxes, const at::Tensor& count,
                                   const at::Tensor& saved, int64_t reduction, double eps) {
  check_inputs(pred, target, num_boxes);
  const auto t = op.bound();
  if (t->reference) return OnCpu<BackwardSig>::call("tuner::giou_loss_backward", pred.device(), grad, pred, target,
                                                    num_boxes, count, saved, reduction, eps);
  const TunerGiouVtable* vt = choose(*t, pred, target);  // the forward's: same dtypes and shape
  const at::Tensor p = ready(pred, vt->alignment), tg = ready(target, vt->alignment);
  at::Tensor grad_pred = at::empty_like(p);
  run_backward(vt, grad.to(at::kFloat).contiguous(), p, tg, counts(num_boxes), count, saved, reduction, eps,
               grad_pred);
  return grad_pred;
}

// ------------------------------------------------------------------ autograd

class GiouLoss : public torch::autograd::Function<GiouLoss> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& pred, const at::Tensor& target,
                            const std::optional<at::Tensor>& num_boxes, int64_t reduction, double eps) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, count, saved] = Call<ForwardSig>::call("tuner::giou_loss_forward", pred, target, num_boxes, reduction, eps);
    ctx->save_for_backward({pred, target, num_boxes.value_or(at::Tensor()), count, saved});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["eps"] = eps;
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    at::Tensor grad_pred;
    if (grads[0].defined()) {
      const std::optional<at::Tensor> n = s[2].defined() ? std::optional<at::Tensor>(s[2]) : std::nullopt;
      grad_pred = Call<BackwardSig>::call("tuner::giou_loss_backward", grads[0], s[0], s[1], n, s[3], s[4],
                                          ctx->saved_data["reduction"].toInt(), ctx->saved_data["eps"].toDouble());
    }
    return {grad_pred, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor giou_loss_autograd(const at::Tensor& pred, const at::Tensor& target,
                              const std::optional<at::Tensor>& num_boxes, c10::string_view reduction, double eps) {
  const int64_t code = reduction_code(reduction);
  if (serves_baseline(pred, target, num_boxes)) return baseline(pred, target, num_boxes, code, eps);  // torch's autograd
  if (!(at::GradMode::is_enabled() && pred.requires_grad())) {  // no graph: the plain forward, nothing saved
    at::AutoDispatchBelowADInplaceOrView below;
    return Call<LossSig>::call("tuner::giou_loss", pred, target, num_boxes, reduction, eps);
  }
  return GiouLoss::apply(pred, target, num_boxes, code, eps);
}

// Which bound winner a call of this shape runs, by its position among the stage() calls
// of its dtype pair (c10 names, e.g. "BFloat16", "Byte"); -1 for none. Lets tests on any
// machine compare the per-call choice with the manifest's.
int64_t chosen(const std::string& pred, const std::string& target, int64_t batch, int64_t slots) {
  const int p = index_of(pred.c_str(), kPreds), q = index_of(target.c_str(), kTargets);
  return p < 0 || q < 0 ? -1 : op.nearest(*op.bound(), p * 4 + q, {batch, slots}, 0);
}

// Whether the baseline serves a call of these dtypes and shape (what tests ask; no tensor needed).
bool served_by_baseline(const std::string& pred, const std::string& target, int64_t batch, int64_t slots) {
  const int p = index_of(pred.c_str(), kPreds), q = index_of(target.c_str(), kTargets);
  return op.choose(*op.bound(), p < 0 || q < 0 ? -1 : p * 4 + q, {batch, slots}, 0, [&] {
             return "pred " + pred + " and target " + target;
           }).baseline();
}

// Whether the forward of this dtype pair returns a saved gradient [B, S, 4] (the fake
// implementation allocates by the same rule).
bool saves_for(const std::string& pred, const std::string& target) {
  const auto t = op.bound_or_null();
  const int p = index_of(pred.c_str(), kPreds), q = index_of(target.c_str(), kTargets);
  return t != nullptr && p >= 0 && q >= 0 && saves(*t, p * 4 + q);
}

}  // namespace
}  // namespace tuner_giou

TORCH_LIBRARY_FRAGMENT(tuner, m) {
  m.def("giou_loss(Tensor pred, Tensor target, Tensor? num_boxes=None, str reduction=\"mean\", float eps=1e-07) "
        "-> Tensor");
  m.def("giou_loss_forward(Tensor pred, Tensor target, Tensor? num_boxes, int reduction, float eps) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("giou_loss_backward(Tensor grad, Tensor pred, Tensor target, Tensor? num_boxes, Tensor count, "
        "Tensor saved_grad, int reduction, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(tuner, CUDA, m) {
  m.impl("giou_loss", &tuner_giou::giou_loss_cuda);
  m.impl("giou_loss_forward", &tuner_giou::giou_loss_forward_cuda);
  m.impl("giou_loss_backward", &tuner_giou::giou_loss_backward_cuda);
}

TORCH_LIBRARY_IMPL(tuner, Autograd, m) {
  m.impl("giou_loss", &tuner_giou::giou_loss_autograd);
}

TUNER_OP_CONTROL(tuner_giou, tuner_giou::op)

TORCH_LIBRARY_FRAGMENT(tuner_giou, m) {
  m.def("chosen(str pred, str target, int batch, int slots) -> int", &tuner_giou::chosen);
  m.def("saves(str pred, str target) -> bool", &tuner_giou::saves_for);
  m.def("served_by_baseline(str pred, str target, int batch, int slots) -> bool", &tuner_giou::served_by_baseline);
}
