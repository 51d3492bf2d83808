"""attend inside PyTorch's compiler: torch.ops.attend.scaled_dot_product_attention and
its backward as registered custom ops, under torch.library.opcheck, torch.compile(fullgraph=True),
torch.export (save, load, run), torch.func.vmap, fake and meta tensors.

The compiled and exported programs call the very same kernels as eager code, on the
very same inputs, so their results must be eager's bit for bit; vmapped results are
judged by the project's error rule (numerics.py) against the per-sample problems.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode

import attend
import attend.ops
from numerics import check_grads, check_output


def randn(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: no graph cached by an earlier test."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# (name, q, k, v, mask shape or None, options) for the op's own checks.
CASES = [
    ("plain", (2, 3, 5, 8), (2, 3, 6, 8), (2, 3, 6, 4), None, {}),
    ("grouped query", (2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 4), None, {"enable_gqa": True}),
    ("causal, scale", (1, 2, 7, 8), (1, 2, 7, 8), (1, 2, 7, 8), None, {"is_causal": True, "scale": 0.3}),
    ("float mask, broadcast batch", (2, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 4), (5, 6), {}),
    ("rank 3 query, rank 4 key", (2, 5, 8), (3, 2, 6, 8), (3, 2, 6, 4), None, {}),
]


def op_args(q, k, v, mask, options, dtype=torch.float32, grad=True):
    tensors = [randn(*s, seed=i, dtype=dtype).requires_grad_(grad) for i, s in enumerate((q, k, v))]
    m = None if mask is None else randn(*mask, seed=9, dtype=dtype)
    return (*tensors, m, 0.0, options.get("is_causal", False), options.get("scale"), options.get("enable_gqa", False), None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_opcheck(case, dtype):
    """PyTorch's own checker of custom ops: schema, autograd registration, fake
    tensors against the real kernel, AOT dispatch with dynamic shapes."""
    _, qs, ks, vs, ms, options = case
    args = op_args(qs, ks, vs, ms, options, dtype)
    result = torch.library.opcheck(torch.ops.attend.scaled_dot_product_attention.default, args)
    assert set(result.values()) == {"SUCCESS"}, result
    out, lse, lse_residual = torch.ops.attend.scaled_dot_product_attention(*args)
    grad = randn(*out.shape, seed=10, dtype=dtype)
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    backward_args = (grad, *detached[:3], out.detach(), lse, lse_residual, *detached[3:])
    result = torch.library.opcheck(torch.ops.attend.scaled_dot_product_attention_backward.default, backward_args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_dropout_seed_crosses_the_op():
    """With dropout the op takes the seed as a tensor (drawn in the graph, so a
    compiled function draws a new one per call) and the backward sees the same."""
    q, k, v = (randn(1, 2, 20, 8, seed=s).requires_grad_() for s in (1, 2, 3))
    seed = torch.tensor(123, dtype=torch.int64)
    args = (q, k, v, None, 0.3, False, None, False, seed)
    result = torch.library.opcheck(torch.ops.attend.scaled_dot_product_attention.default, args)
    assert set(result.values()) == {"SUCCESS"}, result
    a, _, _ = torch.ops.attend.scaled_dot_product_attention(*args)
    b, _, _ = torch.ops.attend.scaled_dot_product_attention(q, k, v, None, 0.3, False, None, False, seed + 1)
    assert torch.equal(a, torch.ops.attend.scaled_dot_product_attention(*args)[0]) and not torch.equal(a, b)


class Recorder:
    """An AOTAutograd backend that keeps the forward and backward graphs it is given
    and runs them as they are: what torch.compile hands any backend."""

    def __init__(self):
        self.graphs = []

    def compiler(self, gm, example_inputs):
        self.graphs.append(gm)
        return make_boxed_func(gm.forward)

    def ops(self):
        return [str(n.target) for g in self.graphs for n in g.graph.nodes if n.op == "call_function"]


def attention_fn(x, mask):
    """The [B, T, 3, H, D] → [B, H, T, D] views every model makes, attend, and the
    view back. No arithmetic besides attend's: a compiler may order its own sums
    differently from eager code."""
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    return attend.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


def test_compile_fullgraph_records_the_op_forward_and_backward():
    recorder = Recorder()
    backend = aot_autograd(fw_compiler=recorder.compiler, bw_compiler=recorder.compiler)
    compiled = torch.compile(attention_fn, fullgraph=True, backend=backend)
    x = randn(2, 9, 3, 2, 8, seed=4).requires_grad_()
    mask = randn(9, 9, seed=5) > -1
    compiled(x, mask).pow(2).sum().backward()
    ops = recorder.ops()
    assert "attend.scaled_dot_product_attention.default" in ops, ops
    assert "attend.scaled_dot_product_attention_backward.default" in ops, ops
    assert len(recorder.graphs) == 2  # one forward graph, one backward graph: no break


def test_compile_fullgraph_inductor_gives_eager_results():
    """The default backend, forward and backward: the same kernels on the same inputs,
    so the same bits as eager for the output and every gradient."""
    x = randn(2, 33, 3, 4, 16, seed=6)
    mask = randn(33, 33, seed=7) > -1
    dout = randn(2, 33, 4, 16, seed=8)
    eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = attention_fn(eager_x, mask)
    want.backward(dout)
    compiled = torch.compile(attention_fn, fullgraph=True)
    got = compiled(compiled_x, mask)
    got.backward(dout)
    assert torch.equal(got, want)
    assert torch.equal(compiled_x.grad, eager_x.grad)


class Attention(torch.nn.Module):
    """Projections, attend, output projection: the shape of every attention layer."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x, mask):
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).unbind(2)
        o = attend.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.out(o.transpose(1, 2).reshape(b, t, w))


