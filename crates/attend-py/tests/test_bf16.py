"""bfloat16 tensors through attend.scaled_dot_product_attention and `attend sdpa --dtype bf16`,
against PyTorch's bf16 scaled_dot_product_attention and the float64 reference on the same
bf16 inputs, with the bf16 form of the project's error rule (docs/design.md, "Numerical
tests"):

    max |attend − reference| ≤ 2 × (error of a yardstick) + floor

The reference is float64 on the bf16 inputs widened exactly. The yardstick is a naive
implementation with bf16 products and f32 accumulation (scores of the bf16 inputs summed in
f32, softmax in f32, the weights rounded to bf16 before they multiply v, the output rounded
to bf16), or PyTorch's own bf16 SDPA on the same inputs (docs/design.md allows either). The
floor is the f32 floor of numerics.py plus the rounding of a bf16 output: one bf16 ulp of
its largest entry, 2⁻⁸ · max|o|.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attend
from conftest import REPO
from numerics import expand_mask, floor, grad_floor, max_err, naive

ATTEND = REPO / "target" / "release" / "attend"
BF16_ULP = 2.0**-8


def randn(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).bfloat16()


def naive_bf16(q, k, v, mask=None, is_causal=False, scale=None):
    """softmax(scale · q kᵀ + mask) v with bf16 inputs, products exact in f32, sums in f32, the
    weights rounded to bf16 before they multiply v and the output rounded to bf16."""
    q, k, v = q.float(), k.float(), v.float()
    if k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    keep, bias = expand_mask(None if mask is None else mask.float() if mask.is_floating_point() else mask,
                             q, k, is_causal)
    s = (q @ k.transpose(-1, -2)) * scale + bias.float()
    w = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    return (w.bfloat16().float() @ v).bfloat16()


def reference(q, k, v, mask=None, is_causal=False, scale=None):
    m = None if mask is None else mask.double() if mask.is_floating_point() else mask
    out, _, _ = naive(q.double(), k.double(), v.double(), m, is_causal, scale, torch.float64)
    return out


def bf16_floor(want, q, k, v, mask=None, is_causal=False, scale=None):
    m = None if mask is None else mask.float() if mask.is_floating_point() else mask
    omax = want.abs().max().item() if want.numel() else 0.0
    return floor(q.float(), k.float(), v.float(), m, is_causal, scale) + BF16_ULP * omax


def check_bf16(got, q, k, v, mask=None, is_causal=False, scale=None, what=""):
    """Asserts the bf16 rule with both yardsticks; returns attend's error."""
    assert got.dtype == torch.bfloat16, f"{what}: got {got.dtype}"
    want = reference(q, k, v, mask, is_causal, scale)
    fl = bf16_floor(want, q, k, v, mask, is_causal, scale)
    err = max_err(got, want)
    nerr = max_err(naive_bf16(q, k, v, mask, is_causal, scale), want)
    assert err <= 2 * nerr + fl, f"{what}: error {err:.3e} > 2 × naive bf16 {nerr:.3e} + floor {fl:.3e}"
    gqa = k.dim() >= 3 and k.shape[-3] != q.shape[-3]
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                            enable_gqa=gqa)
    assert theirs.shape == got.shape and theirs.dtype == got.dtype
    terr = max_err(theirs, want)
    assert err <= 2 * terr + fl, f"{what}: error {err:.3e} > 2 × PyTorch bf16 {terr:.3e} + floor {fl:.3e}"
    return err


# (name, q shape, k shape, v shape)
SHAPES = [
    ("one score", (1, 1, 1, 8), (1, 1, 1, 8), (1, 1, 1, 8)),
    ("decode kernel", (2, 4, 3, 32), (2, 4, 300, 32), (2, 4, 300, 32)),
    ("fused kernel", (1, 4, 130, 64), (1, 4, 70, 64), (1, 4, 70, 64)),
    ("odd widths", (2, 3, 33, 17), (2, 3, 29, 17), (2, 3, 29, 24)),
    ("grouped query", (2, 8, 40, 16), (2, 2, 40, 16), (2, 2, 40, 16)),
    ("rank 2", (9, 8), (11, 8), (11, 5)),
    ("rank 5", (2, 3, 2, 19, 8), (2, 3, 2, 21, 8), (2, 3, 2, 21, 5)),
]


