// The torch side of every GIoU variant, compiled once per torch/CUDA version and
// reused: it checks tensors and calls a variant through the C table the variant exports
// (giou_abi.h), with the per-stream workspace and validate modes of tuner_op.h. Variants themselves
// are CUDA-headers-only translation units, which keeps their builds at ~2 s.
// The user's op (giou_op.cpp) calls the winners bound at load through this code; the
// search calls variants directly (tuner/families/giou/kernel.py).
#include "giou_binding.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>

#include <climits>
#include <cstring>

namespace tuner_giou {

std::string error_text(int64_t bits) {
  std::string text;
  if (bits & TUNER_GIOU_BAD_COUNT) text += "num_boxes has a value outside [0, S]";
  if (bits & TUNER_GIOU_BAD_TARGET) {
    if (!text.empty()) text += "; ";
    text += "a valid target box has a non-finite coordinate";
  }
  return text;
}

int pair_of(const TunerGiouVtable* vt);  // giou_op.cpp

// Workspace words: the variant's scratch (reduction tickets and partials) and the error word.
Op<TunerGiouVtable> op("giou_loss", TUNER_GIOU_ABI, 12, pair_of, error_text, TUNER_GIOU_WS_ERROR,
                       TUNER_GIOU_ERROR_BITS, /*baseline=*/true);

namespace {

void check_boxes(const char* what, const at::Tensor& t, const char* want_dtype, const TunerGiouVtable* vt) {
  TORCH_CHECK(t.is_cuda(), "giou_loss: ", what, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 3 && t.size(2) == 4, "giou_loss: ", what, " must have shape [B, S, 4], got ", text(t.sizes()));
  TORCH_CHECK(std::strcmp(c10::toString(t.scalar_type()), want_dtype) == 0, "giou_loss: variant ", vt->name,
              " takes ", what, " of dtype ", want_dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "giou_loss: ", what, " must be contiguous");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % vt->alignment == 0, "giou_loss: ", what,
              " must be aligned to ", text(vt->alignment), " bytes for variant ", vt->name);
}

struct Common {
  int B, S;
  const long long* num_boxes;
};

Common check_common(const TunerGiouVtable* vt, const at::Tensor& pred, const at::Tensor& target,
                    const std::optional<at::Tensor>& num_boxes) {
  check_boxes("pred", pred, vt->pred_dtype, vt);
  check_boxes("target", target, vt->target_dtype, vt);
  TORCH_CHECK(target.sizes() == pred.sizes(), "giou_loss: pred ", text(pred.sizes()), " and target ", text(target.sizes()),
              " must have the same shape");
  TORCH_CHECK(target.device() == pred.device(), "giou_loss: pred is on ", pred.device(), " but target is on ",
              target.device());
  TORCH_CHECK(pred.numel() < INT_MAX, "giou_loss: at most ", text(INT_MAX / 4), " boxes per call");
  Common c{static_cast<int>(pred.size(0)), static_cast<int>(pred.size(1)), nullptr};
  if (num_boxes.has_value()) {
    const auto& n = *num_boxes;
    TORCH_CHECK(n.device() == pred.device(), "giou_loss: num_boxes is on ", n.device(), " but pred is on ",
                pred.device());
    TORCH_CHECK(n.scalar_type() == at::kLong && n.dim() == 1 && n.size(0) == c.B && n.is_contiguous(),
                "giou_loss: num_boxes must be a contiguous int64 tensor of shape [B] = [", c.B, "]");
    c.num_boxes = reinterpret_cast<const long long*>(n.data_ptr<int64_t>());
  }
  return c;
}

void check_float_out(const char* what, const at::Tensor& t, const at::Tensor& pred, int64_t numel) {
  TORCH_CHECK(t.device() == pred.device() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                  t.numel() == numel,
              "giou_loss: ", what, " must be a contiguous float32 tensor of ", text(numel), " elements on ", pred.device());
}

void check_reduction(int64_t reduction) {
  TORCH_CHECK(reduction >= 0 && reduction <= 2, "giou_loss: reduction code must be 0 (none), 1 (mean) or 2 (sum)");
}

// The fields the forward's and the backward's argument structs share.
template <typename Args>
void fill_common(Args& a, const at::Tensor& pred, const at::Tensor& target, const Common& c, int64_t reduction,
                 double eps) {
  a.pred = pred.data_ptr();
  a.target = target.data_ptr();
  a.num_boxes = c.num_boxes;
  a.B = c.B;
  a.S = c.S;
  a.reduction = static_cast<int>(reduction);
  a.eps = static_cast<float>(eps);
}

}  // namespace

