"""The per-key engine choice: candidates, the 3% rule, the cache and FASTPIPE_CONV_ENGINE."""

import json
import warnings

import pytest
import torch
from torch.autograd import profiler

import fastpipe
import fastpipe.nn as fnn
from conv_ref import conv_call, engine_can_run, run_engines
from fastpipe.nn.functional import conv2d_act

pytestmark = pytest.mark.torch_build

HAS_ONEDNN = torch.backends.mkldnn.is_available()


def ran(fn):
    """Names of the ops a call ran."""
    with profiler.profile() as prof:
        fn()
    return {e.name for e in prof.function_events}


def small_call(c=8, act="silu"):
    x, w, b = torch.randn(2, c, 9, 9), torch.randn(c, c, 3, 3), torch.randn(c)
    return lambda: conv2d_act(x, w, b, padding=1, activation=act)


def test_engine_names():
    cpu = fnn.conv_engines("cpu")
    assert cpu[0] == "eager"
    assert ("onednn" in cpu) == HAS_ONEDNN
    assert fnn.conv_engines("cuda") == (
        ["eager", "epilogue", "cudnn_fused", "depthwise", "depthwise_tiled", "gemm1x1"] if fastpipe.build_info()["cuda"] else [])


def test_every_engine_has_an_expectation_in_the_tests():
    """conv_ref.engine_can_run, which the forcing tests assert the engine that ran against, knows every engine
    of every device type, forward and backward: a new engine without an expectation fails here, on any
    machine, rather than in every forced GPU test on the first GPU run. Each engine also runs some call
    (an expectation that never holds would make those assertions vacuous)."""
    devices = ["cpu"] + (["cuda"] if fastpipe.build_info()["cuda"] else [])
    cl = torch.channels_last
    calls = [conv_call(torch.randn(2, 8, 9, 9), torch.randn(8, 1, 3, 3), dict(padding=1, groups=8), "relu"),
             conv_call(torch.randn(2, 8, 9, 9).to(memory_format=cl), torch.randn(4, 8, 1, 1).to(memory_format=cl),
                       {}, "relu")]
    for device in devices:
        for backward in (False, True):
            for name in fnn.conv_engines(device, backward=backward):
                runs = [engine_can_run(name, torch.float32, c._replace(device=device), backward) for c in calls]
                assert any(runs), f"{device} {'backward ' if backward else ''}engine {name} runs none of the calls"
    with pytest.raises(AssertionError, match="no expectation for engine 'new_engine'"):
        engine_can_run("new_engine", torch.float32, calls[0])


INF = float("inf")


@pytest.mark.parametrize(
    "fastest,ratio,choice",
    [
        ([1.0], [1.0], 0),
        ([1.0, 0.98], [1.0, 0.9], 0),  # fastest round not 3% better
        ([1.0, 0.97], [1.0, 0.98], 0),  # a lucky round: the median of paired rounds is not 3% better
        ([1.0, 0.97], [1.0, 0.97], 1),
        ([1.0, 0.5, 0.4], [1.0, 0.5, 0.45], 2),
        ([1.0, 0.4, 0.5], [1.0, 0.5, 0.45], 2),  # both qualify: the better median wins
        ([1.0, INF], [1.0, INF], 0),  # failed or not timed
        ([0.5, 0.4], [1.0, 0.8], 1),
    ],
)
def test_a_candidate_must_be_3_percent_faster_by_its_best_and_its_median(fastest, ratio, choice):
    assert torch.ops.fastpipe._conv_pick_engine(fastest, ratio) == choice


