"""The torch side of ``scaled_dot_product_attention``: tensors in and out without
copies, and a ``torch.autograd.Function`` running attend's fused backward."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ._sdpa import _Call


_DTYPES = (torch.float32, torch.bfloat16)


def _check_tensor(name: str, t: torch.Tensor) -> None:
    if t.dtype in _DTYPES and t.is_cpu and t.layout is torch.strided:
        return
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got device {t.device}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    raise TypeError(f"{name} must be torch.float32 or torch.bfloat16, got {t.dtype} (convert with .float())")


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's memory, strides included; a bfloat16 tensor
    as its 16-bit patterns (int16), which the compiled half reads as bf16."""
    t = t.detach()
    return t.view(torch.int16).numpy() if t.dtype is torch.bfloat16 else t.numpy()


def _tensor(a: np.ndarray, bf16: bool) -> torch.Tensor:
    """The inverse of ``_numpy`` for a fresh contiguous array: no copy."""
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if bf16 else t


def _mask_numpy(mask, dtype: torch.dtype) -> Optional[np.ndarray]:
    if mask is None:
        return None
    if isinstance(mask, np.ndarray):
        return mask
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.device.type != "cpu":
        raise ValueError(f"attn_mask must be on the CPU, got device {mask.device}")
    floats = (torch.float32,) if dtype is torch.float32 else (torch.float32, dtype)
    if mask.dtype is not torch.bool and mask.dtype not in floats:
        names = " or ".join(str(d) for d in (torch.bool,) + floats)
        raise TypeError(f"attn_mask must be {names} (with {dtype} inputs), got {mask.dtype}")
    if mask.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "attend computes no gradient for attn_mask: pass attn_mask.detach() "
            "(or use torch's scaled_dot_product_attention for a learned mask)"
        )
    if mask.dtype is torch.bfloat16:
        # Widened to float32 (exact): the kernels add f32 biases.
        return mask.detach().float().numpy()
    return _numpy(mask)


def _shaped(t: torch.Tensor, shape) -> torch.Tensor:
    """``t`` (contiguous) as ``shape``: itself when it already has it, else a view."""
    return t if t.shape == shape else t.view(shape)


class _AttendSdpa(torch.autograd.Function):
    """Forward and backward through attend's fused kernels."""

    @staticmethod
    def forward(ctx, query, key, value, call: _Call):  # type: ignore[override]
        out, lse = call.forward()
        ctx.call = call
        ctx.lse = lse
        result = _tensor(out, call.bf16)
        # The tensors are saved so that autograd notices in-place changes to them
        # before the backward; the call reads the same memory through its views.
        ctx.save_for_backward(query, key, value, result)
        return _shaped(result, call.out_shape)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        query, key, value, out = ctx.saved_tensors
        call: _Call = ctx.call
        dq, dk, dv = call.backward(_numpy(out), ctx.lse, _numpy(grad_out))
        grads = []
        for needed, g, like in zip(ctx.needs_input_grad[:3], (dq, dk, dv), (query, key, value)):
            grads.append(_tensor(g, call.bf16).view(like.shape) if needed else None)
        return (*grads, None)


def sdpa_torch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t)
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(
            f"query, key and value must have the same dtype: query {query.dtype}, key {key.dtype}, value {value.dtype}"
        )
    bf16 = query.dtype is torch.bfloat16
    mask = _mask_numpy(attn_mask, query.dtype)
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64)) if dropout_p else 0
    call = _Call(_numpy(query), _numpy(key), _numpy(value), mask, dropout_p, is_causal, scale, enable_gqa, seed, bf16)
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return _AttendSdpa.apply(query, key, value, call)
    out, _ = call.forward()
    return _shaped(_tensor(out, bf16), call.out_shape)
