"""A family's op declared (tuner.declare) and rendered by the core (tuner/build/declared.py): the
C ABI header and the op's C++, checked on a machine without a GPU: the header is valid C and its
ctypes mirror lays out as the compiler does, the C++ compiles against torch and registers the
declared schemas, and a declaration the core cannot render says what to change."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tuner import declare, families, opspec
from tuner.build import binding, declared, toolkit
from tuner.measure import abi

import probe_ops
from probe_ops import BAGS, NULLABLE, RICH

HERE = Path(__file__).parent / "families"



def test_a_declared_header_is_rendered_where_it_is_included_and_kept_nowhere(capsys, tmp_path):
    """No file to write or keep in step: the builds, the exports and the ctypes mirror take the
    header the declaration renders; `python -m tuner.build.declared NAME` prints it."""
    from tuner.build import render

    families.add_path(HERE)
    assert not (families.templates("scale_add") / "scale_add_abi.h").exists()
    text = declared.header(families.get("scale_add").OP_DECLARATION)
    assert render.headers("scale_add") == {"scale_add_abi.h": text}
    assert (render.write_headers("scale_add", tmp_path) / "scale_add_abi.h").read_text() == text
    assert declared.main(["scale_add"]) == 0 and capsys.readouterr().out == text
    assert "`python -m tuner.build.declared scale_add` prints it" in text  # the command its comment names
    assert declared.main(["scale_add_op"]) == 2  # an unknown family: one line, no traceback
    assert capsys.readouterr().err.startswith("error: unknown kernel family 'scale_add_op'")
    assert abi.table("scale_add")[0] == "TunerScaleAddVtable"


def test_a_rendered_header_is_c_and_its_mirror_lays_out_as_the_compiler_does(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "probe_abi.h").write_text(declared.header(RICH))
    structs = ("TunerDeclaredProbeArgs", "TunerDeclaredProbeBackwardArgs", "TunerDeclaredProbeVtable")
    parsed = abi.parse(declared.header(RICH), "probe_abi.h")
    mirrors = {name: abi.mirror(name, parsed[name]) for name in structs}
    lines = ['#include "probe_abi.h"', "#include <stddef.h>", "#include <stdio.h>", "int main(void) {"]
    for name, mirror in mirrors.items():
        lines.append(f'  printf("%zu\\n", sizeof({name}));')
        lines += [f'  printf("%zu\\n", offsetof({name}, {f}));' for f, _ in mirror._fields_]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines + ["  return 0;", "}"]) + "\n")
    subprocess.run([cc, f"-I{tmp_path}", f"-I{toolkit.cuda_home() / 'include'}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, timeout=120)
    want = [int(n) for n in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    got = []
    for mirror in mirrors.values():
        got += [ctypes.sizeof(mirror)] + [getattr(mirror, f).offset for f, _ in mirror._fields_]
    assert got == want
    fields = [f for f, _ in mirrors["TunerDeclaredProbeVtable"]._fields_]
    assert fields == ["abi", "name", "x_dtype", "w_dtype", "vec", "scratch_floats", "forward", "backward"]
    assert [f for f, _ in mirrors["TunerDeclaredProbeBackwardArgs"]._fields_] == [
        "grad_y", "grad_z", "grad_total", "x", "w", "index", "stat", "grad_x", "grad_w", "scratch", "eps", "rounds",
        "fast", "mode", "rows", "width"]
    assert [f for f, _ in mirrors["TunerDeclaredProbeArgs"]._fields_] == [
        "x", "w", "index", "y", "z", "total", "stat", "eps", "rounds", "fast", "mode", "rows", "width"]


def test_the_rendered_op_compiles_and_registers_its_schemas():
    import torch

    probe_ops.library()
    schema = torch.ops.tuner.declared_probe.default._schema
    assert [(a.name, str(a.type), a.default_value) for a in schema.arguments] == [
        ("x", "Tensor", None), ("w", "Optional[Tensor]", None), ("index", "Tensor", None), ("eps", "float", 1e-6),
        ("rounds", "int", 2), ("fast", "bool", False), ("mode", "str", "mean")]
    assert len(schema.returns) == 3
    assert str(torch.ops.tuner.declared_probe_backward.default._schema).startswith(
        "tuner::declared_probe_backward(Tensor grad_y, Tensor grad_z, Tensor grad_total, Tensor x, Tensor w, "
        "Tensor index, Tensor stat, "
        "float eps, int rounds, bool fast, str mode, bool x_grad, bool w_grad) -> (Tensor, Tensor)")
    assert str(torch.ops.tuner.declared_probe_forward.default._schema).endswith("-> (Tensor, Tensor, Tensor, Tensor)")
    assert torch.ops.tuner_declared_probe.has_baseline() is True  # the control ops are there, and say so
    assert "served(int[] sizes, ScalarType x, ScalarType w, bool grad=False) -> str" in str(
        torch.ops.tuner_declared_probe.served.default._schema)
    assert torch.ops.tuner_declared_probe.served([4, 8], torch.float64, torch.float32) == "torch"  # no variant takes it
    x, index = torch.randn(4, 8), torch.zeros(4, dtype=torch.long)
    y, z, total = torch.ops.tuner.declared_probe(x, x.bfloat16(), index, 0.5, 3)  # w outside float32, float16
    torch.testing.assert_close((y, z, total), (x * 0.5, x.bfloat16() * 3.0, x.mean()))
    _, _, total = torch.ops.tuner.declared_probe(x, x.bfloat16(), index, 0.5, 3, mode="sum")  # a word, by name
    torch.testing.assert_close(total, x.sum())
    with pytest.raises(ValueError, match="declared_probe: mode must be one of sum, mean, got max"):
        torch.ops.tuner.declared_probe(x, x.bfloat16(), index, 0.5, 3, mode="max")
    y, z, total = torch.ops.tuner.declared_probe(x, None, index, 0.5, 3)  # w left out: torch's
    torch.testing.assert_close((y, z), (x * 0.5, x * 0.0))
    with pytest.raises(ValueError, match="declared_probe: x is on cpu but index is on meta"):  # devices are checked first
        torch.ops.tuner.declared_probe(x, x.bfloat16(), index.to("meta"), 0.5, 3)
    with pytest.raises(ValueError, match=r"declared_probe: index must have shape \[4\] \(rows\), got \[5\]"):
        torch.ops.tuner.declared_probe(x, x.bfloat16(), torch.zeros(5, dtype=torch.long), 0.5, 3)




def test_an_input_the_variants_get_as_null_is_optional_in_every_schema_and_checked_where_given():
    import torch

    from tuner import opspec

    header = declared.header(NULLABLE)
    assert "const void* counts;" in header  # a pointer, null where the caller left it out
    assert "unsigned* workspace;" in header and "unsigned* errors;" not in header
    assert ".workspace = ws.words + 1" in declared.op_source(NULLABLE)  # after the errors' word
    probe_ops.library()
    assert [str(a.type) for a in torch.ops.tuner.nullable_probe.default._schema.arguments] == [
        "Tensor", "Optional[Tensor]", "float"]
    assert "Tensor? counts" in str(torch.ops.tuner.nullable_probe_forward.default._schema)
    assert "Tensor? counts" in str(torch.ops.tuner.nullable_probe_backward.default._schema)
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"nullable_probe: counts must have shape \[4\] \(rows\), got \[5\]"):
        torch.ops.tuner.nullable_probe(x, torch.zeros(5, dtype=torch.long), 0.5)
    counts32 = torch.zeros(4, dtype=torch.int32)  # outside the variants' dtypes: the baseline's
    torch.testing.assert_close(torch.ops.tuner.nullable_probe(x, counts32, 0.5), x * 0.5)
    with pytest.raises(ValueError, match="nullable_probe: x is on cpu but counts is on meta"):
        torch.ops.tuner.nullable_probe(x, torch.zeros(4, dtype=torch.long, device="meta"), 0.5)
    # In Python as in C++: a call that leaves it out is the variants' (no baseline), one that gives it
    # in another dtype the baseline's.
    assert not opspec.outside(NULLABLE, opspec.bind(NULLABLE, (x, None, 0.5)))
    assert opspec.outside(NULLABLE, opspec.bind(NULLABLE, (x, counts32, 0.5)))
    assert opspec.problem(NULLABLE, opspec.bind(NULLABLE, (x, None, 0.5))) == {"rows": 4}


def _bare_kernel(op, table):
    """A DeclaredKernel with no variant behind it, its memory as `Kernel.__init__` leaves it."""
    from tuner.measure.declared import DeclaredKernel

    kernel = object.__new__(DeclaredKernel)
    kernel.op, kernel.table, kernel._words, kernel._replaced, kernel.error_word = op, table, None, [], 0
    return kernel


def test_the_search_gives_a_declared_workspace_zeroed_after_the_errors_word():
    import types

    import torch

    kernel = _bare_kernel(NULLABLE, types.SimpleNamespace(workspace_words=lambda rows: 2 * rows))
    fields = kernel._word_fields({"x": torch.randn(40, 8), "counts": None, "eps": 0.5}, [40])
    words = kernel._words
    assert set(fields) == {"workspace"} and words.numel() >= 1 + 80 and not words.any()
    assert fields["workspace"] == words.data_ptr() + 4
    kernel._word_fields({"x": torch.randn(2, 8), "counts": None, "eps": 0.5}, [2])
    assert kernel._words is words  # kept while it is long enough
    reporting = _bare_kernel(families.get("cross_entropy").OP_DECLARATION, None)  # errors alone: one word
    x = torch.randn(3, 5)
    fields = reporting._word_fields({"logits": x, "target": torch.zeros(3, dtype=torch.long), "ignore_index": -100,
                                     "label_smoothing": 0.0, "reduction": "mean", "in_place": False}, [3, 5])
    assert set(fields) == {"errors", "error_flags"} and fields["error_flags"] is None
    reporting._words[0] = 1
    assert reporting.take_errors() == 1 and reporting.take_errors() == 0


def test_a_scalar_between_tensors_leaves_the_gradients_where_autograd_counts_them():
    """torch counts a C++ Function's inputs that need a gradient among its tensors alone; the
    gradients it returns, one per argument."""
    op = declare.Op("between", inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("k"),
                                       declare.Tensor("v", like="x")),
                    outputs=(declare.Tensor("y", like="x"),), sizes={"n": "x.numel()"})
    source = declared.op_source(op)
    assert "const bool x_grad = ctx->needs_input_grad(0);" in source
    assert "const bool v_grad = ctx->needs_input_grad(1);" in source
    assert "if (v_grad) result[2] = std::get<1>(got);" in source


@pytest.mark.parametrize("change,message", [
    (dict(outputs=(declare.Tensor("y", like="nope"),)), "y is like 'nope', which is no input tensor"),
    (dict(outputs=(declare.Tensor("y", dtypes=("float32",)),)), "output y: say which input it is allocated like"),
    (dict(outputs=(declare.Tensor("y", dtypes=("float32",), shape=("rows",)),)), "output y: its shape names 'rows'"),
    (dict(sizes={}), "no sizes"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float8",)),)), "x: unknown dtype 'float8'"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("k", "complex"))),
     "scalar k is a 'complex'"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",), grad=False),)), "no input tensor takes a gradient"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("x", like="x"))), "a name is used twice"),
    (dict(inputs=(declare.Tensor("p", like="q"), declare.Tensor("q", like="p")), outputs=(declare.Tensor("y", like="p"),)),
     "p -> q -> p: tensors like each"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("stream", like="x"))),
     "'stream' is a name the rendered C++ uses itself"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("grad_x", like="x"))),
     "'grad_x' is what the rendered C++ names a part of 'x'"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("i", dtypes=("int64",)))),
     "input i: a int64 tensor takes no gradient: grad=False"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("k", "int", 1.5))),
     "scalar k: its default 1.5 is no int"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32", "float32")),)), "x: a dtype is named twice"),
    (dict(alignment=12), "alignment 12: a power of two"),
    (dict(table=("int forward",)), "table field 'forward': the table has that field already"),
    (dict(inputs=(declare.Tensor("X", dtypes=("float32",)),)), "'X' is not a C identifier"),
    (dict(saves=(declare.Tensor("stat", dtypes=("float32",)),)), "saved 'stat': a Tensor of one dtype (or like an input) and a shape"),
    (dict(table=("int vec;",)), "table field 'int vec;': one C declaration without its ';'"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("w", like="x", optional=True))),
     "an optional input needs a baseline"),
    (dict(saves=(declare.Tensor("stat", dtypes=("float32",), shape=("rows",)),)),
     "saved stat: its shape names 'rows', which is no size"),
    (dict(sizes={"n": "x.numel() / 2"}), "size n: 'x.numel() / 2' is not an expression C++ and Python both read"),
    (dict(sizes={"n": "x.numel() >= 2"}), "size n: 'x.numel() >= 2' is not an expression"),
    (dict(checks=("x.dim() >= 1",)), "check 'x.dim() >= 1': a (condition, message) pair"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("mode", "str", "mean"))),
     "scalar mode: a str takes its choices"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("mode", "str", "max", ("sum", "mean")))),
     "scalar mode: its default 'max' is not one of its choices"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("mode", "str", "sum", ("sum", "a b")))),
     "must be distinct words"),
    (dict(checks=(("x.dim() && 1", "m"),)), "a (condition, message) pair, the condition in the sizes' words"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)),
                  declare.Tensor("m", dtypes=("int64",), grad=False, optional="none"))),
     "m: optional='none': True (the baseline serves a call without it) or \"null\""),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)),
                  declare.Tensor("m", dtypes=("float32", "float16"), optional="null"))),
     "input m: an input the variants may get as null is of one dtype or like an input that is always given"),
    (dict(saves=(declare.Tensor("g", dtypes=("int64",), shape=("n",), when=("mode", ("max",))),)),
     "saved g: when=('mode', ('max',)) is (a str scalar's name, a tuple of its choices)"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("mode", "str", "sum", ("sum", "max"))),
          saves=(declare.Tensor("g", dtypes=("int64",), shape=("n",), when=("mode", "max")),)),
     "saved g: when=('mode', 'max') is (a str scalar's name, a tuple of its choices)"),
    (dict(outputs=(declare.Tensor("y", like="x", when=("mode", ("max",))),)), "y: when is for a saved tensor"),
    (dict(inputs=(declare.Scalar("k", default=1.0), declare.Tensor("x", dtypes=("float32",)))),
     "scalar k has a default and an input after it has none"),
    (dict(work=("sideways",)), "work=('sideways',): the passes that get it"),
    (dict(key=("n / 2",)), "key 'n / 2': an expression of the sizes (n) with + - * and ratio(a, b)"),
    (dict(key=("x.numel()",)), "key 'x.numel()': an expression of the sizes"),
    (dict(key=("n > 2",)), "a number, not a truth value"),
    (dict(kind="n"), "kind='n': the name of a str scalar"),
    (dict(work=("forward",), table=("int forward_work_bytes",)), "table field 'forward_work_bytes': the table has"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("k", "str", choices=("a",), optional=True))),
     "scalar k: optional=True is for an int or float scalar with no default"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("k", "int", 1, optional=True))),
     "scalar k: optional=True is for an int or float scalar with no default"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Scalar("k", "int", optional=True),
                  declare.Scalar("k_given", "int"))), "'k_given' is what the rendered C++ names a part of 'k'"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)),
                  declare.Tensor("m", dtypes=("int64",), grad=False, optional="null"),
                  declare.Tensor("k", like="m", grad=False))),
     "input m: an input the variants may get as null"),
    (dict(sizes={"n": "x.numel() if x.dim() > 1 else x.stride(0)"}), "'x.stride(0)' is none of a declaration's words"),
    (dict(checks=(("x.dim() >= 1", 'x must be "big"'),)), "a message without"),
    (dict(errors=("bad",)), "error 'bad': a (name, message) pair"),
    (dict(workspace=3), "workspace 3: a C++ expression of vt and sizes"),
    (dict(workspace="vt->split > 0 ? sizes[0] : 0"), "that the search reads as Python too (vt->f as vt.f; no ?:"),
    (dict(errors=(("Bad", "m"),)), "the name a C identifier in lower case"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("i", dtypes=("int64",), grad=False)),
          errors=(("bad", "m"),), guards=(("i", "x.size(0)", "bad"),)), "guard ('i', 'x.size(0)', 'bad'): "),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("i", dtypes=("int64",), grad=False)),
          errors=(("bad", "m"),), guards=(("x", "x.size(0)", "bad"),), baseline="x"), "an int32/int64 input"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("i", dtypes=("int64",), grad=False)),
          errors=(("bad", "m"),), guards=(("i", "x.size(0)", "worse"),), baseline="x"), "a declared error"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("i", dtypes=("int64",), grad=False),
                  declare.Scalar("skip", "float", 0.0)),
          errors=(("bad", "m"),), guards=(("i", "x.size(0)", "bad", "skip"),), baseline="x"), "an int scalar"),
    (dict(errors=(("bad", "m"), ("bad", "n"))), "at most 8, each named once"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("k", dtypes=("float32",), converts=True))),
     "input k: converts=True is for an integer input of one dtype"),
    (dict(saves=(declare.Tensor("g", dtypes=("float32",), shape=("n",), only_if="saves_g"),)),
     "g: only_if='saves_g' is for a saved tensor (not a gradient_of one), naming an int field of the table"),
    (dict(saves=(declare.Tensor("g", dtypes=("float32",), shape=("n", "four")),)),
     "saved g: its shape names 'four', which is no size"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("w", like="x", shape="n"))),
     "input w: shape='n' names the input it has the shape of"),
    (dict(inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("w", like="x", shape="w"))),
     "input w: shape='w' names the input it has the shape of"),
    (dict(outputs=(declare.Tensor("y", like="x", shape="x"),)), "y: shape='x': an output's or saved tensor's shape is a tuple"),
    (dict(sorted=("x",)), "sorted=('x',): a tuple of integer input tensors a call always gives"),
    (dict(zeroed=("y",)), "zeroed=('y',): a tuple of inputs that take a gradient"),
    (dict(sorted="i", inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("i", dtypes=("int64",), grad=False))),
     "sorted='i': a tuple of integer input tensors"),
    (dict(sorted=("i",), table=("int sorts",),
          inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("i", dtypes=("int64",), grad=False))),
     "table field 'sorts': the table has that field already"),
    (dict(sorted=("i",), inputs=(declare.Tensor("x", dtypes=("float32",)),
                                 declare.Tensor("i", dtypes=("int64",), grad=False), declare.Scalar("i_order", "int"))),
     "'i_order' is what the rendered C++ names a part of 'i'"),
])
def test_a_declaration_the_core_cannot_render_says_what_to_change(change, message):
    given = dict(inputs=(declare.Tensor("x", dtypes=("float32",)),), outputs=(declare.Tensor("y", like="x"),),
                 sizes={"n": "x.numel()"})
    with pytest.raises(declare.DeclarationError, match=re.escape(message)):
        declare.Op("probe", **{**given, **change})


def test_a_changed_declaration_changes_what_every_build_is_keyed_by(monkeypatch):
    """The header is part of each variant's and the binding's content hash: a declaration that
    changes rebuilds them (nothing stale is loaded against a new layout)."""
    from dataclasses import replace

    from tuner.build import render

    families.add_path(HERE)
    fam = families.get("scale_add")
    before, key = render.header_text("scale_add"), binding._key("scale_add")
    monkeypatch.setattr(fam, "OP_DECLARATION", replace(fam.OP_DECLARATION, abi=fam.OP_DECLARATION.abi + 1))
    assert render.header_text("scale_add") != before and binding._key("scale_add") != key


def test_the_python_side_of_a_declared_op_checks_and_computes_as_its_cpp_does():
    """tuner/opspec.py: sizes and checks read in Python, the CPU kernels from the float64 reference
    (gradients by autograd), the fakes' shapes, the baseline outside the declared dtypes."""
    import torch

    from tuner import opspec

    op = declare.Op("norm_probe", inputs=(declare.Tensor("x", dtypes=("float32", "bfloat16")),
                                          declare.Tensor("w", dtypes=("float32",), shape=("width",), optional=True),
                                          declare.Scalar("eps", default=1e-6)),
                    outputs=(declare.Tensor("y", like="x"),), sizes={"rows": "leading(x)", "width": "x.size(-1)"},
                    checks=(("x.dim() >= 1", "x must have at least one dimension"),),
                    saves=(declare.Tensor("r", dtypes=("float32",), shape=("rows",)),), baseline="x")

    def reference(x, w, eps):
        return x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps) * w.double()

    impls = opspec.impls(op, reference, torch_op=lambda x, w=None, eps=1e-6: x * 2)
    x, w = torch.randn(2, 3, 5), torch.randn(5)
    assert opspec.sizes(op, opspec.bind(op, (x, w))) == [6, 5]
    cpu, fake = impls["norm_probe"]
    torch.testing.assert_close(cpu(x, w), reference(x, w, 1e-6).float())
    torch.testing.assert_close(cpu(x.double(), w), x.double() * 2)  # outside the dtypes: the torch op
    torch.testing.assert_close(cpu(x, None), x * 2)  # an optional input left out: the torch op
    assert fake(x.to("meta"), w.to("meta")).shape == x.shape
    y, r = impls["norm_probe_forward"][1](x.to("meta"), w.to("meta"), 1e-6)
    assert y.shape == x.shape and r.shape == (6,) and r.dtype == torch.float32
    with pytest.raises(ValueError, match=r"norm_probe: w must have shape \[5\] \(width\), got \[4\]"):
        cpu(x, torch.randn(4))
    with pytest.raises(ValueError, match="norm_probe: x must have at least one dimension"):
        cpu(torch.tensor(1.0), w)
    with pytest.raises(TypeError, match="norm_probe: w must be float32, got torch.bfloat16"):
        impls["norm_probe_forward"][0](x, w.bfloat16(), 1e-6)
    g = torch.randn(2, 3, 5)
    gx, gw = impls["norm_probe_backward"][0](g, x, w, torch.empty(6), 1e-6, True, False)
    x64 = x.double().requires_grad_()
    (want,) = torch.autograd.grad(reference(x64, w.double(), 1e-6), (x64,), g.double())
    torch.testing.assert_close(gx, want.float())
    assert gw.numel() == 0  # not wanted: empty, as the C++ gives it
    assert opspec.pair(op, {"x": "bfloat16", "w": "float32"}) == 1
    worded = declare.Op("worded", inputs=(declare.Tensor("x", dtypes=("float32",)),
                                          declare.Scalar("mode", "str", "mean", ("sum", "mean"))),
                        outputs=(declare.Tensor("y", like="x"),), sizes={"n": "x.numel()"})
    cpu = opspec.impls(worded, lambda x, mode: x.double() * (2 if mode == "sum" else 1), None)["worded"][0]
    torch.testing.assert_close(cpu(x, "sum"), x * 2)
    torch.testing.assert_close(cpu(x), x)  # the default word
    with pytest.raises(ValueError, match="worded: mode must be one of sum, mean, got max"):
        cpu(x, "max")


