"""attend.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention
and the float64 reference, with the project's error rule (numerics.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attend
from numerics import check_grads, check_output, max_err


def randn(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


# (name, q shape, k shape, v shape, enable_gqa)
SHAPES = [
    ("one score", (1, 1, 1, 8), (1, 1, 1, 8), (1, 1, 1, 8), False),
    ("small", (2, 3, 17, 16), (2, 3, 29, 16), (2, 3, 29, 24), False),
    ("decode kernel", (2, 4, 3, 32), (2, 4, 300, 32), (2, 4, 300, 32), False),
    ("fused kernel", (1, 4, 130, 64), (1, 4, 70, 64), (1, 4, 70, 64), False),
    ("grouped query", (2, 8, 40, 16), (2, 2, 40, 16), (2, 2, 40, 16), True),
    ("grouped decode", (1, 8, 1, 64), (1, 2, 200, 64), (1, 2, 200, 64), True),
    ("rank 2", (9, 8), (11, 8), (11, 5), False),
    ("rank 3", (3, 9, 8), (3, 11, 8), (3, 11, 5), False),
    ("rank 5", (2, 3, 2, 9, 8), (2, 3, 2, 11, 8), (2, 3, 2, 11, 5), False),
]


@pytest.mark.parametrize("name,qs,ks,vs,gqa", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_shapes(name, qs, ks, vs, gqa, causal):
    q, k, v = randn(*qs, seed=1), randn(*ks, seed=2), randn(*vs, seed=3)
    got = attend.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    torch_out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert got.shape == torch_out.shape
    check_output(got, q, k, v, is_causal=causal, what=name)


def masks(L, S, heads):
    g = torch.Generator().manual_seed(7)
    keep = torch.rand(2, heads, L, S, generator=g) > 0.3
    keep[0, 0, 1] = False  # a fully masked row
    padding = torch.ones(2, 1, 1, S, dtype=torch.bool)
    padding[1, ..., S - 3 :] = False
    bias = torch.randn(L, S, generator=g)
    neg_inf = bias.clone()
    neg_inf[2] = float("-inf")  # a fully masked row through -inf
    neg_inf[:, 0] = float("-inf")
    return [
        ("bool full", keep),
        ("bool [L, S]", keep[0, 0]),
        ("bool key padding [B, 1, 1, S]", padding),
        ("float [L, S]", bias),
        ("float -inf rows", neg_inf),
        ("float [B, H, L, S]", torch.randn(2, heads, L, S, generator=g)),
        ("float [1, H, 1, S]", torch.randn(1, heads, 1, S, generator=g)),
    ]


@pytest.mark.parametrize("L,S", [(5, 9), (40, 70)], ids=["decode", "fused"])
@pytest.mark.parametrize("case", range(7))
def test_masks_against_torch(L, S, case):
    heads = 3
    name, mask = masks(L, S, heads)[case]
    q, k, v = randn(2, heads, L, 16, seed=4), randn(2, heads, S, 16, seed=5), randn(2, heads, S, 8, seed=6)
    got = attend.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    check_output(got, q, k, v, mask=mask, what=name)
    torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    keep = mask if mask.dtype == torch.bool else mask > float("-inf")
    empty = ~keep.expand(2, heads, L, S).any(-1)
    # Fully masked rows: 0, as PyTorch >= 2.5 gives them.
    assert torch.equal(got[empty], torch.zeros_like(got[empty]))
    assert torch.equal(torch_out[empty], got[empty])


def test_scale_and_causal_rectangles():
    for L, S in [(7, 12), (12, 7)]:
        q, k, v = randn(1, 2, L, 8, seed=8), randn(1, 2, S, 8, seed=9), randn(1, 2, S, 8, seed=10)
        got = attend.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
        check_output(got, q, k, v, is_causal=True, scale=0.3, what=f"causal {L}x{S}")
        # Top-left alignment, as PyTorch: with L > S the last rows see every key.
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
        assert max_err(got, ref) < 1e-5


def test_strided_views_are_read_in_place():
    B, T, H, D = 2, 33, 4, 16
    x = randn(B, T, 3, H, D, seed=11)
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, T, D] views
    assert not q.is_contiguous()
    got = attend.scaled_dot_product_attention(q, k, v)
    check_output(got, q, k, v, what="transposed views")
    # Non-contiguous last axis and NumPy's negative strides work too.
    wide = randn(1, 2, 10, 16, seed=12)
    got = attend.scaled_dot_product_attention(wide[..., ::2], wide[..., ::2], wide[..., ::2])
    check_output(got, wide[..., ::2], wide[..., ::2], wide[..., ::2], what="strided last axis")
    flipped = wide.numpy()[:, :, ::-1]
    got = attend.scaled_dot_product_attention(flipped, flipped, flipped)
    t = torch.from_numpy(flipped.copy())
    check_output(torch.from_numpy(got), t, t, t, what="negative strides")


def test_no_copy_of_strided_inputs(monkeypatch):
    """Strided views reach the compiled half as the caller's own tensors, which it
    reads in place (DLPack) and folds into the kernels' rank-4 layout: through the
    operator's common case (recognised in Rust) and through its Python kernels (here
    under a dispatch mode) alike."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Through(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    seen = []
    real = attend._attend.sdpa_forward_tensors

    def spy(query, key, value, *rest):
        seen.append((query, key, value))
        return real(query, key, value, *rest)

    monkeypatch.setattr(attend._attend, "sdpa_forward_tensors", spy)
    x = randn(2, 16, 3, 4, 8, seed=13)
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    common = attend.scaled_dot_product_attention(q, k, v)
    with Through():
        general = attend.scaled_dot_product_attention(q, k, v)
    assert len(seen) == 1 and all(a is b for a, b in zip(seen[0], (q, k, v)))
    assert torch.equal(common, general)
    check_output(common, q, k, v, what="strided views")


