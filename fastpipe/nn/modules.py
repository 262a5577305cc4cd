"""FusedConv2d: nn.Conv2d with its activation (and an optional residual add) fused into one op."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import has_torch_function_variadic

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.nn import _activations
from fastpipe.nn.functional import _check_tensors, _pair, fused_conv, padding_plan

__all__ = ["FusedConv2d"]


class FusedConv2d(nn.Conv2d):
    """``act(conv2d(input) + bias [+ residual])`` as one op; a drop-in nn.Conv2d.

    It is an nn.Conv2d subclass with the same parameters, so it loads an nn.Conv2d ``state_dict``
    unchanged; ``forward(input, residual=None)`` adds ``residual`` before the activation.

    Parameters
    ----------
    in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
    device, dtype
        As in :class:`torch.nn.Conv2d`.
    activation : str or nn.Module, default "relu"
        identity, relu, relu6, hardtanh, leaky_relu, silu, gelu, sigmoid, tanh or hardswish, or an
        instance of the matching nn module.
    **activation_kwargs
        ``min_val``/``max_val`` (hardtanh), ``negative_slope`` (leaky_relu), ``approximate`` (gelu).

    Notes
    -----
    Performance: the first call with a new shape, dtype, layout or activation times the available
    implementations (eager PyTorch included) and keeps the fastest, so expect a slower first call. On
    CPUs with oneDNN the conv and activation run as one primitive; on CUDA, cuDNN's convolution is
    followed by one fastpipe kernel for bias, residual and activation. The module's configuration is
    checked once, at construction: ``stride``, ``padding``, ``dilation``, ``groups`` and the activation
    are fixed then (as the op's arguments they are not re-read per call).
    """

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        bias=True,
        padding_mode="zeros",
        activation="relu",
        device=None,
        dtype=None,
        **activation_kwargs,
    ):
        # nn.Conv2d accepts zero channels, zero-size kernels, zero strides and negative padding, which fail
        # (or compute nothing) only at the first call; refused here, naming the argument.
        checks.integer(in_channels, "in_channels", low=1)
        checks.integer(out_channels, "out_channels", low=1)
        for name, value in (("kernel_size", kernel_size), ("stride", stride), ("dilation", dilation)) + (
                () if isinstance(padding, str) else (("padding", padding),)):
            _pair(value, name)
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding,
            dilation,
            groups,
            bias,
            padding_mode,
            device=device,
            dtype=dtype,
        )
        self.activation, self.activation_args = _activations.resolve(activation, activation_kwargs)
        if padding_mode != "zeros":
            # As nn.Conv2d: pad the input with the mode, then convolve without padding.
            self._pre_pad, self._pad_mode, self._padding = self._reversed_padding_repeated_twice, padding_mode, (0, 0)
        else:
            self._pre_pad, self._padding = padding_plan(self.padding, self.kernel_size, self.dilation, self.stride)
            self._pad_mode = "constant"
        self._call = self._make_call()
        # False: computed as the stock modules would (conv, + residual, activation): fuse() keeps a site
        # so where it measured fusion to lose.
        self.fused = True

    def _make_call(self):
        return _C.ConvActCall(list(self.stride), list(self._padding), list(self.dilation), self.groups,
                              self.activation, list(self.activation_args))

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["_call"]  # a C++ object: made again on load
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("fused", True)
        self._call = self._make_call()

    def forward(self, input, residual=None):
        if self._pre_pad is not None:
            input = F.pad(input, self._pre_pad, mode=self._pad_mode)
        weight, bias = self.weight, self.bias
        if not self.fused:  # as the stock modules compute it: the conv, then the add and activation in place
            out = F.conv2d(input, weight, bias, self.stride, self._padding, self.dilation, self.groups)
            if residual is not None:
                out = out.add_(residual)
            return _activations.EAGER_INPLACE[self.activation](out, *self.activation_args)
        if isinstance(input, torch.Tensor) and input.dim() == 4 and not torch.compiler.is_compiling() and \
                not has_torch_function_variadic(input, weight, bias, residual):
            try:
                return self._call(input, weight, bias, residual)  # the configuration checked once, an unboxed call
            except TypeError:  # a non-tensor argument: say which
                _check_tensors(input, weight, bias, residual)
                raise
        # Unbatched input, torch.compile (which traces the op) and tensor subclasses or modes.
        _check_tensors(input, weight, bias, residual)
        return fused_conv(
            input,
            self.weight,
            self.bias,
            self.stride,
            self._padding,
            self.dilation,
            self.groups,
            self.activation,
            self.activation_args,
            residual,
        )

    def extra_repr(self):
        stock = "" if self.fused else ", fused=False"
        return f"{super().extra_repr()}, activation={_activations.describe(self.activation, self.activation_args)}{stock}"
