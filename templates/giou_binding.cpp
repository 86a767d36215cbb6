// The torch side of every GIoU variant, compiled once per torch/CUDA version and
// reused: it checks tensors, owns the per-stream workspace and calls a variant
// through the C table the variant exports (giou_abi.h). Variants themselves are
// CUDA-headers-only translation units, which keeps their builds at ~2 s.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "giou_abi.h"

namespace {

const TunerGiouVtable* table(int64_t address) {
  auto* t = reinterpret_cast<const TunerGiouVtable*>(address);
  TORCH_CHECK(t != nullptr, "giou_loss: null variant table");
  TORCH_CHECK(t->abi == TUNER_GIOU_ABI, "giou_loss: variant ", t->name, " has ABI ", t->abi,
              " but this binding speaks ABI ", TUNER_GIOU_ABI, "; rebuild the variant");
  return t;
}

// One workspace per (device, stream). It starts zeroed and every forward leaves it
// zeroed (the last block resets it), so no memset launch is needed per call. It
// only grows; the error word is carried over when it does. For asynchronous error
// reports it also owns a pinned word and an event: the error word is copied there
// after a launch, and a later call reads it once the event says the copy landed.
struct Workspace {
  at::Tensor words;
  at::Tensor pinned;
  cudaEvent_t copied = nullptr;
  bool pending = false;
};

std::mutex workspace_mutex;
std::map<std::pair<int, cudaStream_t>, Workspace> workspaces;

Workspace& workspace_for(const at::Tensor& like, cudaStream_t stream, int64_t words) {
  std::lock_guard<std::mutex> lock(workspace_mutex);
  auto key = std::make_pair(static_cast<int>(like.get_device()), stream);
  Workspace& ws = workspaces[key];
  if (ws.words.defined() && ws.words.numel() >= words) return ws;
  auto fresh = at::zeros({std::max<int64_t>(words, 1024)}, like.options().dtype(at::kInt));
  if (ws.words.defined()) {
    fresh.narrow(0, TUNER_GIOU_WS_ERROR, 1).copy_(ws.words.narrow(0, TUNER_GIOU_WS_ERROR, 1));
  } else {
    ws.pinned = at::zeros({1}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&ws.copied, cudaEventDisableTiming));
  }
  ws.words = fresh;
  return ws;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

std::string error_text(int64_t bits) {
  std::string text;
  if (bits & TUNER_GIOU_BAD_COUNT) text += "num_boxes has a value outside [0, S]";
  if (bits & TUNER_GIOU_BAD_TARGET) {
    if (!text.empty()) text += "; ";
    text += "a valid target box has a non-finite coordinate";
  }
  return text;
}

// Reads and clears the error word of one workspace (a 4-byte copy and a sync).
int64_t take_error(Workspace& ws) {
  auto word = ws.words.narrow(0, TUNER_GIOU_WS_ERROR, 1);
  const int64_t bits = word.item<int>();
  if (bits) word.zero_();
  ws.pending = false;
  ws.pinned.zero_();
  return bits;
}

// Bits an earlier asynchronous copy brought back, if it has landed (never waits).
int64_t landed_error(Workspace& ws, cudaStream_t stream) {
  if (!ws.pending || cudaEventQuery(ws.copied) != cudaSuccess) return 0;
  ws.pending = false;
  const int64_t bits = *ws.pinned.data_ptr<int>();
  if (bits) {
    *ws.pinned.data_ptr<int>() = 0;
    C10_CUDA_CHECK(cudaMemsetAsync(ws.words.data_ptr<int>() + TUNER_GIOU_WS_ERROR, 0, sizeof(int), stream));
  }
  return bits;
}

void check_boxes(const char* what, const at::Tensor& t, const char* want_dtype, const TunerGiouVtable* vt) {
  TORCH_CHECK(t.is_cuda(), "giou_loss: ", what, " must be a CUDA tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 3 && t.size(2) == 4, "giou_loss: ", what, " must have shape [B, S, 4], got ", t.sizes());
  TORCH_CHECK(std::strcmp(c10::toString(t.scalar_type()), want_dtype) == 0, "giou_loss: variant ", vt->name,
              " takes ", what, " of dtype ", want_dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "giou_loss: ", what, " must be contiguous");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % vt->alignment == 0, "giou_loss: ", what,
              " must be aligned to ", vt->alignment, " bytes for variant ", vt->name);
}

struct Common {
  int B, S;
  const long long* num_boxes;
};

Common check_common(const TunerGiouVtable* vt, const at::Tensor& pred, const at::Tensor& target,
                    const c10::optional<at::Tensor>& num_boxes) {
  check_boxes("pred", pred, vt->pred_dtype, vt);
  check_boxes("target", target, vt->target_dtype, vt);
  TORCH_CHECK(target.sizes() == pred.sizes(), "giou_loss: pred ", pred.sizes(), " and target ", target.sizes(),
              " must have the same shape");
  TORCH_CHECK(target.device() == pred.device(), "giou_loss: pred is on ", pred.device(), " but target is on ",
              target.device());
  TORCH_CHECK(pred.numel() < INT_MAX, "giou_loss: at most ", INT_MAX / 4, " boxes per call");
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
              "giou_loss: ", what, " must be a contiguous float32 tensor of ", numel, " elements on ", pred.device());
}

