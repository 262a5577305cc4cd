"""fastpipe.nn.functional.conv2d_act against a float64 reference, on every engine of each device."""

import warnings

import pytest
import torch
import torch.nn as nn

import fastpipe.nn as fnn
from conv_ref import (ACT_IDS, ACTIVATIONS, DEVICES, check_error, conv_call, eager_conv_act, engines,
                      expected_engine, make_inputs, run_engines, to64)
from fastpipe.bench.conv import SHAPES as BENCH  # the shapes, as the conv suite measures them
from fastpipe.nn.functional import conv2d_act

pytestmark = pytest.mark.torch_build

# (N, C_in, H, W, C_out, kernel, stride, padding, dilation, groups): the awkward cases.
AWKWARD = {
    "c3-7x7s2": (2, 3, 17, 19, 8, 7, 2, 3, 1, 1),
    "c10": (2, 10, 9, 9, 10, 3, 1, 1, 1, 1),
    "c59-3x1": (1, 59, 7, 11, 61, (3, 1), 1, (1, 0), 1, 1),
    "1x3-pad>k/2": (2, 8, 6, 5, 12, (1, 3), 1, (2, 3), 1, 1),
    "dilation2": (2, 16, 12, 12, 16, 3, 1, 2, 2, 1),
    "groups4-s2": (2, 16, 9, 9, 24, 3, 2, 1, 1, 4),
    "dw59-5x5": (2, 59, 10, 10, 59, 5, 1, 2, 1, 59),
    "dw-mult2": (1, 10, 8, 8, 20, 3, 1, 1, 1, 10),
    "out1x1": (3, 12, 3, 3, 7, 3, 1, 0, 1, 1),
    "s3-d2": (2, 6, 13, 11, 9, 3, 3, 1, 2, 1),
}
LAYOUTS = ["nchw", "channels_last", "strided"]


