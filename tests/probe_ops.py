"""Ops declared for the tests of the core's rendering (tests/test_declared.py, test_expression.py),
and their C++ built as one library: each op rendered alone would compile torch's headers again
(about 45 s of a core each on the CI machine); in one translation unit they compile once a run.

Each op's C++ lives in a namespace of its own and registers with macros that name themselves
uniquely (TORCH_LIBRARY_FRAGMENT), so that several go into one unit as they are."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tuner import declare, paths

# More than the toy uses: two tensors of several dtypes (four dtype pairs), a tensor with no
# gradient, an optional one, scalars of each type with defaults, three outputs (one a number), a baseline, a tensor
# saved for the backward, more table fields and scratch memory for the backward.
RICH = declare.Op(
    "declared_probe",
    inputs=(declare.Tensor("x", dtypes=("float32", "bfloat16")),
            declare.Tensor("w", dtypes=("float32", "float16"), optional=True),
            declare.Tensor("index", dtypes=("int64",), grad=False, shape=("rows",)), declare.Scalar("eps", "float", 1e-6),
            declare.Scalar("rounds", "int", 2), declare.Scalar("fast", "bool", False),
            declare.Scalar("mode", "str", "mean", choices=("sum", "mean"))),
    outputs=(declare.Tensor("y", like="x"), declare.Tensor("z", like="w"),
             declare.Tensor("total", dtypes=("float32",), shape=())),
    sizes={"rows": "leading(x)", "width": "x.size(-1)"},
    baseline="std::make_tuple(x * eps, w.has_value() ? *w * static_cast<double>(rounds) : x * 0.0, "
             "mode == \"sum\" ? x.sum() : x.mean())",
    saves=(declare.Tensor("stat", dtypes=("float32",), shape=("rows",)),),
    table=("int vec", "long long (*scratch_floats)(long long rows, long long width)"),
    scratch="vt->scratch_floats(sizes[0], sizes[1])",
)


# An input the variants may get as null (GIoU's num_boxes: valid slots from the targets where it is left out).
NULLABLE = declare.Op(
    "nullable_probe",
    inputs=(declare.Tensor("x", dtypes=("float32",)),
            declare.Tensor("counts", dtypes=("int64",), grad=False, shape=("rows",), optional="null"),
            declare.Scalar("eps", "float", 1e-6)),
    outputs=(declare.Tensor("y", like="x"),),
    sizes={"rows": "x.size(0)"},
    saves=(declare.Tensor("stat", dtypes=("float32",), shape=("rows",)),),
    baseline="x * eps",
    table=("long long (*workspace_words)(long long rows)",),
    workspace="vt->workspace_words(sizes[0])",  # zeroed words kept between calls (a last block's sums)
)


# EmbeddingBag's parts: an output of one input's dtype with a shape of its own, a saved tensor written
# for one word of a scalar alone, an optional input (before a differentiable one) that takes a gradient.
BAGS = declare.Op(
    "bags_probe",
    inputs=(declare.Tensor("indices", dtypes=("int64",), grad=False, shape=("bags", "per")),
            declare.Tensor("scale", like="weight", shape="indices", optional="null"),  # one an entry
            declare.Scalar("mode", "str", choices=("sum", "max")),
            declare.Tensor("weight", dtypes=("float32", "float64")),
            declare.Scalar("padding_idx", "int", optional=True)),
    outputs=(declare.Tensor("out", like="weight", shape=("bags", "dim")),),
    sizes={"bags": "indices.size(0)", "per": "indices.size(1)", "dim": "weight.size(1)"},
    checks=(("indices.dim() == 2", "indices must be [bags, per]"), ("weight.dim() == 2", "weight must be 2-D"),
            ("padding_idx is None or (padding_idx >= -weight.size(0) and padding_idx < weight.size(0))",
             "padding_idx must be within [-rows, rows)")),
    saves=(declare.Tensor("chosen", dtypes=("int64",), shape=("bags", "dim"), when=("mode", ("max",))),),
    work=("forward", "backward"),  # memory each pass's variant sizes from the call
    key=("dim", "ratio(bags * per, bags)"), kind="mode",  # winners by dim and mean bag, kept by mode
    sorted=("indices",),  # a backward may read the entries in row order
)


# A conditional size, an input the caller may leave out read in a size and a check, a word compared.
WHERE = declare.Op(
    "where_probe",
    inputs=(declare.Tensor("x", dtypes=("float32",)),
            declare.Tensor("m", dtypes=("int64",), grad=False, optional="null"),
            declare.Tensor("w", dtypes=("float32",), grad=False, shape=("rows", "given")),
            declare.Scalar("mode", "str", "plain", choices=("plain", "count"))),
    outputs=(declare.Tensor("y", like="x"),),
    sizes={"rows": "x.size(0) if x.dim() == 2 else 1", "given": "m.numel() if m is not None else 0"},
    checks=(("x.dim() == 1 or x.dim() == 2", "x must be 1-D or 2-D"),
            ("m is None or mode == 'count'", "m is for mode count")),
)


OPS = (RICH, NULLABLE, BAGS, WHERE)


def library() -> Path:
    """The library holding every op of OPS, built once a test run (in its TUNER_CACHE, under the
    bindings' lock: one process builds it, the others wait) and loaded once a process."""
    import torch

    from tuner.build import binding, declared

    files = {f"{op.name}_abi.h": declared.header(op) for op in OPS}
    files |= {f"{op.name}_op.cpp": declared.op_source(op) for op in OPS}
    files["probes.cpp"] = "".join(f'#include "{op.name}_op.cpp"\n' for op in OPS)
    made = "\0".join([torch.__version__, *(f"{k}\0{v}" for k, v in sorted(files.items()))])  # a kept cache: torch too
    key = hashlib.sha256(made.encode()).hexdigest()[:16]
    folder = paths.variants_dir() / "_probes" / key
    path = folder / f"tuner_probes_{key}.so"
    with binding._building(folder):
        if not binding._done(path).exists():
            for name, text in files.items():
                (folder / name).write_text(text)
            binding.compile_library(path, [folder / "probes.cpp"], [folder], optimize=False)
            binding._done(path).touch()
    if str(path) not in _LOADED:
        torch.ops.load_library(str(path))
        _LOADED.append(str(path))
    return path


_LOADED: list[str] = []
