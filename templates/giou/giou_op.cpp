// tuner::giou_loss, the user's op, on the call path of a native PyTorch op: schema,
// CUDA kernels and autograd in C++ (pytorch/extension-cpp's pattern), so an eager call
// is one dispatcher hop and runs no Python. tuner.load builds the winners of an
// artifact and binds them here (stage + publish); each call picks the winner of its
// dtype pair nearest to its shape. The CPU implementation (the float64 reference) and
// the fake implementation for torch.compile are registered from Python (tuner/runtime.py).
#include "giou_binding.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

namespace tuner_giou {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kPreds = 3, kTargets = 4;

int pred_index(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    default: return -1;
  }
}

int target_index(at::ScalarType t) {
  switch (t) {
    case at::kByte: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    case at::kFloat: return 3;
    default: return -1;
  }
}

int index_of_name(const char* name, bool pred) {
  for (auto t : {at::kFloat, at::kHalf, at::kBFloat16, at::kByte}) {
    if (std::strcmp(c10::toString(t), name) == 0) return pred ? pred_index(t) : target_index(t);
  }
  return -1;
}

// torch's spelling of a dtype in messages ("torch.float64"), as the Python API prints it.
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "torch.float64";
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: return std::string("torch.") + c10::toString(t);
  }
}

struct Winner {
  int64_t batch, slots;
  const TunerGiouVtable* vt;
  std::string tuned_for;  // non-empty: another dtype pair's parameters, rendered for this one
};

struct Pair {
  std::vector<Winner> winners;
  bool saves = false;  // some winner saves d loss / d pred, so the forward returns [B, S, 4] for it
  std::shared_ptr<std::atomic<bool>> warned = std::make_shared<std::atomic<bool>>(false);
};

struct Table {
  std::array<Pair, kPreds * kTargets> pairs;
  bool reference = false;  // serve the CPU reference (an artifact for another architecture)
};

std::mutex bind_mutex;
Table staging;
std::shared_ptr<const Table> live;  // read with std::atomic_load: a call never sees a half-bound table
std::atomic<int64_t> check_mode{CHECK_ASYNC};

std::shared_ptr<const Table> bound() {
  auto t = std::atomic_load(&live);
  TORCH_CHECK(t != nullptr, "giou_loss: no artifact is loaded; call tuner.load(...) first");
  return t;
}

// Nearest tuned shape in log distance; the first of equals wins (tuner.runtime.choose agrees).
size_t nearest(const Pair& pair, int64_t batch, int64_t slots) {
  const double B = static_cast<double>(std::max<int64_t>(batch, 1));
  const double S = static_cast<double>(std::max<int64_t>(slots, 1));
  size_t best = 0;
  double best_d = 0;
  for (size_t i = 0; i < pair.winners.size(); ++i) {
    const Winner& w = pair.winners[i];
    const double d = std::fabs(std::log(B / w.batch)) + std::fabs(std::log(S / w.slots));
    if (i == 0 || d < best_d) best = i, best_d = d;
  }
  return best;
}

const Pair& pair_of(const Table& t, const at::Tensor& pred, const at::Tensor& target) {
  return t.pairs[pred_index(pred.scalar_type()) * kTargets + target_index(target.scalar_type())];
}

