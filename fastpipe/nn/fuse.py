"""fuse(model): rewrite Conv2d [-> BatchNorm2d] [-> activation] [-> residual add] chains into FusedConv2d."""

import copy
import dataclasses
import logging
import operator

import torch
import torch.fx as fx
import torch.nn as nn

from fastpipe.nn import _activations
from fastpipe.nn.modules import FusedConv2d

__all__ = ["fuse", "FuseReport", "FusedChain"]

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

    def __str__(self):
        lines = [f"fused {len(self.fused)} chain(s):"] + [f"  {c}" for c in self.fused]
        if self.skipped:
            lines += [f"left {len(self.skipped)}:"] + [f"  {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def fuse(model, inplace=False):
    """Rewrites Conv2d → [BatchNorm2d] → [activation] → [residual add] chains into FusedConv2d.

    A chain is fused only where each intermediate result has a single user. BatchNorm2d must be in eval
    mode with running statistics: it is folded into the convolution's weight and bias (in float64).
    Training-mode BatchNorm2d is left alone. The activation is any that FusedConv2d supports, as a
    module, a function (F.relu, torch.sigmoid, ...) or a tensor method; the residual add is ``a + b``,
    ``torch.add(a, b)`` or ``a += b``, and when it is followed by an activation, that is fused too.

    Parameters
    ----------
    model : nn.Module
        Traced with torch.fx. A module that cannot be traced is fused inside its children instead.
    inplace : bool, default False
        Work on ``model`` itself rather than a deep copy: the result shares parameters and submodules.

    Returns
    -------
    nn.Module
        Usually an ``fx.GraphModule``; its ``fuse_report`` attribute (a :class:`FuseReport`) lists what
        was fused and what was left, which is also logged at INFO level. Outputs equal the original's
        up to the rounding of the folded weights and of the fused op.
    """
    if not inplace:
        model = copy.deepcopy(model)
    report = FuseReport()
    fused = _fuse_module(model, "", report)
    fused.fuse_report = report
    log.info("%s", report)
    return fused


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, FusedConv2d) or super().is_leaf_module(m, qualname)


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
    """The other operand when ``node`` adds ``chain`` and another tensor, else None. In-place adds must
    write into ``chain`` (writing into the other operand would be visible through it)."""
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
        return b
    if b is chain and isinstance(a, fx.Node) and not inplace:
        return a
    return None


def _activation_of(node, chain, modules):
    if node.args[:1] != (chain,):
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


def _make_fused(conv, bn, act):
    name, kwargs = act
    fused = FusedConv2d(
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
        if node.op != "call_module" or type(modules.get(node.target)) is not nn.Conv2d:
            continue
        why_not = _fuse_chain(gm, node, modules, calls, qual, report)
        if why_not:
            report.skipped.append((qual(node.target), why_not))
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()


def _fuse_chain(gm, node, modules, calls, qual, report):
    """Fuses the chain that starts at conv call ``node``; returns why not, or None when it did."""
    if len(node.args) != 1 or node.kwargs:
        return "called with more than the input"
    conv = modules[node.target]
    chain, last, bn, act, residual = [node], node, None, ("identity", {}), None
    nxt = _sole_user(last)
    if nxt is not None and nxt.op == "call_module" and type(modules.get(nxt.target)) is nn.BatchNorm2d:
        candidate = modules[nxt.target]
        if candidate.training:
            return f"{qual(nxt.target)} is a BatchNorm2d in training mode"
        if candidate.running_mean is None or candidate.num_features != conv.out_channels:
            return f"{qual(nxt.target)} has no running statistics for the conv's channels"
        bn, last = candidate, nxt
        chain.append(nxt)
        nxt = _sole_user(last)
    if nxt is not None and (found := _activation_of(nxt, last, modules)) is not None:
        act, last = found, nxt
        chain.append(nxt)
    elif nxt is not None and (other := _residual_of(nxt, last)) is not None:
        residual, last = other, nxt
        chain.append(nxt)
        after = _sole_user(last)
        if after is not None and (found := _activation_of(after, last, modules)) is not None:
            act, last = found, after
            chain.append(after)
    if last is node:
        users = len(node.users)
        return "no batch norm, activation or add follows" if users == 1 else f"its output has {users} users"
    try:
        fused = _make_fused(conv, bn, act)
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
