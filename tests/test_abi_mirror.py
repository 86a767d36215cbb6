"""The ctypes mirrors of the families' C argument structs and tables (what the search calls
variants with, tuner/measure/kernel.py) against the C headers themselves: every field at the offset and
of the size the C compiler gives it, and each struct of the C size. A field added to a header and
not to its mirror (or the reverse) fails here, on a machine without a GPU."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from tuner.build import toolkit
from tuner.measure.kernel import TORCH_DTYPES
from tuner.families.embedding_bag import kernel as eb_kernel
from tuner.families.giou import kernel as giou_kernel
from tuner.families.rms_norm import kernel as rms_kernel
from tuner.build.render import templates_dir

MIRRORS = [
    ("giou", "giou_abi.h", "TunerGiouArgs", giou_kernel.Args),
    ("giou", "giou_abi.h", "TunerGiouBackwardArgs", giou_kernel.BackwardArgs),
    ("giou", "giou_abi.h", "TunerGiouVtable", giou_kernel.GiouKernel._table),
    ("rms_norm", "rms_norm_abi.h", "TunerRmsNormArgs", rms_kernel.Args),
    ("rms_norm", "rms_norm_abi.h", "TunerRmsNormBackwardArgs", rms_kernel.BackwardArgs),
    ("rms_norm", "rms_norm_abi.h", "TunerRmsNormVtable", rms_kernel.RmsNormKernel._table),
    ("embedding_bag", "embedding_bag_abi.h", "TunerEmbeddingBagArgs", eb_kernel.Args),
    ("embedding_bag", "embedding_bag_abi.h", "TunerEmbeddingBagBackwardArgs", eb_kernel.BackwardArgs),
    ("embedding_bag", "embedding_bag_abi.h", "TunerEmbeddingBagVtable", eb_kernel.EmbeddingBagKernel._table),
]


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
    subprocess.run([cc, f"-I{templates_dir(family)}", f"-I{toolkit.cuda_home() / 'include'}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, timeout=120)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout
    return [int(n) for n in out.split()]


@pytest.mark.parametrize("family,header,struct,mirror", MIRRORS, ids=[m[2] for m in MIRRORS])
def test_the_ctypes_mirror_lays_out_as_the_header(tmp_path, family, header, struct, mirror):
    names = [f[0] for f in mirror._fields_]
    want = _layout_in_c(tmp_path, family, header, struct, names)
    got = [ctypes.sizeof(mirror)] + [getattr(mirror, n).offset for n in names]
    assert got == want, dict(zip(["sizeof", *names], zip(got, want)))


def test_a_built_variant_loads_and_is_called_through_its_table_without_a_binding(tuner_home):
    """On a machine without a GPU: a variant built and loaded as the search's worker loads it (no
    torch binding), its table read through the mirror, a host function of it called, and CUDA's
    text for an error code found through its library (what a failed launch reports)."""
    from tuner.build import compile as build
    from tuner.families import giou

    variant = giou.covering_set()[0]
    built = build.build([variant], "sm_90", jobs=2)[0]
    assert built.ok, built.error
    kernel = giou_kernel.GiouKernel(built.so, variant.name, built.entry)
    assert kernel.name == variant.name and kernel.pred_dtype in TORCH_DTYPES
    grid = -(-1024 * 256 // (variant["block_size"] * variant["boxes_per_thread"]))
    assert kernel.workspace_words_fn(1024, 256) == 4 + 2 * grid  # TUNER_GIOU_WS_PARTIALS + 2 a block
    assert "too many resources" in kernel.error_string(701)