def test_choice_is_cached_per_key_and_used():
    fnn.clear_conv_engine_cache()
    call = small_call()
    call()
    (line,) = fnn.conv_engine_cache()
    assert "cpu Float input[2, 8, 9, 9]" in line and "silu +bias" in line and "eager=" in line, line
    call()
    assert len(fnn.conv_engine_cache()) == 1  # same key: no new timing
    chosen = line.split(" -> ")[1].split()[0]
    ops = ran(call)
    assert ("mkldnn::_convolution_pointwise" in ops) == (chosen == "onednn"), (chosen, ops)
    small_call(act="relu")()
    assert len(fnn.conv_engine_cache()) == 2  # another activation is another key
    fnn.clear_conv_engine_cache()
    assert fnn.conv_engine_cache() == []


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch without oneDNN")
def test_forcing_an_engine():
    fnn.clear_conv_engine_cache()
    call = small_call(c=12)
    with fnn.use_conv_engine("onednn"):
        assert "mkldnn::_convolution_pointwise" in ran(call)
    with fnn.use_conv_engine("eager"):
        ops = ran(call)
        assert "aten::convolution" in ops and "mkldnn::_convolution_pointwise" not in ops
        # float64 is not a oneDNN type: forcing falls back to eager
    with fnn.use_conv_engine("onednn"):
        x = torch.randn(1, 2, 4, 4, dtype=torch.float64)
        assert "mkldnn::_convolution_pointwise" not in ran(lambda: conv2d_act(x, torch.randn(2, 2, 1, 1, dtype=x.dtype)))
    assert fnn.conv_engine_cache() == []  # forced calls are not timed


def test_unknown_engine_is_an_error():
    """The message lists every engine name once, forward and backward, of every device type."""
    with fnn.use_conv_engine("fastest"), pytest.raises(RuntimeError, match="FASTPIPE_CONV_ENGINE=fastest names no engine; use auto, eager") as e:
        small_call()()
    listed = str(e.value).split("use auto, ")[1].split("\n")[0].split(", ")
    devices = ["cpu"] + (["cuda"] if fastpipe.build_info()["cuda"] else [])
    want = {n for d in devices for backward in (False, True) for n in fnn.conv_engines(d, backward=backward)}
    assert sorted(listed) == sorted(want), listed


@pytest.mark.skipif(not fastpipe.build_info()["cuda"], reason="built without CUDA kernels")
def test_an_engine_of_another_device_falls_back_to_eager():
    with fnn.use_conv_engine("epilogue"):
        assert "aten::convolution" in ran(small_call())


# ---- what the CPU can run: the oneDNN engine declares only what torch's oneDNN runs on this CPU ----------
REDUCED = [torch.float16, torch.bfloat16]
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
               torch.float64: "float64"}
C10_NAMES = {torch.float16: "Half", torch.bfloat16: "BFloat16"}


@pytest.fixture
def onednn_dtypes():
    """set(names): declare the oneDNN engine able to run exactly these dtypes (as on another CPU);
    the CPU's own answer comes back after the test."""
    yield lambda names: torch.ops.fastpipe._conv_onednn_dtypes_override(list(names))
    torch.ops.fastpipe._conv_onednn_dtypes_override(None)


def call_with(dtype, c=6, act="silu", residual=True):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, c, 7, 7, generator=g), torch.randn(c, c, 3, 3, generator=g), torch.randn(c, generator=g)
    r = torch.randn(2, c, 7, 7, generator=g) if residual else None
    x, w, b, r = (None if t is None else t.to(dtype) for t in (x, w, b, r))
    return lambda: conv2d_act(x, w, b, padding=1, activation=act, residual=r)


