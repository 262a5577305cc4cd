"""fastpipe.bench.common: the statistics, formatting and report a suite's numbers go through."""

import json
import math
import os
import sys

import numpy as np
import pytest

from fastpipe.bench import common as bc

NAN = float("nan")


def test_median_skips_missing_values():
    assert bc.median([3, 1, 2]) == 2
    assert bc.median([4, 1, 3, 2]) == 2.5
    assert bc.median([1, NAN, 3, None]) == 2
    assert math.isnan(bc.median([])) and math.isnan(bc.median([None, NAN]))


def test_spread_pct_is_range_over_median():
    assert bc.spread_pct([1, 2, 4]) == pytest.approx(150.0)  # (4 - 1) / 2
    assert bc.spread_pct([10, 10]) == 0.0
    assert math.isnan(bc.spread_pct([5])) and math.isnan(bc.spread_pct([0, 0]))


def test_ratio_and_geomean():
    assert bc.ratio(6, 3) == 2.0
    for a, b in [(1, 0), (None, 1), (1, None), (NAN, 1), (1, NAN)]:
        assert math.isnan(bc.ratio(a, b)), (a, b)
    assert bc.geomean([1, 4]) == pytest.approx(2.0)
    assert bc.geomean([2, 8, 0.5]) == pytest.approx(2.0)  # (2 * 8 * 0.5) ** (1/3)
    assert math.isnan(bc.geomean([]))


def test_number_formats():
    assert bc.fmt(1.23456, ".2f") == "1.23"
    assert bc.fmt(3) == "3"
    assert bc.fmt(None) == "-" and bc.fmt(NAN) == "-"
    assert bc.fmt_rate(1234567.8) == "1,234,568"
    assert bc.fmt_rate(12.345) == "12.3"
    assert bc.fmt_rate(None) == "-" and bc.fmt_rate(NAN) == "-"


def test_format_table():
    text = bc.format_table(["name", "n"], [["a", 1], ["bbb", 22]])
    assert text == "name   n\n----  --\na      1\nbbb   22"
    assert bc.format_table(["x", "y"], [["1", "2"]], align="rl") == "x  y\n-  -\n1  2"


def test_markdown_table_aligns_and_escapes():
    text = bc.markdown_table(["a|b", "n"], [["x", 1]])
    assert text == "| a\\|b | n |\n|---|---:|\n| x | 1 |"


def test_result_path_names_kind_tag_and_time(tmp_path):
    path = bc.result_path("loader", str(tmp_path), "my box/1")
    name = os.path.basename(path)
    assert os.path.dirname(path) == str(tmp_path)
    assert name.startswith("loader_my-box-1_") and name.endswith(".json")
    assert len(name) == len("loader_my-box-1_YYYYmmdd-HHMMSS.json")


def test_write_json_writes_nan_as_null_and_numpy_as_numbers(tmp_path):
    path = bc.write_json({"a": NAN, "b": np.float32(1.5), "c": (1, np.int64(2)), "d": np.arange(2)},
                         str(tmp_path / "sub" / "r.json"))
    assert json.loads(open(path).read()) == {"a": None, "b": 1.5, "c": [1, 2], "d": [0, 1]}
    assert os.listdir(tmp_path / "sub") == ["r.json"]  # no temporary left behind


