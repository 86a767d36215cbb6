// What the two halves of the GIoU torch binding share: giou_binding.cpp (calls any
// variant by its table's address, for the search) and giou_op.cpp (the user's op,
// tuner::giou_loss, with winners bound at tuner.load).
#pragma once
#include <torch/extension.h>
#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "giou_abi.h"
#include "tuner_op.h"

namespace tuner_giou {

using namespace tuner_op;

// The op's state (winners, workspaces, validate mode), defined in giou_binding.cpp.
extern Op<TunerGiouVtable> op;

// Launches a variant's forward on the current stream. `out` is [B, S] for reduction
// none, else a scalar; `count` a scalar; `saved_grad` [B, S, 4] float32 or null when
// the forward should not save d loss / d pred. Tensors are checked, not converted.
void run_forward(const TunerGiouVtable* vt, const at::Tensor& pred, const at::Tensor& target,
                 const std::optional<at::Tensor>& num_boxes, int64_t reduction, double eps, const at::Tensor& out,
                 const at::Tensor& count, const at::Tensor* saved_grad, int64_t check);

void run_backward(const TunerGiouVtable* vt, const at::Tensor& grad_out, const at::Tensor& pred,
                  const at::Tensor& target, const std::optional<at::Tensor>& num_boxes, const at::Tensor& count,
                  const at::Tensor& saved_grad, int64_t reduction, double eps, const at::Tensor& grad_pred);

}  // namespace tuner_giou
