"""The project's error rule for the Python tests (docs/design.md, "numerical tests"):
a kernel's max error against the float64 reference may be at most twice the error of
a naive float32 implementation on the same inputs, plus the float32 rounding floor.

The reference is PyTorch's math path in float64; the naive implementation is
``softmax(scale · q kᵀ + mask) v`` in float32 with PyTorch's ops. The floor is what
any float32 implementation pays whatever its order of operations: the output's own
rounding (a few ulps of its largest entry) and, to first order, the change of the
output when each scaled score is rounded (``|∂out/∂s| · ulp(s)``, bounded by
``2 · max|v| · Σ_j w_ij |s_ij| · ε``).
"""

from __future__ import annotations

import torch

EPS = torch.finfo(torch.float32).eps


def expand_mask(mask, q, k, is_causal):
    """The boolean keep-mask and the additive bias as float64 ``[..., L, S]`` tensors."""
    L, S = q.shape[-2], k.shape[-2]
    keep = torch.ones(q.shape[:-1] + (S,), dtype=torch.bool)
    bias = torch.zeros(q.shape[:-1] + (S,), dtype=torch.float64)
    if is_causal:
        keep = keep & torch.ones(L, S, dtype=torch.bool).tril()
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = keep & mask
        else:
            bias = bias + mask.double()
    return keep, bias


def _repeat_heads(k, q):
    """Grouped-query heads repeated to the query's; a single head on either side
    broadcasts by itself."""
    if k.dim() >= 3 and q.dim() >= 3 and 1 != k.shape[-3] != q.shape[-3] != 1:
        return k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    return k


def naive(q, k, v, mask=None, is_causal=False, scale=None, dtype=torch.float32):
    """``softmax(scale · q kᵀ + mask) v`` in ``dtype``, fully masked rows 0 (PyTorch ≥ 2.5)."""
    q, k, v = q.to(dtype), _repeat_heads(k, q).to(dtype), _repeat_heads(v, q).to(dtype)
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    keep, bias = expand_mask(mask, q, k, is_causal)
    s = (q @ k.transpose(-1, -2)) * scale + bias.to(dtype)
    s = s.masked_fill(~keep, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w @ v, w, s


def floor(q, k, v, mask=None, is_causal=False, scale=None):
    """The float32 rounding floor of the output (see the module docstring)."""
    out, w, s = naive(q.detach(), k.detach(), v.detach(), mask, is_causal, scale, torch.float64)
    s = s.masked_fill(~torch.isfinite(s), 0.0)
    vmax = v.detach().abs().max().item() if v.numel() else 0.0
    score = (2 * vmax * (w * s.abs()).sum(-1) * EPS).max().item() if w.numel() else 0.0
    omax = out.abs().max().item() if out.numel() else 0.0
    return 4 * EPS * max(omax, 1e-30) + 2 * score


def max_err(a, b) -> float:
    if a.numel() == 0:
        return 0.0
    return (a.double() - b.double()).abs().max().item()


def check_output(got, q, k, v, mask=None, is_causal=False, scale=None, what=""):
    """Asserts the error rule for an attention output against the float64 reference."""
    want, _, _ = naive(q, k, v, mask, is_causal, scale, torch.float64)
    ref32, _, _ = naive(q, k, v, mask, is_causal, scale, torch.float32)
    err, nerr = max_err(got, want), max_err(ref32, want)
    fl = floor(q, k, v, mask, is_causal, scale)
    assert err <= 2 * nerr + fl, f"{what}: error {err:.3e} > 2 × naive {nerr:.3e} + floor {fl:.3e}"
    return err


def grad_floor(grads_ref, q, k, v, dout, mask, is_causal, scale):
    """The float32 floor of a gradient: its own rounding, plus the output's floor
    carried through the backward. A change of the weights reaches ``dv`` times
    ``|dout|`` and ``dq``/``dk`` times ``|dout| · scale · |k|`` (or ``|q|``), so the
    output floor is scaled by ``max|dout| · max(1, scale · max(|q|, |k|))``."""
    fl = floor(q, k, v, mask, is_causal, scale)
    gmax = max((g.abs().max().item() for g in grads_ref if g.numel()), default=0.0)
    s = 1.0 / q.shape[-1] ** 0.5 if scale is None else abs(scale)
    qk = max(q.abs().max().item() if q.numel() else 0.0, k.abs().max().item() if k.numel() else 0.0)
    dmax = dout.abs().max().item() if dout.numel() else 0.0
    return 4 * EPS * max(gmax, 1e-30) + 2 * fl * dmax * max(1.0, s * qk)


def check_grads(got, q, k, v, dout, mask=None, is_causal=False, scale=None, what=""):
    """Asserts the error rule for ``(dq, dk, dv)`` against float64 autograd of the
    reference, with float32 autograd of the naive implementation as the yardstick."""

    def grads(dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out, _, _ = naive(*leaves, mask, is_causal, scale, dtype)
        out.backward(dout.to(dtype))
        return [t.grad for t in leaves]

    want, naive32 = grads(torch.float64), grads(torch.float32)
    fl = grad_floor(want, q, k, v, dout, mask, is_causal, scale)
    for name, g, w, n in zip(("dq", "dk", "dv"), got, want, naive32):
        err, nerr = max_err(g, w), max_err(n, w)
        assert g.shape == w.shape, f"{what}: {name} shape {tuple(g.shape)} != {tuple(w.shape)}"
        assert err <= 2 * nerr + fl, f"{what}: {name} error {err:.3e} > 2 × naive {nerr:.3e} + floor {fl:.3e}"
