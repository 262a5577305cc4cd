"""FusedConv2d as a drop-in nn.Conv2d."""

import pytest
import torch
import torch.nn as nn

import fastpipe.nn as fnn
from conv_ref import DEVICES, engines, expected_engine, module_call, run_engines

pytestmark = pytest.mark.torch_build


def pair(activation="relu", **kwargs):
    """A FusedConv2d and the eager Conv2d + activation it must match, sharing parameters."""
    torch.manual_seed(0)
    fused = fnn.FusedConv2d(**{**dict(in_channels=6, out_channels=10, kernel_size=3, padding=1), **kwargs},
                            activation=activation)
    conv = nn.Conv2d(**{**dict(in_channels=6, out_channels=10, kernel_size=3, padding=1), **kwargs})
    conv.load_state_dict(fused.state_dict())
    return fused, conv


def test_is_a_conv2d_and_loads_its_state_dict():
    conv = nn.Conv2d(6, 10, 3, padding=1)
    fused = fnn.FusedConv2d(6, 10, 3, padding=1, activation="silu")
    assert isinstance(fused, nn.Conv2d)
    fused.load_state_dict(conv.state_dict())  # strict: same keys and shapes
    x = torch.randn(2, 6, 8, 8)
    torch.testing.assert_close(fused(x), nn.functional.silu(conv(x)))
    assert "activation=silu" in repr(fused)
    assert "activation=hardtanh(0.0, 6.0)" in repr(fnn.FusedConv2d(2, 2, 1, activation=nn.ReLU6()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(padding_mode="reflect"),
        dict(padding_mode="circular", stride=2),
        dict(padding_mode="replicate", padding=(2, 1), kernel_size=(5, 3)),
        dict(padding="same", kernel_size=4, dilation=(1, 2)),
        dict(padding="valid", bias=False),
        dict(groups=2, dilation=2, padding=2),
    ],
    ids=["reflect", "circular", "replicate", "same-even", "valid-nobias", "groups-dilation"],
)
def test_matches_conv2d_then_activation(device, kwargs):
    fused, conv = pair("gelu", **kwargs)
    fused, conv = fused.to(device), conv.to(device)
    x = torch.randn(2, 6, 11, 9, device=device)
    for engine in engines(device):
        with fnn.use_conv_engine(engine):
            out, ran = run_engines(lambda: fused(x))
            assert ran == [expected_engine(engine, x.dtype, module_call(fused, x))], (engine, ran)
            torch.testing.assert_close(out, nn.functional.gelu(conv(x)))
            torch.testing.assert_close(fused(x[0]), nn.functional.gelu(conv(x[0])))  # unbatched


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_module_and_residual(device):
    fused, conv = pair(nn.LeakyReLU(0.2))
    fused = fused.to(device, memory_format=torch.channels_last)
    conv = conv.to(device, memory_format=torch.channels_last)
    x = torch.randn(3, 6, 7, 7, device=device).to(memory_format=torch.channels_last)
    r = torch.randn(3, 10, 7, 7, device=device)
    for engine in engines(device):
        with fnn.use_conv_engine(engine):
            out, ran = run_engines(lambda: fused(x, residual=r))
        assert ran == [expected_engine(engine, x.dtype, module_call(fused, x))], (engine, ran)
        assert out.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out, nn.functional.leaky_relu(conv(x) + r, 0.2))


def test_dtype_and_gradients():
    fused, conv = pair("tanh", dtype=torch.float64)
    x = torch.randn(2, 6, 5, 5, dtype=torch.float64, requires_grad=True)
    fused(x).square().sum().backward()
    torch.tanh(conv(x)).square().sum().backward()
    for a, b in ((fused.weight, conv.weight), (fused.bias, conv.bias)):
        torch.testing.assert_close(a.grad, b.grad)


def test_bad_activation_names_the_problem():
    with pytest.raises(ValueError, match="activation must be one of"):
        fnn.FusedConv2d(2, 2, 1, activation="swish2")
    with pytest.raises(TypeError, match="takes no keyword argument approx"):
        fnn.FusedConv2d(2, 2, 1, activation="gelu", approx="tanh")


def test_survives_pickle_and_deepcopy_with_its_checked_call():
    import copy
    import io

    fused, conv = pair("silu", stride=2, padding=2, dilation=2)
    x = torch.randn(2, 6, 13, 11)
    buf = io.BytesIO()
    torch.save(fused, buf)
    buf.seek(0)
    for clone in (copy.deepcopy(fused), torch.load(buf, weights_only=False)):
        torch.testing.assert_close(clone(x), nn.functional.silu(conv(x)))


def test_tensor_subclasses_and_modes_see_the_op():
    """The fast path (an unboxed call) is only for plain tensors: a TorchFunctionMode, or a tensor
    subclass, sees the op as torch.ops.fastpipe.conv2d_act, as torch.compile's tracing does."""
    from torch.overrides import TorchFunctionMode

    class Record(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    fused, conv = pair("relu")
    x = torch.randn(1, 6, 5, 5)
    with Record() as mode:
        out = fused(x)
    assert torch.ops.fastpipe.conv2d_act.default in mode.seen, mode.seen
    torch.testing.assert_close(out, nn.functional.relu(conv(x)))