def test_numpy_in_numpy_out():
    q, k, v = (randn(2, 3, 6, 8, seed=s).numpy() for s in (14, 15, 16))
    mask = np.tril(np.ones((6, 6), dtype=bool))
    got = attend.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (2, 3, 6, 8)
    tq, tk, tv = map(torch.from_numpy, (q, k, v))
    check_output(torch.from_numpy(got), tq, tk, tv, mask=torch.from_numpy(mask), what="numpy")


GRAD_CASES = [
    ("fused", (2, 3, 40, 16), (2, 3, 50, 16), (2, 3, 50, 8), None, False, False),
    ("causal", (1, 2, 33, 16), (1, 2, 33, 16), (1, 2, 33, 16), None, True, False),
    ("decode", (1, 2, 4, 16), (1, 2, 90, 16), (1, 2, 90, 16), None, False, False),
    ("gqa", (1, 6, 20, 8), (1, 2, 20, 8), (1, 2, 20, 8), None, True, True),
    ("bool mask", (2, 2, 12, 8), (2, 2, 15, 8), (2, 2, 15, 8), "bool", False, False),
    ("float mask", (2, 2, 12, 8), (2, 2, 15, 8), (2, 2, 15, 8), "float", False, False),
]


@pytest.mark.parametrize("name,qs,ks,vs,mask_kind,causal,gqa", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradients_against_autograd(name, qs, ks, vs, mask_kind, causal, gqa):
    q, k, v = randn(*qs, seed=20), randn(*ks, seed=21), randn(*vs, seed=22)
    L, S = qs[-2], ks[-2]
    mask = None
    if mask_kind == "bool":
        mask = randn(L, S, seed=23) > -0.5
        mask[3] = False  # a fully masked row: zero gradients
    elif mask_kind == "float":
        mask = randn(2, 1, L, S, seed=23)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attend.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    dout = randn(*out.shape, seed=24)
    out.backward(dout)
    check_grads([t.grad for t in leaves], q, k, v, dout, mask, causal, None, what=name)
    # And PyTorch's own autograd agrees to float32 precision.
    tl = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*tl, attn_mask=mask, is_causal=causal, enable_gqa=gqa).backward(dout)
    for a, b in zip(leaves, tl):
        assert max_err(a.grad, b.grad) <= 1e-4 * max(1.0, b.grad.abs().max().item())


def test_gradient_of_a_sum_and_of_views():
    """Autograd hands the backward expanded (stride-0) output gradients and the
    inputs may be transposed views of one leaf."""
    x = randn(1, 10, 3, 2, 8, seed=25).requires_grad_()
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    attend.scaled_dot_product_attention(q, k, v).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    q2, k2, v2 = (x2[:, :, i].transpose(1, 2) for i in range(3))
    F.scaled_dot_product_attention(q2, k2, v2).sum().backward()
    assert max_err(x.grad, x2.grad) <= 1e-5


def test_only_requested_gradients():
    q = randn(1, 1, 4, 8, seed=26).requires_grad_()
    k, v = randn(1, 1, 4, 8, seed=27), randn(1, 1, 4, 8, seed=28)
    attend.scaled_dot_product_attention(q, k, v).sum().backward()
    assert q.grad is not None and k.grad is None and v.grad is None
    with torch.no_grad():
        assert attend.scaled_dot_product_attention(q, k, v).grad_fn is None


