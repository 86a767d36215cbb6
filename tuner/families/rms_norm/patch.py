"""The modules `tuner.patch` hands to the tuned RMSNorm op (tuner.deploy.patching): torch's nn.RMSNorm,
and transformers' Llama-style RMSNorm modules (LlamaRMSNorm and the copies other models keep of
it), each matched by its exact class, so that a subclass with a forward of its own is left alone.
Each forward here is bound to its module in place of the class's."""

from __future__ import annotations

import torch

from tuner import runtime
from tuner.families.rms_norm.op import DTYPES, rms_norm

# transformers' classes whose forward is LlamaRMSNorm's, word for word: normalize in float32,
# cast to the input's dtype, times the weight (so the result has the promoted dtype of the two).
# Gemma's (1 + weight) and OLMo-2's (cast after the weight) differ and are not here.
LLAMA_STYLE = tuple(f"transformers.models.{m}.modeling_{m}.{c}RMSNorm" for m, c in (
    ("llama", "Llama"), ("mistral", "Mistral"), ("mixtral", "Mixtral"), ("qwen2", "Qwen2"),
    ("qwen2_moe", "Qwen2Moe"), ("qwen3", "Qwen3"), ("qwen3_moe", "Qwen3Moe"), ("phi3", "Phi3")))


def nn_rms_norm(self, x):
    """nn.RMSNorm's forward, F.rms_norm over its normalized_shape, on the tuned op."""
    return rms_norm(x, self.normalized_shape, self.weight, self.eps)


def llama_rms_norm(self, hidden_states):
    """LlamaRMSNorm's forward on the tuned op: a CUDA input in the op's dtypes goes to it, the
    result in the dtype the module gives (the weight's and the input's promoted); other calls
    run the module's own forward."""
    weight = self.weight
    if not (hidden_states.is_cuda and hidden_states.dim() >= 1 and isinstance(weight, torch.Tensor)
            and weight.shape == hidden_states.shape[-1:] and hidden_states.dtype in runtime.dtypes(DTYPES)
            and weight.dtype in runtime.dtypes(DTYPES)):
        return type(self).forward(self, hidden_states)
    y = runtime.entry("rms_norm")(hidden_states, weight, self.variance_epsilon)
    out = torch.promote_types(weight.dtype, hidden_states.dtype)
    return y if y.dtype == out else y.to(out)


MODULES = {"torch.nn.modules.normalization.RMSNorm": nn_rms_norm,
           **{name: llama_rms_norm for name in LLAMA_STYLE}}