def run_check(device, engine, shape, dtype, layout, act, act_kwargs, bias, residual, what):
    x, w, b, r, conv = make_inputs(shape, dtype, device, layout, bias=bias, residual=residual)
    with fnn.use_conv_engine(engine), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a forced engine that cannot run the dtype says so once
        ours, ran = run_engines(lambda: conv2d_act(x, w, b, activation=act, residual=r, **conv, **act_kwargs))
    want = expected_engine(engine, dtype, conv_call(x, w, conv, act))
    assert ran == [want], f"{what}: forced {engine} on {dtype}, ran {ran}"
    torch_own = eager_conv_act(x, w, b, **conv, act=act, act_kwargs=act_kwargs, residual=r)
    ref = eager_conv_act(to64(x), to64(w), to64(b), **conv, act=act, act_kwargs=act_kwargs, residual=to64(r))
    assert ours.shape == torch_own.shape and ours.dtype == dtype
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    assert ours.is_contiguous(memory_format=fmt), f"{what}: output strides {ours.stride()} are not {fmt}"
    check_error(what, ours, ref, torch_own, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act,act_kwargs", ACTIVATIONS, ids=ACT_IDS)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("residual", [False, True], ids=["", "res"])
def test_every_activation(device, act, act_kwargs, layout, residual):
    for engine in engines(device):
        run_check(device, engine, AWKWARD["c10"], torch.float32, layout, act, act_kwargs, True, residual,
                  f"{engine} {act}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", list(AWKWARD.values()), ids=list(AWKWARD))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_awkward_shapes(device, shape, layout):
    # Rotate activation and bias/residual presence over the shapes so that each combination appears.
    i = list(AWKWARD.values()).index(shape)
    act, act_kwargs = ACTIVATIONS[(3 * i + 1) % len(ACTIVATIONS)]
    for engine in engines(device):
        for bias, residual in [(True, False), (False, True), (True, True), (False, False)][: 2 + i % 3]:
            run_check(device, engine, shape, torch.float32, layout, act, act_kwargs, bias, residual,
                      f"{engine} {act} bias={bias} residual={residual}")


LOW_PRECISION = [torch.float16, torch.bfloat16, torch.float64]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("act,act_kwargs", [ACTIVATIONS[i] for i in (1, 2, 6, 8, 11)],
                         ids=[ACT_IDS[i] for i in (1, 2, 6, 8, 11)])
def test_dtypes(device, dtype, layout, act, act_kwargs):
    for engine in engines(device):
        for shape in (AWKWARD["c59-3x1"], AWKWARD["dw59-5x5"]):
            run_check(device, engine, shape, dtype, layout, act, act_kwargs, True, True, f"{engine} {dtype}")


@pytest.mark.parametrize("row", BENCH, ids=[r.name for r in BENCH])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_benchmark_shapes(row, layout):
    shape = (1, row.cin, row.size, row.size, row.cout, row.kernel, row.stride, row.kernel // 2, 1, row.groups)
    for engine in engines("cpu"):
        run_check("cpu", engine, shape, torch.float32, layout, row.activation, {}, True, row.residual, f"{engine}")


def test_activation_modules_and_names_agree():
    x, w, b, _, conv = make_inputs(AWKWARD["c10"], torch.float32, "cpu", "nchw")
    pairs = [
        (nn.ReLU6(), "relu6", {}),
        (nn.Hardtanh(-2.0, 0.5), "hardtanh", {"min_val": -2.0, "max_val": 0.5}),
        (nn.LeakyReLU(0.2), "leaky_relu", {"negative_slope": 0.2}),
        (nn.GELU(approximate="tanh"), "gelu", {"approximate": "tanh"}),
        (nn.Identity(), None, {}),
        (nn.SiLU(), "SiLU", {}),
    ]
    for module, name, kwargs in pairs:
        a = conv2d_act(x, w, b, activation=module, **conv)
        c = conv2d_act(x, w, b, activation=name, **conv, **kwargs)
        torch.testing.assert_close(a, c, rtol=0, atol=0)
        torch.testing.assert_close(a, module(eager_conv_act(x, w, b, **conv, act="identity", act_kwargs={})))


def test_padding_strings_and_unbatched_input():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 9, 8, generator=g)
    w = torch.randn(6, 4, 4, 3, generator=g)  # even kernel height: "same" pads asymmetrically
    for padding in ("same", "valid"):
        ours = conv2d_act(x, w, None, padding=padding, dilation=(1, 2), activation="tanh")
        ref = torch.tanh(torch.nn.functional.conv2d(x, w, None, padding=padding, dilation=(1, 2)))
        torch.testing.assert_close(ours, ref)
    ours = conv2d_act(x[0], w, None, padding=1, activation="relu", residual=torch.ones(6, 8, 8))
    torch.testing.assert_close(ours, torch.relu(torch.nn.functional.conv2d(x[:1], w, None, padding=1) + 1)[0])


def test_residual_broadcasts_like_add():
    x, w, b, _, conv = make_inputs(AWKWARD["c10"], torch.float32, "cpu", "nchw")
    r = torch.randn(10, 1, 1)
    ours = conv2d_act(x, w, b, activation="silu", residual=r, **conv)
    torch.testing.assert_close(ours, eager_conv_act(x, w, b, **conv, act="silu", act_kwargs={}, residual=r))
    with pytest.raises(ValueError, match="residual of shape"):
        conv2d_act(x, w, b, activation="silu", residual=torch.randn(3, 9, 9), **conv)


def test_empty_batch():
    x, w, b, _, conv = make_inputs(AWKWARD["c10"], torch.float32, "cpu", "channels_last")
    out = conv2d_act(x[:0], w, b, **conv)
    assert out.shape == (0, 10, 9, 9)


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(x=torch.randn(2, 10, 9)), "input must be 4-D"),
        (dict(w=torch.randn(10, 10, 3)), "weight must be 4-D"),
        (dict(w=torch.randn(10, 5, 3, 3)), "input has 10 channels but weight expects 5"),
        (dict(b=torch.randn(9)), "bias must be 1-D of size out_channels = 10"),
        (dict(b=torch.randn(10, dtype=torch.float64)), "bias has dtype Double but input has Float"),
        (dict(groups=3), "must be divisible by groups = 3"),
        (dict(stride=0), "stride values must be >= 1"),
        (dict(padding=-1), "padding values must be >= 0"),
        (dict(x=torch.randn(2, 10, 2, 2), padding=0), "is smaller than the dilated kernel"),
        (dict(x=torch.randint(0, 3, (2, 10, 9, 9))), "input must have a floating dtype"),
        (dict(residual=torch.randn(2, 10, 9, 9, dtype=torch.float64)), "residual has dtype Double"),
        # A tensor on another device: never computed (a meta one dispatches to the fake kernel).
        (dict(w=torch.randn(10, 10, 3, 3, device="meta")), "weight is on meta but input is on cpu"),
        (dict(b=torch.randn(10, device="meta")), "bias is on meta but input is on cpu"),
        (dict(residual=torch.randn(2, 10, 9, 9, device="meta")), "residual is on meta but input is on cpu"),
        (dict(x=torch.randn(2, 10, 9, 9, device="meta")), "weight is on cpu but input is on meta"),
        (dict(x=torch.randn(2, 0, 9, 9), w=torch.randn(10, 0, 3, 3)), r"in_channels / groups\) must be >= 1"),
        (dict(groups=0), "groups must be >= 1, got 0"),
        (dict(residual=torch.randn(2, 10, 8, 9)), r"residual must have the output's shape \[2, 10, 9, 9\]"),
    ],
)
def test_argument_errors_name_the_argument(change, message):
    args = dict(x=torch.randn(2, 10, 9, 9), w=torch.randn(10, 10, 3, 3), b=torch.randn(10), groups=1, stride=1,
                padding=1, residual=None)
    args.update(change)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.fastpipe.conv2d_act(args["x"], args["w"], args["b"], [args["stride"]] * 2, [args["padding"]] * 2,
                                      [1, 1], args["groups"], "relu", [], args["residual"])


