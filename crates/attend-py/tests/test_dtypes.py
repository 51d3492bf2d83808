"""float16 and float64 tensors through attend.scaled_dot_product_attention, against
PyTorch's own attention in the same dtype, and torch.autograd.gradcheck in float64.

float64 runs the f64 reference, so the project's error rule (docs/design.md,
"Numerical tests") is applied one level up: the reference is computed with mpmath at
40 significant digits, the yardstick is PyTorch's float64 SDPA on the same inputs,
and the floor is numerics.py's floor with float64's epsilon. A scale rounded to
float32 (attend's kernels' scale type) would miss it by ~1e-8 of the scores, far
above the float64 floor (~1e-15).

float16 is widened to float32 (exactly: 11 significant bits fit in 24), computed by
the float32 kernels and rounded to float16 once. It is judged as test_bf16.py judges
bfloat16: against the float64 reference on the same float16 inputs, with a naive
float16 implementation and PyTorch's float16 SDPA as yardsticks, and a floor of
numerics.py's float32 floor plus the float16 rounding of the output (unit roundoff
2⁻¹¹ of its largest entry).
"""

from __future__ import annotations

import mpmath
import pytest
import torch
import torch.nn.functional as F

import attend
from numerics import expand_mask, floor, grad_floor, max_err, naive

EPS64 = torch.finfo(torch.float64).eps
F16_U = 2.0**-11


def randn(*shape, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def repeat_heads(k, q):
    if k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        return k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    return k


def mp_attention(q, k, v, mask=None, is_causal=False, scale=None):
    """``softmax(scale · q kᵀ + mask) v`` with mpmath at 40 digits, as float64 (fully
    masked rows 0). ``q``, ``k``, ``v`` are float64 and of rank 4."""
    k, v = repeat_heads(k, q), repeat_heads(v, q)
    keep, bias = expand_mask(mask, q, k, is_causal)
    keep, bias = keep.expand(q.shape[:-1] + (k.shape[-2],)), bias.expand(q.shape[:-1] + (k.shape[-2],))
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    with mpmath.workdps(40):
        s = mpmath.mpf(1) / mpmath.sqrt(q.shape[-1]) if scale is None else mpmath.mpf(scale)
        for b in range(q.shape[0]):
            for h in range(q.shape[1]):
                qs, ks, vs = q[b, h].tolist(), k[b, h].tolist(), v[b, h].tolist()
                for i, qi in enumerate(qs):
                    scores = [
                        s * mpmath.fsum(mpmath.mpf(x) * y for x, y in zip(qi, kj)) + mpmath.mpf(bias[b, h, i, j].item())
                        for j, kj in enumerate(ks)
                        if keep[b, h, i, j]
                    ]
                    if not scores:
                        continue
                    top = max(scores)
                    weights = [mpmath.exp(x - top) for x in scores]
                    total = mpmath.fsum(weights)
                    kept = [vj for j, vj in enumerate(vs) if keep[b, h, i, j]]
                    for c in range(v.shape[-1]):
                        out[b, h, i, c] = float(mpmath.fsum(w * vj[c] for w, vj in zip(weights, kept)) / total)
    return out


def floor64(q, k, v, mask=None, is_causal=False, scale=None):
    """numerics.floor with float64's epsilon: the output's own rounding and, to first
    order, that of each scaled score."""
    return floor(q, k, v, mask, is_causal, scale) * (EPS64 / torch.finfo(torch.float32).eps)


F64_CASES = [
    # (name, q, k, v, mask kind, causal, scale, gqa)
    ("plain", (1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 6), None, False, None, False),
    ("scale", (2, 1, 4, 16), (2, 1, 6, 16), (2, 1, 6, 4), None, False, 0.37, False),
    ("causal", (1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8), None, True, None, False),
    ("bool mask", (2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 4), "bool", False, None, False),
    ("float mask", (2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 4), "float", False, None, False),
    ("grouped query", (1, 4, 5, 8), (1, 2, 7, 8), (1, 2, 7, 4), None, False, None, True),
]


def make_mask(kind, L, S, seed=30):
    if kind == "bool":
        keep = randn(2, 1, L, S, seed=seed) > -0.3
        keep[0, 0, 1] = False  # a fully masked row
        return keep
    if kind == "float":
        return randn(L, S, seed=seed)
    return None


@pytest.mark.parametrize("name,qs,ks,vs,mask_kind,causal,scale,gqa", F64_CASES, ids=[c[0] for c in F64_CASES])
def test_float64_against_pytorch_and_a_40_digit_reference(name, qs, ks, vs, mask_kind, causal, scale, gqa):
    q, k, v = randn(*qs, seed=1), randn(*ks, seed=2), randn(*vs, seed=3)
    mask = make_mask(mask_kind, qs[-2], ks[-2])
    kw = dict(attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    got = attend.scaled_dot_product_attention(q, k, v, **kw)
    theirs = F.scaled_dot_product_attention(q, k, v, **kw)
    assert got.dtype == torch.float64 and got.shape == theirs.shape
    want = mp_attention(q, k, v, mask, causal, scale)
    fl = floor64(q, repeat_heads(k, q), repeat_heads(v, q), mask, causal, scale)
    err, terr = max_err(got, want), max_err(theirs, want)
    assert err <= 2 * terr + fl, f"{name}: error {err:.3e} > 2 × PyTorch float64 {terr:.3e} + floor {fl:.3e}"


def test_float64_masks_are_added_in_float64():
    """A float64 mask of float64 tensors is added to the scores in float64 (rounded to
    float32, attend's mask type elsewhere, it would move each score by up to 2⁻²⁴ of
    its mask value); values beyond float32's range mask as they do in PyTorch's
    float64 attention (``finfo(float64).min``: a fully masked row averages the
    values)."""
    q, k, v = randn(1, 2, 4, 8, seed=4), randn(1, 2, 6, 8, seed=5), randn(1, 2, 6, 4, seed=6)
    mask = randn(4, 6, seed=7, scale=3.0)
    got = attend.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = mp_attention(q, k, v, mask)
    fl = floor64(q, k, v, mask)
    assert max_err(got, want) <= 2 * max_err(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), want) + fl
    lowest = torch.zeros(4, 6, dtype=torch.float64)
    lowest[1] = torch.finfo(torch.float64).min  # row 1: every key masked
    lowest[2, :3] = torch.finfo(torch.float64).min
    got = attend.scaled_dot_product_attention(q, k, v, attn_mask=lowest)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=lowest)
    assert torch.allclose(got[:, :, 1], v.mean(-2), rtol=0, atol=16 * EPS64 * v.abs().max().item())
    assert max_err(got, theirs) <= 16 * EPS64 * v.abs().max().item()