@pytest.mark.parametrize("name,qs,ks,vs", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bf16_tensors_in_bf16_out(name, qs, ks, vs, causal):
    q, k, v = randn(*qs, seed=1), randn(*ks, seed=2), randn(*vs, seed=3, scale=2.0)
    gqa = len(qs) >= 3 and qs[-3] != ks[-3]
    got = attend.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    check_bf16(got, q, k, v, is_causal=causal, what=name)


def masks(L, S):
    g = torch.Generator().manual_seed(7)
    keep = torch.rand(2, 4, L, S, generator=g) > 0.3
    bias = torch.randn(L, S, generator=g)
    return [
        ("bool", keep),
        ("float32 bias", bias),
        ("bfloat16 bias", bias.bfloat16()),
    ]


@pytest.mark.parametrize("L", [5, 70], ids=["decode", "fused"])
@pytest.mark.parametrize("which", range(3), ids=[m[0] for m in masks(1, 1)])
def test_masks_and_scale(L, which):
    S = 90
    q, k, v = randn(2, 4, L, 32, seed=4), randn(2, 4, S, 32, seed=5), randn(2, 4, S, 32, seed=6)
    name, mask = masks(L, S)[which]
    got = attend.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
    check_bf16(got, q, k, v, mask, scale=0.3, what=name)


def test_fully_masked_rows_are_zero():
    q, k, v = randn(1, 2, 20, 16, seed=8), randn(1, 2, 30, 16, seed=9), randn(1, 2, 30, 16, seed=10)
    keep = torch.ones(20, 30, dtype=torch.bool)
    keep[3] = False
    got = attend.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert torch.equal(got[:, :, 3], torch.zeros_like(got[:, :, 3]))
    rows = torch.arange(20) != 3
    check_bf16(got[:, :, rows], q[:, :, rows], k, v, keep[rows], what="other rows")


def test_strided_bf16_views_are_read_in_place():
    # The [B, T, H, D] → [B, H, T, D] transpose every model does.
    x = randn(2, 50, 4, 32, seed=11)
    q = k = v = x.transpose(1, 2)
    assert not q.is_contiguous()
    got = attend.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(got, attend.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                                                is_causal=True))
    check_bf16(got, q, k, v, is_causal=True, what="transposed")


def test_one_and_two_threads_give_the_same_bits():
    q, k, v = randn(1, 4, 150, 64, seed=12), randn(1, 4, 150, 64, seed=13), randn(1, 4, 150, 64, seed=14)
    try:
        attend.set_num_threads(1)
        one = attend.scaled_dot_product_attention(q, k, v)
        attend.set_num_threads(2)
        assert torch.equal(one, attend.scaled_dot_product_attention(q, k, v))
    finally:
        attend.set_num_threads(None)


def test_backward_gives_bf16_gradients_within_the_rule():
    """The backward runs in f32 on the bf16 values: judged against float64 autograd of the
    reference, with PyTorch's bf16 backward as the yardstick, plus the f32 gradient floor and
    the rounding of the bf16 gradients and of the bf16 output the backward reads."""
    q, k, v = (randn(2, 2, 24, 16, seed=s).requires_grad_() for s in (15, 16, 17))
    dout = randn(2, 2, 24, 16, seed=18)
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
    # The output the backward reads is rounded to bf16: one bf16 ulp of max|o| on each
    # output entry, carried into the gradients as the f32 output floor is (grad_floor).
    fl = grad_floor(want, qf, kf, vf, dout.float(), None, True, None)
    omax = out.abs().max().item()
    dmax = dout.abs().max().item()
    fl += 2 * BF16_ULP * omax * dmax * max(1.0, 0.25 * max(qf.abs().max().item(), kf.abs().max().item()))
    for name, g, w, t in zip(("dq", "dk", "dv"), got, want, theirs):
        assert g.dtype == torch.bfloat16 and g.shape == w.shape
        gfl = fl + BF16_ULP * w.abs().max().item()
        err, terr = max_err(g, w), max_err(t, w)
        assert err <= 2 * terr + gfl, f"{name}: error {err:.3e} > 2 × PyTorch bf16 {terr:.3e} + floor {gfl:.3e}"


