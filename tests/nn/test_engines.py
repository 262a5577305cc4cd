"""The per-key engine choice: candidates, the 3% rule, the cache and FASTPIPE_CONV_ENGINE."""

import pytest
import torch
from torch.autograd import profiler

import fastpipe
import fastpipe.nn as fnn
from fastpipe.nn.functional import conv2d_act

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
    assert fnn.conv_engines("cuda") == (["eager", "epilogue"] if fastpipe.build_info()["cuda"] else [])


@pytest.mark.parametrize(
    "times,choice",
    [([1.0], 0), ([1.0, 0.98], 0), ([1.0, 0.97], 1), ([1.0, 0.5, 0.4], 2), ([1.0, float("inf")], 0), ([0.5, 0.4], 1)],
)
def test_a_candidate_must_be_3_percent_faster(times, choice):
    assert torch.ops.fastpipe._conv_pick_engine(times) == choice


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
    with fnn.use_conv_engine("fastest"), pytest.raises(RuntimeError, match="FASTPIPE_CONV_ENGINE=fastest names no engine; use auto, eager"):
        small_call()()


@pytest.mark.skipif(not fastpipe.build_info()["cuda"], reason="built without CUDA kernels")
def test_an_engine_of_another_device_falls_back_to_eager():
    with fnn.use_conv_engine("epilogue"):
        assert "aten::convolution" in ran(small_call())
