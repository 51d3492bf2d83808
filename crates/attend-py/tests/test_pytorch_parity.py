"""What PyTorch's users and tests rely on beyond the numbers of ordinary calls: its
error texts and classes (matched by ``assertRaisesRegex`` and ``except`` clauses),
``torch.nn.attention.bias.CausalBias`` masks, NumPy scalars and 0-d tensors for the
options, ``dropout_p=1``, ``torch.export`` of a mask with a data-dependent size,
and ``import attend`` with torch blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import attend
from numerics import check_grads, check_output


def randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def qkv(lq=4, s=6, seed=0):
    return randn(2, 3, lq, 8, seed=seed), randn(2, 3, s, 8, seed=seed + 1), randn(2, 3, s, 8, seed=seed + 2)


# (name, call arguments from q, k, v, the text PyTorch's message holds and users match)
ERRORS = [
    ("mask and is_causal", lambda q, k, v: ((q, k, v), {"attn_mask": torch.ones(4, 6, dtype=torch.bool), "is_causal": True}),
     "Explicit attn_mask should not be set when is_causal=True"),
    ("CausalBias and is_causal", lambda q, k, v: ((q, k, v), {"attn_mask": causal_upper_left(4, 6), "is_causal": True}),
     "CausalBias should not be used with causal=True"),
    ("mixed dtypes", lambda q, k, v: ((q.double(), k, v), {}), "Expected query, key, and value to have the same dtype"),
    ("int mask", lambda q, k, v: ((q, k, v), {"attn_mask": torch.ones(4, 6, dtype=torch.int64)}),
     "Expected attn_mask dtype to be bool or float or to match query dtype"),
    ("rank 1", lambda q, k, v: ((q[0, 0, 0], k[0, 0, 0], v[0, 0, 0]), {}), "at least 2 dimensional"),
    ("heads do not divide", lambda q, k, v: ((q, k[:, :2], v[:, :2]), {"enable_gqa": True}),
     "Number of heads in key and value must divide the number of heads in query"),
    ("dropout above 1", lambda q, k, v: ((q, k, v), {"dropout_p": 1.5}),
     "dropout probability has to be between 0 and 1, but got 1.5"),
]


@pytest.mark.parametrize("name,make,text", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_carry_pytorchs_text_and_class(name, make, text):
    """attend's error is an instance of the class PyTorch raises for the same call and
    holds the text PyTorch's message holds, on one line."""
    args, kw = make(*qkv())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CausalBias warns about its own shapes
        with pytest.raises(Exception) as theirs:
            F.scaled_dot_product_attention(*args, **kw)
        with pytest.raises(Exception) as ours:
            attend.scaled_dot_product_attention(*args, **kw)
    assert text in str(theirs.value), f"PyTorch's message no longer holds {text!r}: {theirs.value}"
    assert isinstance(ours.value, type(theirs.value)), f"{type(ours.value).__mro__} is not a {type(theirs.value)}"
    assert text in str(ours.value) and "\n" not in str(ours.value), str(ours.value)


CAUSAL_SHAPES = [(4, 6), (6, 6), (6, 4), (23, 56), (40, 17)]


