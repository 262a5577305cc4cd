"""fastpipe's torch ops: entry points, fake kernels (torch.compile) and autograd.

The ops are defined in C++ (csrc/ops/conv.cpp) and registered when fastpipe._C loads:

``fastpipe::conv2d_act(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual)``
    ``act(conv2d(input, weight) + bias + residual)``. ``activation`` is one of identity, relu, hardtanh
    (act_args = [min, max]), leaky_relu ([negative_slope]), silu, gelu, gelu_tanh, sigmoid, tanh,
    hardswish. The output is channels_last when input or weight is.
``fastpipe::_conv2d_act_train(...)``
    The same arguments; returns (output, pre-activation) for activations whose derivative needs the
    pre-activation.
``fastpipe::_conv2d_act_backward(grad_out, saved, activation, act_args, bias_grad)``
    (gradient w.r.t. the pre-activation, bias gradient or an empty tensor) in one pass. ``saved`` is the
    output where :func:`grad_from_output` says so, the pre-activation otherwise.

Backward then calls ``aten.convolution_backward`` for the input and weight gradients.
"""

import torch
from torch._prims_common import suggest_memory_format

import fastpipe._ext  # noqa: F401  (loads fastpipe._C, which registers the ops)

_fwd = torch.ops.fastpipe.conv2d_act.default
_train = torch.ops.fastpipe._conv2d_act_train.default
_act_bwd = torch.ops.fastpipe._conv2d_act_backward.default
_conv_bwd = torch.ops.aten.convolution_backward.default

# Activations whose derivative their output determines: backward keeps the output (which exists anyway).
_GRAD_FROM_OUTPUT = frozenset({"identity", "relu", "hardtanh", "sigmoid", "tanh"})


def grad_from_output(activation, act_args):
    """Whether backward reads the derivative of ``activation`` from its output (else its input)."""
    return activation in _GRAD_FROM_OUTPUT or (activation == "leaky_relu" and act_args[0] >= 0)


def conv2d_act(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual):
    """Calls ``fastpipe::conv2d_act``, or the training op when backward will need the pre-activation."""
    if (
        torch.is_grad_enabled()
        and not grad_from_output(activation, act_args)
        and (
            input.requires_grad
            or weight.requires_grad
            or (bias is not None and bias.requires_grad)
            or (residual is not None and residual.requires_grad)
        )
    ):
        return _train(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual)[0]
    return _fwd(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual)


# ---- fake kernels -------------------------------------------------------------------------------------
def _pair(v, d):
    return v[d] if len(v) == 2 else v[0]


def _fake_output(input, weight, stride, padding, dilation, groups):
    torch._check(input.dim() == 4, lambda: f"input must be 4-D (N, C, H, W), got {input.dim()}-D")
    torch._check(weight.dim() == 4, lambda: f"weight must be 4-D, got {weight.dim()}-D")
    torch._check(
        input.shape[1] == weight.shape[1] * groups,
        lambda: f"input has {input.shape[1]} channels but weight expects {weight.shape[1] * groups}",
    )
    size = [input.shape[0], weight.shape[0]]
    for d in range(2):
        extent = _pair(dilation, d) * (weight.shape[2 + d] - 1) + 1
        size.append((input.shape[2 + d] + 2 * _pair(padding, d) - extent) // _pair(stride, d) + 1)
    channels_last = torch.channels_last in (suggest_memory_format(input), suggest_memory_format(weight))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(size, dtype=input.dtype, device=input.device, memory_format=fmt)


# Defaults as in the schema: trailing arguments left at them may not be passed.
@torch.library.register_fake("fastpipe::conv2d_act")
def _conv2d_act_fake(
    input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, activation="relu",
    act_args=(), residual=None,
):
    return _fake_output(input, weight, stride, padding, dilation, groups)


@torch.library.register_fake("fastpipe::_conv2d_act_train")
def _conv2d_act_train_fake(
    input, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, activation="relu",
    act_args=(), residual=None,
):
    out = _fake_output(input, weight, stride, padding, dilation, groups)
    return out, torch.empty_like(out)


@torch.library.register_fake("fastpipe::_conv2d_act_backward")
def _conv2d_act_backward_fake(grad_out, saved, activation, act_args, bias_grad):
    grad_in = torch.empty(
        saved.shape, dtype=saved.dtype, device=saved.device, memory_format=suggest_memory_format(saved)
    )
    return grad_in, saved.new_empty([saved.shape[1] if bias_grad else 0])


# ---- autograd -----------------------------------------------------------------------------------------
def _setup_context(ctx, inputs, output):
    input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual = inputs
    out, preact = output if isinstance(output, tuple) else (output, None)
    if preact is not None:  # the training op: its pre-activation is for backward only
        ctx.mark_non_differentiable(preact)
        ctx.set_materialize_grads(False)  # else autograd fills a zero gradient for it on every backward
    # None: the plain op with an activation that needs its input; backward recomputes it.
    saved = out if grad_from_output(activation, act_args) else preact
    ctx.save_for_backward(input, weight, saved, bias if saved is None else None, residual if saved is None else None)
    ctx.conv = (stride, padding, dilation, groups, activation, act_args)


def _backward(ctx, grad, *_):
    if grad is None:  # the training op does not materialize zero gradients
        return (None,) * 10
    input, weight, saved, bias, residual = ctx.saved_tensors
    stride, padding, dilation, groups, activation, act_args = ctx.conv
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    # Trailing arguments left at their defaults may be missing from needs_input_grad.
    need_r = len(ctx.needs_input_grad) > 9 and ctx.needs_input_grad[9]
    if saved is None:
        saved = _fwd(input, weight, bias, stride, padding, dilation, groups, "identity", [], residual)
    grad_bias = None
    # The bias gradient comes from convolution_backward where no activation kernel runs, and on the CPU,
    # where oneDNN sums it inside its weight-gradient pass; on CUDA the activation kernel sums it in the
    # same pass over the gradient.
    bias_from_conv = need_b and (activation == "identity" or not grad.is_cuda)
    if activation == "identity":
        grad_pre = grad
    else:
        grad_pre, grad_bias = _act_bwd(grad, saved, activation, act_args, need_b and not bias_from_conv)
    grad_x = grad_w = None
    if need_x or need_w or bias_from_conv:
        grad_x, grad_w, grad_b = _conv_bwd(
            grad_pre,
            input,
            weight,
            [weight.shape[0]] if bias_from_conv else None,
            stride,
            padding,
            dilation,
            False,
            [0, 0],
            groups,
            [need_x, need_w, bias_from_conv],
        )
        if bias_from_conv:
            grad_bias = grad_b
    return (
        grad_x,
        grad_w,
        grad_bias if need_b else None,
        None,
        None,
        None,
        None,
        None,
        None,
        grad_pre if need_r else None,
    )


torch.library.register_autograd("fastpipe::conv2d_act", _backward, setup_context=_setup_context)
torch.library.register_autograd("fastpipe::_conv2d_act_train", _backward, setup_context=_setup_context)