def engine_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, ran = run_engines(fn)
    return out, ran, [str(w.message) for w in caught if "fastpipe" in str(w.message)]


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch without oneDNN")
def test_onednn_declares_what_torch_can_run_here():
    declared = set(torch.ops.fastpipe._conv_onednn_dtypes())
    expected = {DTYPE_NAMES[d] for d in DTYPE_NAMES if engine_can_run("onednn", d)}
    assert declared == expected, f"oneDNN engine declares {declared}; torch's oneDNN runs {expected} on this CPU"
    print("this CPU:", sorted(declared))


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch without oneDNN")
@pytest.mark.parametrize("dtype", REDUCED, ids=str)
def test_forced_engine_on_a_cpu_without_the_dtype_falls_back_and_says_so_once(onednn_dtypes, dtype):
    """As on an AVX2-only CPU, whatever this CPU is: oneDNN declines the dtype, eager runs, one warning."""
    onednn_dtypes({"float32"})
    with fnn.use_conv_engine("onednn"):
        out, ran, warned = engine_warnings(call_with(dtype))
        assert ran == ["eager"]
        assert len(warned) == 1, warned
        assert f"FASTPIPE_CONV_ENGINE=onednn cannot run {C10_NAMES[dtype]} on cpu" in warned[0], warned[0]
        assert "no " + DTYPE_NAMES[dtype] + " path" in warned[0], warned[0]
        _, ran, warned = engine_warnings(call_with(dtype, c=9))
        assert ran == ["eager"] and warned == [], "the fallback warns once, not on every call"
        _, ran, _ = engine_warnings(call_with(torch.float32))
        assert ran == ["onednn"], "float32 stays on oneDNN"
    torch.testing.assert_close(out, call_with(dtype)())


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch without oneDNN")
@pytest.mark.parametrize("dtype", REDUCED, ids=str)
def test_auto_choice_on_a_cpu_without_the_dtype_never_tries_onednn(onednn_dtypes, dtype):
    onednn_dtypes({"float32"})
    _, ran, warned = engine_warnings(call_with(dtype))
    assert ran == ["eager"] and warned == [], "a declined candidate is neither timed nor warned about"
    (line,) = fnn.conv_engine_cache()
    assert line.endswith("-> eager [eager alone: not timed, not saved]"), line


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch without oneDNN")
def test_a_declared_engine_that_throws_is_remembered_for_its_key(onednn_dtypes):
    """A candidate that declares a dtype it cannot run (float64 here, which oneDNN refuses) throws once
    while timed: the call still succeeds on eager, one warning names the engine and the error, and the
    key never tries it again. This is also what the dtype tests rely on to notice a wrong declaration."""
    onednn_dtypes({"float32", "float64"})
    call = call_with(torch.float64, residual=False)
    out, ran, warned = engine_warnings(call)
    assert "onednn" in ran and ran[-1] == "eager", ran
    assert len(warned) == 1 and "conv engine 'onednn' failed on cpu Double" in warned[0], warned
    for _ in range(2):
        again, ran, warned = engine_warnings(call)
        assert ran == ["eager"] and warned == [], "a failed candidate was tried again on the same key"
    torch.testing.assert_close(out, again)
    (line,) = fnn.conv_engine_cache()
    assert "-> eager" in line and "onednn=failed" in line, line


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch without oneDNN")
def test_a_forced_engine_that_throws_fails_the_call(onednn_dtypes):
    """Forcing never hides a failure behind eager's result: the call raises oneDNN's own error, completed
    with the engine's name and the call, on every call of the key; another key still runs oneDNN."""
    onednn_dtypes({"float32", "float64"})
    call = call_with(torch.float64, residual=False)
    with fnn.use_conv_engine("onednn"):
        for _ in range(2):
            with pytest.raises(RuntimeError) as e:
                run_engines(call)
            message = str(e.value)
            assert "conv engine 'onednn', forced by FASTPIPE_CONV_ENGINE, failed on cpu Double" in message, message
            assert not message.startswith("fastpipe"), f"oneDNN's own error comes first: {message}"
        _, ran, warned = engine_warnings(call_with(torch.float32, residual=False))
        assert ran == ["onednn"] and warned == [], "another key is not affected"
    assert fnn.conv_engine_cache() == []  # forced calls are never timed


