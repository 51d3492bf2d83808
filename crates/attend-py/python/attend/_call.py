"""What a call of scaled dot-product attention must be, whichever way it comes in
(NumPy arrays through ``_sdpa``, tensors through ``ops``): the options' Python types
and the one error for arguments of mixed kinds."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ._errors import AttendTypeError


def _number(name: str, x: Any, kind: str) -> Any:
    """``x`` as a Python number: an int or float as given (under
    ``torch.compile(dynamic=True)``, ``float()`` of a constant would trace a symbolic
    float and restart the analysis), a NumPy scalar or a 0-d tensor or array as the
    float it holds, as PyTorch takes them; anything else is refused."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x
    if isinstance(x, (np.floating, np.integer)):
        return float(x)
    if getattr(x, "ndim", None) == 0 and getattr(x, "dtype", None) is not None and hasattr(x, "item"):
        if getattr(x, "requires_grad", False):
            raise AttendTypeError(f"{name} must be {kind}, got a tensor that requires grad (attend has no gradient for it)")
        value = x.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    raise AttendTypeError(f"{name} must be {kind}, got {type(x).__name__}")


def check_options(dropout_p: Any, is_causal: Any, scale: Any, enable_gqa: Any) -> Tuple[Any, Any]:
    """``(dropout_p, scale)`` as Python numbers, or the error for options of the
    wrong Python type (their values are the compiled half's to judge: a dropout
    probability in [0, 1], a finite scale)."""
    dropout_p = _number("dropout_p", dropout_p, "a float")
    if scale is not None:
        scale = _number("scale", scale, "a float or None")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise AttendTypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if not isinstance(enable_gqa, (bool, np.bool_)):
        raise AttendTypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    return dropout_p, scale


def kind_error(query: Any, key: Any, value: Any, tensor: Optional[type] = None) -> AttendTypeError:
    """The error for arguments that are neither all arrays nor all tensors
    (``tensor``: torch.Tensor, once torch is imported)."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, np.ndarray) and not (tensor is not None and isinstance(x, tensor)):
            return AttendTypeError(f"{name} must be a torch.Tensor or a numpy.ndarray, got {type(x).__name__}")
    return AttendTypeError("query, key and value must all be torch.Tensors or all numpy.ndarrays")