def test_export_save_load_and_run(tmp_path):
    torch.manual_seed(8)
    module = Attention().eval()
    x, mask = randn(2, 11, 32, seed=9), randn(2, 1, 11, 11, seed=10) > -1
    want = module(x, mask)
    program = torch.export.export(module, (x, mask))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert "attend.scaled_dot_product_attention.default" in targets, targets
    path = tmp_path / "attention.pt2"
    torch.export.save(program, path)
    loaded = torch.export.load(path)
    assert torch.equal(loaded.module()(x, mask), want)
    # A fresh process: `import attend` after torch registers the ops the file names.
    torch.save((x, mask, want), tmp_path / "io.pt")
    script = (
        "import sys, torch, attend\n"
        f"x, mask, want = torch.load({str(tmp_path / 'io.pt')!r})\n"
        f"got = torch.export.load({str(path)!r}).module()(x, mask)\n"
        "sys.exit(0 if torch.equal(got, want) else 1)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def test_dynamic_shapes_compile_once():
    """With sizes kept symbolic the fake implementation keeps them symbolic: one
    graph serves every batch and sequence length. (The sizes of the first call are
    all different, so that PyTorch's duck sizing ties none of them together.)"""
    counter = CompileCounterWithBackend("aot_eager")

    def f(q, k, v, mask):
        return attend.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    compiled = torch.compile(f, backend=counter, dynamic=True, fullgraph=True)
    frames = []
    for b, n in ((3, 5), (6, 9), (7, 17)):
        q, k, v = randn(b, 4, n, 16, seed=n), randn(b, 2, n + 2, 16, seed=n + 1), randn(b, 2, n + 2, 16, seed=n + 2)
        mask = randn(n, n + 2, seed=n + 3) > -1
        assert torch.equal(compiled(q, k, v, mask), f(q, k, v, mask))
        frames.append(counter.frame_count)
    # The first call may compile twice (dynamo restarts once to specialize the float
    # dropout_p default); no later size compiles again.
    assert frames[1:] == frames[:1] * 2, frames


def test_export_with_a_dynamic_sequence_length():
    torch.manual_seed(11)
    module = Attention().eval()
    x, mask = randn(2, 11, 32, seed=12), randn(2, 1, 11, 11, seed=13) > -1
    t = torch.export.Dim("T", min=2, max=512)
    program = torch.export.export(module, (x, mask), dynamic_shapes=({1: t}, {2: t, 3: t}))
    for n in (5, 20, 37):
        x, mask = randn(2, n, 32, seed=n), randn(2, 1, n, n, seed=n + 1) > -1
        assert torch.equal(program.module()(x, mask), module(x, mask))


VMAPS = [
    # (name, q, k, v, in_dims): the vmapped axis anywhere, some arguments unbatched.
    ("query only", (4, 2, 5, 8), (2, 7, 8), (2, 7, 6), (0, None, None)),
    ("all, axis 1", (2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 6), (1, 1, 1)),
    ("key and value only", (2, 5, 8), (3, 2, 7, 8), (3, 2, 7, 6), (None, 0, 0)),
    ("rank 2 samples", (3, 5, 8), (3, 7, 8), (3, 7, 6), (0, 0, 0)),
]


def per_sample(t, dim, i):
    return t if dim is None else t.select(dim, i)


@pytest.mark.parametrize("name,qs,ks,vs,dims", VMAPS, ids=[c[0] for c in VMAPS])
def test_vmap_against_a_python_loop(name, qs, ks, vs, dims):
    q, k, v = randn(*qs, seed=11), randn(*ks, seed=12), randn(*vs, seed=13)
    n = next(t.shape[d] for t, d in zip((q, k, v), dims) if d is not None)
    got = torch.func.vmap(attend.scaled_dot_product_attention, in_dims=dims)(q, k, v)
    for i in range(n):
        qi, ki, vi = (per_sample(t, d, i) for t, d in zip((q, k, v), dims))
        assert got[i].shape == F.scaled_dot_product_attention(qi, ki, vi).shape
        check_output(got[i], qi, ki, vi, what=f"{name}, sample {i}")


def test_vmap_of_masked_causal_and_grouped_calls():
    q, k, v = randn(3, 1, 4, 9, 8, seed=14), randn(2, 9, 8, seed=15), randn(2, 9, 8, seed=16)
    mask = randn(3, 9, 9, seed=17) > -0.5

    def f(q, mask):
        return attend.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    got = torch.func.vmap(f)(q, mask)
    for i in range(3):
        kr, vr = (t.repeat_interleave(2, dim=0) for t in (k, v))
        check_output(got[i], q[i], kr, vr, mask=mask[i], what=f"masked, sample {i}")
    causal = torch.func.vmap(lambda q: attend.scaled_dot_product_attention(q, q, q, is_causal=True))(q)
    for i in range(3):
        check_output(causal[i], q[i], q[i], q[i], is_causal=True, what=f"causal, sample {i}")


def test_batched_gradients_run_the_backward_ops_vmap_rule():
    """``is_grads_batched`` vmaps the backward over a batch of output gradients: each
    gradient of the batch is judged as its own backward pass."""
    q = randn(2, 4, 6, 8, seed=18).requires_grad_()
    k2, v2 = (randn(2, 2, 6, 8, seed=s).requires_grad_() for s in (19, 20))
    out = attend.scaled_dot_product_attention(q, k2, v2, is_causal=True, enable_gqa=True)
    douts = randn(3, *out.shape, seed=21)
    grads = torch.autograd.grad(out, (q, k2, v2), douts, is_grads_batched=True)
    for i in range(3):
        got = [g[i] for g in grads]
        check_grads(got, q.detach(), k2.detach(), v2.detach(), douts[i], is_causal=True, what=f"gradient batch {i}")


def test_torch_func_grad_and_per_sample_gradients():
    """torch.func.grad, and vmap of it with an unbatched key and value whose
    gradients must still be per sample (the backward op's vmap rule repeats them)."""
    q, k, v = randn(3, 2, 6, 8, seed=22), randn(2, 7, 8, seed=23), randn(2, 7, 4, seed=24)

    def loss(q, k, v):
        return attend.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    single = torch.func.grad(loss, argnums=(0, 1, 2))(q[0], k, v)
    check_grads(single, q[0], k, v, torch.ones(2, 6, 4), is_causal=True, what="torch.func.grad")
    grads = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)), in_dims=(0, None, None))(q, k, v)
    assert [g.shape for g in grads] == [q.shape, (3, *k.shape), (3, *v.shape)]
    for i in range(3):
        check_grads([g[i] for g in grads], q[i], k, v, torch.ones(2, 6, 4), is_causal=True, what=f"sample {i}")


