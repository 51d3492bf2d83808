"""``attend.scaled_dot_product_attention``: PyTorch's signature and semantics on
attend's fused kernels."""

from __future__ import annotations

import sys
from typing import Optional

import numpy as np

from . import _attend
from ._call import check_options, kind_error
from ._errors import AttendTypeError
from ._threads import get_num_threads


def _sdpa_numpy(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> np.ndarray:
    for name, a in (("query", query), ("key", key), ("value", value)):
        if a.dtype != np.float32:
            raise AttendTypeError(f"{name} must be float32, got {a.dtype} (convert with .astype(np.float32))")
    if attn_mask is not None:
        if not isinstance(attn_mask, np.ndarray):
            raise AttendTypeError(
                f"attn_mask must be a numpy.ndarray with numpy inputs, got {type(attn_mask).__name__}"
            )
        if attn_mask.dtype != np.bool_ and attn_mask.dtype != np.float32:
            raise AttendTypeError(f"attn_mask must be bool or float32 (the query's dtype), got {attn_mask.dtype}")
    dropout_p, scale = check_options(dropout_p, is_causal, scale, enable_gqa)
    seed = int(np.random.randint(0, 2**63 - 1, dtype=np.int64)) if dropout_p else 0
    opts = _attend.Options(
        is_causal=bool(is_causal),
        scale=None if scale is None else float(scale),
        dropout_p=float(dropout_p),
        enable_gqa=bool(enable_gqa),
        seed=seed,
    )
    out, _ = _attend.sdpa_forward((query, key, value), attn_mask, opts, get_num_threads())
    return out


_sdpa_torch = None
"""``attend.ops.sdpa_torch`` once a call has imported it (an import statement costs
a microsecond a call even when the module is loaded)."""


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
):
    """Scaled dot-product attention with ``torch.nn.functional.scaled_dot_product_attention``'s
    signature and semantics, on attend's fused CPU kernels.

    Args:
        query: ``[..., L, E]``, a CPU ``torch.Tensor`` of any float dtype PyTorch's
            CPU attention takes, or a float32 ``numpy.ndarray``:

            - ``torch.float32``: the fused kernels;
            - ``torch.bfloat16``: bf16 products, f32 sums, the result rounded to
              bfloat16 once; the backward runs in f32 on the bf16 values; no dropout;
            - ``torch.float16``: widened to float32 (one copy: the kernels have no
              float16 loads), the float32 kernels, the result rounded to float16 once;
            - ``torch.float64``: the f64 reference, which holds every score
              (correct, and slow), so that ``torch.autograd.gradcheck`` runs.
        key: ``[..., S, E]``, the same kind and dtype as ``query``.
        value: ``[..., S, Ev]``, the same kind and dtype as ``query``.
            The leading axes of the three broadcast as PyTorch broadcasts them (a
            lower rank, a single key/value head, a batch of one); with
            ``enable_gqa`` the key and value heads (axis -3) may divide the query's.
        attn_mask: boolean (``True`` = attend) or additive (float32 or the query's
            dtype; float64 tensors take a float64 mask whole, the other dtypes round
            it to float32, attend's mask type),
            broadcastable to ``[..., L, S]``. Rows whose keys are all masked give 0,
            as PyTorch ≥ 2.5 does.
        dropout_p: probability of dropping each attention weight. The drop pattern
            is attend's own (drawn from torch's or NumPy's global generator), not
            PyTorch's bits.
        is_causal: query ``i`` sees keys ``j ≤ i`` (top-left aligned); not together
            with ``attn_mask``.
        scale: multiplies ``q·k``; defaults to ``1/√E``.
        enable_gqa: let ``key`` and ``value`` have fewer heads (axis -3) than
            ``query``, dividing its count.

    Returns:
        ``[..., L, Ev]`` of the same kind and dtype as ``query``. Torch tensors go
        through the custom op ``torch.ops.attend.scaled_dot_product_attention``
        (see :mod:`attend.ops`), so
        the call is differentiable (attend's fused backward), compiles with
        ``torch.compile(fullgraph=True)``, exports with ``torch.export`` and
        batches with ``torch.func.vmap``.

    Strided inputs (such as ``x.view(B, T, H, D).transpose(1, 2)``) are read in
    place. Errors are one line naming the argument: ``attend.AttendTypeError``
    (wrong kind or dtype) or ``attend.AttendValueError`` (shapes, values), each
    both the builtin ``TypeError``/``ValueError`` and ``RuntimeError``.
    """
    if isinstance(query, np.ndarray) and isinstance(key, np.ndarray) and isinstance(value, np.ndarray):
        return _sdpa_numpy(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    global _sdpa_torch
    if _sdpa_torch is None:
        if sys.modules.get("torch") is None:  # no tensor without torch: not importing it here
            raise kind_error(query, key, value)
        from .ops import sdpa_torch as _sdpa_torch  # torch, and the operators, with the first tensor

    return _sdpa_torch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
