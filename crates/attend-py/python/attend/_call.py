"""What a call of scaled dot-product attention must be, whichever way it comes in
(NumPy arrays through ``_sdpa``, tensors through ``ops``): the options' Python types
and the one error for arguments of mixed kinds."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._errors import AttendTypeError


def check_options(dropout_p: Any, is_causal: Any, scale: Any, enable_gqa: Any) -> None:
    """Refuses options of the wrong Python type (their values are the compiled
    half's to judge: a dropout probability in [0, 1), a finite scale)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise AttendTypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise AttendTypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise AttendTypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if not isinstance(enable_gqa, (bool, np.bool_)):
        raise AttendTypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")


def kind_error(query: Any, key: Any, value: Any, tensor: Optional[type] = None) -> AttendTypeError:
    """The error for arguments that are neither all arrays nor all tensors
    (``tensor``: torch.Tensor, once torch is imported)."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, np.ndarray) and not (tensor is not None and isinstance(x, tensor)):
            return AttendTypeError(f"{name} must be a torch.Tensor or a numpy.ndarray, got {type(x).__name__}")
    return AttendTypeError("query, key and value must all be torch.Tensors or all numpy.ndarrays")