@pytest.fixture
def perturb_check():
    """perturb(engine, amount): the tuner's output check sees `amount` added to that engine's output."""
    fnn.clear_conv_engine_cache()
    yield lambda name, amount: torch.ops.fastpipe._conv_engine_perturb_check(name, amount)
    torch.ops.fastpipe._conv_engine_perturb_check("", 0.0)
    fnn.clear_conv_engine_cache()


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch without oneDNN")
def test_a_candidate_whose_output_disagrees_with_eager_is_dropped_for_its_key(perturb_check):
    perturb_check("onednn", 0.5)
    call = call_with(torch.float32)
    out, ran, warned = engine_warnings(call)
    assert ran[-1] == "eager", ran
    assert len(warned) == 1 and "conv engine 'onednn' disagrees with eager on cpu Float" in warned[0], warned
    assert "differs from eager's by up to 0.5" in warned[0], warned[0]
    (line,) = fnn.conv_engine_cache()
    assert "-> eager" in line and "onednn=wrong" in line, line
    for _ in range(2):
        again, ran, warned = engine_warnings(call)
        assert ran == ["eager"] and warned == [], "a wrong candidate was tried again on the same key"
    torch.testing.assert_close(out, again)
    with fnn.use_conv_engine("onednn"):  # dropped by the timing only: forcing runs what it names
        _, ran, _ = engine_warnings(call)
        assert ran == ["onednn"], ran


@pytest.mark.skipif(not HAS_ONEDNN, reason="torch without oneDNN")
@pytest.mark.parametrize("dtype,amount,wrong", [(torch.float32, 1e-6, False), (torch.float32, 0.5, True),
                                                (torch.bfloat16, 1e-3, False), (torch.bfloat16, 5.0, True)], ids=str)
def test_the_output_check_tolerates_rounding_only(perturb_check, dtype, amount, wrong):
    """Relative to the largest magnitude of eager's output (10 to 30 here): float32 within 1e-3,
    bfloat16 within 4e-2 (the dtype's rounding over a convolution's sum)."""
    if DTYPE_NAMES[dtype] not in torch.ops.fastpipe._conv_onednn_dtypes():
        pytest.skip(f"this CPU's oneDNN has no {dtype} path")
    perturb_check("onednn", amount)
    _, _, warned = engine_warnings(call_with(dtype))
    (line,) = fnn.conv_engine_cache()
    assert ("onednn=wrong" in line) == wrong and (len(warned) == 1) == wrong, (line, warned)


def test_the_dtype_override_rejects_unknown_names():
    with pytest.raises(RuntimeError, match="unknown dtype 'float8'"):
        torch.ops.fastpipe._conv_onednn_dtypes_override(["float8"])
    assert torch.ops.fastpipe._conv_onednn_dtypes() == [
        DTYPE_NAMES[d] for d in DTYPE_NAMES if HAS_ONEDNN and engine_can_run("onednn", d)]


def test_the_environment_variable_is_read_at_load(fp):
    """FASTPIPE_CONV_ENGINE is read once, when fastpipe loads (no environment lookup per call); it
    forces the engine for every call, which use_conv_engine changes at run time."""
    code = """
        import os, torch
        from torch.autograd import profiler
        import fastpipe.nn as fnn
        from fastpipe.nn.functional import conv2d_act
        x, w = torch.randn(2, 8, 9, 9), torch.randn(8, 8, 3, 3)
        def ran():
            with profiler.profile() as p:
                conv2d_act(x, w, padding=1, activation="silu")
            return sorted(e.name for e in p.function_events if e.name.startswith("fastpipe::conv_engine."))
        first = ran()
        os.environ["FASTPIPE_CONV_ENGINE"] = "onednn"  # too late: not read per call
        second = ran()
        with fnn.use_conv_engine("onednn"):
            third = ran()
        print(first, second, third, fnn.conv_engine_cache())
    """
    proc = fp.run_python(code, env={"FASTPIPE_CONV_ENGINE": "eager"})
    assert proc.returncode == 0, fp.describe_exit(proc)
    want = "['fastpipe::conv_engine.eager'] ['fastpipe::conv_engine.eager'] "
    onednn = "['fastpipe::conv_engine.onednn']" if HAS_ONEDNN else "['fastpipe::conv_engine.eager']"
    assert proc.stdout.startswith(want + onednn + " []"), proc.stdout  # forced calls are never timed


