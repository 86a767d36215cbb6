"""tuner.capture: a training run's calls of what families replace, recorded per problem, with the
run itself untouched (results, other modes); the file it writes and read()'s checks of one."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import tuner
import tuner.deploy.captured
import tuner.deploy.capturing
from tuner import families
from tuner.errors import TunerError


class Model(nn.Module):
    """RMSNorm in float32 (two shapes, one 3-D) and bfloat16; EmbeddingBag 1-D with offsets
    (int64, and int32 with include_last_offset) and F.embedding_bag on 2-D int32 ids."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.norm = nn.RMSNorm(64)
        self.norm16 = nn.RMSNorm(32, dtype=torch.bfloat16)
        self.bag = nn.EmbeddingBag(50, 8, mode="sum")
        self.last = nn.EmbeddingBag(40, 8, mode="mean", include_last_offset=True)
        self.table = nn.Parameter(torch.randn(30, 8, generator=g))
        for p in self.parameters():
            p.data.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x):
        a = self.norm(x["x3d"]).sum() + self.norm(x["x2d"]).sum() + self.norm16(x["h"]).float().sum()
        b = self.bag(x["ids"], x["offsets"]).sum() + self.last(x["ids32"], x["offsets32"]).sum()
        return a + b + F.embedding_bag(x["ids2d"], self.table, mode="max").sum()


def inputs() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"x3d": torch.randn(4, 3, 64, generator=g), "x2d": torch.randn(10, 64, generator=g),
            "h": torch.randn(5, 32, generator=g).bfloat16(),
            "ids": torch.randint(0, 50, (40,), generator=g), "offsets": torch.tensor([0, 10, 25, 30]),
            "ids32": torch.randint(0, 40, (40,), generator=g, dtype=torch.int32),
            "offsets32": torch.tensor([0, 10, 25, 40], dtype=torch.int32),
            "ids2d": torch.randint(0, 30, (6, 5), generator=g, dtype=torch.int32)}


EXPECTED = {  # key -> (family, calls per step, op)
    "R12-W64-float32-float32": ("rms_norm", 1, "torch.nn.functional.rms_norm"),
    "R10-W64-float32-float32": ("rms_norm", 1, "torch.nn.functional.rms_norm"),
    "R5-W32-bfloat16-bfloat16": ("rms_norm", 1, "torch.nn.functional.rms_norm"),
    "R50-D8-B4-L10-sum-float32-int64-random": ("embedding_bag", 1, "torch.nn.functional.embedding_bag"),
    "R40-D8-B3-L13-mean-float32-int32-random": ("embedding_bag", 1, "torch.nn.functional.embedding_bag"),
    "R30-D8-B6-L5-max-float32-int32-random": ("embedding_bag", 1, "torch.nn.functional.embedding_bag"),
}


def train(model: nn.Module, steps: int = 3) -> list[torch.Tensor]:
    """Losses and gradients of a few steps (no optimizer: the same step each time)."""
    out = []
    for _ in range(steps):
        model.zero_grad()
        loss = model(inputs())
        loss.backward()
        out += [loss.detach()] + [p.grad.clone() for p in model.parameters()]
    return out


