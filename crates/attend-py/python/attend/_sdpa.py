"""``attend.scaled_dot_product_attention``: PyTorch's signature and semantics on
attend's fused kernels."""

from __future__ import annotations

import math
import sys
from typing import Any, Optional, Tuple

import numpy as np

from . import _attend
from ._threads import get_num_threads

_RANK4 = 4


def _kind_of(name: str, x: Any) -> str:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return "torch"
    if isinstance(x, np.ndarray):
        return "numpy"
    raise TypeError(f"{name} must be a torch.Tensor or a numpy.ndarray, got {type(x).__name__}")


def _as_rank4(a: np.ndarray) -> np.ndarray:
    """``[..., H, T, D]`` as ``[B, H, T, D]``: a view, except when more than one
    leading axis must be merged and their strides do not allow it."""
    if a.ndim == _RANK4:
        return a
    if a.ndim < _RANK4:
        return a.reshape((1,) * (_RANK4 - a.ndim) + a.shape)
    return a.reshape((math.prod(a.shape[:-3]),) + a.shape[-3:])


class _Call:
    """One call, validated, with every array in the kernels' rank-4 layout."""

    def __init__(
        self,
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        attn_mask: Optional[np.ndarray],
        dropout_p: float,
        is_causal: bool,
        scale: Optional[float],
        enable_gqa: bool,
        seed: int,
        bf16: bool = False,
    ) -> None:
        q, k, v = query, key, value
        if q.ndim < 2:
            raise ValueError(f"query must be [..., L, E] (rank 2 or more), got shape {q.shape}")
        if k.ndim != q.ndim or v.ndim != q.ndim:
            raise ValueError(
                f"query, key and value must have the same rank: query {q.shape}, key {k.shape}, value {v.shape}"
            )
        if k.shape[-1] != q.shape[-1]:
            raise ValueError(f"query and key widths differ: query {q.shape}, key {k.shape}")
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"key and value must agree on all but the last axis: key {k.shape}, value {v.shape}")
        if q.shape[:-3] != k.shape[:-3]:
            raise ValueError(f"query and key batch shapes differ: query {q.shape}, key {k.shape}")
        if q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
            hq, hkv = q.shape[-3], k.shape[-3]
            if not enable_gqa:
                raise ValueError(
                    f"query has {hq} heads and key {hkv}: pass enable_gqa=True for grouped-query attention "
                    f"(query {q.shape}, key {k.shape})"
                )
            if hkv == 0 or hq % hkv != 0:
                raise ValueError(
                    f"query heads ({hq}) must be a multiple of key/value heads ({hkv}): query {q.shape}, key {k.shape}"
                )
        if is_causal and attn_mask is not None:
            raise ValueError("attn_mask and is_causal=True cannot both be given (PyTorch's rule): fold causality into the mask")
        if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
            raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
            raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
        if isinstance(is_causal, (np.ndarray,)) or not isinstance(is_causal, (bool, np.bool_)):
            raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")

        self.out_shape = q.shape[:-1] + (v.shape[-1],)
        self.q, self.k, self.v = _as_rank4(q), _as_rank4(k), _as_rank4(v)
        self.mask = None
        self.bias = None
        if attn_mask is not None:
            weights = q.shape[:-1] + (k.shape[-2],)
            m = _mask_rank4(attn_mask, weights)
            if m.dtype == np.bool_:
                self.mask = m
            else:
                self.bias = m
        self.causal = bool(is_causal)
        self.scale = None if scale is None else float(scale)
        self.dropout_p = float(dropout_p)
        self.seed = seed
        # q, k, v (and out, dout, the gradients) are int16 arrays of bfloat16 bits.
        self.bf16 = bf16

    def forward(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(out [B, H, L, Ev], lse [B, H, L])``; ``out`` as bfloat16 bits for a bf16 call."""
        if self.bf16:
            return _attend.sdpa_forward_bf16(self, get_num_threads())
        return _attend.sdpa_forward(self, get_num_threads())

    def backward(self, out: np.ndarray, lse: np.ndarray, dout: np.ndarray):
        """``(dq, dk, dv)`` in the rank-4 layout, from ``dout`` shaped like the output."""
        if self.bf16:
            return _attend.sdpa_backward_bf16(self, out, lse, _as_rank4(dout), get_num_threads())
        return _attend.sdpa_backward(self, out, lse, _as_rank4(dout), get_num_threads())


def _mask_rank4(mask: np.ndarray, weights: Tuple[int, ...]) -> np.ndarray:
    """The mask as a rank-4 view broadcastable to the weights' rank-4 shape."""
    if mask.dtype != np.bool_ and mask.dtype != np.float32:
        raise TypeError(f"attn_mask must be bool or float32 (the query's dtype), got {mask.dtype}")
    try:
        fits = np.broadcast_shapes(mask.shape, weights) == weights
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"attn_mask of shape {mask.shape} does not broadcast to the attention weights' shape {weights} ([..., L, S])"
        )
    if len(weights) <= _RANK4:
        return mask.reshape((1,) * (_RANK4 - mask.ndim) + mask.shape)
    return _as_rank4(np.broadcast_to(mask, weights))


