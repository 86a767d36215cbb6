// tuner::scale_add(x, y, alpha) = alpha * x + y on float32: the toy family's op in C++ on the
// core's machinery (templates/common/tuner_op.h): its schema, checks and autograd are all it writes.
#include "scale_add_abi.h"
#include "tuner_op.h"

namespace {

using namespace tuner_op;
using Sig = at::Tensor(const at::Tensor&, const at::Tensor&, double);

int pair_of(const TunerScaleAddVtable*) { return 0; }  // one dtype pair: float32
Op<TunerScaleAddVtable> op("scale_add", TUNER_SCALE_ADD_ABI, 1, pair_of, nullptr);

at::Tensor scale_add_cuda(const at::Tensor& x, const at::Tensor& y, double alpha) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat, "scale_add: x and y must be float32");
  TORCH_CHECK_VALUE(x.sizes() == y.sizes() && x.device() == y.device(), "scale_add: x and y must match in shape and device");
  const auto t = op.bound();
  if (t->reference) return OnCpu<Sig>::call("tuner::scale_add", x.device(), x, y, alpha);
  const auto& w = op.choose(*t, 0, {x.numel()}, 0, [] { return std::string("float32"); });
  const at::Tensor a = x.contiguous(), b = y.contiguous();
  at::Tensor out = at::empty_like(a);
  c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  op.launch(w.vt, [&] {
    return w.vt->launch(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), alpha, a.numel(), stream);
  });
  return out;
}

class ScaleAdd : public torch::autograd::Function<ScaleAdd> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y, double alpha) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["alpha"] = alpha;
    return Call<Sig>::call("tuner::scale_add", x, y, alpha);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0] * ctx->saved_data["alpha"].toDouble(), grads[0], at::Tensor()};
  }
};

at::Tensor scale_add_autograd(const at::Tensor& x, const at::Tensor& y, double alpha) {
  return ScaleAdd::apply(x, y, alpha);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tuner, m) { m.def("scale_add(Tensor x, Tensor y, float alpha) -> Tensor"); }
TORCH_LIBRARY_IMPL(tuner, CUDA, m) { m.impl("scale_add", &scale_add_cuda); }
TORCH_LIBRARY_IMPL(tuner, Autograd, m) { m.impl("scale_add", &scale_add_autograd); }
TUNER_OP_CONTROL(tuner_scale_add, op)