GRADCHECK = [
    ("plain", (1, 2, 4, 6), (1, 2, 5, 6), (1, 2, 5, 3), None, {}),
    ("bool mask", (2, 1, 4, 6), (2, 1, 5, 6), (2, 1, 5, 3), "bool", {}),
    ("float mask", (1, 2, 4, 6), (1, 2, 5, 6), (1, 2, 5, 3), "float", {}),
    ("causal", (1, 2, 5, 6), (1, 2, 5, 6), (1, 2, 5, 3), None, {"is_causal": True}),
    ("grouped query", (1, 4, 4, 6), (1, 2, 5, 6), (1, 2, 5, 3), None, {"enable_gqa": True}),
    ("broadcast batch and heads", (2, 3, 4, 6), (1, 1, 5, 6), (1, 3, 5, 3), None, {}),
    ("rank 3 and scale", (2, 4, 6), (2, 5, 6), (2, 5, 3), None, {"scale": 0.7}),
]


@pytest.mark.parametrize("name,qs,ks,vs,mask_kind,kw", GRADCHECK, ids=[c[0] for c in GRADCHECK])
def test_gradcheck_float64(name, qs, ks, vs, mask_kind, kw):
    """torch.autograd.gradcheck's finite differences against the backward op, with its
    own tolerances, in float64."""
    inputs = [randn(*s, seed=10 + i).requires_grad_() for i, s in enumerate((qs, ks, vs))]
    mask = make_mask(mask_kind, qs[-2], ks[-2], seed=13)
    if mask is not None and mask.dtype == torch.bool:
        mask = mask[: qs[0]]

    def f(q, k, v):
        return attend.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)

    assert torch.autograd.gradcheck(f, inputs)


def test_gradcheck_float64_with_dropout():
    """Dropout in float64: the same seed before each evaluation gives the same
    pattern, so the function gradcheck differentiates is a fixed one."""
    inputs = [randn(1, 2, 5, 4, seed=20 + i).requires_grad_() for i in range(3)]

    def f(q, k, v):
        torch.manual_seed(7)
        return attend.scaled_dot_product_attention(q, k, v, dropout_p=0.3)

    assert torch.autograd.gradcheck(f, inputs)
    assert not torch.equal(f(*inputs), attend.scaled_dot_product_attention(*inputs)), "nothing was dropped"


# float16


def naive_f16(q, k, v, mask=None, is_causal=False, scale=None):
    """softmax(scale · q kᵀ + mask) v on float16 inputs with float32 arithmetic (the
    products of float16 numbers are exact there) and the output rounded to float16."""
    m = None if mask is None else mask if mask.dtype == torch.bool else mask.float()
    out, _, _ = naive(q.float(), k.float(), v.float(), m, is_causal, scale, torch.float32)
    return out.half()


def reference(q, k, v, mask=None, is_causal=False, scale=None):
    m = None if mask is None else mask if mask.dtype == torch.bool else mask.double()
    out, _, _ = naive(q.double(), k.double(), v.double(), m, is_causal, scale, torch.float64)
    return out


def f16_floor(want, q, k, v, mask=None, is_causal=False, scale=None):
    m = None if mask is None else mask if mask.dtype == torch.bool else mask.float()
    omax = want.abs().max().item() if want.numel() else 0.0
    return floor(q.float(), k.float(), v.float(), m, is_causal, scale) + F16_U * omax


