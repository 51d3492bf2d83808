"""The gradient with respect to a float (additive) ``attn_mask``, a learned mask:
attend's autograd against torch's autograd of the math path in float64 on the same
inputs, within 5x the error of torch's own math path at the inputs' dtype plus 4
ulps of the golden's largest entry (the rule of test_opinfo.py), summed over the
axes the mask was broadcast along; a mask that does not ask for a gradient gets
none."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attend


def _math(*args, **kwargs):
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(*args, **kwargs)


def _grads(fn, q, k, v, mask, grad_out, dtype, **kwargs):
    inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, mask)]
    out = fn(*inputs[:3], attn_mask=inputs[3], **kwargs)
    return torch.autograd.grad(out, inputs, grad_out.to(dtype))


# (dtype, query, key/value, mask shape): a mask broadcast over batch and heads, and
# one per batch row broadcast over heads and queries, with padding of finfo.min.
# A float64 mask of float64 tensors is added in float64 (the f64 reference's
# `bias_f64`); rounded to float32 it would leave ~1e-8 of error.
CASES = [
    (torch.float32, (2, 3, 5, 8), (2, 3, 7, 8), (5, 7)),
    (torch.float16, (2, 3, 4, 16), (2, 3, 9, 16), (2, 1, 1, 9)),
    (torch.float64, (2, 3, 4, 16), (2, 3, 9, 16), (2, 1, 1, 9)),
]


@pytest.mark.parametrize("dtype, q_shape, kv_shape, mask_shape", CASES)
def test_a_learned_masks_gradient_is_torchs(dtype, q_shape, kv_shape, mask_shape):
    gen = torch.Generator().manual_seed(sum(q_shape))
    q, k, v = (torch.randn(s, generator=gen, dtype=dtype) for s in (q_shape, kv_shape, kv_shape))
    mask = torch.randn(mask_shape, generator=gen, dtype=dtype)
    mask[..., -1] = torch.finfo(dtype).min  # a padded key: weight 0, gradient 0
    grad_out = torch.randn(q_shape, generator=gen, dtype=dtype).double()
    golden = _grads(_math, q, k, v, mask, grad_out, torch.float64)
    ours = _grads(attend.scaled_dot_product_attention, q, k, v, mask, grad_out, dtype)
    theirs = _grads(_math, q, k, v, mask, grad_out, dtype)
    eps = torch.finfo(dtype).eps
    for name, g, a, t in zip(("query", "key", "value", "attn_mask"), golden, ours, theirs):
        assert a.shape == g.shape and a.dtype == dtype, name
        bound = 5 * (t.double() - g).abs().max().item() + 4 * eps * g.abs().max().item()
        err = (a.double() - g).abs().max().item()
        assert err <= bound, f"grad {name}: error {err:.3g} > {bound:.3g}"
    assert ours[3].abs().max() > 0  # the check above is not of zeros


def test_a_mask_that_asks_for_no_gradient_gets_none():
    q = torch.randn(1, 2, 3, 4, requires_grad=True)
    mask = torch.randn(3, 3)
    out = attend.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    out.sum().backward()
    assert q.grad is not None and mask.grad is None