def test_declared_errors_reach_the_header_and_the_op():
    """A declaration's errors: a bit each in the header, the forward's error word and host flags, a
    `validates` in the table, and the op's words for the bits (its launch checked as the validate
    mode says)."""
    op = declare.Op("probe", inputs=(declare.Tensor("x", dtypes=("float32",)),), outputs=(declare.Tensor("y", like="x"),),
                    sizes={"n": "x.numel()"}, errors=(("negative", "x has a negative element"), ("big", "x is big")))
    header = declared.header(op)
    assert "#define TUNER_PROBE_ERROR_NEGATIVE 0  // x has a negative element" in header
    assert "#define TUNER_PROBE_ERROR_BIG 1" in header
    assert "unsigned* errors;" in header and "unsigned char* error_flags;" in header and "int validates;" in header
    assert "tuner_probe_report(unsigned* errors, unsigned char* error_flags, int bit)" in header
    source = declared.op_source(op)
    assert '"x has a negative element", "x is big"' in source
    assert "op.launch(vt, vt->validates != 0, op.check(), ws, stream" in source
    plain = declared.op_source(declare.Op("probe", inputs=op.inputs, outputs=op.outputs, sizes=op.sizes))
    assert "error_flags" not in plain and "validates" not in plain


BOXES = declare.Op(  # GIoU's parts: an integer input of any integer dtype, a saved tensor some variants
    "boxes_probe",   # write, a shape with a number, a check that reads sizes, a baseline of statements
    inputs=(declare.Tensor("p", dtypes=("float32",)),
            declare.Tensor("n", dtypes=("int64",), grad=False, shape=("b",), optional="null", converts=True)),
    outputs=(declare.Tensor("y", dtypes=("float32",), shape=("b",)),),
    sizes={"b": "p.size(0)"},
    checks=(("p.dim() == 2", "p must be [b, 4]"), ("p.size(1) == 4", "p must be [b, 4]")),
    saves=(declare.Tensor("g", dtypes=("float32",), shape=("b", 4), only_if="saves_g"),),
    table=("int saves_g",),
    baseline="""
        const at::Tensor s = p.sum(-1);
        return s;""",
)