def test_jacrev_matches_pytorchs():
    q, k, v = randn(2, 3, 8, seed=25, dtype=torch.float64), randn(2, 5, 8, seed=26, dtype=torch.float64), randn(
        2, 5, 4, seed=27, dtype=torch.float64
    )
    ours = torch.func.jacrev(lambda q: attend.scaled_dot_product_attention(q, k, v))(q)
    theirs = torch.func.jacrev(lambda q: F.scaled_dot_product_attention(q, k, v))(q)
    # Both are float64 evaluations of the same gradients: a few float64 ulps of
    # the largest entry per summed term, far below any real difference.
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max() <= 64 * torch.finfo(torch.float64).eps * theirs.abs().max()


SECOND_DERIVATIVES = [
    ("autograd double backward", lambda f, q: torch.autograd.grad(
        torch.autograd.grad(f(q), q, create_graph=True)[0].sum(), q)),
    ("gradgradcheck", lambda f, q: torch.autograd.gradgradcheck(f, (q,))),
    ("torch.func.grad of grad", lambda f, q: torch.func.grad(lambda x: torch.func.grad(f)(x).sum())(q)),
    ("torch.func.hessian", lambda f, q: torch.func.hessian(f)(q)),
    ("torch.func.jvp", lambda f, q: torch.func.jvp(f, (q,), (torch.ones_like(q),))),
]