@pytest.mark.parametrize("tty,enabled", [(False, True), (True, False)])
def test_progress_bar_is_silent_without_a_terminal_or_when_disabled(tty, enabled, monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    with bc.progress_bar(total=3, enabled=enabled, desc="x") as bar:
        bar.update()
    assert list(bc.progress_bar(range(3), enabled=enabled)) == [0, 1, 2]
    assert capsys.readouterr().err == ""


def _report(tmp_path, capsys):
    # a results folder that does not exist yet: the report makes it, whichever file it writes first
    out = bc.Report("demo", str(tmp_path / "res"), tag="t", options={"quick": True, "unset": None})
    out.heading("part one")
    out.table(["row", "x"], [["r1", "1.00x"]], title="a table")
    out.note("a note")
    out.bars("speed", "a plot", {"s1": {"r1": 1.0, "r2": NAN}, "s2": {"r1": 2.0}}, "speedup", ref=1.0)
    files = out.save({"value": 1})
    printed = capsys.readouterr().out
    return out, files, printed


def test_report_writes_json_markdown_and_prints(tmp_path, capsys):
    out, files, printed = _report(tmp_path, capsys)
    assert "=== part one ===" in printed and "a table\nrow      x\n---  -----\nr1   1.00x" in printed
    doc = json.loads(open(files["json"]).read())
    assert doc["suite"] == "demo" and doc["complete"] is True and doc["results"] == {"value": 1}
    assert doc["options"] == {"quick": True, "unset": None}
    for key in ("hostname", "cpu_model", "usable_cpus", "torch", "fastpipe", "gpus", "loadavg_end"):
        assert key in doc["machine"], key
    md = open(files["markdown"]).read()
    assert md.startswith("# fastpipe bench: demo\n\n") and bc.machine_line(out.facts) in md
    assert "Options: `quick=True`." in md
    assert "## part one\n\n**a table**\n\n| row | x |\n|---|---:|\n| r1 | 1.00x |\n\na note" in md
    assert os.path.basename(files["json"]).startswith("demo_t_")
    assert files["markdown"] == files["json"][:-5] + ".md"


def test_report_plots_when_matplotlib_is_there(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _, files, _ = _report(tmp_path, capsys)
    assert files["plots"] == [files["json"][:-5] + "_speed.png"]
    with open(files["plots"][0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "](" + os.path.basename(files["plots"][0]) + ")" in open(files["markdown"]).read()


def test_report_without_matplotlib_skips_plots_with_one_note(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` raise ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    _, files, printed = _report(tmp_path, capsys)
    assert files["plots"] == []
    assert printed.count("matplotlib is not installed") == 1
    assert not [p for p in os.listdir(tmp_path / "res") if p.endswith(".png")]
    md = open(files["markdown"]).read()  # the markdown says so too, and links no missing picture
    assert "matplotlib is not installed, so no PNG plots were written (1 skipped" in md and "![" not in md


def test_checkpoint_marks_the_json_incomplete(tmp_path):
    out = bc.Report("demo", str(tmp_path))
    out.checkpoint({"partial": True})
    doc = json.loads(open(out.json_path).read())
    assert doc["complete"] is False and doc["results"] == {"partial": True}
    assert os.listdir(tmp_path) == [os.path.basename(out.json_path)]  # no markdown or plots yet


class _Clock:
    """A stand-in for time.perf_counter that moves only when told to."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_budget_runs_another_repetition_while_the_slowest_still_fits(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(bc.time, "perf_counter", clock)
    unbudgeted = bc.Budget(None)  # --full, --quick, --reps: the full count
    assert unbudgeted.more([1e9] * 4, 2, 5) and not unbudgeted.more([1e9] * 5, 2, 5)
    b = bc.Budget(1.0)  # 60 s
    clock.t += 10  # e.g. data generation and a first repetition of 10 s
    assert b.left() == 50
    assert b.more([10], 2, 5)  # below the minimum
    assert b.more([10, 10], 2, 5)  # 50 s left: another 10 s fits
    assert not b.more([10, 10, 10, 10, 10], 2, 5)  # the full count
    assert not b.more([10, 60], 2, 5)  # the slowest so far (a busier machine) does not fit
    clock.t += 200  # over: the minimum still runs, and the note says so
    assert b.more([10], 2, 5) and not b.more([10, 10], 2, 5)
    line = b.line([10, 10], "every case")
    assert "time budget 1 min: 2 repetition(s) of every case (10, 10 s" in line and "over budget" in line
    with pytest.raises(SystemExit):
        bc.Budget(0)


def test_budget_shares_what_is_left_among_the_loops_still_to_run(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(bc.time, "perf_counter", clock)
    b = bc.Budget(1.0)
    b.plan({"a": 1.0, "b": 1.0, "c": 2.0})
    for r in b.repeat("a", 2, 10):  # its share: a quarter of what is left after its first repetition
        clock.t += 3
    assert b.chosen["a"] == 1 + int((60 - 3) / 4 // 3)  # 5: the first, and 4 more of 3 s in 14.25 s
    for r in b.repeat("b", 2, 10):  # a third of what is left (c weighs 2)
        clock.t += 1
    assert b.chosen["b"] == 10  # cheap: the full count
    seen = []
    for r in b.repeat("c", 3, 4):
        seen.append(r)
        clock.t += 100  # far over: the minimum
    assert seen == [0, 1, 2] and b.chosen["c"] == 3
    unbudgeted = bc.Budget(None)
    assert list(unbudgeted.repeat("x", 3, 7)) == list(range(7)) and unbudgeted.chosen == {"x": 7}
    assert list(bc.Budget(0.01).repeat("y", 3, 1)) == [0]  # never more than asked for, even under the minimum