def test_an_integer_input_a_saved_tensor_some_variants_write_and_statements_render():
    import torch

    source = declared.op_source(BOXES)
    assert "ready(n->to(at::kLong), 16)" in source  # any integer dtype, converted for the variants
    assert ".g = g.numel() && vt->saves_g ? g.data_ptr() : nullptr" in source  # null to a variant that does not
    assert "if (!w.baseline() && w.vt->saves_g) return true;" in source  # room where a winner of the pair writes it
    assert ".g = vt->saves_g ? g_.data_ptr() : nullptr" in source
    assert "at::empty({sizes[0], int64_t{4}}" in source
    assert "  const at::Tensor s = p.sum(-1);\n  return s;\n}" in source
    # The check that reads a size is made once shapes are concrete (after the symbolic return), the other first.
    early, late = source.index("p.dim() == 2"), source.index("p.size(1) == 4")
    assert early < source.index("return;  // checked when it runs") < late
    p = torch.randn(3, 4)
    for n in (torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([1, 2, 3], dtype=torch.uint8), None):
        values = opspec.bind(BOXES, (p, n))
        opspec.check(BOXES, values)
        assert not opspec.outside(BOXES, values)
    with pytest.raises(TypeError, match="boxes_probe: n must be an integer tensor, got torch.float32"):
        opspec.check(BOXES, opspec.bind(BOXES, (p, torch.ones(3))))
    with pytest.raises(ValueError, match=r"boxes_probe: p must be \[b, 4\]"):
        opspec.check(BOXES, opspec.bind(BOXES, (torch.randn(3, 5), None)))
    assert list(opspec.empty(BOXES, BOXES.saves[0], opspec.bind(BOXES, (p, None))).shape) == [3, 4]
    giou = families.get("giou").OP_DECLARATION  # a shape with a number, in Python's words as in C++'s
    with pytest.raises(ValueError, match=r"target must have shape \[4, 5, 4\] \(batch, slots, 4\), got \[4, 3, 4\]"):
        opspec.check(giou, opspec.bind(giou, (torch.randn(4, 5, 4), torch.zeros(4, 3, 4, dtype=torch.uint8))))