const Winner& choose(const Pair& pair, const at::Tensor& pred, const at::Tensor& target) {
  TORCH_CHECK(!pair.winners.empty(), "giou_loss: the loaded artifact has no variant for pred ",
              dtype_name(pred.scalar_type()), " and target ", dtype_name(target.scalar_type()));
  const Winner& best = pair.winners[nearest(pair, pred.size(0), pred.size(1))];
  if (!best.tuned_for.empty() && !pair.warned->exchange(true)) {
    warn("giou_loss: no variant was tuned for pred " + dtype_name(pred.scalar_type()) + " and target " +
         dtype_name(target.scalar_type()) + "; using the parameters tuned for " + best.tuned_for);
  }
  return best;
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
  TORCH_CHECK_TYPE(pred_index(pred.scalar_type()) >= 0, "giou_loss: pred must be float32, float16 or bfloat16, got ",
                   dtype_name(pred.scalar_type()));
  TORCH_CHECK_TYPE(target_index(target.scalar_type()) >= 0,
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

// Contiguous and aligned for the variant's loads (a copy only when needed).
at::Tensor ready(const at::Tensor& t, int alignment) {
  at::Tensor c = t.contiguous();
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % alignment) c = c.clone();
  return c;
}

std::optional<at::Tensor> counts(const std::optional<at::Tensor>& num_boxes) {
  if (!num_boxes.has_value()) return std::nullopt;
  return num_boxes->to(at::kLong).contiguous();
}

std::vector<int64_t> saved_shape(const Pair& pair, const at::Tensor& pred) {
  if (!pair.saves) return {0};
  return {pred.size(0), pred.size(1), 4};
}

c10::Device cpu() { return c10::Device(c10::kCPU); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_op(const at::Tensor& pred, const at::Tensor& target,
                                                          const std::optional<at::Tensor>& num_boxes,
                                                          int64_t reduction, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("tuner::giou_loss_forward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t, double)>();
  return op.call(pred, target, num_boxes, reduction, eps);
}

at::Tensor backward_op(const at::Tensor& grad, const at::Tensor& pred, const at::Tensor& target,
                       const std::optional<at::Tensor>& num_boxes, const at::Tensor& count, const at::Tensor& saved,
                       int64_t reduction, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("tuner::giou_loss_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
                                         int64_t, double)>();
  return op.call(grad, pred, target, num_boxes, count, saved, reduction, eps);
}

at::Tensor loss_op(const at::Tensor& pred, const at::Tensor& target, const std::optional<at::Tensor>& num_boxes,
                   c10::string_view reduction, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("tuner::giou_loss", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view, double)>();
  return op.call(pred, target, num_boxes, reduction, eps);
}

std::optional<at::Tensor> on_cpu(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return std::nullopt;
  return t->to(cpu());
}

// ------------------------------------------------------------------ CUDA kernels

// The forward: (loss, count, saved_grad); with `save` false, saved_grad is not made.
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_cuda(const at::Tensor& pred, const at::Tensor& target,
                                                            const std::optional<at::Tensor>& num_boxes,
                                                            int64_t reduction, double eps, bool save) {
  check_inputs(pred, target, num_boxes);
  const auto t = bound();
  if (t->reference) {  // the CPU implementation, moved there and back
    auto r = forward_op(pred.to(cpu()), target.to(cpu()), on_cpu(num_boxes), reduction, eps);
    return {std::get<0>(r).to(pred.device()), std::get<1>(r).to(pred.device()), std::get<2>(r).to(pred.device())};
  }
  const Pair& pair = pair_of(*t, pred, target);
  const Winner& w = choose(pair, pred, target);
  const at::Tensor p = ready(pred, w.vt->alignment), tg = ready(target, w.vt->alignment);
  const auto n = counts(num_boxes);
  const auto f32 = pred.options().dtype(at::kFloat);
  at::Tensor loss = reduction == 0 ? at::empty({pred.size(0), pred.size(1)}, f32) : at::empty({}, f32);
  at::Tensor count = at::empty({}, f32);
  at::Tensor saved = save ? at::empty(saved_shape(pair, pred), f32) : at::Tensor();
  run_forward(w.vt, p, tg, n, reduction, eps, loss, count, save && w.vt->saves_grad ? &saved : nullptr,
              check_mode.load(std::memory_order_relaxed));
  return {loss, count, saved};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> giou_loss_forward_cuda(const at::Tensor& pred,
                                                                      const at::Tensor& target,
                                                                      const std::optional<at::Tensor>& num_boxes,
                                                                      int64_t reduction, double eps) {
  TORCH_CHECK_VALUE(reduction >= 0 && reduction <= 2, "giou_loss: reduction code must be 0, 1 or 2");
  return forward_cuda(pred, target, num_boxes, reduction, eps, /*save=*/true);
}

at::Tensor giou_loss_cuda(const at::Tensor& pred, const at::Tensor& target, const std::optional<at::Tensor>& num_boxes,
                          c10::string_view reduction, double eps) {
  return std::get<0>(forward_cuda(pred, target, num_boxes, reduction_code(reduction), eps, /*save=*/false));
}

at::Tensor giou_loss_backward_cuda(const at::Tensor& grad, const at::Tensor& pred, const at::Tensor& target,
                                   const std::optional<at::Tensor>& num_boxes, const at::Tensor& count,
                                   const at::Tensor& saved, int64_t reduction, double eps) {
  check_inputs(pred, target, num_boxes);
  const auto t = bound();
  if (t->reference) {
    return backward_op(grad.to(cpu()), pred.to(cpu()), target.to(cpu()), on_cpu(num_boxes), count.to(cpu()),
                       saved.to(cpu()), reduction, eps)
        .to(pred.device());
  }
  const Winner& w = choose(pair_of(*t, pred, target), pred, target);  // the forward's: same dtypes and shape
  const at::Tensor p = ready(pred, w.vt->alignment), tg = ready(target, w.vt->alignment);
  at::Tensor grad_pred = at::empty_like(p);
  run_backward(w.vt, grad.to(at::kFloat).contiguous(), p, tg, counts(num_boxes), count, saved, reduction, eps,
               grad_pred);
  return grad_pred;
}

// ------------------------------------------------------------------ autograd

class GiouLoss : public torch::autograd::Function<GiouLoss> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& pred, const at::Tensor& target,
                            const std::optional<at::Tensor>& num_boxes, int64_t reduction, double eps) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, count, saved] = forward_op(pred, target, num_boxes, reduction, eps);
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
      grad_pred = backward_op(grads[0], s[0], s[1], n, s[3], s[4], ctx->saved_data["reduction"].toInt(),
                              ctx->saved_data["eps"].toDouble());
    }
    return {grad_pred, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor giou_loss_autograd(const at::Tensor& pred, const at::Tensor& target,
                              const std::optional<at::Tensor>& num_boxes, c10::string_view reduction, double eps) {
  const int64_t code = reduction_code(reduction);
  if (!(at::GradMode::is_enabled() && pred.requires_grad())) {  // no graph: the plain forward, nothing saved
    at::AutoDispatchBelowADInplaceOrView below;
    return loss_op(pred, target, num_boxes, reduction, eps);
  }
  return GiouLoss::apply(pred, target, num_boxes, code, eps);
}

// ------------------------------------------------------------------ binding winners

void stage(int64_t variant, int64_t batch, int64_t slots, std::string tuned_for) {
  const TunerGiouVtable* vt = table(variant);
  const int p = index_of_name(vt->pred_dtype, true), q = index_of_name(vt->target_dtype, false);
  TORCH_CHECK(p >= 0 && q >= 0, "giou_loss: variant ", vt->name, " has unknown dtypes");
  TORCH_CHECK(batch > 0 && slots > 0, "giou_loss: a tuned shape must be positive");
  std::lock_guard<std::mutex> lock(bind_mutex);
  Pair& pair = staging.pairs[p * kTargets + q];
  pair.winners.push_back(Winner{batch, slots, vt, std::move(tuned_for)});
  pair.saves = pair.saves || vt->saves_grad;
}

// Makes the staged winners the live table (calls in flight keep the one they took).
void publish(bool reference) {
  std::lock_guard<std::mutex> lock(bind_mutex);
  staging.reference = reference;
  std::atomic_store(&live, std::shared_ptr<const Table>(std::make_shared<Table>(std::move(staging))));
  staging = Table();
}

void set_check(int64_t mode) {
  TORCH_CHECK(mode >= CHECK_DEFERRED && mode <= CHECK_ASYNC, "giou_loss: check mode must be 0, 1 or 2");
  check_mode.store(mode);
}

// Which bound winner a call of this shape runs, by its position among the stage() calls
// of its dtype pair (c10 names, e.g. "BFloat16", "Byte"); -1 for none. Lets tests on any
// machine compare the per-call choice with tuner.runtime's.
int64_t chosen(const std::string& pred, const std::string& target, int64_t batch, int64_t slots) {
  const auto t = bound();
  const int p = index_of_name(pred.c_str(), true), q = index_of_name(target.c_str(), false);
  if (p < 0 || q < 0) return -1;
  const Pair& pair = t->pairs[p * kTargets + q];
  return pair.winners.empty() ? -1 : static_cast<int64_t>(nearest(pair, batch, slots));
}

// Whether the forward of this dtype pair returns a saved gradient [B, S, 4] (the fake
// implementation allocates by the same rule).
bool saves(const std::string& pred, const std::string& target) {
  const auto t = std::atomic_load(&live);
  const int p = index_of_name(pred.c_str(), true), q = index_of_name(target.c_str(), false);
  return t != nullptr && p >= 0 && q >= 0 && t->pairs[p * kTargets + q].saves;
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

TORCH_LIBRARY_FRAGMENT(tuner_giou, m) {
  m.def("stage(int variant, int batch, int slots, str tuned_for) -> ()", &tuner_giou::stage);
  m.def("publish(bool reference) -> ()", &tuner_giou::publish);
  m.def("set_check(int mode) -> ()", &tuner_giou::set_check);
  m.def("chosen(str pred, str target, int batch, int slots) -> int", &tuner_giou::chosen);
  m.def("saves(str pred, str target) -> bool", &tuner_giou::saves);
  m.def("set_error_module(str module) -> ()", &tuner_binding::set_error_module);
}
