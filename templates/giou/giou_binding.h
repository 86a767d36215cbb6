// What the two halves of the GIoU torch binding share: giou_binding.cpp (calls any
// variant by its table's address, for the search) and giou_op.cpp (the user's op,
// tuner::giou_loss, with winners bound at tuner.load).
#pragma once
#include <torch/extension.h>
#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "giou_abi.h"
#include "tuner_binding.h"

namespace tuner_giou {

// How bad input that a variant's validation finds reaches the host.
enum Check : int64_t {
  CHECK_DEFERRED = 0,  // left in the workspace until take_errors()
  CHECK_SYNC = 1,      // read after the launch (a stream sync; only when the variant validates)
  CHECK_ASYNC = 2,     // raised by a later call once the kernel's flag has landed (no sync, no copy)
};

// The table a variant exports, checked for the ABI this binding speaks.
const TunerGiouVtable* table(int64_t address);

// Launches a variant's forward on the current stream. `out` is [B, S] for reduction
// none, else a scalar; `count` a scalar; `saved_grad` [B, S, 4] float32 or null when
// the forward should not save d loss / d pred. Tensors are checked, not converted.
void run_forward(const TunerGiouVtable* vt, const at::Tensor& pred, const at::Tensor& target,
                 const std::optional<at::Tensor>& num_boxes, int64_t reduction, double eps, const at::Tensor& out,
                 const at::Tensor& count, const at::Tensor* saved_grad, int64_t check);

void run_backward(const TunerGiouVtable* vt, const at::Tensor& grad_out, const at::Tensor& pred,
                  const at::Tensor& target, const std::optional<at::Tensor>& num_boxes, const at::Tensor& count,
                  const at::Tensor& saved_grad, int64_t reduction, double eps, const at::Tensor& grad_pred);

using tuner_binding::capturing;
using tuner_binding::raise_input_error;
using tuner_binding::RelaxedCapture;
using tuner_binding::text;
using tuner_binding::warn;

// Waits for every device with a workspace, then reads and clears all error flags; their OR.
int64_t take_errors();
std::string error_text(int64_t bits);

}  // namespace tuner_giou