def _bags_reference(indices, scale, mode, weight, padding_idx=None):
    rows = weight.double()[indices]  # [bags, per, dim]
    if padding_idx is not None:  # its rows add nothing (negative: from the end)
        rows = rows * (indices != padding_idx % weight.shape[0])[..., None]
    if scale is not None:
        rows = rows * scale.double()[..., None]
    return rows.sum(1) if mode == "sum" else rows.amax(1)


def test_an_optional_input_with_a_gradient_and_a_saved_tensor_of_one_word_render_and_run():
    """Autograd counts the tensors a call gives: a gradient after an optional input left out is
    still found, and the optional one's gradient is given where it is; the saved tensor has room
    at its word alone; an optional int reaches the backward. Run on CPU through the rendered
    autograd function and the Python kernels."""
    import torch

    from tuner import runtime

    header, source = declared.header(BAGS), declared.op_source(BAGS)
    assert "void* chosen;  // saved for the backward where mode is max (null else)" in header
    assert "void* grad_scale;  // null also where scale is" in header
    assert "long long padding_idx;\n  int padding_idx_given;  // 0: the caller left padding_idx out" in header
    assert ".padding_idx = static_cast<long long>(padding_idx.value_or(0)), .padding_idx_given = " in source
    assert "long long (*forward_work_bytes)(const TunerBagsProbeArgs* args);" in header
    assert "  void* grad_weight;\n  const long long* indices_sorted;" in header and "\n  int sorts;  // 1: its" in header
    assert ("if (vt->sorts && (scale_grad || weight_grad) && indices_.numel() > 0)\n    std::tie(indices_sorted, "
            "indices_order) = at::sort(indices_.reshape(-1).to(at::kLong), /*stable=*/true, 0, false);") in source
    assert "const long long work_bytes = vt->backward_work_bytes(&a);" in source
    assert "return {dim, ratio((bags * per), bags)};" in source
    assert "key_of(sizes_of(indices, scale, mode, weight, padding_idx)), mode_index(mode)" in source
    spec = opspec.spec(BAGS, "bags_probe", reference=_bags_reference)
    assert spec.shape({"bags": 3, "per": 5, "dim": 4, "mode": "max"}) == ([4, 5], 1)
    assert spec.shape({"bags": 0, "per": 5, "dim": 4, "mode": "sum"}) == ([4, 0], 0)
    with pytest.raises(KeyError, match="give the family's problem_class scalars=\\('mode',\\)"):
        spec.shape({"bags": 3, "per": 5, "dim": 4})
    assert 'at::Tensor chosen = saving && (mode == "max") ? at::empty({sizes[0], sizes[2]}, ' in source
    assert '.chosen = saving && (mode == "max") ? chosen.data_ptr() : nullptr' in source  # inference: none
    assert "const bool weight_grad = ctx->needs_input_grad(1 + (scale.has_value() ? 1 : 0));" in source
    assert ".grad_scale = (scale_grad && scale_.defined()) ? grad_scale.data_ptr() : nullptr" in source
    probe_ops.library()
    impls = opspec.impls(BAGS, _bags_reference, None, "tuner_bags_probe")
    runtime.register_python(types_namespace(impls=impls))
    assert "Tensor? scale" in str(torch.ops.tuner.bags_probe.default._schema)
    assert str(torch.ops.tuner_bags_probe.served.default._schema).endswith(
        "served(int[] sizes, ScalarType weight, int kind=0, bool grad=False) -> str")
    assert str(torch.ops.tuner.bags_probe.default._schema).endswith("int? padding_idx=None) -> Tensor")
    g = torch.Generator().manual_seed(0)
    weight, indices = torch.randn(9, 4, generator=g), torch.randint(0, 9, (3, 5), generator=g)
    scale, grad = torch.rand(3, 5, generator=g) + 0.5, torch.randn(3, 4, generator=g)
    for mode in ("sum", "max"):
        for given in (None, scale):
            for wanted in ((True, True), (False, True), (True, False)):
                w = weight.clone().requires_grad_(wanted[0])
                s = None if given is None else given.clone().requires_grad_(wanted[1])
                if not (w.requires_grad or (s is not None and s.requires_grad)):
                    continue
                pad = -2 if wanted[0] else None
                out = torch.ops.tuner.bags_probe(indices, s, mode, w, pad)
                torch.testing.assert_close(out, _bags_reference(indices, given, mode, weight, pad).float())
                out.backward(grad)
                w64 = weight.double().requires_grad_()
                s64 = None if given is None else given.double().requires_grad_()
                leaves = [x for x in (w64, s64) if x is not None]
                want = dict(zip(("w", "s"), torch.autograd.grad(_bags_reference(indices, s64, mode, w64, pad),
                                                               leaves, grad.double())))
                assert (w.grad is not None) == wanted[0]
                if wanted[0]:
                    torch.testing.assert_close(w.grad, want["w"].float())
                if s is not None:
                    assert (s.grad is not None) == wanted[1]
                    if wanted[1]:
                        torch.testing.assert_close(s.grad, want["s"].float())
        out, chosen = impls["bags_probe_forward"][1](indices.to("meta"), None, mode, weight.to("meta"))
        assert out.shape == (3, 4) and out.dtype == torch.float32
        assert chosen.shape == ((3, 4) if mode == "max" else (0,)) and chosen.dtype == torch.int64
    with pytest.raises(TypeError, match="bags_probe: scale must have weight's dtype, torch.float32, got torch.float64"):
        torch.ops.tuner.bags_probe(indices, scale.double(), "sum", weight)
    for refuse in (lambda *a: torch.ops.tuner.bags_probe(*a), lambda *a: opspec.check(BAGS, opspec.bind(BAGS, a))):
        with pytest.raises(ValueError, match=re.escape("bags_probe: scale must have indices's shape [3, 5], got [3, 4]")):
            refuse(indices, scale[:, :4].contiguous(), "sum", weight)
    for pad in (9, -10):
        for refuse in (lambda *a: torch.ops.tuner.bags_probe(*a), lambda *a: opspec.check(BAGS, opspec.bind(BAGS, a))):
            with pytest.raises(ValueError, match=re.escape("bags_probe: padding_idx must be within [-rows, rows)")):
                refuse(indices, None, "sum", weight, pad)
    kernel = _bare_kernel(BAGS, None)  # the search's side: the same rule for the saved tensor, the optional int
    values = opspec.bind(BAGS, (indices, None, "sum", weight))
    assert not kernel._writes(BAGS.saves[0], values) and kernel._writes(BAGS.saves[0], {**values, "mode": "max"})
    fields = kernel._scalars_and_sizes(values, [3, 5, 4])
    assert (fields["padding_idx"], fields["padding_idx_given"], fields["mode"]) == (0, 0, 0)
    fields = kernel._scalars_and_sizes({**values, "padding_idx": -2, "mode": "max"}, [3, 5, 4])
    assert (fields["padding_idx"], fields["padding_idx_given"], fields["mode"]) == (-2, 1, 1)