@pytest.mark.parametrize("name,run", SECOND_DERIVATIVES, ids=[c[0] for c in SECOND_DERIVATIVES])
def test_derivatives_attend_lacks_are_refused_in_one_line(name, run):
    """attend has first derivatives in reverse mode only: a second derivative or a
    forward-mode one raises instead of silently coming out 0."""
    k = randn(1, 5, 4, seed=28, dtype=torch.float64)

    def f(q):
        return attend.scaled_dot_product_attention(q, k, k).pow(2).sum()

    q = randn(1, 3, 4, seed=29, dtype=torch.float64).requires_grad_()
    with pytest.raises(attend.AttendValueError) as info:
        run(f, q)
    message = str(info.value)
    assert "\n" not in message and ("second derivative" in message or "one torch.func level" in message
                                     or "forward-mode" in message), message


def test_vmap_refuses_dropout_with_the_same_randomness():
    q = randn(2, 1, 4, 8, seed=21)
    f = torch.func.vmap(lambda q: attend.scaled_dot_product_attention(q, q, q, dropout_p=0.5), randomness="same")
    with pytest.raises(attend.AttendValueError, match='randomness="different"'):
        f(q)
    out = torch.func.vmap(lambda q: attend.scaled_dot_product_attention(q, q, q, dropout_p=0.5), randomness="different")(q)
    assert out.shape == q.shape


