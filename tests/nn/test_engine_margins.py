"""Issue 21: each persisted engine choice keeps the margin it was made by; a thin one is re-timed once by
a later process, a wide one is trusted; retune() forgets them; the report says which is which.

Observed through the report lines and the engines each call ran (a re-timing runs every candidate), never
through wall-clock times."""

import json
import os
import re

import pytest
import torch

import fastpipe.nn as fnn
from conv_ref import run_engines
from fastpipe.nn.functional import conv2d_act

pytestmark = [pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                 reason="torch without oneDNN: the CPU has eager alone, nothing is timed"),
              pytest.mark.torch_build]

THIN = "runner_up=1.01 eager=1.01 spread=0.002 timings=1"
WIDE = "runner_up=2 eager=2 spread=0.01 timings=1"
SAVED = (": saved, later runs use it untimed]", ": saved, the next run re-times it]")  # wide, thin
MARGIN = re.compile(r"margin x(\d+\.\d{3}) over the runner-up, x(\d+\.\d{3}) over eager, spread (\d+\.\d)%")


def call(c, act="silu"):
    g = torch.Generator().manual_seed(c)
    x, w, b = torch.randn(2, c, 9, 9, generator=g), torch.randn(c, c, 3, 3, generator=g), torch.randn(c, generator=g)
    return lambda: conv2d_act(x, w, b, padding=1, activation=act)


def channels(line):
    """The input's channel count in a report or exported line: what tells these tests' keys apart."""
    return int(line.split("input[2, ")[1].split(",")[0])


def line_of(c):
    """The report line of call(c)'s key."""
    (line,) = [line for line in fnn.conv_engine_cache() if channels(line) == c]
    return line


def with_margin(exported, margin):
    key, engine, _, report = exported.split("\t", 3)
    return f"{key}\t{engine}\t{margin}\t{report}"


@pytest.fixture
def loaded():
    """loaded({c: margin}): times call(c) for each c, then replaces the cache with those choices as a
    later process loads them from the file, each with the given margin field."""
    def load(margins):
        fnn.clear_conv_engine_cache()
        for c in margins:
            call(c)()
        exported = torch.ops.fastpipe._conv_engine_export("cpu")
        assert len(exported) == len(margins), exported
        fnn.clear_conv_engine_cache()
        assert torch.ops.fastpipe._conv_engine_import([with_margin(line, margins[channels(line)])
                                                       for line in exported]) == len(margins)
        return {channels(line): line.split("\t")[1] for line in exported}  # the engine each key loaded

    yield load
    fnn.clear_conv_engine_cache()
    fnn._engines._forgotten.clear()  # retune()'s, kept for the next save


def test_a_timed_choice_reports_its_margin_and_keeps_it_through_save_and_load(tmp_path):
    fnn.clear_conv_engine_cache()
    call(8)()
    line = line_of(8)
    assert " [timed here; margin x" in line and ", 1 timing; " in line and "not saved (per process)]" in line, line
    (exported,) = torch.ops.fastpipe._conv_engine_export("cpu")
    margin = exported.split("\t")[2]
    fields = dict(field.split("=") for field in margin.split())
    assert list(fields) == ["runner_up", "eager", "spread", "timings"] and fields["timings"] == "1", margin
    runner_up, eager, spread = (float(fields[k]) for k in ("runner_up", "eager", "spread"))
    # The report prints the margin to 3 decimals (the spread in percent to 1), the export to 6 significant
    # digits: equal within half the report's last digit and the export's rounding (rounding the export
    # again would round twice: 1.5385012 is 1.539, its export 1.5385 would give 1.538).
    shown = [float(v) for v in MARGIN.search(line).groups()]
    for value, exact, digit in zip(shown, (runner_up, eager, 100 * spread), (1e-3, 1e-3, 1e-1), strict=True):
        assert abs(value - exact) <= digit / 2 + 1e-5 * abs(exact), (line, margin)
    chosen = line.split(" -> ")[1].split()[0]
    assert runner_up > 0 and spread >= 0 and (eager == 1.0) == (chosen == "eager"), margin
    assert (runner_up >= 1.10 and runner_up - 1 >= 2 * spread) == ("; wide" in line), (line, margin)
    path = str(tmp_path / "engines.json")
    fnn.save_conv_engine_choices(path)
    data = json.loads(open(path).read())
    assert data["format"] == 3 and [line.split("\t")[2] for line in data["machines"].popitem()[1]] == [margin]
    fnn.clear_conv_engine_cache()
    assert fnn.load_conv_engine_choices(path) == 1
    again = line_of(8)
    assert again.startswith(line.split(" [")[0] + " [loaded from the cache file; "), again
    assert MARGIN.search(again).groups() == MARGIN.search(line).groups(), (line, again)
    assert torch.ops.fastpipe._conv_engine_export("cpu") == [exported]
    fnn.clear_conv_engine_cache()