def types_namespace(**fields):
    import types

    return types.SimpleNamespace(**fields)


def test_a_pass_declared_work_gets_the_bytes_its_variant_asks_of_the_call():
    """The search's side of `work`: the variant's table function reads the call's arguments (here
    its sizes and mode) and the pass gets that many bytes, kept as long as the call."""
    import ctypes

    import torch

    structs = abi.parse(declared.header(BAGS))
    kernel = _bare_kernel(BAGS, None)
    kernel.Args, kernel.name, kernel.weight_dtype, kernel.forward_fn = (
        abi.mirror("Args", structs["TunerBagsProbeArgs"]), "probe", "Float", None)
    asked = []

    def forward_work_bytes(address):
        a = kernel.Args.from_address(address)
        asked.append((a.bags, a.per, a.dim, a.mode))
        return a.bags * a.dim * 4 * (2 if a.mode == 1 else 1)

    kernel.forward_work_bytes_fn = forward_work_bytes
    kernel.backward_work_bytes_fn = lambda address: 0  # none this call: a null pointer, as the op gives it
    values = opspec.bind(BAGS, (torch.randint(0, 9, (3, 5)), None, "max", torch.randn(9, 4)))
    kernel.prepare(values)  # asks once, of the call's arguments
    assert asked == [(3, 5, 4, 1)]
    args = kernel.Args(bags=2, per=5, dim=8, mode=0)
    work = kernel._work("forward", args, values)
    assert asked[-1] == (2, 5, 8, 0) and work.numel() == 2 * 8 * 4 and work.dtype == torch.uint8
    assert args.work == work.data_ptr() and kernel._work("backward", args, values) is None and not args.work
    assert _bare_kernel(NULLABLE, None)._work("forward", args, values) is None  # declared by no pass