def test_dropout_is_attends_own_mask_applied_consistently():
    """With ``v = I`` the output is the dropped, rescaled weight matrix; the same seed
    must then give ``W v`` for any ``v`` and the gradients of ``W v``."""
    L = S = 64
    p = 0.25
    q, k = randn(1, 2, L, 16, seed=29), randn(1, 2, S, 16, seed=30)
    eye = torch.eye(S).expand(1, 2, S, S)
    torch.manual_seed(123)
    w = attend.scaled_dot_product_attention(q, k, eye, dropout_p=p)
    dropped = (w == 0).double().mean().item()
    assert abs(dropped - p) < 4 * (p * (1 - p) / w.numel()) ** 0.5  # within 4 sigma
    kept = (w != 0)
    probs = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
    assert max_err(w[kept], (probs / (1 - p))[kept]) < 1e-5

    v = randn(1, 2, S, 8, seed=31)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(123)
    out = attend.scaled_dot_product_attention(*leaves, dropout_p=p)
    assert max_err(out, w @ v) < 1e-5
    dout = randn(1, 2, L, 8, seed=32)
    out.backward(dout)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    (torch.softmax(ref[0] @ ref[1].transpose(-1, -2) / 4.0, dim=-1) * kept / (1 - p) @ ref[2]).backward(dout)
    for a, b in zip(leaves, ref):
        assert max_err(a.grad, b.grad) < 1e-4


def test_nan_propagates_to_the_rows_it_touches():
    q, k, v = randn(1, 1, 20, 8, seed=33), randn(1, 1, 20, 8, seed=34), randn(1, 1, 20, 8, seed=35)
    q[0, 0, 1, 2] = float("nan")
    for L in (2, 20):  # the decode kernel and the fused kernel
        got = attend.scaled_dot_product_attention(q[:, :, :L], k, v)
        ref = F.scaled_dot_product_attention(q[:, :, :L], k, v)
        assert torch.equal(got.isnan(), ref.isnan())


def test_threads_follow_torch_and_can_be_set():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert attend.get_num_threads() == 1
        attend.set_num_threads(2)
        assert attend.get_num_threads() == 2
        q = randn(1, 2, 64, 16, seed=36)
        one = attend.scaled_dot_product_attention(q, q, q)
        attend.set_num_threads(1)
        # The same bits whatever the thread count.
        assert torch.equal(one, attend.scaled_dot_product_attention(q, q, q))
    finally:
        attend.set_num_threads(None)
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="between 1 and 1024"):
        attend.set_num_threads(0)
    with pytest.raises(TypeError):
        attend.set_num_threads(2.5)


BAD = [
    ("int query", lambda q, k, v: (q.long(), k.long(), v.long(), {}), TypeError,
     "query must be torch.float32, torch.bfloat16, torch.float16 or torch.float64, got torch.int64"),
    ("mixed dtypes", lambda q, k, v: (q.double(), k, v, {}), TypeError, "Expected query, key, and value to have the same dtype"),
    ("int mask", lambda q, k, v: (q, k, v, {"attn_mask": torch.ones(4, 6, dtype=torch.int64)}), TypeError,
     "Expected attn_mask dtype to be bool or float or to match query dtype"),
    ("rank 1", lambda q, k, v: (q[0, 0, 0], k[0, 0, 0], v[0, 0, 0], {}), ValueError, "at least 2 dimensional"),
    ("widths differ", lambda q, k, v: (q, k[..., :4], v, {}), ValueError, "widths differ"),
    ("k and v lengths", lambda q, k, v: (q, k, v[:, :, :5], {}), ValueError, "k and v disagree on heads or length"),
    ("batches do not broadcast", lambda q, k, v: (q, torch.zeros(3, 3, 6, 8), torch.zeros(3, 3, 6, 8), {}), ValueError,
     "do not broadcast"),
    ("heads do not broadcast", lambda q, k, v: (q, k[:, :2], v[:, :2], {}), ValueError, "do not broadcast"),
    ("heads do not divide", lambda q, k, v: (q, k[:, :2], v[:, :2], {"enable_gqa": True}), ValueError, "must divide"),
    ("no key heads", lambda q, k, v: (q, k[:, :0], v[:, :0], {"enable_gqa": True}), ValueError, "must divide"),
    ("mask shape", lambda q, k, v: (q, k, v, {"attn_mask": torch.ones(5, 6, dtype=torch.bool)}), ValueError, "does not broadcast"),
    ("mask of higher rank", lambda q, k, v: (q, k, v, {"attn_mask": torch.ones(2, 2, 3, 4, 6, dtype=torch.bool)}), ValueError,
     "does not broadcast"),
    ("mask and causal", lambda q, k, v: (q, k, v, {"attn_mask": torch.ones(4, 6, dtype=torch.bool), "is_causal": True}), ValueError,
     "Explicit attn_mask should not be set when is_causal=True"),
    ("nan scale", lambda q, k, v: (q, k, v, {"scale": float("nan")}), ValueError, "scale must be finite"),
    ("nan dropout", lambda q, k, v: (q, k, v, {"dropout_p": float("nan")}), ValueError, "dropout probability"),
    ("dropout above 1", lambda q, k, v: (q, k, v, {"dropout_p": 1.5}), ValueError, "dropout probability"),
    ("mixed kinds", lambda q, k, v: (q, k.numpy(), v, {}), TypeError, "must all be torch.Tensors or all numpy"),
    ("a list", lambda q, k, v: (q.tolist(), k, v, {}), TypeError, "torch.Tensor or a numpy.ndarray"),
    ("numpy float64", lambda q, k, v: (q.double().numpy(), k.double().numpy(), v.double().numpy(), {}), TypeError, "must be float32"),
    ("numpy shapes", lambda q, k, v: (q.numpy(), k[..., :4].numpy(), v.numpy(), {}), ValueError, "widths differ"),
]


