"""On a GPU machine: export both families with binaries and a wheel, then check what a training
job without a toolchain gets.

    python tools/deploy_check.py OUT

For GIoU (a simulated study of the recorded H100 search) and EmbeddingBag (its recorded search):
`tuner export-best --wheel`; the wheel installed into a folder of its own; then, each in a fresh
process with no nvcc, C++ compiler or ninja on PATH and CUDA_HOME unset: the wheel's op (time from
`import` to the end of the first call) and `tuner.load(DIR)` of the export; outputs and gradients of
both compared bit for bit with `tuner.load(DIR, prebuilt=False)`, the export built from its sources
(the old way).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "giou": (["--simulate", str(ROOT / "tests/data/h100-giou-bf16-u8.jsonl"), "--trials", "40"], "giou_loss"),
    "embedding_bag": (["--simulate", str(ROOT / "benchmarks/h100-embedding-bag/search.jsonl"), "--trials", "400"],
                      "embedding_bag"),
}

CALL = r"""
import sys, time, json
t0 = time.time()
import torch
t1 = time.time()
how, family, where, out = sys.argv[1:5]
if how == "wheel":
    import importlib
    op = getattr(importlib.import_module(where), {"giou": "giou_loss", "embedding_bag": "embedding_bag"}[family])
else:
    import tuner
    op = tuner.load(where, prebuilt=(how == "prebuilt"))
g = torch.Generator(device="cuda").manual_seed(7)
if family == "giou":
    B, S = 1024, 256
    tgt = torch.randint(0, 200, (B, S, 2), generator=g, device="cuda").float()
    tgt = torch.cat([tgt, tgt + torch.randint(1, 50, (B, S, 2), generator=g, device="cuda")], -1)
    x = (tgt + torch.randn(B, S, 4, generator=g, device="cuda") * 5).bfloat16().requires_grad_()
    n = torch.randint(0, 6, (B,), generator=g, device="cuda")
    y = op(x, tgt.to(torch.uint8), n, "none")  # per box: no reduction, no atomics
    mean = op(x, tgt.to(torch.uint8), n, "mean")
else:
    x = torch.randn(20000, 128, generator=g, device="cuda").requires_grad_()
    idx = torch.randint(0, 20000, (2048 * 150,), generator=g, device="cuda")
    offs = torch.arange(0, 2048 * 150, 150, device="cuda")
    y = op(x, idx, offs, "sum")
    mean = op(x, idx, offs, "mean")
y.float().square().sum().backward()
torch.cuda.synchronize()
t2 = time.time()
torch.save({"y": y.detach().cpu(), "mean": mean.detach().cpu(), "grad": x.grad.cpu()}, out)
heavy = sorted(m for m in ("tuner", "optuna", "pandas", "matplotlib", "jinja2") if m in sys.modules)
print(json.dumps({"from_import_torch_s": round(t2 - t0, 3), "after_torch_s": round(t2 - t1, 3), "heavy": heavy}))
"""


def bare_env(site: Path | None) -> dict:
    """No toolkit, no compiler, no ninja: PATH is an empty folder (python is run by its full path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CXX", "CC")}
    empty = Path(os.environ.get("TMPDIR", "/tmp")) / "empty-path"
    empty.mkdir(exist_ok=True)
    env["PATH"] = str(empty)
    for tool in ("nvcc", "c++", "g++", "gcc", "ninja"):
        assert shutil.which(tool, path=env["PATH"]) is None
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(site) if site else "", env.get("PYTHONPATH", "")] if p)
    return env


def run(args: list[str], env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", CALL, *args], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        raise SystemExit(f"{args}: failed\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder for the summary and the wheels")
    out = ap.parse_args().out

    import torch

    out.mkdir(parents=True, exist_ok=True)
    home = Path(os.environ.get("TUNER_HOME", "/tmp/tuner-home"))
    summary = {}
    for family, (search, op) in CASES.items():
        env = {**os.environ, "TUNER_HOME": str(home)}
        subprocess.run(["tuner", "search", "--family", family, "--gpu", "H100", *search, "--sampler", "random",
                        "--quiet"], check=True, env=env, stdout=subprocess.DEVNULL)
        started = time.time()
        subprocess.run(["tuner", "export-best", "--family", family, "--gpu", "H100", "--wheel", str(home / "wheels")],
                       check=True, env=env)
        export_s = time.time() - started
        export_dir = home / "exports" / f"{family}-H100"
        (whl,) = (home / "wheels").glob(f"tuned_{family}_h100-*.whl")
        site = home / f"site-{family}"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                        str(whl)], check=True)
        package = whl.name.split("-")[0]
        wheel_run = run(["wheel", family, package, str(out / f"{family}-wheel.pt")], bare_env(site))
        load_run = run(["prebuilt", family, str(export_dir), str(out / f"{family}-load.pt")], bare_env(None))
        source_run = run(["sources", family, str(export_dir), str(out / f"{family}-sources.pt")], dict(os.environ))
        again = run(["sources", family, str(export_dir), str(out / f"{family}-again.pt")], dict(os.environ))
        a, b, c, d = (torch.load(out / f"{family}-{k}.pt") for k in ("wheel", "load", "sources", "again"))
        # Per output: bit-identical to the source build, or (float atomics: a reduction's order varies
        # from call to call) no further from it than the source build is from itself run again.
        same = {k: {"wheel": torch.equal(a[k], c[k]), "load": torch.equal(b[k], c[k]),
                    "sources_again": torch.equal(d[k], c[k]),
                    "max_abs_diff": max(float((x[k].float() - c[k].float()).abs().max()) for x in (a, b, d))}
                for k in ("y", "mean", "grad")}
        ok = all(v["wheel"] and v["load"] or not v["sources_again"] for v in same.values())
        summary[family] = {"export_s": round(export_s, 1), "wheel_mb": round(whl.stat().st_size / 1e6, 2),
                           "wheel": wheel_run, "tuner_load_prebuilt": load_run, "tuner_load_sources": source_run,
                           "outputs": same, "bit_identical_to_sources": ok}
        print(family, json.dumps(summary[family]), flush=True)
    (out / "deploy_check.json").write_text(json.dumps(summary, indent=1))
    ok = all(s["bit_identical_to_sources"] and not s["wheel"]["heavy"] for s in summary.values())
    print("PASS" if ok else "FAIL")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
