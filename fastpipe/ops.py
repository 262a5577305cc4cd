"""fastpipe's torch ops: the entry point used by fastpipe.nn and the fake kernels for torch.compile.

The ops are defined in C++ (csrc/ops/conv_act.cpp) and registered when fastpipe._C loads:

``fastpipe::conv2d_act(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual)``
    ``act(conv2d(input, weight) + bias + residual)``. ``activation`` is one of identity, relu, hardtanh
    (act_args = [min, max]), leaky_relu ([negative_slope]), silu, gelu, gelu_tanh, sigmoid, tanh,
    hardswish. The output is channels_last when input or weight is.
``fastpipe::_conv2d_act_train(...)``
    The same arguments; returns (output, pre-activation) for activations whose derivative needs the
    pre-activation.
``fastpipe::_conv2d_act_backward(grad_out, saved, activation, act_args, bias_grad)``
    (gradient w.r.t. the pre-activation, bias gradient or an empty tensor) in one pass. ``saved`` is the
    output or the pre-activation, as ``fastpipe._C.CONV_ACTIVATIONS`` says per activation (the table in
    csrc/kernels/activation.h).

Autograd is registered in C++ (csrc/ops/autograd): backward runs ``_conv2d_act_backward`` then
``aten.convolution_backward`` for the input and weight gradients. This module adds the fake kernels and
the output size (the Python twin of conv_act.h's conv_output_size).
"""

import torch
from torch._prims_common import suggest_memory_format

import fastpipe._ext  # noqa: F401  (loads fastpipe._C, which registers the ops)

# The op's autograd (C++, Autograd key) keeps the pre-activation for backward only when a backward will
# run and the activation needs it; its CPU/CUDA kernels pick the fastest engine per call key.
conv2d_act = torch.ops.fastpipe.conv2d_act.default


def conv_output_size(size, kernel, stride, padding, dilation):
    """One spatial dimension of a convolution's output."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def conv_output_shape(input_shape, weight_shape, stride, padding, dilation):
    """[N, C_out, H_out, W_out] of a batched convolution; stride, padding and dilation are pairs (or one
    value for both dimensions, as the schema allows)."""
    pair = lambda v, d: v[d] if len(v) == 2 else v[0]  # noqa: E731
    return [input_shape[0], weight_shape[0]] + [
        conv_output_size(input_shape[2 + d], weight_shape[2 + d], pair(stride, d), pair(padding, d), pair(dilation, d))
        for d in range(2)
    ]


# ---- fake kernels -------------------------------------------------------------------------------------


def _check_like(t, name, like, like_name="input"):
    """The real kernels' device and dtype checks (conv_act.cpp): a fake or meta call must fail as the
    real one would, not compute garbage on the input's device (a meta weight with a CPU input
    dispatches here)."""
    if t is None:
        return
    torch._check(t.device == like.device, lambda: f"{name} is on {t.device} but {like_name} is on {like.device}")
    torch._check(t.dtype == like.dtype, lambda: f"{name} has dtype {t.dtype} but {like_name} has {like.dtype}")


def _fake_output(input, weight, stride, padding, dilation, groups, bias=None, residual=None):
    torch._check(input.dim() == 4, lambda: f"input must be 4-D (N, C, H, W), got {input.dim()}-D")
    for t, name in ((weight, "weight"), (bias, "bias"), (residual, "residual")):
        _check_like(t, name, input)
    torch._check(weight.dim() == 4, lambda: f"weight must be 4-D, got {weight.dim()}-D")
    torch._check(
        input.shape[1] == weight.shape[1] * groups,
        lambda: f"input has {input.shape[1]} channels but weight expects {weight.shape[1] * groups}",
    )
    size = conv_output_shape(input.shape, weight.shape, stride, padding, dilation)
    channels_last = torch.channels_last in (suggest_memory_format(input), suggest_memory_format(weight))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(size, dtype=input.dtype, device=input.device, memory_format=fmt)


# Defaults as in the schema: trailing arguments left at them may not be passed.
@torch.library.register_fake("fastpipe::conv2d_act")
def _conv2d_act_fake(
    input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, activation="relu",
    act_args=(), residual=None,
):
    return _fake_output(input, weight, stride, padding, dilation, groups, bias, residual)


@torch.library.register_fake("fastpipe::_conv2d_act_train")
def _conv2d_act_train_fake(
    input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, activation="relu",
    act_args=(), residual=None,
):
    out = _fake_output(input, weight, stride, padding, dilation, groups, bias, residual)
    return out, torch.empty_like(out)


@torch.library.register_fake("fastpipe::_conv2d_act_backward")
def _conv2d_act_backward_fake(grad_out, saved, activation, act_args, bias_grad):
    _check_like(grad_out, "grad_out", saved, "saved")
    grad_in = torch.empty(
        saved.shape, dtype=saved.dtype, device=saved.device, memory_format=suggest_memory_format(saved)
    )
    return grad_in, saved.new_empty([saved.shape[1] if bias_grad else 0])
