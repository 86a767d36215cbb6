"""`tuner report` on a simulated study (no GPU): its tables and plots name the study, the GPU and
the objective, count the trials behind each value, say what they leave out, and keep the space's
order of values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

from tuner.report import plots as report_plots
from tuner.report import tables as report_tables
from tuner.store import study  # noqa: E402
from tuner.store import trials  # noqa: E402
from tuner.cli.main import main  # noqa: E402

DATA = Path(__file__).parent / "data" / "h100-giou-bf16-u8.jsonl"
BLOCKS = (64, 128, 256, 512, 1024)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A 40-trial study replayed from an H100 recording, with two planted faults (failed trials)
    and, at this seed, some pruned trials; and its report written by `tuner report`."""
    home = tmp_path_factory.mktemp("report-home")
    storage = str(home / "j.journal")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNER_HOME", str(home))
        assert main(["search", "--gpu", "H100", "--simulate", str(DATA), "--trials", "40", "--quiet",
                     "--storage", storage, "--seed", "1", "--plant-faults", "compile,wrong"]) == 0
        (name,) = [s.study_name for s in study.summaries(storage)]
        assert main(["report", "--study", name, "--storage", storage, "--out", str(home / "rep")]) == 0
        st = study.load(name, storage)
    space = study.family_of(st).space_for(st.user_attrs["problem"])
    frame = trials.trials_frame(st, space)
    states = frame["state"].value_counts()
    assert states.get("PRUNED", 0) and states.get("FAIL", 0)  # both kinds of left-out trial are there
    return st, space, frame, home / "rep"


def _about(made):
    st, _, frame, _ = made
    return report_tables.describe(st, frame)


def test_about_counts_and_names(made):
    st, _, frame, _ = made
    about = _about(made)
    assert about.study == st.study_name and about.objective == "fwd+bwd"
    assert about.gpu.startswith("NVIDIA H100 80GB HBM3") and "replayed from h100-giou-bf16-u8.jsonl" in about.gpu
    assert about.verified == len(frame[(frame.state == "COMPLETE") & (frame.fault == "")])
    assert about.pruned == (frame.state == "PRUNED").sum() and about.failed == (frame.state == "FAIL").sum() == 2
    assert about.verified + about.pruned + about.failed == 40


def test_values_in_the_space_order_then_numeric():
    assert report_tables.ordered([1024, 128, 512, 256], BLOCKS) == [128, 256, 512, 1024]
    assert report_tables.ordered(["two_pass", "atomic"], ("atomic", "two_pass")) == ["atomic", "two_pass"]
    # values the space no longer has: numbers as numbers (not 1024 before 128), then text
    assert report_tables.ordered([1024, "x", 128, 96], (128,)) == [128, 96, 1024, "x"]


def test_by_dimension_md_stands_alone_in_numeric_order(made):
    st, _, frame, out = made
    about = _about(made)
    text = (out / "by_dimension.md").read_text()
    header = text.splitlines()[2]
    assert st.study_name in header and "GPU NVIDIA H100 80GB HBM3" in header and "fwd+bwd" in header
    assert "µs" in header
    assert f"{about.verified} verified, {about.pruned} pruned, {about.failed} failed" in header
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| block_size |")]
    values = [int(r[1]) for r in rows]
    assert values == sorted(values) and set(values) <= set(BLOCKS) and len(values) >= 3
    for r in rows:  # verified, pruned and failed trials of each value
        part = frame[frame.block_size == int(r[1])]
        assert int(r[2]) == len(part[(part.state == "COMPLETE") & (part.fault == "")])
        assert (int(r[3]), int(r[4])) == ((part.state == "PRUNED").sum(), (part.state == "FAIL").sum())
    csv = (out / "by_dimension.csv").read_text().splitlines()
    assert [int(line.split(",")[1]) for line in csv if line.startswith("block_size,")] == values
    regs = csv[0].split(",").index("regs_fwd")  # whole numbers, even beside empty cells
    assert all("." not in line.split(",")[regs] for line in csv[1:])


def test_report_folder_has_an_index(made):
    _, _, _, out = made
    about = _about(made)
    index = (out / "README.txt").read_text()
    assert about.study in index and about.counts() in index and "failures by reason" in index
    for name in ("trials.csv", "importance.json", "by_dimension.md", "time_by_dimension.png",
                 "time_vs_registers.png"):
        assert name in index and (out / name).stat().st_size > 0


def test_a_report_that_fails_half_way_leaves_nothing(made, tmp_path, monkeypatch):
    """Written beside its folder and moved in at the end: Ctrl-C at the plots left 4 of 7 files."""
    from tuner.report import report

    st, _, _, done = made

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_plots, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.report(st, tmp_path / "rep")
    assert list(tmp_path.iterdir()) == []
    before = {p.name: p.read_bytes() for p in done.iterdir()}
    with pytest.raises(KeyboardInterrupt):
        report.report(st, done)  # an earlier report stays whole
    assert {p.name: p.read_bytes() for p in done.iterdir()} == before


def _titles(fig) -> str:
    return fig._suptitle.get_text()


def test_time_by_dimension_titled_counted_and_says_what_it_leaves_out(made):
    st, space, frame, _ = made
    about = _about(made)
    dims = [d.name for d in space.dims]
    fig = report_plots.time_by_dimension(frame, dims, {d.name: d.values for d in space.dims}, about)
    title = _titles(fig)
    assert st.study_name in title and "NVIDIA H100 80GB HBM3" in title and "fwd+bwd" in title and "µs" in title
    assert f"{about.verified} verified" in title and f"{about.pruned} pruned" in title
    assert f"not shown: {about.failed} failed" in title
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert list(axes) == dims and "µs" in axes[dims[0]].get_ylabel()
    labels = [t.get_text() for t in axes["block_size"].get_xticklabels()]
    values = [int(label.split("\n")[0]) for label in labels]
    assert values == sorted(values)
    done = frame[(frame.state == "COMPLETE") & (frame.fault == "")]
    for value, label in zip(values, labels):
        assert label == f"{value}\nn={(done.block_size == value).sum()}"
    # pruned trials drawn apart from the verified ones, at their probe time, one cross each
    crosses = [c for c in axes["block_size"].collections if c.get_offsets().shape[0] and
               tuple(c.get_facecolor()[0][:3]) == pytest.approx((0.839, 0.153, 0.157), abs=0.01)]
    assert sum(len(c.get_offsets()) for c in crosses) == about.pruned
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("pruned" in t for t in legend) and any("verified" in t for t in legend)


def test_time_vs_registers_titled_with_whole_register_ticks(made):
    st, _, frame, _ = made
    fig = report_plots.time_vs_registers(frame, _about(made))
    assert st.study_name in _titles(fig) and "NVIDIA H100" in _titles(fig) and "fwd+bwd" in _titles(fig)
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert "registers per thread" in ax.get_xlabel() and "µs" in ax.get_ylabel() and ax.get_title()
        ticks = ax.get_xticks()
        assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend[0].startswith("verified") and legend[1].startswith("pruned")