void forward(int64_t variant, const at::Tensor& pred, const at::Tensor& target,
             const c10::optional<at::Tensor>& num_boxes, int64_t reduction, double eps, at::Tensor out,
             at::Tensor count, at::Tensor saved_grad, int64_t check) {
  const auto* vt = table(variant);
  TORCH_CHECK(reduction >= 0 && reduction <= 2, "giou_loss: reduction code must be 0 (none), 1 (mean) or 2 (sum)");
  const Common c = check_common(vt, pred, target, num_boxes);
  check_float_out("out", out, pred, reduction == 0 ? int64_t(c.B) * c.S : 1);
  check_float_out("count", count, pred, 1);
  const bool save = saved_grad.numel() > 0;
  TORCH_CHECK(!save || vt->saves_grad, "giou_loss: variant ", vt->name, " does not save gradients");
  if (save) check_float_out("saved_grad", saved_grad, pred, pred.numel());

  c10::cuda::CUDAGuard guard(pred.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (c.B * c.S == 0) {  // nothing to launch: an empty mean or sum is 0
    out.zero_();
    count.zero_();
    return;
  }
  Workspace& ws = workspace_for(pred, stream, vt->workspace_words(c.B, c.S));
  const bool async = check == 2 && vt->validates && !capturing(stream);
  if (async) {
    const int64_t earlier = landed_error(ws, stream);
    TORCH_CHECK_VALUE(earlier == 0, "giou_loss: invalid input in an earlier call: ", error_text(earlier));
  }
  TunerGiouArgs a;
  a.pred = pred.data_ptr();
  a.target = target.data_ptr();
  a.num_boxes = c.num_boxes;
  a.B = c.B;
  a.S = c.S;
  a.reduction = static_cast<int>(reduction);
  a.eps = static_cast<float>(eps);
  a.out = out.data_ptr<float>();
  a.count_out = count.data_ptr<float>();
  a.saved_grad = save ? saved_grad.data_ptr<float>() : nullptr;
  a.workspace = reinterpret_cast<unsigned*>(ws.words.data_ptr<int>());
  const int rc = vt->forward(&a, stream);
  TORCH_CHECK(rc == 0, "giou_loss: variant ", vt->name, " failed to launch: ",
              cudaGetErrorString(static_cast<cudaError_t>(rc)));
  if (check == 1) {
    const int64_t bits = take_error(ws);
    TORCH_CHECK_VALUE(bits == 0, "giou_loss: invalid input: ", error_text(bits));
  } else if (async) {
    C10_CUDA_CHECK(cudaMemcpyAsync(ws.pinned.data_ptr<int>(), ws.words.data_ptr<int>() + TUNER_GIOU_WS_ERROR,
                                   sizeof(int), cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaEventRecord(ws.copied, stream));
    ws.pending = true;
  }
}

void backward(int64_t variant, const at::Tensor& grad_out, const at::Tensor& pred, const at::Tensor& target,
              const c10::optional<at::Tensor>& num_boxes, const at::Tensor& count, const at::Tensor& saved_grad,
              int64_t reduction, double eps, at::Tensor grad_pred) {
  const auto* vt = table(variant);
  TORCH_CHECK(reduction >= 0 && reduction <= 2, "giou_loss: reduction code must be 0 (none), 1 (mean) or 2 (sum)");
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
  a.pred = pred.data_ptr();
  a.target = target.data_ptr();
  a.num_boxes = c.num_boxes;
  a.B = c.B;
  a.S = c.S;
  a.reduction = static_cast<int>(reduction);
  a.eps = static_cast<float>(eps);
  a.grad_out = grad_out.data_ptr<float>();
  a.count = count.data_ptr<float>();
  a.saved_grad = vt->saves_grad ? saved_grad.data_ptr<float>() : nullptr;
  a.grad_pred = grad_pred.data_ptr();
  const int rc = vt->backward(&a, stream);
  TORCH_CHECK(rc == 0, "giou_loss: variant ", vt->name, " backward failed to launch: ",
              cudaGetErrorString(static_cast<cudaError_t>(rc)));
}

// Reads and clears the error words of every workspace (syncs); returns their OR.
int64_t take_errors() {
  std::lock_guard<std::mutex> lock(workspace_mutex);
  int64_t bits = 0;
  for (auto& entry : workspaces) bits |= take_error(entry.second);
  return bits;
}

std::string describe_errors(int64_t bits) { return error_text(bits); }

}  // namespace

TORCH_LIBRARY(tuner_giou, m) {
  m.def("forward(int variant, Tensor pred, Tensor target, Tensor? num_boxes, int reduction, float eps, "
        "Tensor(a!) out, Tensor(b!) count, Tensor(c!) saved_grad, int check) -> ()");
  m.def("backward(int variant, Tensor grad_out, Tensor pred, Tensor target, Tensor? num_boxes, Tensor count, "
        "Tensor saved_grad, int reduction, float eps, Tensor(a!) grad_pred) -> ()");
  m.def("take_errors() -> int", &take_errors);
  m.def("describe_errors(int bits) -> str", &describe_errors);
}

TORCH_LIBRARY_IMPL(tuner_giou, CUDA, m) {
  m.impl("forward", &forward);
  m.impl("backward", &backward);
}