def test_a_thin_loaded_choice_is_retimed_once_and_a_wide_one_is_not(loaded):
    engines = loaded({5: THIN, 7: WIDE})
    assert line_of(5).endswith("margin x1.010 over the runner-up, x1.010 over eager, spread 0.2%, 1 timing; "
                               "thin: re-timed at its first call]"), line_of(5)
    assert line_of(7).endswith("1 timing; wide: used untimed, not saved (per process)]"), line_of(7)
    _, ran = run_engines(call(5))
    assert sorted(set(ran)) == ["eager", "onednn"] and len(ran) > 2, f"the thin choice was not re-timed: {ran}"
    for _ in range(2):
        _, ran = run_engines(call(5))
        assert len(ran) == 1, f"re-timed more than once in a process: {ran}"
    assert " [re-timed here (thin when loaded), " in line_of(5) and ", 2 timings; " in line_of(5), line_of(5)
    for _ in range(3):
        _, ran = run_engines(call(7))
        assert ran == [engines[7]], f"the wide choice was timed or not used: {ran}"
    assert " [loaded from the cache file; " in line_of(7) and "1 timing; wide: used untimed," in line_of(7)
    margins = {line.split("\t")[3].split(" -> ")[0]: line.split("\t")[2]
               for line in torch.ops.fastpipe._conv_engine_export("cpu")}
    assert sorted(m.split("timings=")[1] for m in margins.values()) == ["1", "2"], margins


def test_a_choice_thin_after_3_timings_is_trusted(loaded):
    engines = loaded({6: THIN.replace("timings=1", "timings=3")})
    assert line_of(6).endswith("3 timings; thin after 3 timings: its engines are within noise of each other, "
                               "kept untimed]"), line_of(6)
    _, ran = run_engines(call(6))
    assert ran == [engines[6]], ran


def test_an_older_format_file_loads_as_thin_and_is_retimed(tmp_path, loaded):
    loaded({9: WIDE})
    (exported,) = torch.ops.fastpipe._conv_engine_export("cpu")
    key, engine, _, report = exported.split("\t", 3)
    path = tmp_path / "engines.json"
    machines = {fnn._engines._fingerprint(): [f"{key}\t{engine}\t{report}"]}
    path.write_text(json.dumps({"format": 2, "machines": machines}))
    fnn.clear_conv_engine_cache()
    assert fnn.load_conv_engine_choices(str(path)) == 1
    assert line_of(9).endswith("[loaded from the cache file; margin unknown (an older cache file), 1 timing; "
                               "thin: re-timed at its first call]"), line_of(9)
    _, ran = run_engines(call(9))
    assert sorted(set(ran)) == ["eager", "onednn"], ran
    # An unknown margin is the weakest evidence: the new timing replaces it.
    assert " [re-timed here (thin when loaded), replacing the loaded choice; margin x" in line_of(9), line_of(9)
    fnn.save_conv_engine_choices(str(path))
    data = json.loads(path.read_text())
    (lines,) = data["machines"].values()
    assert data["format"] == 3 and re.search(r" spread=\S+ timings=2\t", lines[0]), lines