def check_f16(got, q, k, v, mask=None, is_causal=False, scale=None, gqa=False, what=""):
    assert got.dtype == torch.float16, f"{what}: got {got.dtype}"
    want = reference(q, k, v, mask, is_causal, scale)
    fl = f16_floor(want, q, repeat_heads(k, q), repeat_heads(v, q), mask, is_causal, scale)
    err = max_err(got, want)
    nerr = max_err(naive_f16(q, k, v, mask, is_causal, scale), want)
    assert err <= 2 * nerr + fl, f"{what}: error {err:.3e} > 2 × naive float16 {nerr:.3e} + floor {fl:.3e}"
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)
    assert theirs.shape == got.shape and theirs.dtype == got.dtype
    terr = max_err(theirs, want)
    assert err <= 2 * terr + fl, f"{what}: error {err:.3e} > 2 × PyTorch float16 {terr:.3e} + floor {fl:.3e}"


F16_CASES = [
    ("decode kernel", (2, 4, 3, 32), (2, 4, 300, 32), (2, 4, 300, 32), {}),
    ("fused kernel", (1, 4, 130, 64), (1, 4, 70, 64), (1, 4, 70, 64), {}),
    ("causal", (2, 2, 40, 16), (2, 2, 40, 16), (2, 2, 40, 16), {"is_causal": True}),
    ("grouped query", (2, 8, 40, 16), (2, 2, 40, 16), (2, 2, 40, 16), {"gqa": True}),
    ("rank 2", (9, 8), (11, 8), (11, 5), {}),
]


@pytest.mark.parametrize("name,qs,ks,vs,kw", F16_CASES, ids=[c[0] for c in F16_CASES])
def test_float16_in_float16_out(name, qs, ks, vs, kw):
    q, k, v = randn(*qs, seed=1, dtype=torch.float16), randn(*ks, seed=2, dtype=torch.float16), randn(
        *vs, seed=3, dtype=torch.float16, scale=2.0
    )
    causal, gqa = kw.get("is_causal", False), kw.get("gqa", False)
    got = attend.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    check_f16(got, q, k, v, is_causal=causal, gqa=gqa, what=name)
    # Computed as designed: the float32 kernels on the widened values, rounded once.
    wide = attend.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=gqa)
    assert torch.equal(got, wide.half())


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.float16], ids=str)
def test_float16_masks(dtype):
    q, k, v = (randn(2, 4, n, 32, seed=s, dtype=torch.float16) for s, n in ((4, 20), (5, 50), (6, 50)))
    mask = randn(2, 1, 20, 50, seed=7) > -0.5 if dtype == torch.bool else randn(20, 50, seed=7).to(dtype)
    got = attend.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    check_f16(got, q, k, v, mask, scale=0.3, what=str(dtype))


def test_float16_dropout_is_the_float32_dropout_rounded():
    q, k, v = (randn(1, 2, 30, 16, seed=s, dtype=torch.float16) for s in (8, 9, 10))
    torch.manual_seed(3)
    got = attend.scaled_dot_product_attention(q, k, v, dropout_p=0.2)
    torch.manual_seed(3)
    wide = attend.scaled_dot_product_attention(q.float(), k.float(), v.float(), dropout_p=0.2)
    assert got.dtype == torch.float16 and torch.equal(got, wide.half())


def test_float16_backward_within_the_rule():
    """The backward runs in float32 on the float16 values and rounds the gradients
    once: judged against float64 autograd of the reference, with PyTorch's float16
    backward as the yardstick, plus the float32 gradient floor, the float16 rounding
    of each gradient and that of the output the backward reads (as test_bf16.py)."""
    q, k, v = (randn(2, 2, 24, 16, seed=s, dtype=torch.float16).requires_grad_() for s in (11, 12, 13))
    dout = randn(2, 2, 24, 16, seed=14, dtype=torch.float16)
    attend.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)
    got = [t.grad for t in (q, k, v)]
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, _, _ = naive(*leaves, None, True, None, torch.float64)
    out.backward(dout.double())
    want = [t.grad for t in leaves]
    theirs_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*theirs_leaves, is_causal=True).backward(dout)
    theirs = [t.grad for t in theirs_leaves]
    qf, kf, vf = (t.detach().float() for t in (q, k, v))
    fl = grad_floor(want, qf, kf, vf, dout.float(), None, True, None)
    omax, dmax = out.abs().max().item(), dout.abs().max().item()
    fl += 2 * F16_U * omax * dmax * max(1.0, 0.25 * max(qf.abs().max().item(), kf.abs().max().item()))
    for name, g, w, t in zip(("dq", "dk", "dv"), got, want, theirs):
        assert g.dtype == torch.float16 and g.shape == w.shape
        gfl = fl + F16_U * w.abs().max().item()
        err, terr = max_err(g, w), max_err(t, w)
        assert err <= 2 * terr + gfl, f"{name}: error {err:.3e} > 2 × PyTorch float16 {terr:.3e} + floor {gfl:.3e}"
