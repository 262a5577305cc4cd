"""Argument checks of the public API: a wrong type is a TypeError, a wrong value a ValueError, and each
message names the argument and says what it must be."""

import math
import numbers
import operator
import os
import re

import numpy as np


def integer(value, name, *, low=None, high=None, why=""):
    """``value`` as an int (numpy's, or an integer tensor of one element, as a torch Subset with tensor
    indices passes them), refusing bools, floats (even 2.0) and strings; ``why`` explains ``high``."""
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    try:
        value = int(value) if isinstance(value, numbers.Integral) else operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if low is not None and value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high}{why}, got {value}")
    return value


def real(value, name, *, low=None, high=None, positive=False, allow_inf=False):
    """``value`` as a float: a finite number (infinity only with ``allow_inf``) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def flag(value, name):
    """``value`` as a bool: True/False (numpy's too) or 0/1, never a string or another truthy object."""
    if isinstance(value, (bool, np.bool_)) or isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def choice(value, name, options):
    """``value`` if it is one of the names in ``options``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(map(repr, options))}, got {type(value).__name__} "
                        f"{value!r}")
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value


def path(value, name):
    """``value`` as a str path (str or os.PathLike)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__}")
    return os.fspath(value)


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_size(value, name):
    """An int of bytes, or a string such as ``"50GB"``, ``"512 MiB"``."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{name} must be bytes as an int or a string such as '50GB' or '512MiB', got {value!r}")
        return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    return integer(value, name, low=0)


def per_channel(value, name, positive=False):
    """A finite number, or a non-empty sequence of them (one per channel), as a list of floats."""
    if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real) and not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a number or a sequence of numbers, got {type(value).__name__} {value!r}")
    if isinstance(value, numbers.Real):
        value = [value]
    values = [real(v, f"{name}[{i}]", positive=positive) for i, v in enumerate(value)]
    if not values:
        raise ValueError(f"{name} must not be empty")
    return values