SHAPES = [
    ("plain", (2, 3, 5, 8), (2, 3, 6, 8), (2, 3, 6, 4), {}),
    ("grouped", (2, 8, 5, 8), (2, 2, 6, 8), (2, 2, 6, 4), {"enable_gqa": True}),
    ("one key/value head", (2, 8, 5, 8), (2, 1, 6, 8), (2, 1, 6, 4), {}),
    ("rank 2 query", (5, 8), (2, 3, 6, 8), (2, 3, 6, 4), {}),
    ("rank 5", (3, 2, 4, 5, 8), (1, 2, 4, 6, 8), (1, 2, 4, 6, 4), {}),
    ("zero heads", (2, 0, 5, 8), (2, 0, 6, 8), (2, 0, 6, 4), {}),
    ("empty rows", (2, 3, 0, 8), (2, 3, 6, 8), (2, 3, 6, 4), {}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("name,qs,ks,vs,kw", SHAPES, ids=[s[0] for s in SHAPES])
def test_fake_and_meta_tensors_give_pytorchs_shapes(name, qs, ks, vs, kw, dtype):
    real = [randn(*s, seed=i, dtype=dtype) for i, s in enumerate((qs, ks, vs))]
    want = F.scaled_dot_product_attention(*real, **kw)
    got_real = attend.scaled_dot_product_attention(*real, **kw)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in real]
        got_fake = attend.scaled_dot_product_attention(*fake, **kw)
        out, lse, residual = torch.ops.attend.scaled_dot_product_attention(
            *fake, None, 0.0, False, None, kw.get("enable_gqa", False), None
        )
    meta = [t.to("meta") for t in real]
    got_meta = attend.scaled_dot_product_attention(*meta, **kw)
    for t in (got_real, got_fake, got_meta):
        assert t.shape == want.shape and t.dtype == want.dtype
        assert t.stride() == got_real.stride()
    assert got_meta.device.type == "meta"
    _, real_lse, real_residual = torch.ops.attend.scaled_dot_product_attention(
        *real, None, 0.0, False, None, kw.get("enable_gqa", False), None
    )
    assert lse.shape == real_lse.shape == want.shape[:-1] and lse.dtype == real_lse.dtype
    assert residual.shape == real_residual.shape == lse.shape and residual.dtype == real_residual.dtype == lse.dtype


def test_fake_tensors_refuse_what_the_kernels_refuse():
    q, k, v = randn(2, 3, 4, 8), randn(2, 3, 6, 7), randn(2, 3, 6, 8)
    with pytest.raises(attend.AttendValueError) as eager:
        attend.scaled_dot_product_attention(q, k, v)
    with FakeTensorMode() as mode, pytest.raises(attend.AttendValueError) as fake:
        attend.scaled_dot_product_attention(*(mode.from_tensor(t) for t in (q, k, v)))
    assert str(fake.value) == str(eager.value) == "q and k widths differ: q [2, 3, 4, 8], k [2, 3, 6, 7]"


def test_a_cuda_tensor_is_refused_in_one_line():
    """attend runs on CPU tensors; a CUDA tensor (a fake one: no GPU is needed to
    make it) is refused before anything reaches a kernel."""
    with FakeTensorMode():
        q = torch.empty(1, 2, 4, 8, device="cuda")
        with pytest.raises(attend.AttendValueError) as info:
            attend.scaled_dot_product_attention(q, q, q)
    message = str(info.value)
    assert message == "attend runs on CPU tensors: query is on cuda:0 (move it with .cpu())"
    assert isinstance(info.value, RuntimeError)


def test_the_dispatcher_still_routes_modes_and_views_past_the_cpu_shortcut():
    """The autograd kernel calls the CPU kernel itself only for plain CPU tensors
    with nothing else active: a dispatch mode still sees the op, and a negative view
    is resolved by PyTorch before the kernel reads it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    q, k, v = randn(1, 2, 4, 8, seed=1), randn(1, 2, 5, 8, seed=2), randn(1, 2, 5, 8, seed=3)
    want = attend.scaled_dot_product_attention(q, k, v)
    with Seen() as mode:
        got = attend.scaled_dot_product_attention(q, k, v)
    assert torch.ops.attend.scaled_dot_product_attention.default in mode.ops
    assert torch.equal(got, want)
    flipped = attend.scaled_dot_product_attention(torch._neg_view(q), k, v)
    assert torch.equal(flipped, attend.scaled_dot_product_attention(-q, k, v))


def test_the_cpu_kernel_refuses_what_it_cannot_read_in_place():
    """attend._attend.sdpa_forward_tensors, the CPU kernel's compiled half, reads
    tensors' memory as PyTorch describes it: whatever it cannot read that way is
    refused in one line, never read."""
    q = randn(1, 2, 4, 8)

    def kernel(query, key=q, value=q, mask=None):
        return attend._attend.sdpa_forward_tensors(query, key, value, mask, 0.0, False, None, False, None, 1)

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(q)
    unaligned = torch.frombuffer(bytearray(4 * 64 + 1), dtype=torch.float32, offset=1).view(1, 2, 4, 8)
    refused = [
        (attend.AttendTypeError, "query must be a torch.Tensor, got list", lambda: kernel([1.0])),
        (attend.AttendValueError, "query is a negative view", lambda: kernel(torch._neg_view(q))),
        (attend.AttendValueError, "query has no data", lambda: kernel(fake)),
        (attend.AttendTypeError, "key must be torch.float32, got torch.float64", lambda: kernel(q, q.double())),
        (attend.AttendTypeError, "key must be torch.float16, got torch.float32", lambda: kernel(q.half())),
        (attend.AttendTypeError, "attn_mask must be torch.bool or torch.float32", lambda: kernel(q, mask=q.long())),
        (attend.AttendValueError, "not aligned", lambda: kernel(unaligned)),
    ]
    for error, message, call in refused:
        with pytest.raises(error, match=message):
            call()
    out, lse, residual = kernel(q)
    assert torch.equal(out, attend.scaled_dot_product_attention(q, q, q)) and lse.shape == residual.shape == (1, 2, 4)


def test_log_sum_exp_has_no_gradient():
    q = randn(1, 2, 4, 8).requires_grad_()
    out, lse, residual = torch.ops.attend.scaled_dot_product_attention(q, q, q, None, 0.0, False, None, False, None)
    assert out.requires_grad and not lse.requires_grad and not residual.requires_grad
    # lse: log Σ exp(scores), as the f64 reference computes it; the residual what
    # rounding it to float32 left out, at most half its ulp.
    s = (q.double() @ q.double().transpose(-1, -2)) / 8**0.5
    eps = torch.finfo(torch.float32).eps
    assert (lse.double() - torch.logsumexp(s, -1)).abs().max() <= 4 * eps * s.abs().max()
    assert (residual.double().abs() <= eps / 2 * lse.double().abs()).all()


def test_import_attend_loads_its_submodules_lazily():
    script = (
        "import sys, attend\n"
        "heavy = [m for m in ('torch', 'transformers', 'ray') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert {'ops', 'ray', 'transformers'} <= set(dir(attend))\n"
        "attend.transformers.register()\n"
        "assert attend.transformers.is_registered() and 'transformers' in sys.modules\n"
        "assert attend.ops.sdpa is not None and 'ray' not in sys.modules\n"
        "assert callable(attend.ray.Embedder)\n"
        "try:\n"
        "    attend.nonexistent\n"
        "except AttributeError as e:\n"
        "    assert str(e) == \"module 'attend' has no attribute 'nonexistent'\", e\n"
        "else:\n"
        "    sys.exit('no AttributeError')\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