def test_the_search_sorts_a_declared_input_on_each_backward_call_where_the_variant_reads_it(monkeypatch):
    """The search times what the op runs: a variant whose table sets `sorts` gets the entries in
    stable order and their positions, sorted again by each call; one that does not gets null."""
    import ctypes

    import torch

    from tuner.measure import declared as measured

    monkeypatch.setattr(measured, "stream", lambda device=None: 0)
    structs = abi.parse(declared.header(BAGS))
    kernel = _bare_kernel(BAGS, None)
    kernel.BackwardArgs, kernel.name, kernel.weight_dtype, kernel.sorts = (
        abi.mirror("BackwardArgs", structs["TunerBagsProbeBackwardArgs"]), "probe", "Float", 1)
    kernel.backward_work_bytes_fn = lambda address: 0
    seen = []

    def backward(address, stream):
        a = kernel.BackwardArgs.from_address(address)
        n = a.bags * a.per
        read = [None if p is None else list((ctypes.c_longlong * n).from_address(p))
                for p in (a.indices_sorted, a.indices_order)]
        seen.append((read, a.indices_sorted))
        return 0

    kernel.backward_fn = backward
    indices = torch.tensor([[3, 1, 3], [0, 1, 2]])
    values = opspec.bind(BAGS, (indices, None, "sum", torch.randn(4, 2)))
    saved = {"chosen": torch.empty(0, dtype=torch.long)}
    call, _ = kernel.prepare_backward({"out": torch.randn(2, 2)}, values, saved)
    call()
    call()
    assert [r for r, _ in seen] == [[[0, 1, 1, 2, 3, 3], [3, 1, 4, 5, 0, 2]]] * 2  # stable: equal rows in entry order
    kernel.sorts = 0
    kernel.prepare_backward({"out": torch.randn(2, 2)}, values, saved)[0]()
    assert seen[-1] == ([None, None], None)
