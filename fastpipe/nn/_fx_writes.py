"""Which calls of an fx graph may write into a tensor (in place, through a view, or by ``out=``): fuse()
moves a chain's reads to its last node, which is safe only when nothing writes them in between."""

import inspect
import operator

import torch
import torch.fx as fx
import torch.nn as nn

_INPLACE_FUNCTIONS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift,
                      operator.irshift, operator.imatmul, operator.setitem}
# Calls whose result may share memory with their first argument.
_VIEW_METHODS = {"view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze",
                 "transpose", "permute", "narrow", "select", "expand", "expand_as", "t", "contiguous", "detach",
                 "as_strided", "split", "chunk", "unbind", "movedim", "swapaxes", "swapdims", "unfold",
                 "diagonal", "__getitem__", "to", "type_as", "float", "half", "bfloat16", "double"}
_VIEW_FUNCTIONS = {operator.getitem, getattr, torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze,
                   torch.transpose, torch.permute, torch.narrow, torch.select, torch.split, torch.chunk,
                   torch.unbind, torch.movedim, torch.t, torch.detach, torch.diagonal}


def _inplace_argument(node):
    """Whether a call_function passes ``inplace=True`` (by keyword or position)."""
    if node.kwargs.get("inplace") is True:
        return True
    try:
        bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):  # builtins without a signature, or a call this signature does not take
        return False
    return bound.arguments.get("inplace") is True


def _writes(node, modules):
    """The nodes a call may write into: its first argument when it works in place, and ``out=``."""
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if node.op == "call_method":
        inplace = node.target.endswith("_") and not node.target.startswith("_")
    elif node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        inplace = node.target in _INPLACE_FUNCTIONS or (name.endswith("_") and not name.startswith("_")) or (
            _inplace_argument(node))
    elif node.op == "call_module":
        inplace = getattr(modules.get(node.target), "inplace", False) is True
    else:
        inplace = False
    written = [first] if inplace and first is not None else []
    out = node.kwargs.get("out")
    written += [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, fx.Node)]
    return written


def _root(node, modules):
    """The node whose memory ``node`` may share, following views and in-place results to their source."""
    while isinstance(node, fx.Node) and node.args and isinstance(node.args[0], fx.Node):
        aliases = (node.op == "call_method" and node.target in _VIEW_METHODS) or (
            node.op == "call_function" and node.target in _VIEW_FUNCTIONS) or (
            node.op == "call_module" and type(modules.get(node.target)) in (nn.Identity, nn.Flatten, nn.Unflatten)) or (
            node.args[0] in _writes(node, modules))
        if not aliases:
            break
        node = node.args[0]
    return node


def written_before_end(first, last, chain, reads, modules):
    """A node between ``first`` and ``last`` (outside the chain) that may write into one of ``reads``;
    the fused op, which runs at ``last``, would read the changed value."""
    roots = {_root(r, modules) for r in reads if isinstance(r, fx.Node)}
    node = first.next
    while node is not last and node.op != "root":
        if node not in chain and any(_root(w, modules) in roots for w in _writes(node, modules)):
            return node
        node = node.next
    return None