def test_a_residual_of_any_strides_is_read_correctly():
    """Non-contiguous (a strided view) and channels_last residuals are inputs like any other."""
    x, w, b = torch.randn(2, 10, 9, 9), torch.randn(10, 10, 3, 3), torch.randn(10)
    for r in (torch.randn(2, 10, 9, 18)[..., ::2], torch.randn(2, 9, 9, 10).permute(0, 3, 1, 2),
              torch.randn(10, 2, 9, 9).transpose(0, 1)):
        got = torch.ops.fastpipe.conv2d_act(x, w, b, [1, 1], [1, 1], [1, 1], 1, "silu", [], r)
        want = torch.nn.functional.silu(torch.nn.functional.conv2d(x.double(), w.double(), b.double(), padding=1)
                                        + r.double())
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_activation_errors():
    x, w = torch.randn(1, 2, 4, 4), torch.randn(2, 2, 1, 1)
    with pytest.raises(ValueError, match="activation must be one of"):
        conv2d_act(x, w, activation="mish")
    with pytest.raises(TypeError, match="takes no keyword argument slope; it takes negative_slope"):
        conv2d_act(x, w, activation="leaky_relu", slope=0.1)
    with pytest.raises(ValueError, match="min_val < max_val"):
        conv2d_act(x, w, activation="hardtanh", min_val=1.0, max_val=1.0)
    with pytest.raises(ValueError, match="approximate must be"):
        conv2d_act(x, w, activation="gelu", approximate="fast")
    with pytest.raises(ValueError, match="module ELU is not supported"):
        conv2d_act(x, w, activation=nn.ELU())
    with pytest.raises(TypeError, match="apply to activation names"):
        conv2d_act(x, w, activation=nn.ReLU(), inplace=True)
    with pytest.raises(ValueError, match="activation must be one of"):  # the op's own check
        torch.ops.fastpipe.conv2d_act(x, w, None, [1, 1], [0, 0], [1, 1], 1, "relu6", [], None)
    with pytest.raises(RuntimeError, match="'hardtanh' takes 2 value"):
        torch.ops.fastpipe.conv2d_act(x, w, None, [1, 1], [0, 0], [1, 1], 1, "hardtanh", [1.0], None)
