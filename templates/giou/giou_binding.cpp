// The torch side of every GIoU variant, compiled once per torch/CUDA version and
// reused: it checks tensors, owns the per-stream workspace and error flags, and calls
// a variant through the C table the variant exports (giou_abi.h). Variants themselves
// are CUDA-headers-only translation units, which keeps their builds at ~2 s.
// The search calls variants by address through tuner_giou::forward / backward; the
// user's op (giou_op.cpp) calls the winners bound at load through the same code.
#include "giou_binding.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>

#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace tuner_giou {

const TunerGiouVtable* table(int64_t address) {
  auto* t = reinterpret_cast<const TunerGiouVtable*>(address);
  TORCH_CHECK(t != nullptr, "giou_loss: null variant table");
  TORCH_CHECK(t->abi == TUNER_GIOU_ABI, "giou_loss: variant ", t->name, " has ABI ", text(t->abi),
              " but this binding speaks ABI ", TUNER_GIOU_ABI, "; rebuild the variant");
  return t;
}

namespace {

// One workspace per (device, stream): 32-bit words that start zeroed, and every
// forward leaves them zeroed (the last block resets them) except the sticky error
// word; and `flags`, host memory the GPU writes to (one byte per error bit), so that
// reading them is a plain load. The memory comes from cudaMalloc / cudaHostAlloc, not
// from torch's allocator: a workspace first used while a CUDA graph is being captured or
// recorded (torch.compile's cudagraph trees) must not live in the graph's memory pool,
// and it outlives every graph that captured it (workspaces only grow; outgrown words
// stay allocated, since a captured graph may still use them).
struct Workspace {
  unsigned* words = nullptr;
  int64_t capacity = 0;
  unsigned char* flags = nullptr;         // host pointer
  unsigned char* flags_device = nullptr;  // the same memory as the kernel sees it
  cudaStream_t stream = nullptr;
  int device = 0;
};

std::mutex workspace_mutex;
std::map<std::pair<int, cudaStream_t>, Workspace> workspaces;

Workspace& workspace_for(int device, cudaStream_t stream, int64_t words) {
  std::lock_guard<std::mutex> lock(workspace_mutex);
  Workspace& ws = workspaces[std::make_pair(device, stream)];
  if (ws.capacity >= words) return ws;
  const int64_t capacity = std::max<int64_t>(words, 1024);
  RelaxedCapture relaxed;
  void* fresh = nullptr;
  C10_CUDA_CHECK(cudaMalloc(&fresh, capacity * sizeof(unsigned)));
  // Zeroed on a private stream of the device, so that nothing lands in a graph being captured.
  static std::map<int, cudaStream_t> zeroing_streams;
  cudaStream_t& zeroing = zeroing_streams[device];
  if (zeroing == nullptr) C10_CUDA_CHECK(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking));
  C10_CUDA_CHECK(cudaMemsetAsync(fresh, 0, capacity * sizeof(unsigned), zeroing));
  C10_CUDA_CHECK(cudaStreamSynchronize(zeroing));
  if (ws.flags == nullptr) {
    void* host = nullptr;
    C10_CUDA_CHECK(cudaHostAlloc(&host, 8, cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(host, 0, 8);
    void* dev = nullptr;
    C10_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
    ws.flags = static_cast<unsigned char*>(host);
    ws.flags_device = static_cast<unsigned char*>(dev);
    ws.stream = stream;
    ws.device = device;
  }
  ws.words = static_cast<unsigned*>(fresh);
  ws.capacity = capacity;
  return ws;
}

// Error bits whose flags have landed, cleared (never waits). Clearing the device's
// sticky word too lets a later launch report the same bit again; until then, launches
// already queued do not repeat a report the host has taken.
int64_t take_landed(Workspace& ws) {
  int64_t bits = 0;
  for (int i = 0; i < TUNER_GIOU_ERROR_BITS; ++i) {
    if (__atomic_load_n(ws.flags + i, __ATOMIC_ACQUIRE)) {
      bits |= int64_t(1) << i;
      __atomic_store_n(ws.flags + i, 0, __ATOMIC_RELEASE);
    }
  }
  if (bits) {
    C10_CUDA_CHECK(cudaMemsetAsync(ws.words + TUNER_GIOU_WS_ERROR, 0, sizeof(unsigned), ws.stream));
  }
  return bits;
}

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

std::string error_text(int64_t bits) {
  std::string text;
  if (bits & TUNER_GIOU_BAD_COUNT) text += "num_boxes has a value outside [0, S]";
  if (bits & TUNER_GIOU_BAD_TARGET) {
    if (!text.empty()) text += "; ";
    text += "a valid target box has a non-finite coordinate";
  }
  return text;
}

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
  Workspace& ws = workspace_for(static_cast<int>(pred.get_device()), stream, vt->workspace_words(c.B, c.S));
  // Under graph capture nothing may sync or be enqueued besides the launch: reports
  // then wait for a later eager call on this stream or for take_errors().
  const bool validates = vt->validates && check != CHECK_DEFERRED && !capturing(stream);
  if (validates && check == CHECK_ASYNC) {
    const int64_t earlier = take_landed(ws);
    if (earlier) raise_input_error("giou_loss: invalid input in an earlier call: " + error_text(earlier));
  }
  TunerGiouArgs a;
  fill_common(a, pred, target, c, reduction, eps);
  a.out = out.data_ptr<float>();
  a.count_out = count.data_ptr<float>();
  a.saved_grad = saved_grad != nullptr ? saved_grad->data_ptr<float>() : nullptr;
  a.workspace = ws.words;
  a.error_flags = ws.flags_device;
  const int rc = vt->forward(&a, stream);
  TORCH_CHECK(rc == 0, "giou_loss: variant ", vt->name, " failed to launch: ",
              cudaGetErrorString(static_cast<cudaError_t>(rc)));
  if (validates && check == CHECK_SYNC) {
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t bits = take_landed(ws);
    if (bits) raise_input_error("giou_loss: invalid input: " + error_text(bits));
  }
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

int64_t take_errors() {
  std::lock_guard<std::mutex> lock(workspace_mutex);
  int64_t bits = 0;
  int synced = -1;
  for (auto& entry : workspaces) {
    Workspace& ws = entry.second;
    if (ws.flags == nullptr) continue;
    if (ws.device != synced) {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(ws.device));
      C10_CUDA_CHECK(cudaDeviceSynchronize());
      synced = ws.device;
    }
    bits |= take_landed(ws);
  }
  return bits;
}

namespace {

// The search's calls: one variant by its table's address, outputs given by the caller.
void forward_by_address(int64_t variant, const at::Tensor& pred, const at::Tensor& target,
                        const std::optional<at::Tensor>& num_boxes, int64_t reduction, double eps,
                        const at::Tensor& out, const at::Tensor& count, const at::Tensor& saved_grad, int64_t check) {
  run_forward(table(variant), pred, target, num_boxes, reduction, eps, out, count,
              saved_grad.numel() > 0 ? &saved_grad : nullptr, check);
}

void backward_by_address(int64_t variant, const at::Tensor& grad_out, const at::Tensor& pred,
                         const at::Tensor& target, const std::optional<at::Tensor>& num_boxes,
                         const at::Tensor& count, const at::Tensor& saved_grad, int64_t reduction, double eps,
                         const at::Tensor& grad_pred) {
  run_backward(table(variant), grad_out, pred, target, num_boxes, count, saved_grad, reduction, eps, grad_pred);
}

}  // namespace
}  // namespace tuner_giou

TORCH_LIBRARY_FRAGMENT(tuner_giou, m) {
  m.def("forward(int variant, Tensor pred, Tensor target, Tensor? num_boxes, int reduction, float eps, "
        "Tensor(a!) out, Tensor(b!) count, Tensor(c!) saved_grad, int check) -> ()");
  m.def("backward(int variant, Tensor grad_out, Tensor pred, Tensor target, Tensor? num_boxes, Tensor count, "
        "Tensor saved_grad, int reduction, float eps, Tensor(a!) grad_pred) -> ()");
  m.def("take_errors() -> int", &tuner_giou::take_errors);
  m.def("describe_errors(int bits) -> str", &tuner_giou::error_text);
}

TORCH_LIBRARY_IMPL(tuner_giou, CUDA, m) {
  m.impl("forward", &tuner_giou::forward_by_address);
  m.impl("backward", &tuner_giou::backward_by_address);
}