def _check_numpy(name: str, a: np.ndarray) -> None:
    if a.dtype != np.float32:
        raise TypeError(f"{name} must be float32, got {a.dtype} (convert with .astype(np.float32))")


def _draw_seed_numpy() -> int:
    return int(np.random.randint(0, 2**63 - 1, dtype=np.int64))


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
        query: ``[..., L, E]`` float32, a CPU ``torch.Tensor`` or a ``numpy.ndarray``;
            or a ``torch.bfloat16`` tensor (bf16 products, f32 accumulation, a
            bfloat16 result; the backward runs in f32 on the bf16 values and returns
            bf16 gradients; no dropout).
        key: ``[..., S, E]``, the same kind as ``query``.
        value: ``[..., S, Ev]``, the same kind as ``query``.
        attn_mask: boolean (``True`` = attend) or float32 (added to the scaled scores;
            also bfloat16 with bfloat16 inputs, as PyTorch allows), broadcastable to ``[..., L, S]``. Rows whose keys are all masked give 0,
            as PyTorch ≥ 2.5 does.
        dropout_p: probability of dropping each attention weight. The drop pattern
            is attend's own (drawn from torch's or NumPy's global generator), not
            PyTorch's bits.
        is_causal: query ``i`` sees keys ``j ≤ i`` (top-left aligned); not together
            with ``attn_mask``.
        scale: multiplies ``q·k``; defaults to ``1/√E``.
        enable_gqa: let ``query`` have a multiple of ``key``'s heads (axis -3).

    Returns:
        ``[..., L, Ev]`` of the same kind as ``query``. With torch tensors that
        require grad, the result is differentiable (attend's fused backward).

    Strided inputs (such as ``x.view(B, T, H, D).transpose(1, 2)``) are read in
    place. Errors are ``TypeError`` (wrong kind or dtype) or ``ValueError`` (shapes,
    values) with one line naming the argument.
    """
    kinds = {_kind_of(n, x) for n, x in (("query", query), ("key", key), ("value", value))}
    if len(kinds) != 1:
        raise TypeError("query, key and value must all be torch.Tensors or all numpy.ndarrays")
    if kinds == {"torch"}:
        from ._torch import sdpa_torch

        return sdpa_torch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    for name, a in (("query", query), ("key", key), ("value", value)):
        _check_numpy(name, a)
    if attn_mask is not None and not isinstance(attn_mask, np.ndarray):
        raise TypeError(f"attn_mask must be a numpy.ndarray with numpy inputs, got {type(attn_mask).__name__}")
    seed = _draw_seed_numpy() if dropout_p else 0
    call = _Call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed)
    out, _ = call.forward()
    return out.reshape(call.out_shape)
