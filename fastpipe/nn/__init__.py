"""fastpipe.nn: fused convolution + bias + activation (+ residual) for PyTorch models.

- :class:`FusedConv2d`: an nn.Conv2d that applies its activation (and a residual) in the same op.
- :func:`functional.conv2d_act`: the functional form.
- :func:`fuse`: rewrites Conv2d → BatchNorm2d → activation → add chains of a model into FusedConv2d.
- :func:`conv_engines`, :func:`conv_engine_cache`, :func:`clear_conv_engine_cache`,
  :func:`use_conv_engine`, :func:`save_conv_engine_choices`, :func:`load_conv_engine_choices`,
  :func:`retune`: the per-call-key engine choice (env FASTPIPE_CONV_ENGINE; kept from run to run in
  FASTPIPE_CONV_CACHE with the margin each choice was made by; thin ones are re-timed);
  :func:`use_conv_act_backward`: the CUDA activation backward's kernel (env FASTPIPE_CONV_ACT_BACKWARD).
"""

from fastpipe.nn import functional
from fastpipe.nn._engines import (
    clear_conv_engine_cache,
    conv_engine_cache,
    conv_engines,
    load_conv_engine_choices,
    retune,
    save_conv_engine_choices,
    use_conv_act_backward,
    use_conv_engine,
)
from fastpipe.nn.fuse import FusedChain, FuseReport, fuse
from fastpipe.nn.modules import FusedConv2d

__all__ = [
    "FusedConv2d",
    "functional",
    "fuse",
    "FuseReport",
    "FusedChain",
    "conv_engines",
    "conv_engine_cache",
    "clear_conv_engine_cache",
    "use_conv_engine",
    "use_conv_act_backward",
    "save_conv_engine_choices",
    "load_conv_engine_choices",
    "retune",
]