BAD = [
    ("mixed dtypes", lambda q: (q, q.float(), q, {}), TypeError,
     "Expected query, key, and value to have the same dtype, but got query.dtype: torch.bfloat16 key.dtype: torch.float32 "
     "and value.dtype: torch.bfloat16"),
    ("float64 mask", lambda q: (q, q, q, {"attn_mask": torch.zeros(4, 4, dtype=torch.float64)}), TypeError,
     "attn_mask.dtype: torch.float64 and query.dtype: torch.bfloat16 "
     "(attn_mask must be torch.bool or torch.float32 or torch.bfloat16)"),
    ("bf16 mask with f32", lambda q: (q.float(), q.float(), q.float(), {"attn_mask": torch.zeros(4, 4).bfloat16()}),
     TypeError,
     "attn_mask.dtype: torch.bfloat16 and query.dtype: torch.float32 (attn_mask must be torch.bool or torch.float32)"),
    ("dropout", lambda q: (q, q, q, {"dropout_p": 0.1}), ValueError, "dropout_p > 0 is not supported for torch.bfloat16"),
]


@pytest.mark.parametrize("name,make,exc,message", BAD, ids=[b[0] for b in BAD])
def test_bad_calls_name_the_problem(name, make, exc, message):
    q, k, v, kw = make(randn(1, 2, 4, 8, seed=19))
    with pytest.raises(exc) as info:
        attend.scaled_dot_product_attention(q, k, v, **kw)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_the_command_line_rounds_as_pytorch_and_matches_its_bf16_sdpa(tmp_path):
    """`attend sdpa --dtype bf16` on float32 files: the inputs rounded as `t.to(torch.bfloat16)`
    rounds them, so the result is the Python binding's on PyTorch's bf16 tensors, bit for bit
    (the same library call), and within the bf16 rule of PyTorch's bf16 SDPA."""
    if not ATTEND.is_file():
        pytest.fail(f"{ATTEND} is missing: build it with cargo build --release -p attend-cli")
    g = torch.Generator().manual_seed(20)
    # float32 values with more bits than bf16 keeps, including exact ties (1 + 2⁻⁸).
    q, k, v = (torch.randn(2, 4, n, 32, generator=g) for n in (40, 60, 60))
    v[0, 0, 0, :4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-130])
    bias = torch.randn(40, 60, generator=g)
    files = {}
    for name, t in (("q", q), ("k", k), ("v", v), ("mask", bias)):
        files[name] = tmp_path / f"{name}.npy"
        np.save(files[name], t.numpy())
    out = tmp_path / "out.npy"
    args = [str(ATTEND), "sdpa", "--dtype", "bf16", "--out", str(out)]
    for name, path in files.items():
        args += [f"--{name}", str(path)]
    subprocess.run(args, check=True, capture_output=True)
    got = np.load(out)
    assert got.dtype == np.float32
    got = torch.from_numpy(got)
    qb, kb, vb, mb = (t.to(torch.bfloat16) for t in (q, k, v, bias))
    assert torch.equal(got, got.bfloat16().float()), "the output holds values bf16 cannot"
    py = attend.scaled_dot_product_attention(qb, kb, vb, attn_mask=mb)
    assert torch.equal(got, py.float())
    check_bf16(got.bfloat16(), qb, kb, vb, mb, what="attend sdpa --dtype bf16")


def test_bf16_floor_is_not_the_whole_budget():
    """The rule is no formality: a result one bf16 step off everywhere breaks it."""
    q, k, v = randn(1, 2, 64, 32, seed=21), randn(1, 2, 64, 32, seed=22), randn(1, 2, 64, 32, seed=23)
    got = attend.scaled_dot_product_attention(q, k, v)
    want = reference(q, k, v)
    off = (got.float() + 4 * BF16_ULP * want.abs().max().item()).bfloat16()
    with pytest.raises(AssertionError):
        check_bf16(off, q, k, v)
