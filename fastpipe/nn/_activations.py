"""The activations fastpipe fuses, from names, nn.Module instances or (for fuse) traced calls.

Everything resolves to the ops' form: ``(name, act_args)``, e.g. ``("hardtanh", [0.0, 6.0])`` for relu6.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from fastpipe import _checks as checks

# Names users may pass, with the keyword arguments each takes and their defaults.
_DEFAULTS = {
    "identity": {},
    "relu": {},
    "relu6": {},
    "hardtanh": {"min_val": -1.0, "max_val": 1.0},
    "leaky_relu": {"negative_slope": 0.01},
    "silu": {},
    "gelu": {"approximate": "none"},
    "sigmoid": {},
    "tanh": {},
    "hardswish": {},
}

# nn.Module types (matched exactly: a subclass may compute something else) and their keyword arguments.
_MODULES = {
    nn.Identity: ("identity", lambda m: {}),
    nn.ReLU: ("relu", lambda m: {}),
    nn.ReLU6: ("relu6", lambda m: {}),
    nn.Hardtanh: ("hardtanh", lambda m: {"min_val": m.min_val, "max_val": m.max_val}),
    nn.LeakyReLU: ("leaky_relu", lambda m: {"negative_slope": m.negative_slope}),
    nn.SiLU: ("silu", lambda m: {}),
    nn.GELU: ("gelu", lambda m: {"approximate": m.approximate}),
    nn.Sigmoid: ("sigmoid", lambda m: {}),
    nn.Tanh: ("tanh", lambda m: {}),
    nn.Hardswish: ("hardswish", lambda m: {}),
}

# Functions as traced by torch.fx: name and the positional parameters after the input.
_FUNCTIONS = {
    F.relu: ("relu", ("inplace",)),
    torch.relu: ("relu", ()),
    torch.relu_: ("relu", ()),
    F.relu6: ("relu6", ("inplace",)),
    F.hardtanh: ("hardtanh", ("min_val", "max_val", "inplace")),
    F.leaky_relu: ("leaky_relu", ("negative_slope", "inplace")),
    F.silu: ("silu", ("inplace",)),
    F.gelu: ("gelu", ("approximate",)),
    torch.sigmoid: ("sigmoid", ()),
    F.sigmoid: ("sigmoid", ()),
    torch.tanh: ("tanh", ()),
    F.tanh: ("tanh", ()),
    F.hardswish: ("hardswish", ("inplace",)),
}
# Eager PyTorch for each op-level name (what resolve returns), called as EAGER[name](t, *act_args).
EAGER = {
    "identity": lambda t: t,
    "relu": torch.relu,
    "hardtanh": F.hardtanh,
    "leaky_relu": F.leaky_relu,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "hardswish": F.hardswish,
}
# The same, writing into their input where torch can (what the stock modules do with inplace=True).
EAGER_INPLACE = {
    **EAGER,
    "relu": torch.relu_,
    "hardtanh": lambda t, lo, hi: F.hardtanh(t, lo, hi, inplace=True),
    "leaky_relu": lambda t, slope: F.leaky_relu(t, slope, inplace=True),
    "silu": lambda t: F.silu(t, inplace=True),
    "sigmoid": torch.sigmoid_,
    "tanh": torch.tanh_,
    "hardswish": lambda t: F.hardswish(t, inplace=True),
}
_METHODS = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "sigmoid_": "sigmoid", "tanh": "tanh", "tanh_": "tanh"}


def resolve(activation, kwargs=None):
    """``(name, act_args)`` for the ops from a name (with keyword arguments) or an nn.Module instance.

    Raises ValueError for an unknown activation or bad values, TypeError for unknown keyword arguments.
    """
    kwargs = dict(kwargs or {})
    if isinstance(activation, nn.Module):
        if type(activation) not in _MODULES:
            raise ValueError(
                f"activation module {type(activation).__name__} is not supported; use one of "
                f"{', '.join(t.__name__ for t in _MODULES)}"
            )
        if kwargs:
            raise TypeError(
                f"activation keyword arguments {sorted(kwargs)} apply to activation names, not to a "
                f"{type(activation).__name__} module"
            )
        name, params = _MODULES[type(activation)]
        return _canonical(name, params(activation))
    if activation is None:
        activation = "identity"
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a name or an nn.Module, got {type(activation).__name__}")
    name = activation.lower()
    if name not in _DEFAULTS:
        raise ValueError(f"activation must be one of {', '.join(_DEFAULTS)} (or such an nn.Module), got {activation!r}")
    unknown = sorted(set(kwargs) - set(_DEFAULTS[name]))
    if unknown:
        takes = f"; it takes {', '.join(_DEFAULTS[name])}" if _DEFAULTS[name] else ""
        raise TypeError(f"activation {name!r} takes no keyword argument {', '.join(unknown)}{takes}")
    return _canonical(name, {**_DEFAULTS[name], **kwargs})


def _canonical(name, p):
    if name == "relu6":
        return "hardtanh", [0.0, 6.0]
    if name == "hardtanh":
        lo, hi = checks.real(p["min_val"], "min_val"), checks.real(p["max_val"], "max_val")
        if not lo < hi:
            raise ValueError(f"hardtanh needs min_val < max_val, got min_val={lo}, max_val={hi}")
        return "hardtanh", [lo, hi]
    if name == "leaky_relu":
        return "leaky_relu", [checks.real(p["negative_slope"], "negative_slope")]
    if name == "gelu":
        if p["approximate"] not in ("none", "tanh"):
            raise ValueError(f"gelu's approximate must be 'none' or 'tanh', got {p['approximate']!r}")
        return ("gelu" if p["approximate"] == "none" else "gelu_tanh"), []
    return name, []


def describe(name, act_args):
    """A short text for reprs and reports, e.g. ``hardtanh(0.0, 6.0)``."""
    return f"{name}({', '.join(map(str, act_args))})" if act_args else name


def from_call(op, target, args, kwargs, module=None):
    """``(name, kwargs)`` when a traced call (fx node op/target/args/kwargs) applies a supported
    activation to its first argument alone, else None. ``module`` is the called module for call_module."""
    if op == "call_module":
        if type(module) not in _MODULES or len(args) != 1 or kwargs:
            return None
        name, params = _MODULES[type(module)]
        return name, params(module)
    if op == "call_method":
        if target not in _METHODS or len(args) != 1 or kwargs:
            return None
        return _METHODS[target], {}
    if op != "call_function" or target not in _FUNCTIONS:
        return None
    name, positional = _FUNCTIONS[target]
    if len(args) - 1 > len(positional):
        return None
    given = dict(zip(positional, args[1:]))
    given.update(kwargs)
    given.pop("inplace", None)
    if any(not isinstance(v, (int, float, str)) for v in given.values()):
        return None  # a traced value; only constants can be fused
    if set(given) - set(_DEFAULTS[name]):
        return None
    return name, given
