"""The ctypes mirrors of the families' C argument structs and tables, read from the C headers
(tuner/measure/abi.py: what the search calls variants with) against the layout the C compiler
gives the headers themselves: every field at its offset, each struct of its size. A header the
reader gets wrong fails here, on a machine without a GPU."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from tuner.build import toolkit
from tuner.build.render import templates_dir, write_headers
from tuner.measure import abi
from tuner.measure.kernel import TORCH_DTYPES
from tuner.errors import SpaceError

MIRRORS = [(family, header, name) for family, header in (("giou", "giou_abi.h"), ("rms_norm", "rms_norm_abi.h"),
                                                         ("embedding_bag", "embedding_bag_abi.h"),
                                                         ("cross_entropy", "cross_entropy_abi.h"))
           for name in abi.declarations(family)]


def _layout_in_c(tmp_path, family: str, header: str, struct: str, fields: list[str]) -> list[int]:
    """[sizeof, offsetof(field) for each field] as the C compiler lays the struct out."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = [f'#include "{header}"', "#include <stddef.h>", "#include <stdio.h>", "int main(void) {",
             f'  printf("%zu\\n", sizeof({struct}));']
    lines += [f'  printf("%zu\\n", offsetof({struct}, {f}));' for f in fields]
    lines += ["  return 0;", "}"]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    headers = write_headers(family, tmp_path / "include")  # as a build has them (a declared op's rendered)
    subprocess.run([cc, f"-I{headers}", f"-I{templates_dir(family)}", f"-I{toolkit.cuda_home() / 'include'}", str(src),
                    "-o", str(exe)], check=True, capture_output=True, timeout=120)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout
    return [int(n) for n in out.split()]


@pytest.mark.parametrize("family,header,struct", MIRRORS, ids=[m[2] for m in MIRRORS])
def test_the_ctypes_mirror_lays_out_as_the_header(tmp_path, family, header, struct):
    mirror = abi.struct(family, struct)
    names = [f[0] for f in mirror._fields_]
    want = _layout_in_c(tmp_path, family, header, struct, names)
    got = [ctypes.sizeof(mirror)] + [getattr(mirror, n).offset for n in names]
    assert got == want, dict(zip(["sizeof", *names], zip(got, want)))


def test_a_built_variant_loads_and_is_called_through_its_table_without_a_binding(tuner_home):
    """On a machine without a GPU: a variant built and loaded as the search's worker loads it (no
    torch binding), its table read through the mirror, a host function of it called, and CUDA's
    text for an error code found through its library (what a failed launch reports)."""
    import torch

    from tuner.build import compile as build
    from tuner.families import giou
    from tuner.measure.declared import DeclaredKernel

    variant = giou.covering_set()[0]
    built = build.build([variant], "sm_90", jobs=2)[0]
    assert built.ok, built.error
    kernel = DeclaredKernel(giou.FAMILY, built.so, variant.name, built.entry)
    assert kernel.name == variant.name and kernel.pred_dtype in TORCH_DTYPES
    grid = -(-1024 * 256 // (variant["block_size"] * variant["boxes_per_thread"]))
    assert kernel.workspace_words_fn(1024, 256) == 3 + 2 * grid  # the ticket and sums, then 2 a block
    assert "too many resources" in kernel.error_string(701)

    # the inputs as the op hands them to a variant: num_boxes (declared `converts`) in int64, a
    # misaligned pred copied, an aligned one not; the saved gradient only where the table keeps it
    p, t, n = giou.make_inputs(2, 8, variant["pred"], variant["target"], seed=0)
    odd = torch.empty(p.numel() + 1, dtype=p.dtype)[1:].view(p.shape).copy_(p)
    values = {"pred": odd, "target": t, "num_boxes": n.int(), "reduction": "mean", "eps": giou.DEFAULT_EPS}
    ready = kernel._ready(values)
    assert ready["num_boxes"].dtype == torch.int64 and torch.equal(ready["num_boxes"], n)
    assert ready["pred"].data_ptr() % 16 == 0 and torch.equal(ready["pred"], p)
    assert kernel._ready({**values, "pred": p})["pred"].data_ptr() == p.data_ptr()
    saved_grad = next(s for s in giou.OP_DECLARATION.saves if s.name == "saved_grad")
    assert kernel._writes(saved_grad, values) == bool(kernel.saves_grad) == (variant["backward"] == "fused")


def test_a_built_declared_variant_gives_the_search_its_error_word(tuner_home):
    """A declared family's variant loaded as the worker loads it: the declaration's structs and
    table read, and the forward's error fields pointing into the kernel's zeroed words."""
    import torch

    from tuner.build import compile as build
    from tuner.families import cross_entropy
    from tuner.measure.declared import DeclaredKernel

    variant = cross_entropy.covering_set()[0]
    built = build.build([variant], "sm_90", jobs=2)[0]
    assert built.ok, built.error
    kernel = DeclaredKernel("cross_entropy", built.so, variant.name, built.entry)
    assert kernel.name == variant.name
    values = {"logits": torch.randn(3, 5), "target": torch.zeros(3, dtype=torch.long), "ignore_index": -100,
              "label_smoothing": 0.0, "reduction": "mean", "in_place": False}
    fields = kernel._word_fields(values, [3, 5])
    assert fields == {"errors": kernel._words.data_ptr(), "error_flags": None} and not kernel._words.any()
    assert kernel.take_errors() == 0


def test_the_reader_takes_the_c_the_headers_write():
    fields = dict(abi._fields("""
        const void* x;  // a comment; with a semicolon
        int B, S;       /* two at once */
        long long rows, *counts;
        const char* name;
        unsigned char* flags;
        long long (*scratch)(long long rows, const float* w, cudaStream_t);
        void (*done)(void);
    """, "test.h: T"))
    assert fields["x"] is ctypes.c_void_p and fields["B"] is fields["S"] is ctypes.c_int
    assert fields["rows"] is ctypes.c_longlong and fields["counts"] is ctypes.c_void_p
    assert fields["name"] is ctypes.c_char_p and fields["flags"] is ctypes.c_void_p
    scratch = fields["scratch"].type
    assert scratch._restype_ is ctypes.c_longlong
    assert scratch._argtypes_ == (ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p)
    assert fields["done"].type._argtypes_ == ()
    with pytest.raises(SpaceError, match="test.h: T.v: C type 'half' has no ctypes mirror"):
        abi._fields("half v;", "test.h: T")
