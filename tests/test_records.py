"""Reading measurement logs that are damaged or are no log at all: a line that is not a JSON
object is skipped with one warning naming the file and the line, a path that is no file is an
error naming it, and no reader of a log (replay, import, sampler quality) gets a non-object."""

import json
import warnings

import pytest

from tuner import search
from tuner.search import quality
from tuner.store import records
from tuner.errors import TunerError
from tuner.search.evaluate import SimulatedEvaluator
from tuner.families import giou

import simdata


def _read(path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = list(records.read(path))
    return found, [str(w.message) for w in caught if issubclass(w.category, records.RecordDamageWarning)]


def _damaged(path, good, lines: list[bytes], last: bytes = b""):
    """`good` records, each followed by the damaged lines, then a last line without its end."""
    with open(path, "wb") as f:
        for rec in good:
            f.write(json.dumps(rec).encode() + b"\n")
            f.writelines(line + b"\n" for line in lines)
        f.write(last)
    return path


def test_lines_that_are_not_objects_are_skipped_with_one_warning_per_run(tmp_path):
    path = _damaged(tmp_path / "m.jsonl", [{"variant": "a"}, {"variant": "b"}],
                    [b"[1, 2]", b"3", b'"x"', b"", b"\xff\xfe{", b"{not json"], last=b'{"variant": "c"')
    found, said = _read(path)
    assert [r["variant"] for r in found] == ["a", "b"]  # the cut last line is being written: no warning
    assert said == [
        f"{path} lines 2-4 (3): not a measurement record, skipped (not a JSON object)",
        f"{path} lines 6-7 (2): not a measurement record, skipped (not UTF-8, not JSON)",
        f"{path} lines 9-11 (3): not a measurement record, skipped (not a JSON object)",
        f"{path} lines 13-14 (2): not a measurement record, skipped (not UTF-8, not JSON)"]
    assert _read(path) == (found, [])  # each line once per process (`tuner samplers` reads it per run)


def test_timings_that_are_no_plain_numbers_are_never_measurements(tmp_path):
    """json reads NaN and Infinity: a search ranked them (an export shipped a winner of "inf us");
    such a record, or one whose timing is a word, is skipped as a damaged line is."""
    good = {"variant": "a", "fwd": {"median_us": 3.5, "spread_us": 0.1, "min_us": 3.0, "reps": 40, "graphed": True},
            "bwd": {"median_us": 0.0, "spread_us": 0.0}}
    bad = [json.dumps({**good, "variant": name, **change}).encode() for name, change in (
        ("nan", {"fwd": {"median_us": float("nan")}}), ("inf", {"bwd": {"median_us": float("inf")}}),
        ("neg", {"fwd": {"median_us": -1e9}}), ("word", {"fwd": "fast"}), ("str", {"fwd": {"median_us": "3"}}),
        ("bool", {"bwd": {"spread_us": True}}))]
    path = _damaged(tmp_path / "m.jsonl", [good], bad)
    found, said = _read(path)
    assert [r["variant"] for r in found] == ["a"]
    assert len(said) == 1 and "lines 2-7" in said[0] and "timings that are not finite" in said[0]
    (tmp_path / "n.jsonl").write_bytes(b"\n".join(bad) + b"\n")
    with pytest.raises(TunerError, match="holds no measurement"):
        records.read_some(tmp_path / "n.jsonl", "--simulate")


def test_a_binary_file_warns_instead_of_raising(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_bytes(bytes(range(256)) * 4)
    found, said = _read(path)
    assert found == [] and len(said) == 1 and f"{path} lines 1-" in said[0]


@pytest.mark.parametrize("kind", ["folder", "missing"])
def test_a_path_that_is_no_file_is_an_error_naming_it(tmp_path, kind):
    path = tmp_path / "log.jsonl"
    if kind == "folder":
        path.mkdir()
    with pytest.raises(TunerError, match=f"--simulate {path}: {'a folder' if kind == 'folder' else 'no such file'}"):
        records.read(path, "--simulate")  # at the call, not at the first record


def test_readers_of_a_log_skip_what_is_not_a_record(tmp_path, tuner_home):
    sim = simdata.write(tmp_path / "sim.jsonl")
    junk = [b"[1, 2]", b"3", b'"x"', b"null", b"{}", b'{"variant": [1], "problem": "' + giou.Problem().key().encode() + b'"}']
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"\n".join(junk) + b"\n" + sim.read_bytes() + b"\n".join(junk) + b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", records.RecordDamageWarning)
        problem = giou.Problem()
        assert quality.dataset_best(mixed, problem) == quality.dataset_best(sim, problem)
        assert SimulatedEvaluator(mixed, problem, "fwd+bwd", "H100").table.keys() == \
            SimulatedEvaluator(sim, problem, "fwd+bwd", "H100").table.keys()
        first = search.run(search.SearchConfig(gpu="H100", problem=problem, trials=10, simulate=mixed,
                                               progress=False, seed=1, sampler="random", study="first"))
        log = first.records_path
        log.write_bytes(b"\n".join(junk) + b"\n" + log.read_bytes())
        again = search.run(search.SearchConfig(gpu="H100", problem=problem, trials=12, simulate=sim, progress=False,
                                               seed=2, sampler="random", study="second", import_records=log))
    assert again.imported == 10 and again.trials == 2


def test_a_log_without_any_record_is_an_error_naming_it(tmp_path):
    only_junk = tmp_path / "j.jsonl"
    only_junk.write_text("[1, 2]\n5\n")
    problem = giou.Problem()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", records.RecordDamageWarning)
        with pytest.raises(TunerError, match=f"--simulate {only_junk}: holds no measurement"):
            SimulatedEvaluator(only_junk, problem, "fwd+bwd", "H100")
        with pytest.raises(TunerError, match=f"--simulate {only_junk}: holds no measurement"):
            quality.dataset_best(only_junk, problem)
    with pytest.raises(TunerError, match=f"--simulate {tmp_path}: a folder"):
        SimulatedEvaluator(tmp_path, problem, "fwd+bwd", "H100")