@pytest.mark.parametrize("lq,s", CAUSAL_SHAPES, ids=[f"L{lq}-S{s}" for lq, s in CAUSAL_SHAPES])
@pytest.mark.parametrize("make", [causal_upper_left, causal_lower_right], ids=["upper_left", "lower_right"])
def test_causal_bias_masks(lq, s, make):
    """A CausalBias is the causal mask it stands for: forward and gradients within the
    error rule against the float64 reference with that mask, no NaN, and PyTorch's
    numbers for the same call (rows that see no key give 0, as in PyTorch)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lower-right with L > S warns of NaN (PyTorch's CPU path gives 0)
        bias = make(lq, s)
    dense = bias._materialize()
    q, k, v = qkv(lq, s, seed=10)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attend.scaled_dot_product_attention(*leaves, attn_mask=bias)
    assert not out.isnan().any()
    check_output(out.detach(), q, k, v, mask=dense, what=f"{make.__name__}({lq}, {s})")
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    dout = randn(*out.shape, seed=11)
    out.backward(dout)
    check_grads([t.grad for t in leaves], q, k, v, dout, mask=dense, what=f"{make.__name__}({lq}, {s}) gradients")


def test_causal_bias_compiles_in_one_graph():
    q, k, v = qkv(5, 9, seed=12)
    bias = causal_lower_right(5, 9)
    compiled = torch.compile(attend.scaled_dot_product_attention, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, attn_mask=bias), attend.scaled_dot_product_attention(q, k, v, attn_mask=bias))


@pytest.mark.parametrize(
    "scale",
    [np.float32(0.3), np.float64(0.3), np.int64(2), torch.tensor(0.3), torch.tensor(0.3, dtype=torch.float64)],
    ids=["np.float32", "np.float64", "np.int64", "0-d float32 tensor", "0-d float64 tensor"],
)
def test_numpy_scalars_and_0d_tensors_as_scale(scale):
    """As PyTorch takes them: the float they hold (a float32 0.3 is not the float 0.3)."""
    q, k, v = qkv(seed=20)
    value = float(scale.item())
    want = attend.scaled_dot_product_attention(q, k, v, scale=value)
    assert torch.equal(attend.scaled_dot_product_attention(q, k, v, scale=scale), want)
    arrays = (q.numpy(), k.numpy(), v.numpy())
    assert np.array_equal(attend.scaled_dot_product_attention(*arrays, scale=scale),
                          attend.scaled_dot_product_attention(*arrays, scale=value))
    torch.testing.assert_close(want, F.scaled_dot_product_attention(q, k, v, scale=scale))


@pytest.mark.parametrize("dropout_p", [np.float32(0), np.float64(0.0), torch.tensor(0.0)], ids=["np.float32", "np.float64", "0-d tensor"])
def test_numpy_scalars_and_0d_tensors_as_dropout_p(dropout_p):
    q, k, v = qkv(seed=21)
    want = attend.scaled_dot_product_attention(q, k, v)
    assert torch.equal(attend.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), want)


@pytest.mark.parametrize(
    "scale,text",
    [(torch.tensor(0.3, requires_grad=True), "requires grad"), (torch.tensor([0.3]), "Tensor"), ("0.3", "str")],
    ids=["tensor with grad", "1-d tensor", "str"],
)
def test_what_pytorch_refuses_for_scale_is_refused(scale, text):
    q, k, v = qkv(seed=22)
    with pytest.raises(TypeError):
        F.scaled_dot_product_attention(q, k, v, scale=scale)
    with pytest.raises(TypeError, match=text):
        attend.scaled_dot_product_attention(q, k, v, scale=scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_dropout_1_gives_zeros_as_pytorch_does(dtype):
    q, k, v = (t.to(dtype).requires_grad_() for t in qkv(seed=23))
    out = attend.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    theirs = F.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    assert out.dtype == dtype and torch.equal(out, theirs) and not out.any()
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and not t.grad.any()
    numpy_out = attend.scaled_dot_product_attention(*(t.detach().float().numpy() for t in (q, k, v)), dropout_p=1.0)
    assert numpy_out.shape == tuple(out.shape) and not numpy_out.any()


class _MaskOfDataDependentRows(torch.nn.Module):
    """A mask whose row count comes from a tensor's value: under torch.export an
    unbacked size, with no example value to guard on."""

    def forward(self, q, k, v, rows):
        mask = torch.zeros(rows.item(), k.shape[-2])
        return attend.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_export_with_an_unbacked_mask_size():
    q, k, v = qkv(seed=24)
    program = torch.export.export(_MaskOfDataDependentRows(), (q, k, v, torch.tensor(4)))
    run = program.module()
    # L rows, or one row broadcast over them, as PyTorch's exported program takes.
    for rows in (4, 1):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(rows, 6))
        torch.testing.assert_close(run(q, k, v, torch.tensor(rows)), want)
    with pytest.raises(ValueError, match="does not broadcast"):
        run(q, k, v, torch.tensor(3))


def test_import_with_torch_blocked():
    """``sys.modules["torch"] = None`` (torch unavailable, as some sandboxes and
    lightweight deployments arrange): ``import attend`` works and its torch-free
    parts run."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None
        import numpy as np
        import attend

        q = np.ones((1, 2, 3, 4), dtype=np.float32)
        assert attend.scaled_dot_product_attention(q, q, q).shape == (1, 2, 3, 4)
        assert attend.get_num_threads() >= 1
        try:
            attend.scaled_dot_product_attention([1.0], q, q)
        except attend.AttendTypeError as e:
            assert "query must be a torch.Tensor or a numpy.ndarray" in str(e), e
        else:
            raise AssertionError("a list was taken for a query")
        print("torch-free ok")
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert "torch-free ok" in run.stdout