@pytest.mark.parametrize("name,make,exc,text", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_one_clear_line(name, make, exc, text):
    """Each error is one line, of today's class (ValueError or TypeError) and of
    PyTorch's (RuntimeError) at once."""
    q, k, v = randn(2, 3, 4, 8, seed=37), randn(2, 3, 6, 8, seed=38), randn(2, 3, 6, 8, seed=39)
    q, k, v, kw = make(q, k, v)
    with pytest.raises(exc) as info:
        attend.scaled_dot_product_attention(q, k, v, **kw)
    message = str(info.value)
    assert text in message and "\n" not in message
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, attend.AttendValueError if exc is ValueError else attend.AttendTypeError)


def test_the_gil_is_released_while_the_kernels_run():
    """While one thread is inside a long attention call, another runs Python code:
    the longest pause of a loop in the main thread stays far below the call's time
    (with the GIL held it would be the whole call)."""
    import threading
    import time

    attend.set_num_threads(1)  # leave a core to the main thread
    try:
        # Long enough to tell on a fast CPU too: the sequence doubles until one call
        # takes a tenth of a second.
        for n in (2048, 4096, 8192, 16384):
            q = randn(1, 4, n, 64, seed=42)
            start = time.perf_counter()
            attend.scaled_dot_product_attention(q, q, q)
            call = time.perf_counter() - start
            if call > 0.1:
                break
        worker = threading.Thread(target=attend.scaled_dot_product_attention, args=(q, q, q))
        # The first tick is taken before the start: a worker holding the GIL from
        # its first instruction would block the loop before its first iteration.
        ticks = [time.perf_counter()]
        worker.start()
        while worker.is_alive():
            ticks.append(time.perf_counter())
        ticks.append(time.perf_counter())
        worker.join()
    finally:
        attend.set_num_threads(None)
    longest = max(b - a for a, b in zip(ticks, ticks[1:]))
    assert call > 0.05, f"the call took {call:.3f} s: too short to tell"
    assert longest < call / 2, f"the main thread paused {longest:.3f} s during a {call:.3f} s call"


EMPTY = [
    # (name, q, k, v, enable_gqa)
    ("no queries", (1, 1, 0, 8), (1, 1, 5, 8), (1, 1, 5, 8), False),
    ("no keys", (1, 1, 3, 8), (1, 1, 0, 8), (1, 1, 0, 8), False),
    ("no batch", (0, 1, 3, 8), (0, 1, 4, 8), (0, 1, 4, 8), False),
    ("zero heads", (2, 0, 3, 8), (2, 0, 4, 8), (2, 0, 4, 8), False),
    ("zero query heads, grouped", (2, 0, 3, 8), (2, 2, 4, 8), (2, 2, 4, 8), True),
    ("zero width", (1, 1, 3, 0), (1, 1, 4, 0), (1, 1, 4, 4), False),
    ("zero width, fused kernels", (2, 2, 40, 0), (2, 2, 50, 0), (2, 2, 50, 4), False),
    ("zero value width", (1, 1, 3, 8), (1, 1, 4, 8), (1, 1, 4, 0), False),
]


