"""A live search over planted faults and good variants, and artifacts for another architecture."""

import pytest

from tuner.families import giou

pytestmark = pytest.mark.gpu

EXPECTED = {"compile": "compile error", "oob": "illegal address", "assert": "device-side assert",
            "hang": "hang", "wrong": "wrong result", "nan": "nan", "resources": "launch error"}


def test_search_survives_every_planted_fault_and_exports_a_good_variant(shared_home, tmp_path):
    from tuner import search
    from tuner.deploy import export
    from tuner.store import study

    cfg = search.SearchConfig(gpu="auto", problem=giou.Problem(), trials=len(EXPECTED) + 8, sampler="random",
                              study="reliability", eval_timeout=15, plant_faults=tuple(EXPECTED), seed=5,
                              progress=False)
    report = search.run(cfg)
    st = study.load("reliability")
    reasons = {t.user_attrs["fault"]: t.user_attrs.get("reason") for t in st.get_trials()
               if t.user_attrs.get("fault")}
    assert reasons == EXPECTED
    good = [t for t in st.get_trials() if t.state.name == "COMPLETE" and not t.user_attrs.get("fault")]
    assert good, "no good variant finished"
    out = export.export(["reliability"], tmp_path / "art")
    (entry,) = export.read(out)["entries"]
    assert "fault" not in entry["variant"]
    assert report.winner["variant"] == entry["variant"]
    print(f"planted {len(EXPECTED)}, failed with the right reason {sum(reasons[k] == v for k, v in EXPECTED.items())}, "
          f"worker restarts {report.worker_restarts}")


def test_artifact_for_another_arch_is_rebuilt_or_served_by_the_reference(shared_home, tmp_path):
    import tuner
    from tuner import gpus, runtime
    from tuner.deploy import export

    gpu = {**gpus.attached().describe(), "arch": "sm_80", "gpu_name": "NVIDIA A100-SXM4-80GB"}
    v = giou.covering_set()[-4]  # a bfloat16/uint8 variant
    out = export.write(tmp_path / "a100", [{"variant": v, "problem": giou.Problem().__dict__}], gpu)
    p, t, n = giou.make_inputs(32, 64, "bfloat16", "uint8", device="cuda")
    with pytest.warns(UserWarning, match="tuned for sm_80.*building"):
        op = tuner.load(out)
    assert giou.check("rebuilt", op(p, t, n), giou.reference(p, t, n), giou.LOSS_TOL)[0]
    assert not runtime.loaded("giou").reference
    with pytest.warns(UserWarning, match="using the reference"):
        op = tuner.load(out, fallback="reference")
    assert runtime.loaded("giou").reference
    assert giou.check("reference", op(p, t, n), giou.reference(p, t, n), giou.LOSS_TOL)[0]