def test_a_training_run_is_recorded_per_problem_and_left_as_it_was(tmp_path):
    model = Model()
    plain = train(copy.deepcopy(model))
    path = tmp_path / "shapes.json"
    with tuner.capture(path) as cap:
        captured = train(model)
    assert all(torch.equal(a, b) for a, b in zip(plain, captured, strict=True))

    doc = json.loads(path.read_text())
    assert doc["format"] == 1 and doc["tuner"] == tuner.__version__ and doc["torch"] == torch.__version__
    assert doc["gpu"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    found = {p["key"]: p for p in doc["problems"]}
    assert found.keys() == EXPECTED.keys()
    for key, (family, per_step, op) in EXPECTED.items():
        p = found[key]
        assert p["family"] == family and p["calls"] == 3 * per_step and p["ops"] == {op: 3 * per_step}
        assert families.get(family).Problem(**p["problem"]).key() == key and p["time_us"] > 0
    assert found["R12-W64-float32-float32"]["problem"] == {"rows": 12, "width": 64, "x": "float32",
                                                           "weight": "float32"}
    times = [p["time_us"] for p in doc["problems"]]
    assert times == sorted(times, reverse=True)

    assert cap.problems == tuner.deploy.captured.read(path)
    assert sum(p["share"] for p in cap.problems) == pytest.approx(1.0)
    assert [p["share"] for p in cap.problems] == pytest.approx([t / sum(times) for t in times])
    norms = tuner.deploy.captured.problems(path, "rms_norm")
    assert {p.key() for p, _ in norms} == {k for k, v in EXPECTED.items() if v[0] == "rms_norm"}
    assert sum(share for _, share in norms) == pytest.approx(1.0)


def test_calls_outside_what_a_family_tunes_are_not_recorded(tmp_path):
    x, w = torch.randn(2, 3, 64), torch.randn(64)
    ids, offsets, table = torch.randint(0, 10, (12,)), torch.tensor([0, 4]), torch.randn(10, 8)
    path = tmp_path / "none.json"
    with tuner.capture(path) as cap:
        F.rms_norm(x, (3, 64), torch.randn(3, 64))             # two normalized dimensions
        nn.RMSNorm(64, elementwise_affine=False)(x)            # no weight
        F.rms_norm(x.double(), (64,), w.double())              # float64
        F.embedding_bag(ids, table, offsets, max_norm=1.0)     # renormalizes rows
        F.embedding_bag(ids, table, offsets, sparse=True)
        F.layer_norm(x, (64,), w)                              # no family's call at all
    assert cap.problems == [] and json.loads(path.read_text())["problems"] == []
    with pytest.raises(TunerError, match="holds no problems"):
        tuner.deploy.captured.read(path)


class Log(TorchFunctionMode):
    """Another mode: the names of every call it sees."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(tuner.deploy.capturing.qualified_name(func))
        return func(*args, **kwargs or {})


def test_it_nests_with_other_modes_either_way_round(tmp_path):
    model, batch = nn.RMSNorm(64), torch.randn(4, 64)
    with Log() as alone:
        model(batch).sum().backward()
    with Log() as outer, tuner.capture(tmp_path / "a.json") as inner_capture:
        model(batch).sum().backward()
    with tuner.capture(tmp_path / "b.json") as outer_capture, Log() as inner:
        model(batch).sum().backward()
    assert "torch.nn.functional.rms_norm" in alone.seen
    assert outer.seen == alone.seen == inner.seen  # the capture's own shape and device reads are seen by none
    for cap in (inner_capture, outer_capture):
        assert [(p["key"], p["calls"]) for p in cap.problems] == [("R4-W64-float32-float32", 1)]


def test_an_exception_in_the_block_writes_the_calls_so_far_and_goes_on(tmp_path):
    path = tmp_path / "partial.json"
    with pytest.raises(RuntimeError, match="out of memory, say"):
        with tuner.capture(path):
            nn.RMSNorm(16)(torch.randn(3, 16))
            raise RuntimeError("out of memory, say")
    assert [(p["key"], p["calls"]) for p in tuner.deploy.captured.read(path)] == [("R3-W16-float32-float32", 1)]
    assert [f.name for f in tmp_path.iterdir()] == ["partial.json"]  # no temporary left


def test_a_path_in_a_missing_folder_fails_before_the_block_runs(tmp_path):
    ran = []
    with pytest.raises(TunerError, match="does not exist"):
        with tuner.capture(tmp_path / "no" / "shapes.json"):
            ran.append(True)
    assert not ran and torch._C._len_torch_function_stack() == 0


@torch.library.custom_op("capture_test::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
    return x * factor


PROBE = '''
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Problem:
    family: ClassVar[str] = "capture_probe"
    n: int = 1
    dtype: str = "float32"

    def key(self) -> str:
        return f"N{self.n}-{self.dtype}"
'''


@pytest.fixture
def probe_family(tmp_path, monkeypatch):
    """A family outside tuner whose capture.py names a custom op: the core finds it by itself."""
    package = tmp_path / "families" / "capture_probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PROBE)
    (package / "capture.py").write_text(
        'CALLS = {"capture_test::scale": lambda args, kwargs: {"n": args[0].numel(), '
        '"dtype": str(args[0].dtype).removeprefix("torch.")}}\n')
    monkeypatch.setattr(families, "__path__", list(families.__path__))
    monkeypatch.setenv(families.ENV_PATH, "")
    families.add_path(package.parent)


def test_custom_ops_reach_the_mode_as_packet_overload_and_function(tmp_path, probe_family):
    x = torch.arange(6.0)
    with tuner.capture(tmp_path / "ops.json") as cap:
        got = [torch.ops.capture_test.scale(x), torch.ops.capture_test.scale.default(x, factor=3.0), scale(x)]
    assert all(torch.equal(a, b) for a, b in zip(got, [x * 2, x * 3, x * 2]))
    assert [(p["family"], p["key"], p["calls"], p["ops"]) for p in cap.problems] == [
        ("capture_probe", "N6-float32", 3, {"capture_test::scale": 3})]


def test_the_tuned_ops_map_to_their_problems():
    """The tuned ops' mappings, called as the mode calls them (the ops need a built binding): read
    from their declarations (GIoU's alone: it has no capture.py), or a family's capture.py."""
    calls = {}
    for name, found in tuner.deploy.capturing._mappings().items():
        for family, problem_of in found:
            calls.setdefault(family, {})[name] = problem_of
    x, w = torch.randn(2, 5, 48, dtype=torch.float16), torch.randn(48, dtype=torch.bfloat16)
    assert calls["rms_norm"]["tuner::rms_norm"]((x, w), {"eps": 1e-5}) == {
        "rows": 10, "width": 48, "x": "float16", "weight": "bfloat16"}
    assert calls["rms_norm"]["tuner::rms_norm"]((x, torch.randn(47)), {}) is None
    assert calls["rms_norm"]["tuner::rms_norm"]((x, None), {}) is None  # no weight: torch's op serves it
    assert calls["rms_norm"]["tuner::rms_norm"]((x.double(), w), {}) is None  # no variant takes float64
    assert calls["rms_norm"]["tuner::rms_norm"]((x[:0], w), {}) is None  # empty

    table, ids = torch.randn(100, 16, dtype=torch.bfloat16), torch.randint(0, 100, (21,), dtype=torch.int32)
    offsets = torch.tensor([0, 5, 9, 21], dtype=torch.int32)
    assert calls["embedding_bag"]["tuner::embedding_bag"]((table, ids, offsets), {"mode": "sum",
                                                                                  "include_last_offset": True}) == {
        "rows": 100, "dim": 16, "bags": 3, "bag_size": 7, "mode": "sum", "weight": "bfloat16", "index": "int32",
        "distribution": "random"}
    assert calls["embedding_bag"]["tuner::embedding_bag"]((table, ids), {}) is None  # 1-D ids need offsets

    pred, target = torch.rand(8, 32, 4), torch.randint(0, 255, (8, 32, 4), dtype=torch.uint8)
    assert calls["giou"]["tuner::giou_loss"]((pred, target, None), {"reduction": "sum"}) == {
        "batch": 8, "slots": 32, "pred": "float32", "target": "uint8", "distribution": "article",
        "reduction": "sum"}
    assert calls["giou"]["tuner::giou_loss"]((pred[0], target[0]), {}) is None


def _write(path, problems, fmt=1):
    path.write_text(json.dumps({"format": fmt, "problems": problems}))
    return path


def _norm(time_us=1.0, calls=1, **fields):
    return {"family": "rms_norm", "problem": {"rows": 8, "width": 64, "x": "float32", "weight": "float32", **fields},
            "calls": calls, "time_us": time_us}


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{not json", "is not JSON"),
    ({"format": 2, "problems": [_norm()]}, "has format 2; this tuner reads format 1"),
    ({"format": 1}, "has no list of problems"),
    ({"format": 1, "problems": [{**_norm(), "family": "layer_norm"}]}, "problem 1 is of unknown family 'layer_norm'"),
    ({"format": 1, "problems": [_norm(rows="many")]}, "is not a rms_norm problem: rows='many' is not int"),
    ({"format": 1, "problems": [_norm(), _norm(depth=3)]}, "problem 2 is not a rms_norm problem: unknown depth"),
    ({"format": 1, "problems": [{**_norm(), "problem": {"rows": 8}}]}, "missing width, missing x, missing weight"),
    ({"format": 1, "problems": [_norm(calls=0)]}, "calls must be a whole number of at least 1, got 0"),
    # values its command line would refuse (they passed, and a simulated search blamed its recording)
    ({"format": 1, "problems": [_norm(rows=-5)]}, "is not a rms_norm problem: rows=-5 is below 1"),
    ({"format": 1, "problems": [_norm(width=0)]}, "width=0 is below 1"),
    ({"format": 1, "problems": [_norm(x="int8")]}, "is not a rms_norm problem: .*int8"),
    ({"format": 1, "problems": [{"family": "giou", "problem": {**families.get("giou").Problem().__dict__,
                                                              "distribution": "bogus"}, "calls": 1, "time_us": 1.0}]},
     "distribution='bogus' is not one of article, uniform, full"),
    ({"format": 1, "problems": [{"family": "cross_entropy", "problem": {
        **families.get("cross_entropy").Problem().__dict__, "label_smoothing": 1.5}, "calls": 1, "time_us": 1.0}]},
     "label_smoothing=1.5 is not a number from 0 to 1"),
    ({"format": 1, "problems": [_norm(time_us=-1.0)]}, "time_us must be a finite number of at least 0"),
    ({"format": 1, "problems": []}, "holds no problems"),
    ({"format": True, "problems": [_norm()]}, "has format True; this tuner reads format 1"),  # True == 1 in Python
    ({"format": 1, "problems": [_norm(rows=2**31)]}, "rows=2147483648 is above 2147483647"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),  # past Python's stack: no RecursionError
])
def test_read_names_the_file_and_what_is_wrong_with_it(tmp_path, content, message):
    path = tmp_path / "shapes.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(TunerError, match=message) as caught:
        tuner.deploy.captured.read(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_read_takes_one_family_and_shares_by_calls_without_times(tmp_path):
    path = _write(tmp_path / "s.json", [_norm(time_us=10.0, rows=1), _norm(time_us=30.0, rows=2)])
    assert [(p["key"], p["share"]) for p in tuner.deploy.captured.read(path, "rms_norm")] == [
        ("R2-W64-float32-float32", 0.75), ("R1-W64-float32-float32", 0.25)]
    with pytest.raises(TunerError, match=f"capture file {path} holds no giou problems"):
        tuner.deploy.captured.read(path, "giou")
    untimed = _write(tmp_path / "u.json", [_norm(time_us=0.0, calls=1, rows=1), _norm(time_us=0.0, calls=3, rows=2)])
    assert [(p.rows, share) for p, share in tuner.deploy.captured.problems(untimed, "rms_norm")] == [(2, 0.75), (1, 0.25)]


def test_a_problem_listed_twice_is_one_with_both_counts(tmp_path):
    """Captures of two runs joined (or a file edited by hand) name a problem twice: it is read once,
    its calls, time and ops added up, so that a search runs it once with its whole share."""
    twice = [{**_norm(time_us=10.0, rows=1), "ops": {"F.rms_norm": 1}}, _norm(time_us=20.0, rows=2),
             {**_norm(time_us=30.0, calls=2, rows=1), "ops": {"F.rms_norm": 2, "nn.RMSNorm": 1}}]
    got = tuner.deploy.captured.read(_write(tmp_path / "s.json", twice))
    assert [(p["key"], p["calls"], p["time_us"], p["share"]) for p in got] == [
        ("R1-W64-float32-float32", 3, 40.0, 40 / 60), ("R2-W64-float32-float32", 1, 20.0, 20 / 60)]
    assert got[0]["ops"] == {"F.rms_norm": 3, "nn.RMSNorm": 1}


def test_import_tuner_and_reading_a_capture_leave_torch_alone(tmp_path):
    """`tuner search --problems` reads the file before its worker has started CUDA."""
    path = _write(tmp_path / "s.json", [_norm()])
    code = (f"import sys, tuner\nfrom tuner.deploy import captured\nassert captured.read({str(path)!r})\n"
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_declared_functional_s_torch_function_is_captured_by_the_op_s_served():
    """F.cross_entropy, F.embedding_bag and F.rms_norm come from their declarations (no capture.py): the calls
    the op's `served` takes, as the op's own calls would be recorded; the others are not."""
    from tuner.deploy.capturing import declared_calls

    ce = declared_calls("cross_entropy")["torch.nn.functional.cross_entropy"]
    logits, labels = torch.randn(6, 11, dtype=torch.bfloat16), torch.randint(0, 11, (6,))
    assert ce((logits, labels), {"label_smoothing": 0.1, "reduction": "sum"}) == {
        **families.get("cross_entropy").Problem().__dict__, "rows": 6, "vocab": 11, "logits": "bfloat16",
        "label_smoothing": 0.1, "reduction": "sum"}
    assert ce((logits, labels), {"weight": torch.ones(11)}) is None  # class weights: torch's alone
    assert ce((logits, labels.float()), {}) is None  # class probabilities
    eb = declared_calls("embedding_bag")["torch.nn.functional.embedding_bag"]
    table, ids = torch.randn(30, 4), torch.randint(0, 30, (12,))
    assert eb((ids, table, torch.tensor([0, 5])), {"mode": "max"})["bag_size"] == 6
    assert eb((ids[:7], table, torch.tensor([0, 4])), {})["bag_size"] == 3  # the op's key: n // bags
    assert eb((ids[:1], table, torch.tensor([0, 1, 1])), {})["bag_size"] == 1  # sparse bags: tuned as bags of one
    assert eb((ids, table, torch.tensor([0])), {"include_last_offset": True}) is None  # no bag
    assert eb((ids, table, torch.tensor([0, 5])), {"max_norm": 1.0}) is None
    assert eb((ids, table.double(), torch.tensor([0, 5])), {}) is None
    norm = declared_calls("rms_norm")["torch.nn.functional.rms_norm"]
    x, w = torch.randn(5, 3, 16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16)
    assert norm((x, (16,), w), {}) == {**families.get("rms_norm").Problem().__dict__, "rows": 15, "width": 16,
                                       "x": "bfloat16", "weight": "bfloat16"}
    assert norm((x, 16, w), {"eps": 1e-5})["rows"] == 15  # an int normalized_shape, as torch takes it
    assert norm((x, (3, 16), torch.randn(3, 16)), {}) is None  # two normalized dimensions: torch's alone
    assert norm((x.double(), (16,), w.double()), {}) is None


def test_a_call_no_search_could_tune_is_left_out_and_goes_on(tmp_path):
    """A table of 2**31 rows (beyond a problem's sizes): the call runs as torch runs it and the
    capture leaves it out (a Problem's checks raised inside the user's call)."""
    import torch
    import torch.nn.functional as F

    import tuner

    w = torch.empty(2**31, 4, device="meta")
    idx = torch.zeros(40, dtype=torch.long, device="meta")
    with tuner.capture(tmp_path / "c.json"):
        out = F.embedding_bag(idx, w, torch.arange(0, 40, 10, device="meta"), mode="sum")
    assert out.shape == (4, 4)