def test_choices_persist_from_run_to_run(fp, tmp_path):
    """A run saves its CPU choices at exit; the next run on the same machine loads them and makes the
    same choice for each key whose margin was wide without timing it (the cache report says loaded);
    a thin one it re-times (test_engine_margins.py makes both happen on purpose)."""
    cache = tmp_path / "engines.json"
    code = """
        import sys, torch
        import fastpipe.nn as fnn
        from fastpipe.nn.functional import conv2d_act
        torch.manual_seed(0)
        for c, act in ((8, "silu"), (5, "relu"), (16, "gelu")):
            x, w = torch.randn(2, c, 11, 9), torch.randn(c, c, 3, 3)
            conv2d_act(x, w, torch.randn(c), padding=1, activation=act)
        for line in fnn.conv_engine_cache():
            print(line)
    """
    first = fp.run_python(code, env={"FASTPIPE_CONV_CACHE": str(cache)})
    assert first.returncode == 0, fp.describe_exit(first)
    lines = first.stdout.splitlines()
    assert len(lines) == 3 and all(" [timed here; margin x" in line for line in lines), first.stdout
    wide = sorted(line.split(" (ms:")[0] for line in lines if "; wide: saved, later runs use it untimed]" in line)
    second = fp.run_python(code, env={"FASTPIPE_CONV_CACHE": str(cache)})
    assert second.returncode == 0, fp.describe_exit(second)
    lines = second.stdout.splitlines()
    assert len(lines) == 3 and all(" [loaded from the cache file;" in line or " [re-timed here" in line
                                   for line in lines), second.stdout
    assert sorted(line.split(" (ms:")[0] for line in lines if " [loaded from the cache file;" in line) == wide
    off = fp.run_python(code, env={"FASTPIPE_CONV_CACHE": "off"})
    assert off.returncode == 0 and "loaded" not in off.stdout, fp.describe_exit(off)
    assert all(line.endswith(", not saved (per process)]") for line in off.stdout.splitlines()), off.stdout


def test_saved_choices_are_kept_per_machine(tmp_path):
    fnn.clear_conv_engine_cache()
    small_call()()
    path = str(tmp_path / "engines.json")
    assert fnn.save_conv_engine_choices(path) == path
    with open(path) as f:
        data = json.load(f)
    (mine,) = data["machines"].values()
    assert len(mine) == 1
    # Another machine's (or torch's) choices for the same key are kept apart, and not loaded here.
    data["machines"]["another cpu | torch 0.0"] = [mine[0].replace("\tonednn\t", "\teager\t")]
    with open(path, "w") as f:
        json.dump(data, f)
    fnn.clear_conv_engine_cache()
    assert fnn.load_conv_engine_choices(path) == 1
    (line,) = fnn.conv_engine_cache()
    assert line.startswith(mine[0].split("\t", 3)[3] + " [loaded from the cache file; margin x"), (line, mine)
    assert fnn.load_conv_engine_choices(path) == 0  # a key already chosen keeps its choice
    fnn.save_conv_engine_choices(path)
    with open(path) as f:
        assert len(json.load(f)["machines"]) == 2
    fnn.clear_conv_engine_cache()


