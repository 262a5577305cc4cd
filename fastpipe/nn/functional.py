"""Functional form of fastpipe's fused convolution."""

import torch
import torch.nn.functional as F
from torch.overrides import has_torch_function_variadic

from fastpipe import _checks as checks
from fastpipe import ops
from fastpipe._ext import _C
from fastpipe.nn import _activations

__all__ = ["conv2d_act"]


_LOWEST = {"stride": 1, "dilation": 1, "kernel_size": 1, "padding": 0}


def _pair(v, name):
    """An int or a pair of ints as a pair, each at least the lowest value ``name`` may take."""
    if not isinstance(v, (tuple, list)):
        v = (checks.integer(v, name),) * 2
    if len(v) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")
    return tuple(checks.integer(x, name, low=_LOWEST[name]) for x in v)


def padding_plan(padding, kernel_size, dilation, stride):
    """``(pre_pad, padding)``: F.pad widths to apply first (or None) and the conv's own padding pair.

    "same" pads asymmetrically when the dilated kernel's extent is even; the conv cannot, so the input
    is padded first then.
    """
    if not isinstance(padding, str):
        return None, _pair(padding, "padding")
    if padding == "valid":
        return None, (0, 0)
    if padding != "same":
        raise ValueError(f"padding must be 'same', 'valid', an int or a pair of ints, got {padding!r}")
    if stride != (1, 1):
        raise ValueError(f"padding='same' needs stride 1, got stride={stride}")
    totals = [d * (k - 1) for d, k in zip(dilation, kernel_size)]
    if all(t % 2 == 0 for t in totals):
        return None, (totals[0] // 2, totals[1] // 2)
    (th, tw) = totals
    return (tw // 2, tw - tw // 2, th // 2, th - th // 2), (0, 0)


def fused_conv(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual):
    """The shared body of conv2d_act and FusedConv2d: unbatched input and a broadcast residual."""
    unbatched = input.dim() == 3
    if unbatched:
        input = input.unsqueeze(0)
        if residual is not None:
            residual = residual.unsqueeze(0)
    if residual is not None:
        out_shape = ops.conv_output_shape(input.shape, weight.shape, stride, padding, dilation)
        if list(residual.shape) != out_shape:
            try:
                residual = residual.expand(out_shape)
            except RuntimeError:
                raise ValueError(
                    f"residual of shape {list(residual.shape)} does not broadcast to the output shape {out_shape}"
                ) from None
    out = ops.conv2d_act(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual)
    return out.squeeze(0) if unbatched else out


def conv2d_act(
    input,
    weight,
    bias=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    activation="relu",
    residual=None,
    **activation_kwargs,
):
    """``act(conv2d(input, weight, bias) + residual)`` as one fused op.

    Parameters
    ----------
    input : Tensor
        ``(N, C_in, H, W)`` or unbatched ``(C_in, H, W)``; float32, float16, bfloat16 or float64.
    weight, bias, stride, padding, dilation, groups
        As in :func:`torch.nn.functional.conv2d` (padding may be "same" or "valid").
    activation : str or nn.Module
        identity, relu, relu6, hardtanh, leaky_relu, silu, gelu, sigmoid, tanh or hardswish, or an
        instance of the matching nn module (nn.ReLU(), nn.GELU(approximate="tanh"), ...).
    residual : Tensor, optional
        Added before the activation; broadcast to the output's shape like ``+`` would.
    **activation_kwargs
        The activation's arguments: ``min_val``/``max_val`` (hardtanh), ``negative_slope``
        (leaky_relu), ``approximate`` (gelu).

    Returns
    -------
    Tensor
        Channels_last when input or weight is, like eager convolution.

    Notes
    -----
    Each new shape/dtype/layout/activation combination is timed once against eager PyTorch and the
    faster implementation is kept (see ``fastpipe.nn.conv_engines``); set FASTPIPE_CONV_ENGINE to
    ``eager`` or an engine's name to force one.
    """
    if isinstance(input, torch.Tensor) and input.dim() == 4 and not torch.compiler.is_compiling() and \
            not has_torch_function_variadic(input, weight, bias, residual):
        # A configuration seen before is resolved and checked once: a dict lookup, then an unboxed call.
        key = (stride, padding, dilation, groups, activation, *activation_kwargs.items())
        try:
            call = _CALLS[key]
        except (KeyError, TypeError):  # new, or unhashable (a list, an activation module)
            call = _call_for(key, stride, padding, dilation, groups, activation, activation_kwargs)
        if call is not None:
            try:
                return call(input, weight, bias, residual)
            except TypeError:  # a non-tensor argument: say which
                _check_tensors(input, weight, bias, residual)
                raise
    _check_tensors(input, weight, bias, residual)
    act, act_args = _activations.resolve(activation, activation_kwargs)
    stride = _pair(stride, "stride")
    dilation = _pair(dilation, "dilation")
    groups = checks.integer(groups, "groups", low=1)
    pre_pad, pad = padding_plan(padding, tuple(weight.shape[2:]), dilation, stride)
    if pre_pad is not None:
        input = F.pad(input, pre_pad)
    return fused_conv(input, weight, bias, stride, pad, dilation, groups, act, act_args, residual)


def _check_tensors(input, weight, bias=None, residual=None):
    """TypeError naming the argument that is not a tensor (the op's own checks name the rest)."""
    for name, t in (("input", input), ("weight", weight), ("bias", bias), ("residual", residual)):
        optional = name in ("bias", "residual")
        if not (isinstance(t, torch.Tensor) or hasattr(t, "__torch_function__") or optional and t is None):
            raise TypeError(f"{name} must be a Tensor, got {type(t).__name__}")


# conv2d_act's checked configurations, by their arguments (names of activations only: a module is
# mutable). Bounded: a program has few call sites.
_CALLS = {}
_MAX_CALLS = 1024


def _call_for(key, stride, padding, dilation, groups, activation, activation_kwargs):
    """The ConvActCall of a configuration, cached when its arguments are hashable; None for the general
    path (padding "same", which depends on the kernel)."""
    if isinstance(padding, str) or not (activation is None or isinstance(activation, str)):
        return None
    act, act_args = _activations.resolve(activation, activation_kwargs)
    stride, dilation, padding = _pair(stride, "stride"), _pair(dilation, "dilation"), _pair(padding, "padding")
    groups = checks.integer(groups, "groups", low=1)
    call = _C.ConvActCall(list(stride), list(padding), list(dilation), groups, act, list(act_args))
    try:
        if len(_CALLS) < _MAX_CALLS:
            _CALLS[key] = call
    except TypeError:
        pass
    return call

