"""The modules `tuner.patch` hands to the tuned EmbeddingBag op (tuner.deploy.patching): torch's
nn.EmbeddingBag, matched by its exact class (a subclass with a forward of its own is left
alone). Each forward here is bound to its module in place of the class's."""

from __future__ import annotations

from tuner.families.embedding_bag.op import embedding_bag


def nn_embedding_bag(self, input, offsets=None, per_sample_weights=None):
    """nn.EmbeddingBag's forward, F.embedding_bag with the module's settings, on the tuned op
    (which hands max_norm, scale_grad_by_freq and sparse tables to torch)."""
    return embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq,
                         self.mode, self.sparse, per_sample_weights, self.include_last_offset, self.padding_idx)


MODULES = {"torch.nn.modules.sparse.EmbeddingBag": nn_embedding_bag}