def test_an_older_fastpipes_cache_is_replaced_without_a_warning(tmp_path):
    """Format 1 held 28-field keys (no forward/backward fields): its choices are not loaded, and the
    next save writes the current format over them."""
    fnn.clear_conv_engine_cache()
    path = tmp_path / "engines.json"
    path.write_text(json.dumps({"format": 1, "machines": {"m": [",".join(["0"] * 28) + "\teager\tr"]}}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fnn.load_conv_engine_choices(str(path)) == 0
    small_call()()
    fnn.save_conv_engine_choices(str(path))
    data = json.loads(path.read_text())
    assert data["format"] == 3 and "m" not in data["machines"]
    (lines,) = data["machines"].values()
    assert [len(line.split("\t")[0].split(",")) for line in lines] == [30]
    fnn.clear_conv_engine_cache()


@pytest.mark.parametrize("content", ["{not json", '{"format": 99, "machines": {}}', "[]"])
def test_a_broken_cache_file_is_ignored_with_a_warning(tmp_path, content):
    path = tmp_path / "engines.json"
    path.write_text(content)
    with pytest.warns(UserWarning, match="ignoring the conv engine cache"):
        assert fnn.load_conv_engine_choices(str(path)) == 0


@pytest.mark.parametrize(
    "line,error",
    [
        ("1,2\tonednn\t\tr", "has 2 key fields"),
        (",".join(["0"] * 29) + ",x\teager\t\tr", "is not an integer"),
        ("no tabs", "is not '<key>"),
        (",".join(["0"] * 30) + "\teager\tr", r"is not '<key>\\t<engine>\\t<margin>"),  # format 2's
        (",".join(["0"] * 30) + "\teager\trunner_up=fast\tr", "margin field 'runner_up=fast' is not <name>=<number>"),
        (",".join(["0"] * 30) + "\teager\tvotes=3\tr", "unknown margin field 'votes'"),
        (",".join(["0"] * 30) + "\teager\ttimings=0\tr", "timings must be a positive integer, got 0"),
    ],
)
def test_malformed_saved_choices_are_refused(line, error):
    with pytest.raises(RuntimeError, match=error):
        torch.ops.fastpipe._conv_engine_import([line])


def test_saved_choices_of_unknown_engines_or_devices_are_skipped():
    fnn.clear_conv_engine_cache()
    key = ",".join(["0"] * 30)
    assert torch.ops.fastpipe._conv_engine_import([f"{key}\tno-such-engine\t\tr"]) == 0
    assert torch.ops.fastpipe._conv_engine_import([f"{key.replace('0', '99', 1)}\teager\t\tr"]) == 0
    assert torch.ops.fastpipe._conv_engine_import([f"{key}\teager\t\tr"]) == 1
    (line,) = fnn.conv_engine_cache()
    assert line.startswith("r [loaded from the cache file; margin unknown"), line
    fnn.clear_conv_engine_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["epilogue", "cudnn_fused"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_an_engine_not_yet_validated_on_a_gpu_runs_only_when_forced(engine, residual, dtype):
    """The CUDA engines have not passed their tests on a real GPU yet: timing never picks them (the key
    is not even kept: there is nothing to time), FASTPIPE_CONV_ENGINE=<name> runs them, and they compute what
    the float64 reference does."""
    fnn.clear_conv_engine_cache()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, 8, 9, 9, device="cuda", generator=g)
    w = torch.randn(8, 8, 3, 3, device="cuda", generator=g)
    b = torch.randn(8, device="cuda", generator=g)
    r = torch.randn(2, 8, 9, 9, device="cuda", generator=g) if residual else None
    x, w, b, r = (t if t is None else t.to(dtype) for t in (x, w, b, r))
    call = lambda: conv2d_act(x, w, b, padding=1, activation="relu", residual=r)  # noqa: E731
    _, ran, _ = engine_warnings(call)
    assert ran == ["eager"]
    assert fnn.conv_engine_cache() == [], "nothing to time: no key is kept"
    with fnn.use_conv_engine(engine):
        got, ran, warned = engine_warnings(call)
    assert ran == [engine] and warned == [], (ran, warned)
    want = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1)
    want = torch.relu(want + r.double() if residual else want)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())
