"""fuse(model): rewrite Conv2d [-> BatchNorm2d] [-> activation] [-> residual add] chains into FusedConv2d."""

import copy
import dataclasses
import logging
import operator

import torch
import torch.fx as fx
import torch.nn as nn

from fastpipe import _checks as checks
from fastpipe import ops
from fastpipe.nn import _activations, _fuse_timing, _fx_writes
from fastpipe.nn.modules import FusedConv2d

__all__ = ["fuse", "FuseReport", "FusedChain", "FusedConv2dAdd"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class FusedChain:
    """One rewritten chain: the module names it replaced and the FusedConv2d that now computes it."""

    module: str
    conv: str
    batchnorm: str | None
    activation: str
    residual: bool

    def __str__(self):
        parts = [self.conv] + ([self.batchnorm] if self.batchnorm else []) + (["add"] if self.residual else [])
        return f"{' + '.join(parts)} + {self.activation} -> {self.module}"


@dataclasses.dataclass
class FuseReport:
    """What :func:`fuse` did: chains fused, and convolutions (or modules) left alone with the reason."""

    fused: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)  # (name, reason)
    kept: list = dataclasses.field(default_factory=list)  # (module, reason): computed the stock way

    def __str__(self):
        lines = [f"fused {len(self.fused)} chain(s):"] + [f"  {c}" for c in self.fused]
        if self.kept:
            lines += [f"kept {len(self.kept)} stock (measured):"] + [f"  {name}: {why}" for name, why in self.kept]
        if self.skipped:
            lines += [f"left {len(self.skipped)}:"] + [f"  {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def fuse(model, inplace=False, example_inputs=None):
    """Rewrites Conv2d → [BatchNorm2d] → [activation] → [residual add] chains into FusedConv2d.

    A chain is fused only where each intermediate result has a single user. BatchNorm2d must be in eval
    mode with running statistics: it is folded into the convolution's weight and bias (in float64).
    Training-mode BatchNorm2d, and one without running statistics (``track_running_stats=False``, which
    normalises with batch statistics), is left alone. The activation is any that FusedConv2d supports, as
    a module, a function (F.relu, torch.sigmoid, ...) or a tensor method; others (ELU, Mish, softplus, ...)
    stay as they are. The residual add is ``a + b``, ``torch.add(a, b)``, ``a.add(b)`` or ``conv_out += b``
    (not ``b += conv_out``, which writes into ``b``, nor an add with ``alpha``), and when it is followed by
    an activation, that is fused too; it becomes a :class:`FusedConv2dAdd`, which keeps the add's own
    broadcasting and type promotion. Left alone, with the reason in the report: a conv called with more
    than its input, Conv2d subclasses that fx keeps as modules (those defined outside torch.nn are traced
    through, down to their F.conv2d, which stays as it is), modules with hooks (e.g. ``weight_norm``), and
    chains whose input or residual an in-place operation may change before the chain ends (the fused op
    reads them there). ``a += b`` is traced as the in-place add it is (plain fx records ``a = a + b``).

    Parameters
    ----------
    model : nn.Module
        Traced with torch.fx. A module that cannot be traced is fused inside its children instead.
    inplace : bool, default False
        Work on ``model`` itself rather than a deep copy: the result shares parameters and submodules.
    example_inputs : tuple, optional
        Inputs to run the model on once. Each fused chain is then timed on the input it really gets,
        against the same chain computed by the stock ops (the folded convolution, the add, the
        activation: what BatchNorm folding alone gives); where the fused module is not faster it computes
        the stock way (``FusedConv2d.fused = False``, parameters unchanged) and the report's ``kept``
        says so, with the times. So the fused model is never slower than the stock one, nor than folding
        alone, site by site (the decision is the median of 9 paired rounds, so a site within noise of
        its twin may go either way: both compute at the same speed there). Without example inputs the
        size rule is that every chain is fused, at every size: a FusedConv2d call costs less than the
        stock conv and activation modules (3-5 us less on a small call; ``python -m fastpipe.bench conv
        --part overhead``), and for each input shape its engine choice runs eager PyTorch (the conv,
        then the add and the activation in place, as the stock modules do) wherever no fused engine
        measured at least 3% faster, so no size of call is slower fused. The time of a site's first call
        includes that choice (about 150 ms per new shape, then kept across runs: see
        ``fastpipe.nn.conv_engines``).

    Returns
    -------
    nn.Module
        Usually an ``fx.GraphModule``; its ``fuse_report`` attribute (a :class:`FuseReport`) lists what
        was fused and what was left, which is also logged at INFO level. Outputs equal the original's
        up to the rounding of the folded weights and of the fused op.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    inplace = checks.flag(inplace, "inplace")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    elif example_inputs is not None and not isinstance(example_inputs, (tuple, list)):
        raise TypeError(f"example_inputs must be a tuple of the model's inputs (or one Tensor), got "
                        f"{type(example_inputs).__name__}")
    if not inplace:
        model = copy.deepcopy(model)
    report = FuseReport()
    fused = _fuse_module(model, "", report)
    if example_inputs is not None:
        _fuse_timing.keep_stock_where_fusion_loses(fused, tuple(example_inputs), report)
    fused.fuse_report = report
    log.info("%s", report)
    return fused


class _Proxy(fx.Proxy):
    """fx's Proxy traces ``a += b`` as ``a = a + b``, losing the write into ``a`` that eager PyTorch makes
    (visible through every other reference to ``a``, the caller's tensor included); this one records
    ``operator.iadd`` and its kin, which the generated code runs as ``a += b``."""


def _inplace_magic(op):
    def method(self, other):
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    method.__name__ = f"__{op.__name__}__"
    return method


for _op in (operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
            operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift,
            operator.irshift):
    setattr(_Proxy, f"__{_op.__name__}__", _inplace_magic(_op))


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, FusedConv2d) or super().is_leaf_module(m, qualname)

    def proxy(self, node):
        return _Proxy(node, self)


class FusedConv2dAdd(FusedConv2d):
    """What :func:`fuse` makes of a chain with a residual add: ``forward(input, residual)`` computes
    ``act(conv(input) + residual)`` exactly as the traced add did.

    The fused op runs when ``residual`` is a tensor of the input's dtype and device that broadcasts to
    the convolution's output shape. Anything else the add accepted (a residual that broadcasting makes
    the output larger, as in ``x + conv(x.mean((2, 3), keepdim=True))``, another dtype that type
    promotion wins, a Python number) runs the same steps in eager PyTorch instead, so the result is
    what the original model computed. ``add_inplace`` marks ``conv_out += residual``: then, as in eager,
    the output keeps the convolution's dtype and shape (and a residual that would enlarge it raises).
    """

    def __init__(self, *args, add_inplace=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_inplace = add_inplace

    def _fits(self, input, residual):
        if not isinstance(residual, torch.Tensor) or residual.dtype != input.dtype or residual.device != input.device:
            return False
        if input.dim() not in (3, 4) or residual.dim() > input.dim():
            return False
        h, w = input.shape[-2:]
        if self._pre_pad is not None:
            h, w = h + self._pre_pad[2] + self._pre_pad[3], w + self._pre_pad[0] + self._pre_pad[1]
        out = [*input.shape[:-3], self.out_channels] + [
            ops.conv_output_size(size, k, s, p, d)
            for size, p, d, k, s in zip((h, w), self._padding, self.dilation, self.kernel_size, self.stride)
        ]
        return all(r in (1, o) for r, o in zip(reversed(residual.shape), reversed(out)))

    def forward(self, input, residual=None):
        if residual is None or self._fits(input, residual):
            return super().forward(input, residual)
        out = nn.Conv2d.forward(self, input)
        out = out.add_(residual) if self.add_inplace else out + residual
        return _activations.EAGER[self.activation](out, *self.activation_args)

    def extra_repr(self):
        return f"{super().extra_repr()}, add_inplace={self.add_inplace}"


def _hooks(m):
    """Which kinds of hooks a module has (fusing it would drop them)."""
    kinds = {"forward": m._forward_hooks, "forward pre": m._forward_pre_hooks, "backward": m._backward_hooks,
             "backward pre": m._backward_pre_hooks}
    return [k for k, v in kinds.items() if v]


def _fuse_module(module, prefix, report):
    try:
        graph = _Tracer().trace(module)
    except Exception as e:  # noqa: BLE001  (tracing fails in many ways; the children may still trace)
        report.skipped.append((prefix or type(module).__name__, f"not traceable ({type(e).__name__}); fused its children"))
        for name, child in module.named_children():
            new = _fuse_module(child, f"{prefix}.{name}" if prefix else name, report)
            if new is not child:
                setattr(module, name, new)
        return module
    gm = fx.GraphModule(module, graph, module.__class__.__name__)
    _rewrite(gm, prefix, report)
    return gm


def _sole_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


_ADDS = {operator.add: False, torch.add: False, operator.iadd: True}  # target: in place
_METHOD_ADDS = {"add": False, "add_": True}


def _residual_of(node, chain):
    """``(other operand, in place)`` when ``node`` adds ``chain`` and another value, else None. In-place
    adds must write into ``chain`` (writing into the other operand would be visible through it); an add
    with keyword arguments (``alpha``, ``out``) is not a plain add."""
    if node.kwargs or len(node.args) != 2:
        return None
    if node.op == "call_function" and node.target in _ADDS:
        inplace = _ADDS[node.target]
    elif node.op == "call_method" and node.target in _METHOD_ADDS:
        inplace = _METHOD_ADDS[node.target]
    else:
        return None
    a, b = node.args
    if a is chain and isinstance(b, fx.Node) and b is not chain:
        return b, inplace
    if b is chain and isinstance(a, fx.Node) and a is not chain and not inplace:
        return a, inplace
    return None  # also chain + chain: the conv's output would be needed twice


def _activation_of(node, chain, modules):
    if node.args[:1] != (chain,):
        return None
    if node.op == "call_module" and _hooks(modules[node.target]):
        return None
    return _activations.from_call(node.op, node.target, node.args, node.kwargs, modules.get(node.target))


def _fold_batchnorm(conv, bn):
    """The conv's weight and bias with the eval-mode batch norm applied, computed in float64."""
    w = conv.weight.detach()
    scale = torch.rsqrt(bn.running_var.double() + bn.eps)
    shift = -bn.running_mean.double() * scale
    if bn.affine:
        scale = scale * bn.weight.detach().double()
        shift = shift * bn.weight.detach().double() + bn.bias.detach().double()
    bias = conv.bias.detach().double() if conv.bias is not None else torch.zeros_like(scale)
    weight = (w.double() * scale.reshape(-1, 1, 1, 1)).to(w.dtype)  # keeps w's memory format
    return weight, (bias * scale + shift).to(w.dtype)


def _make_fused(conv, bn, act, add_inplace=None):
    name, kwargs = act
    extra = {} if add_inplace is None else {"add_inplace": add_inplace}
    fused = (FusedConv2d if add_inplace is None else FusedConv2dAdd)(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        bias=conv.bias is not None or bn is not None,
        padding_mode=conv.padding_mode,
        activation=name,
        device="meta",  # parameters are replaced below; skip initialising them
        **extra,
        **kwargs,
    )
    if bn is None:
        fused.weight, fused.bias = conv.weight, conv.bias
    else:
        weight, bias = _fold_batchnorm(conv, bn)
        fused.weight = nn.Parameter(weight, requires_grad=conv.weight.requires_grad)
        fused.bias = nn.Parameter(bias, requires_grad=conv.weight.requires_grad)
    return fused


def _rewrite(gm, prefix, report):
    modules = dict(gm.named_modules())
    qual = (lambda n: f"{prefix}.{n}") if prefix else (lambda n: n)
    calls = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(modules.get(node.target), nn.Conv2d):
            continue
        m = modules[node.target]
        if isinstance(m, FusedConv2d):
            continue
        if type(m) is not nn.Conv2d:
            why_not = f"a {type(m).__name__}, not an nn.Conv2d: a subclass may compute something else"
        else:
            why_not = _fuse_chain(gm, node, modules, calls, qual, report)
        if why_not:
            report.skipped.append((qual(node.target), why_not))
    # No eliminate_dead_code(): the chains' nodes are erased above, and fx's dead code elimination would
    # also drop in-place calls whose result is unused (``y.relu_()``, ``nn.ReLU(inplace=True)(y)``).
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()


def _fuse_chain(gm, node, modules, calls, qual, report):
    """Fuses the chain that starts at conv call ``node``; returns why not, or None when it did."""
    if len(node.args) != 1 or node.kwargs:
        return "called with more than the input"
    conv = modules[node.target]
    if hooks := _hooks(conv):
        return f"it has {' and '.join(hooks)} hooks, which the fused module would not run"
    chain, last, bn, act, residual, add_inplace = [node], node, None, ("identity", {}), None, None
    nxt = _sole_user(last)
    if nxt is not None and nxt.op == "call_module" and type(modules.get(nxt.target)) is nn.BatchNorm2d:
        candidate = modules[nxt.target]
        if candidate.training:
            return f"{qual(nxt.target)} is a BatchNorm2d in training mode"
        if candidate.running_mean is None or candidate.running_var is None:
            return (f"{qual(nxt.target)} has no running statistics (track_running_stats=False): it normalises "
                    f"with each batch's statistics, which cannot be folded")
        if candidate.num_features != conv.out_channels:
            return f"{qual(nxt.target)} has {candidate.num_features} features for {conv.out_channels} channels"
        if hooks := _hooks(candidate):
            return f"{qual(nxt.target)} has {' and '.join(hooks)} hooks, which the fused module would not run"
        bn, last = candidate, nxt
        chain.append(nxt)
        nxt = _sole_user(last)
    if nxt is not None and (found := _activation_of(nxt, last, modules)) is not None:
        act, last = found, nxt
        chain.append(nxt)
    elif nxt is not None and (other := _residual_of(nxt, last)) is not None:
        (residual, add_inplace), last = other, nxt
        chain.append(nxt)
        after = _sole_user(last)
        if after is not None and (found := _activation_of(after, last, modules)) is not None:
            act, last = found, after
            chain.append(after)
    if last is node:
        users = len(node.users)
        return "no batch norm, activation or add follows" if users == 1 else f"its output has {users} users"
    if (writer := _fx_writes.written_before_end(node, last, chain, [node.args[0], residual], modules)) is not None:
        return (f"{writer.name} may change its input or the residual in place before the chain ends, where the "
                f"fused op would read them")
    try:
        fused = _make_fused(conv, bn, act, add_inplace)
    except (ValueError, TypeError) as e:  # e.g. hardtanh with min_val >= max_val
        return f"activation not fusable ({e})"
    # Reuse the conv's name (keeps state_dict keys) unless the conv module is also called elsewhere.
    target = node.target if calls[node.target] == 1 else f"{node.target}_fused_{len(report.fused)}"
    gm.add_submodule(target, fused)
    with gm.graph.inserting_after(last):
        new = gm.graph.call_module(target, (node.args[0],), {"residual": residual} if residual is not None else {})
    last.replace_all_uses_with(new)
    for n in reversed(chain):
        gm.graph.erase_node(n)
    report.fused.append(
        FusedChain(
            module=qual(target),
            conv=qual(node.target),
            batchnorm=qual(chain[1].target) if bn is not None else None,
            activation=_activations.describe(*_activations.resolve(act[0], act[1])),
            residual=residual is not None,
        )
    )
    return None
