"""The activations table kept once in C++ (csrc/kernels/activation.h, exported as _C.CONV_ACTIVATIONS)
against its Python views in fastpipe/nn/_activations.py."""

import pytest

from conv_ref import ACTIVATIONS, grad_from_output
from fastpipe._ext import _C
from fastpipe.nn import _activations

pytestmark = pytest.mark.torch_build


def test_activations_are_one_table():
    """The ops' activations (C++ table) against what Python resolves users' names to, the eager
    fallback's table, and what backward keeps (from the tests' own reference)."""
    table = {name: (nargs, keeps_output) for name, nargs, keeps_output in _C.CONV_ACTIVATIONS}
    assert set(_activations.EAGER) == set(table)
    resolved = set()
    for act, kw in ACTIVATIONS + [(name, {}) for name in _activations._DEFAULTS]:
        name, args = _activations.resolve(act, kw)
        assert name in table, f"{act} resolves to {name}, which the ops do not know"
        assert len(args) == table[name][0], f"{act}: {len(args)} act_args, the ops take {table[name][0]}"
        if name != "leaky_relu":  # its answer depends on the slope's sign, checked with the tests' reference
            assert table[name][1] == grad_from_output(name, args), name
        resolved.add(name)
    assert resolved == set(table), f"no user-facing name reaches {set(table) - resolved}"