def test_retune_forgets_thin_choices_or_all_and_the_file_drops_them(tmp_path, loaded):
    loaded({5: THIN, 7: WIDE})
    path = str(tmp_path / "engines.json")
    assert fnn.save_conv_engine_choices(path) == path
    assert fnn.retune(thin_only=True) == 1
    (line,) = fnn.conv_engine_cache()
    assert "input[2, 7, 9, 9]" in line, line
    _, ran = run_engines(call(5))
    assert sorted(set(ran)) == ["eager", "onednn"], f"the forgotten key was not timed: {ran}"
    assert " [timed here; margin x" in line_of(5), line_of(5)
    assert fnn.retune("cpu") == 2 and fnn.conv_engine_cache() == []
    fnn.save_conv_engine_choices(path)
    assert json.loads(open(path).read())["machines"][fnn._engines._fingerprint()] == [], "the file kept them"
    call(7)()
    assert " [timed here; " in line_of(7), line_of(7)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(device="tpu:x"), ValueError, "device must name a device type such as 'cpu' or 'cuda', got 'tpu:x'"),
    (dict(thin_only="yes"), TypeError, "thin_only must be a bool, got str"),
])
def test_retune_names_a_bad_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        fnn.retune(**kwargs)


def test_the_report_says_whether_a_choice_is_saved(loaded):
    """With the cache file on (FASTPIPE_CONV_CACHE), the CPU's choices are saved at exit: the report says
    what the next run does with each; GPU choices, and CPU ones with the file off, are per process."""
    old = torch.ops.fastpipe._conv_engine_persist("cpu", True)
    try:
        fnn.clear_conv_engine_cache()
        call(8)()
        assert line_of(8).endswith(SAVED), line_of(8)
        loaded({5: THIN})
        run_engines(call(5))
        assert line_of(5).endswith(SAVED), line_of(5)
    finally:
        torch.ops.fastpipe._conv_engine_persist("cpu", old)


def test_a_process_retimes_a_persisted_thin_choice_and_trusts_a_wide_one(fp, tmp_path):
    """The whole path: a run saves its choices at exit; with one made thin and one wide in the file, the
    next run re-times the thin one at its first call (once) and runs the wide one untimed."""
    cache = tmp_path / "engines.json"
    code = """
        import torch
        import fastpipe.nn as fnn
        from conv_ref import run_engines
        from fastpipe.nn.functional import conv2d_act
        g = torch.Generator().manual_seed(0)
        calls = {c: (torch.randn(2, c, 9, 9, generator=g), torch.randn(c, c, 3, 3, generator=g)) for c in (5, 7)}
        for c, (x, w) in calls.items():
            for i in range(2):
                _, ran = run_engines(lambda: conv2d_act(x, w, padding=1, activation="relu"))
                print(c, i, ",".join(sorted(set(ran))), len(ran))
        for line in fnn.conv_engine_cache():
            print(line)
    """
    here = os.path.dirname(os.path.abspath(__file__))  # conv_ref
    env = {"FASTPIPE_CONV_CACHE": str(cache), "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    first = fp.run_python(code, env=env)
    assert first.returncode == 0 and cache.exists(), fp.describe_exit(first)
    data = json.loads(cache.read_text())
    (machine, lines) = data["machines"].popitem()
    margins = {5: THIN, 7: WIDE}
    data["machines"][machine] = [with_margin(line, margins[channels(line)]) for line in lines]
    cache.write_text(json.dumps(data))
    second = fp.run_python(code, env=env)
    assert second.returncode == 0, fp.describe_exit(second)
    out = second.stdout.splitlines()
    ran = {tuple(line.split()[:2]): line.split()[2:] for line in out[:4]}
    assert ran[("5", "0")][0] == "eager,onednn" and int(ran[("5", "0")][1]) > 2, second.stdout  # re-timed
    assert ran[("5", "1")][1] == "1" and ran[("7", "0")][1] == "1" and ran[("7", "1")][1] == "1", second.stdout
    report = "\n".join(out[4:])
    retimed = r"input\[2, 5, 9, 9\][^\n]* \[re-timed here \(thin when loaded\), [^\n]*, 2 timings; "
    assert re.search(retimed, report), report
    assert re.search(r"input\[2, 7, 9, 9\].* \[loaded from the cache file; .*1 timing; wide: used untimed\]", report), report
    saved = {channels(line): line for line in json.loads(cache.read_text())["machines"][machine]}
    assert "timings=2\t" in saved[5] and saved[7].split("\t")[2] == WIDE, saved
