"""The exceptions attend raises for bad input.

Each is both the builtin that attend has always raised (``ValueError``,
``TypeError``) and ``RuntimeError``, what PyTorch raises for the same calls to
``torch.nn.functional.scaled_dot_product_attention``: code written against either
catches them.
"""

from __future__ import annotations


class AttendValueError(ValueError, RuntimeError):
    """A shape or value attend cannot take (one line naming the argument)."""


class AttendTypeError(TypeError, RuntimeError):
    """An argument of the wrong kind or dtype (one line naming the argument)."""