void run_forward(const TunerGiouVtable* vt, const at::Tensor& pred, const at::Tensor& target,
                 const std::optional<at::Tensor>& num_boxes, int64_t reduction, double eps, const at::Tensor& out,
                 const at::Tensor& count, const at::Tensor* saved_grad, int64_t check) {
  check_reduction(reduction);
  const Common c = check_common(vt, pred, target, num_boxes);
  check_float_out("out", out, pred, reduction == 0 ? int64_t(c.B) * c.S : 1);
  check_float_out("count", count, pred, 1);
  TORCH_CHECK(saved_grad == nullptr || vt->saves_grad, "giou_loss: variant ", vt->name, " does not save gradients");
  if (saved_grad != nullptr) check_float_out("saved_grad", *saved_grad, pred, pred.numel());

  c10::cuda::CUDAGuard guard(pred.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (c.B * c.S == 0) {  // nothing to launch: an empty mean or sum is 0
    out.zero_();
    count.zero_();
    return;
  }
  Workspace& ws = op.workspaces.get(static_cast<int>(pred.get_device()), stream, vt->workspace_words(c.B, c.S));
  TunerGiouArgs a;
  fill_common(a, pred, target, c, reduction, eps);
  a.out = out.data_ptr<float>();
  a.count_out = count.data_ptr<float>();
  a.saved_grad = saved_grad != nullptr ? saved_grad->data_ptr<float>() : nullptr;
  a.workspace = ws.words;
  a.error_flags = ws.flags_device;
  op.launch(vt, vt->validates, check, ws, stream, [&] { return vt->forward(&a, stream); });
}

void run_backward(const TunerGiouVtable* vt, const at::Tensor& grad_out, const at::Tensor& pred,
                  const at::Tensor& target, const std::optional<at::Tensor>& num_boxes, const at::Tensor& count,
                  const at::Tensor& saved_grad, int64_t reduction, double eps, const at::Tensor& grad_pred) {
  check_reduction(reduction);
  const Common c = check_common(vt, pred, target, num_boxes);
  check_float_out("grad_out", grad_out, pred, reduction == 0 ? int64_t(c.B) * c.S : 1);
  check_float_out("count", count, pred, 1);
  if (vt->saves_grad) check_float_out("saved_grad", saved_grad, pred, pred.numel());
  check_boxes("grad_pred", grad_pred, vt->pred_dtype, vt);
  TORCH_CHECK(grad_pred.sizes() == pred.sizes() && grad_pred.device() == pred.device(),
              "giou_loss: grad_pred must match pred");

  c10::cuda::CUDAGuard guard(pred.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (c.B * c.S == 0) return;
  TunerGiouBackwardArgs a;
  fill_common(a, pred, target, c, reduction, eps);
  a.grad_out = grad_out.data_ptr<float>();
  a.count = count.data_ptr<float>();
  a.saved_grad = vt->saves_grad ? saved_grad.data_ptr<float>() : nullptr;
  a.grad_pred = grad_pred.data_ptr();
  const int rc = vt->backward(&a, stream);
  TORCH_CHECK(rc == 0, "giou_loss: variant ", vt->name, " backward failed to launch: ",
              cudaGetErrorString(static_cast<cudaError_t>(rc)));
}

}  // namespace tuner_giou
