"""PyTorch's own OpInfo samples for ``nn.functional.scaled_dot_product_attention``
(they ship in the torch wheel) run through attend's drop-in
``attend.scaled_dot_product_attention``, forward and backward, in float64, float32,
bfloat16 and float16, on every instruction set (``ATTEND_MAX_ISA``: each in a fresh
interpreter, since the cap is read at import).

Judged by PyTorch's own rule (its ``test_transformers`` tolerances): the error
against a float64 golden (PyTorch's math path in float64 on the same inputs, widened
exactly) must be within 5x PyTorch's own error at that dtype, the larger of its two
CPU paths' (the math path and the kernel ``F.scaled_dot_product_attention`` picks:
both are what PyTorch answers at that dtype). Plus a floor: 4 ulps of the dtype
times the golden's largest entry (the rounding of the result and of its sums' last
steps, which no implementation avoids) and, in float64 only, the first-order move
of every result when each scaled score is rounded to the dtype (``ulp(max |s|)``
per unit of the result's size: docs/design.md, "Numerical tests"). In float64
PyTorch's own error is 0, its math path being the golden itself, so it cannot
measure that rounding, which any other order of the same operations pays; at the
other dtypes PyTorch's error already holds it.

Dropout samples (``dropout_p = 0.5``) are random patterns, PyTorch's and attend's
different by design: only the deterministic samples (``dropout_p = 0``) are
compared; every other argument of the dropout samples appears in those too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ISAS = ("amx", "avx512bf16", "avx512", "avx2vnni", "avx2", "portable")
DTYPES = ("float64", "float32", "bfloat16", "float16")
FUDGE = 5.0
FLOOR_ULPS = 4.0


def _samples(dtype):
    from torch.testing._internal.common_methods_invocations import op_db

    (op,) = [o for o in op_db if o.name == "nn.functional.scaled_dot_product_attention"]
    return [s for s in op.sample_inputs("cpu", dtype, requires_grad=True) if not s.kwargs.get("dropout_p")]


def _call(fn, sample, dtype, grad_out):
    """``fn``'s output and the gradients of ``(output · grad_out).sum()`` with
    respect to every input the sample differentiates, computed in ``dtype`` from the
    sample's values."""
    import torch

    kwargs = dict(sample.kwargs)
    tensors = [sample.input, *sample.args]
    mask = kwargs.pop("attn_mask", None)
    if mask is not None:
        tensors.append(mask)

    def cast(t):
        wanted, t = t.requires_grad, t.detach()
        return (t.to(dtype) if t.is_floating_point() else t).requires_grad_(wanted)

    inputs = [cast(t) for t in tensors]
    q, k, v = inputs[:3]
    if mask is not None:
        kwargs["attn_mask"] = inputs[3]
    out = fn(q, k, v, **kwargs)
    wrt = [t for t in inputs if t.requires_grad]
    grads = torch.autograd.grad(out, wrt, grad_out.to(dtype))
    names = ["query", "key", "value", "attn_mask"]
    named = [n for n, t in zip(names, inputs) if t.requires_grad]
    return {"output": out, **{f"grad {n}": g for n, g in zip(named, grads)}}


def _max_score(sample) -> float:
    """The largest scaled score ``|q·k| · scale (+ |mask|)`` of a sample, in float64."""
    import torch

    q, k = sample.input.detach().double(), sample.args[0].detach().double()
    if q.dim() == 3 and k.dim() == 4:
        q = q.unsqueeze(0)
    if sample.kwargs.get("enable_gqa") and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scale = sample.kwargs.get("scale") or q.shape[-1] ** -0.5
    s = (q @ k.transpose(-1, -2)).abs() * scale
    mask = sample.kwargs.get("attn_mask")
    if mask is not None and mask.is_floating_point():
        s = s + mask.detach().double().abs()
    return s.max().item()


def _judge() -> dict:
    """Every deterministic sample in every dtype on the instruction set this
    interpreter runs: one row per quantity with attend's error, the bound and
    PyTorch's errors."""
    import attend
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def math(*args, **kwargs):
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(*args, **kwargs)

    rows = []
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        for n, sample in enumerate(_samples(dtype)):
            gen = torch.Generator().manual_seed(n)
            shape = math(sample.input, *sample.args, **sample.kwargs).shape
            grad_out = torch.randn(shape, generator=gen).to(dtype).double()
            golden = _call(math, sample, torch.float64, grad_out)
            max_score = _max_score(sample)
            ours = _call(attend.scaled_dot_product_attention, sample, dtype, grad_out)
            theirs = [_call(fn, sample, dtype, grad_out) for fn in (math, F.scaled_dot_product_attention)]
            eps = torch.finfo(dtype).eps
            for what, g in golden.items():

                def err(result):
                    return (result[what].double() - g).abs().max().item()

                size = g.abs().max().item()
                torch_err = max(err(t) for t in theirs)
                scores = max_score if dtype is torch.float64 else 0.0
                bound = FUDGE * torch_err + (FLOOR_ULPS + scores) * eps * size
                rows.append(
                    {
                        "dtype": dtype_name,
                        "sample": n,
                        "args": f"q {tuple(sample.input.shape)} k {tuple(sample.args[0].shape)} "
                        + " ".join(f"{k}={v!r}" if not hasattr(v, "shape") else f"{k}={tuple(v.shape)}"
                                   for k, v in sample.kwargs.items()),
                        "what": what,
                        "err": err(ours),
                        "bound": bound,
                        "torch_err": torch_err,
                    }
                )
    return {"isa": attend.isa(), "rows": rows}


@pytest.fixture(scope="module")
def judged():
    """``_judge``'s rows per instruction set, each from a fresh interpreter."""
    cache = {}

    def run(isa):
        if isa not in cache:
            env = dict(os.environ, ATTEND_MAX_ISA=isa)
            proc = subprocess.run(
                [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600
            )
            assert proc.returncode == 0, proc.stderr
            cache[isa] = json.loads(proc.stdout.strip().splitlines()[-1])
        return cache[isa]

    return run


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("isa", ISAS)
def test_opinfo_samples_are_within_pytorchs_own_error(judged, isa, dtype):
    result = judged(isa)
    if result["isa"] != isa:
        pytest.skip(f"this CPU runs {result['isa']} at most under ATTEND_MAX_ISA={isa}")
    rows = [r for r in result["rows"] if r["dtype"] == dtype]
    assert len(rows) > 30  # 13 deterministic samples, output and 3-4 gradients each
    bad = [r for r in rows if not r["err"] <= r["bound"]]
    assert not bad, "\n".join(
        f"{r['args']} {r['what']}: error {r['err']:.3g} > bound {r['bound']:.3g} (torch {r['torch_err']:.3g})"
        for r in bad
    )


if __name__ == "__main__":
    print(json.dumps(_judge()))