@pytest.mark.parametrize("name,qs,ks,vs,gqa", EMPTY, ids=[e[0] for e in EMPTY])
def test_empty_axes_as_pytorch(name, qs, ks, vs, gqa):
    """Forward and gradients, PyTorch's shapes and values: with E = 0 every score is 0
    and each query averages the values (the default scale, 1/√0, must not make them
    NaN); empty outputs give zero gradients."""
    q, k, v = (randn(*s, seed=43 + i).requires_grad_() for i, s in enumerate((qs, ks, vs)))
    got = attend.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    dout = randn(*got.shape, seed=46)
    got.backward(dout)
    ours = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    want.backward(dout)
    assert got.shape == want.shape
    assert max_err(got, want) <= 1e-6
    for g, t in zip(ours, (q, k, v)):
        assert g.shape == t.shape and not g.isnan().any()
        assert max_err(g, t.grad) <= 1e-6


BROADCAST = [
    # (name, q, k, v, enable_gqa): PyTorch broadcasts the leading axes as a matrix
    # product does; attend reads repeated axes with stride 0 and sums their gradients.
    ("query of rank 2", (5, 8), (2, 3, 6, 8), (2, 3, 6, 4), False),
    ("query of rank 3", (3, 5, 8), (2, 3, 6, 8), (2, 3, 6, 4), False),
    ("key and value of rank 3", (2, 3, 5, 8), (3, 6, 8), (3, 6, 4), False),
    ("one key/value head", (2, 3, 5, 8), (2, 1, 6, 8), (2, 1, 6, 4), False),
    ("one query head", (2, 1, 5, 8), (2, 3, 6, 8), (2, 3, 6, 4), False),
    ("one key head, three value heads", (2, 3, 5, 8), (2, 1, 6, 8), (2, 3, 6, 4), False),
    ("key batch of one", (2, 3, 5, 8), (1, 3, 6, 8), (1, 3, 6, 4), False),
    ("query batch of one", (1, 3, 5, 8), (2, 3, 6, 8), (2, 3, 6, 4), False),
    ("grouped key, one value head", (2, 8, 5, 8), (2, 2, 6, 8), (2, 1, 6, 4), True),
    ("grouped, key and value heads differ", (2, 6, 5, 8), (2, 2, 6, 8), (2, 3, 6, 4), True),
    ("rank 5, grouped, broadcast", (3, 2, 4, 5, 8), (1, 2, 2, 6, 8), (3, 1, 2, 6, 4), True),
    ("fused kernel, one key/value head", (2, 4, 40, 16), (1, 1, 50, 16), (1, 1, 50, 8), False),
]


@pytest.mark.parametrize("name,qs,ks,vs,gqa", BROADCAST, ids=[b[0] for b in BROADCAST])
def test_broadcasting_as_pytorch(name, qs, ks, vs, gqa):
    q, k, v = (randn(*s, seed=50 + i).requires_grad_() for i, s in enumerate((qs, ks, vs)))
    got = attend.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    want = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True, enable_gqa=gqa)
    assert got.shape == want.shape
    check_output(got, q.detach(), k.detach(), v.detach(), is_causal=True, what=name)
    dout = randn(*got.shape, seed=53)
    got.backward(dout)
    check_grads([t.grad for t in (q, k, v)], q.detach(), k.detach(), v.detach(), dout, is_causal=True, what=name)


def test_broadcast_masks_of_every_rank():
    """Masks broadcast to the weights [..., L, S] from any lower rank, with rank-5
    inputs whose leading axes fold into one batch."""
    q, k, v = randn(3, 2, 2, 5, 8, seed=54), randn(3, 2, 2, 7, 8, seed=55), randn(1, 2, 2, 7, 4, seed=56)
    g = torch.Generator().manual_seed(57)
    for shape in [(7,), (5, 7), (2, 1, 7), (2, 1, 5, 7), (3, 1, 1, 5, 7), (3, 2, 2, 5, 7)]:
        for mask in (torch.rand(*shape, generator=g) > 0.3, torch.randn(*shape, generator=g)):
            got = attend.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            check_output(got, q, k, v, mask=mask, what=f"{mask.dtype} mask {shape}")


def test_inference_mode_tensors():
    q = randn(1, 2, 4, 8, seed=46)
    with torch.inference_mode():
        t = q.clone()
        got = attend.scaled_dot_product_attention(t, t, t)
    assert max_err(got, F.scaled_dot_product_attention(q, q, q)) <= 1e-6
