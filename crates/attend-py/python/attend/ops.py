"""attend's attention as PyTorch custom operators.

``torch.ops.attend.scaled_dot_product_attention`` (the forward) and
``torch.ops.attend.scaled_dot_product_attention_backward`` are defined with
``torch.library.Library``: each runs attend's kernels on CPU tensors and has a fake
implementation (shapes, dtypes and strides from the inputs' shapes alone, by the same
Rust shape rules that the kernels apply); the forward has an autograd kernel (the
fused backward, on saved tensors) and a vmap rule (the vmapped axis folded into the
batch). So ``torch.compile(fullgraph=True)``, ``torch.export`` and ``torch.func`` see
one opaque operator instead of breaking at a NumPy call.

The autograd kernel is registered by hand rather than with
``torch.library.register_autograd``, whose wrapper rebuilds the schema's argument
list for every argument on every differentiable call (``fill_defaults``: 39 µs for
these nine arguments on the machine of the README's figures) and cannot run under
``torch.func.grad`` (pytorch/pytorch#170834). Here a single-level autograd Function
records the backward, as PyTorch's own fix for that issue does.

Importing this module registers the operators; ``attend.scaled_dot_product_attention``
imports it with the first tensor it is given, and ``import attend`` does when torch
is already imported. A program exported with these operators needs them registered
before ``torch.export.load``: ``import attend.ops`` first.

Every float dtype of PyTorch's CPU attention crosses to the kernels without a copy
where they can read it (DLPack, in ``attend._attend``): float32 and bfloat16 as they
are, float64 for the f64 reference; float16 is widened to float32 by PyTorch first
(the kernels have no float16 loads) and the results rounded back once.

The forward's autograd kernel, which the dispatcher calls on every call, is
``attend._attend.ForwardShortcut``: the common call (plain CPU tensors, no gradient
to record, no forward-mode AD or ``torch.func`` transform, no mask or a bool or
float32 one) goes from there to the compiled kernel without a Python frame; every
other call comes to ``_forward_autograd`` here. Below autograd, the CPU kernel is
called directly whenever the dispatcher would go straight to it, rather than through
a second trip into Python.
"""

import functools
import threading
from typing import Any, Optional

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor
from torch._C._functorch import (
    get_single_level_autograd_function_allowed,
    set_single_level_autograd_function_allowed,
)
from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw, has_guarding_hint
from torch.nn.attention.bias import CausalBias, CausalVariant

from . import _attend
from ._call import check_options, kind_error
from ._errors import AttendTypeError, AttendValueError
from ._threads import get_num_threads

_F32 = torch.finfo(torch.float32)
_is_grad_enabled = torch.is_grad_enabled
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The log-sum-exp's dtype for inputs of ``dtype``."""
    if dtype not in _FLOATS:
        raise AttendTypeError(
            f"query must be torch.float32, torch.bfloat16, torch.float16 or torch.float64, got {dtype}"
        )
    return torch.float64 if dtype is torch.float64 else torch.float32


def _kernel_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The mask as the kernels take it for queries of ``dtype``: bool, or an additive
    float32 mask, or float64 for float64 queries (the f64 reference adds it in f64)."""
    if mask.dtype is torch.bool or mask.dtype is torch.float32:
        return mask
    if mask.dtype is torch.float64 and dtype is torch.float64:
        return mask
    if mask.dtype is torch.float64:
        # attend's masks are float32: finite values beyond its range saturate, so
        # that float64's finfo.min still masks a score rather than becoming -inf
        # (which would zero a fully masked row that PyTorch averages).
        finite = mask.clamp(_F32.min, _F32.max)
        return torch.where(mask.isinf(), mask, finite).float()
    return mask.float()  # bfloat16 and float16 widen exactly


_LIB = torch.library.Library("attend", "DEF")
_ARGS = "Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, bool enable_gqa, Tensor? seed"
_LIB.define(
    f"scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, {_ARGS}) -> (Tensor, Tensor, Tensor)"
)
_LIB.define(
    "scaled_dot_product_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
    f"Tensor out, Tensor lse, Tensor lse_residual, {_ARGS}, bool mask_grad=False) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)

sdpa = torch.ops.attend.scaled_dot_product_attention.default
"""Attention forward: ``(query, key, value, attn_mask, dropout_p, is_causal, scale,
enable_gqa, seed) → (out [..., L, Ev], lse [..., L], lse_residual [..., L])``, ``out``
in the query's dtype, ``lse`` (each query's log-sum-exp, as PyTorch's) and
``lse_residual`` (what rounding ``lse`` left out, which the backward adds back) in
float32 (float64 for float64 queries, whose backward reads neither). ``seed``, an
int64 scalar tensor or ``None`` without dropout, picks the dropout pattern."""

sdpa_backward = torch.ops.attend.scaled_dot_product_attention_backward.default
"""Attention backward: ``(grad_out, query, key, value, out, lse, lse_residual,
attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, mask_grad=False) → (dq, dk,
dv, dmask)`` shaped
like ``query``, ``key`` and ``value`` (summed over the axes they were broadcast
along), and with ``mask_grad`` the gradient of a float ``attn_mask`` shaped and typed
like it (its scores' gradient ``dS``), else an empty tensor."""


@functools.lru_cache(maxsize=64)
def _options(dropout_p: float, is_causal: bool, scale: Optional[float], enable_gqa: bool) -> _attend.Options:
    """The compiled half's options for the shape rules; made once for each set."""
    return _attend.Options(is_causal=is_causal, scale=scale, dropout_p=dropout_p, enable_gqa=enable_gqa, seed=0)


def _forward_cpu(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed):
    if attn_mask is not None:
        attn_mask = _kernel_mask(attn_mask, query.dtype)
    return _attend.sdpa_forward_tensors(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, get_num_threads()
    )


def _backward_cpu(
    grad_out, query, key, value, out, lse, lse_residual, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed,
    mask_grad=False,
):
    kernel_mask = None if attn_mask is None else _kernel_mask(attn_mask, query.dtype)
    mask_grad = mask_grad and attn_mask is not None and attn_mask.is_floating_point()
    *grads, dmask = _attend.sdpa_backward_tensors(
        grad_out, query, key, value, out, lse, lse_residual, kernel_mask, dropout_p, is_causal, scale, enable_gqa,
        seed, get_num_threads(), mask_grad,
    )
    return (*grads, query.new_empty(0) if dmask is None else dmask.to(attn_mask.dtype))


def _shapes(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """``(out_shape, lse_shape)`` by the kernels' own shape rules, with their errors.

    The rules run on the sizes' hints (their values in the example the compiler
    traced); the shapes are then made of the arguments' own sizes, so that sizes the
    compiler keeps symbolic (``torch.compile(dynamic=True)``, ``torch.export`` with
    ``dynamic_shapes``) stay symbolic, under the equalities and divisibilities the
    rules rely on."""
    shapes = [query.shape, key.shape, value.shape, () if attn_mask is None else attn_mask.shape]
    hints = [[guarding_hint_or_throw(n) for n in shape] for shape in shapes[:3]]
    hints.append(_mask_hints(shapes[3], *hints))
    opts = _options(dropout_p, is_causal, scale, enable_gqa)
    out, lse, equal, divides = _attend.sdpa_shapes(*hints[:3], None if attn_mask is None else hints[3], opts)

    def size(source):
        return source if isinstance(source, int) else shapes[source[0]][source[1]]

    for a, b in equal:
        if isinstance(a, tuple) and a[0] == 3 and not has_guarding_hint(size(a)):
            continue  # an unbacked mask size: checked by the kernel (see _mask_hints)
        torch._check(size(a) == size(b))
    for multiple, divisor in divides:
        torch._check(size(multiple) % size(divisor) == 0)
    return [size(s) for s in out], [size(s) for s in lse]


def _mask_hints(mask_shape, q: list, k: list, v: list) -> list:
    """The mask's sizes for the shape rules. A size with no hint, one made from data
    under ``torch.export`` (``.item()``, ``nonzero()``: an unbacked size), is taken
    as that of the attention weights' axis it lies on, which the rules accept; the
    kernel checks its value when the program runs (a 1 broadcasts, as in PyTorch).
    The output's shape never depends on the mask's."""
    weights = []  # [..., L, S]; none for shapes the rules refuse
    if min(len(q), len(k), len(v)) >= 2:
        rank = max(len(q), len(k), len(v))
        leading = [[1] * (rank - len(s)) + s[:-2] for s in (q, k, v)]
        weights = [max(sizes) for sizes in zip(*leading)] + [q[-2], k[-2]]
    offset = len(weights) - len(mask_shape)
    return [
        guarding_hint_or_throw(n) if has_guarding_hint(n) else (weights[offset + j] if offset + j >= 0 else 1)
        for j, n in enumerate(mask_shape)
    ]


def _forward_fake(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed):
    out_shape, lse_shape = _shapes(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    lse_dtype = _lse_dtype(query.dtype)
    return query.new_empty(out_shape), query.new_empty(lse_shape, dtype=lse_dtype), query.new_empty(
        lse_shape, dtype=lse_dtype
    )


def _backward_fake(
    grad_out, query, key, value, out, lse, lse_residual, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed,
    mask_grad=False,
):
    _shapes(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    mask_grad = mask_grad and attn_mask is not None and attn_mask.is_floating_point()
    dmask = attn_mask.new_empty(attn_mask.shape) if mask_grad else query.new_empty(0)
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), dmask


_LIB.impl("scaled_dot_product_attention", _forward_cpu, "CPU")
_LIB.impl("scaled_dot_product_attention_backward", _backward_cpu, "CPU")
torch.library.register_fake("attend::scaled_dot_product_attention", _forward_fake, lib=_LIB)
torch.library.register_fake("attend::scaled_dot_product_attention_backward", _backward_fake, lib=_LIB)


def _save(ctx, inputs, output) -> None:
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, keyset = inputs
    out, lse, lse_residual = output
    ctx.save_for_backward(query, key, value, attn_mask, out, lse, lse_residual, seed)
    ctx.options = (dropout_p, is_causal, scale, enable_gqa)
    # The log-sum-exp has no gradient rule: using it in a loss must fail, not be ignored.
    ctx.mark_non_differentiable(lse, lse_residual)


def _gradients(ctx, grad_out):
    query, key, value, attn_mask, out, lse, lse_residual, seed = ctx.saved_tensors
    dropout_p, is_causal, scale, enable_gqa = ctx.options
    mask_grad = ctx.needs_input_grad[3]
    grads = sdpa_backward(
        grad_out, query, key, value, out, lse, lse_residual, attn_mask, dropout_p, is_causal, scale, enable_gqa,
        seed, mask_grad,
    )
    dq, dk, dv, dmask = (g if needed else None for g, needed in zip(grads, ctx.needs_input_grad[:4]))
    return dq, dk, dv, dmask, None, None, None, None, None, None


_CPU_KEYS = (
    torch._C.DispatchKeySet(torch._C.DispatchKey.CPU) | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradCPU)
).raw_repr()
"""The keyset of a call on plain CPU tensors with nothing else active."""


def _below_autograd(op, cpu_kernel, keyset, args):
    """``op`` past the autograd key: the next kernel for ``keyset``, as the
    dispatcher would have chosen without autograd. When that is the CPU kernel and
    nothing else lies between (no mode, subclass, functionalization, transform or
    other device in the keyset), it is called here without a second dispatch."""
    if keyset.raw_repr() == _CPU_KEYS:
        return cpu_kernel(*args)
    return _redispatch(op, keyset, args)


def _redispatch(op, keyset, args):
    """``op`` dispatched again below the autograd key."""
    with torch._C._AutoDispatchBelowAutograd():
        return op.redispatch(keyset & torch._C._after_autograd_keyset, *args)


def _records_grad(tensors) -> bool:
    """Whether autograd records a call on ``tensors`` (``None`` allowed):
    ``torch._C._any_requires_grad``, for the few tensors of these schemas at a
    fraction of its cost."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


class _Recording(threading.local):
    depth = 0
    """How many of attend's differentiable forwards this thread is inside (a class
    default, so that reading it never raises and catches an AttributeError)."""


_recording = _Recording()


def _recorded(function, args):
    """``function.apply(*args)`` with single-level Functions allowed, as
    ``torch._functorch.utils.enable_single_level_autograd_function`` allows them,
    without that context manager's generator (a microsecond a call)."""
    allowed = get_single_level_autograd_function_allowed()
    set_single_level_autograd_function_allowed(True)
    try:
        return function.apply(*args)
    finally:
        set_single_level_autograd_function_allowed(allowed)


class _Differentiable(torch.autograd.function._SingleLevelFunction):
    """The forward with its backward recorded. A single-level Function (what
    ``torch.func`` itself records a custom Function's backward with, one transform
    level at a time) in the ``forward(ctx, ...)`` form: it costs a quarter of the
    ``setup_context`` form's time to apply, and, unlike ``register_autograd``'s
    wrapper in PyTorch 2.15, runs under ``torch.func.grad``."""

    @staticmethod
    def forward(ctx, *args):  # type: ignore[override]
        _recording.depth += 1
        try:
            output = _below_autograd(sdpa, _forward_cpu, args[-1], args[:-1])
        finally:
            _recording.depth -= 1
        _save(ctx, args, output)
        return output

    @staticmethod
    def backward(ctx, grad_out, _grad_lse, _grad_lse_residual):  # type: ignore[override]
        return _gradients(ctx, grad_out)


def _has_tangent(args) -> bool:
    """Whether forward-mode AD (``torch.func.jvp``, ``jacfwd``) carries a tangent into
    the query, key, value or mask."""
    return any(fwAD.unpack_dual(t).tangent is not None for t in args[:4] if t is not None)


def _forward_autograd(keyset, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed):
    # Every call ForwardShortcut does not take comes here, differentiable ones
    # included: arguments by name and checks written out, as each Python call here
    # is a visible share of the operator's overhead.
    if fwAD._current_level >= 0 and _has_tangent((query, key, value, attn_mask)):
        raise AttendValueError(
            "attend has no forward-mode derivative (torch.func.jvp, jacfwd, hessian): "
            "use reverse mode (backward, torch.func.grad, jacrev)"
        )
    if _recording.depth and torch._C._are_functorch_transforms_active():
        # Reached again from inside a recording forward, for an outer torch.func
        # level (grad or jvp; vmap levels go through the vmap rule) that the
        # single-level Function hides: its derivative would silently be 0.
        raise AttendValueError(
            "attend differentiates at one torch.func level: nested torch.func.grad, "
            "jacrev, jvp or hessian over attend are not supported"
        )
    args = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed)
    if _is_grad_enabled() and (
        query.requires_grad
        or key.requires_grad
        or value.requires_grad
        or (attn_mask is not None and attn_mask.requires_grad)
    ):
        return _recorded(_Differentiable, (*args, keyset))
    if keyset.raw_repr() == _CPU_KEYS:  # _below_autograd's shortcut, one call sooner
        return _forward_cpu(*args)
    return _redispatch(sdpa, keyset, args)


class _NoSecondDerivative(torch.autograd.function._SingleLevelFunction):
    """The backward op when its result may be differentiated again (``create_graph``,
    nested ``torch.func.grad``): the gradients as usual, and an error, rather than a
    silent zero, if anything differentiates them."""

    @staticmethod
    def forward(ctx, *args):  # type: ignore[override]
        return _below_autograd(sdpa_backward, _backward_cpu, args[-1], args[:-1])

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        raise AttendValueError(
            "attend computes no second derivative of attention (double backward): "
            "use torch's scaled_dot_product_attention for it"
        )


def _backward_autograd(keyset, *args):
    if _records_grad(args[:8]):
        return _recorded(_NoSecondDerivative, (*args, keyset))
    return _below_autograd(sdpa_backward, _backward_cpu, keyset, args)


_LIB.impl(
    "scaled_dot_product_attention",
    _attend.ForwardShortcut(
        kernel=_forward_autograd,
        cpu_keys=_CPU_KEYS,
        forward_ad=fwAD,
        grad_enabled=torch.is_grad_enabled,
        transforms_active=torch._C._are_functorch_transforms_active,
        threads=get_num_threads,
    ),
    "Autograd",
    with_keyset=True,
)
_LIB.impl("scaled_dot_product_attention_backward", _backward_autograd, "Autograd", with_keyset=True)


def _lift(t: Optional[Tensor], dim: Optional[int], rank: int, batch_size: int, repeat: bool) -> Optional[Tensor]:
    """``t`` with the vmapped axis in front, then leading axes of 1 up to ``rank``
    axes besides it (as the shape rules would add them), so that the vmapped axes of
    all the arguments line up as one more batch axis. An unbatched tensor gets an
    axis of 1 there, or of ``batch_size`` (a stride-0 view) when ``repeat`` asks for
    a gradient per sample."""
    if t is None:
        return None
    t = t.movedim(dim, 0) if dim is not None else t.unsqueeze(0)
    t = t.reshape(t.shape[:1] + (1,) * max(0, rank - t.dim() + 1) + t.shape[1:])
    if dim is None and repeat:
        t = t.expand(batch_size, *t.shape[1:])
    return t


def _logical_rank(tensors, in_dims) -> int:
    """The output's rank without the vmapped axis: the highest of query, key, value."""
    return max(t.dim() - (d is not None) for t, d in zip(tensors, in_dims))


def _seed_for_vmap(info, seed: Optional[Tensor], seed_dim: Optional[int], dropout_p: float) -> Optional[Tensor]:
    """The one seed of a vmapped call. The samples are batch rows of one call, and
    attend's dropout pattern differs from row to row: ``randomness="different"``
    (each sample's seed then differs too; the first serves), never ``"same"``."""
    if not dropout_p:
        return seed
    if info.randomness == "same":
        raise AttendValueError(
            'attend\'s dropout gives every vmapped sample its own pattern: use torch.vmap(..., randomness="different")'
        )
    return seed if seed_dim is None else seed.select(seed_dim, 0)


def _forward_vmap(info, in_dims, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed):
    rank = _logical_rank((query, key, value), in_dims[:3])
    q, k, v, m = (_lift(t, d, rank, info.batch_size, False) for t, d in zip((query, key, value, attn_mask), in_dims))
    seed = _seed_for_vmap(info, seed, in_dims[8], dropout_p)
    return sdpa(q, k, v, m, dropout_p, is_causal, scale, enable_gqa, seed), (0, 0, 0)


def _backward_vmap(
    info, in_dims, grad_out, query, key, value, out, lse, lse_residual, attn_mask, dropout_p, is_causal, scale,
    enable_gqa, seed, mask_grad=False,
):
    rank = _logical_rank((query, key, value), in_dims[1:4])
    tensors = (grad_out, query, key, value, out, lse, lse_residual, attn_mask)
    ranks = (rank,) * 5 + (rank - 1, rank - 1, rank)  # the log-sum-exp lacks the output's last axis
    # Every input repeated to the batch, so that each sample gets its own gradient.
    g, q, k, v, o, l, r, m = (_lift(t, d, n, info.batch_size, True) for t, d, n in zip(tensors, in_dims, ranks))
    seed = _seed_for_vmap(info, seed, in_dims[12], dropout_p)
    grads = sdpa_backward(g, q, k, v, o, l, r, m, dropout_p, is_causal, scale, enable_gqa, seed, mask_grad)
    # The mask's gradient is batched like the mask was lifted; the empty one is not.
    return grads, (0, 0, 0, 0 if grads[3].numel() else None)


torch.library.register_vmap("attend::scaled_dot_product_attention", _forward_vmap, lib=_LIB)
torch.library.register_vmap("attend::scaled_dot_product_attention_backward", _backward_vmap, lib=_LIB)


def _check_tensor(name: str, t: Tensor) -> None:
    if t.dtype in _FLOATS and (t.is_cpu or t.is_meta) and t.layout is torch.strided:
        return
    if t.device.type not in ("cpu", "meta"):
        raise AttendValueError(f"attend runs on CPU tensors: {name} is on {t.device} (move it with .cpu())")
    if t.layout != torch.strided:
        raise AttendTypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    raise AttendTypeError(
        f"{name} must be torch.float32, torch.bfloat16, torch.float16 or torch.float64, got {t.dtype}"
    )


def _check_mask(mask: Any, dtype: torch.dtype) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor):
        raise AttendTypeError(f"attn_mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.device.type not in ("cpu", "meta"):
        raise AttendValueError(f"attend runs on CPU tensors: attn_mask is on {mask.device} (move it with .cpu())")
    floats = (torch.float32,) if dtype is torch.float32 else (torch.float32, dtype)
    if mask.dtype is not torch.bool and mask.dtype not in floats:
        names = " or ".join(str(d) for d in (torch.bool,) + floats)
        raise AttendTypeError(
            "Expected attn_mask dtype to be bool or float or to match query dtype, but got "
            f"attn_mask.dtype: {mask.dtype} and query.dtype: {dtype} (attn_mask must be {names})"
        )


def _causal_bias(mask: Any, is_causal: Any, query: Tensor) -> tuple:
    """``(attn_mask, is_causal)`` with a ``torch.nn.attention.bias.CausalBias`` mask
    made attend's causal attention, as PyTorch's CPU path makes it: the upper-left
    variant (and the lower-right one when ``L = S``, where the two agree) is
    ``is_causal=True``; the lower-right one with ``L ≠ S`` is the boolean mask it
    stands for."""
    if not isinstance(mask, CausalBias):
        return mask, is_causal
    if is_causal:
        raise AttendValueError("CausalBias should not be used with causal=True: the bias already is the causal mask")
    if mask.variant == CausalVariant.UPPER_LEFT or mask.seq_len_q == mask.seq_len_kv:
        return None, True
    return mask._materialize(query.device), False


def sdpa_torch(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> Tensor:
    """:func:`attend.scaled_dot_product_attention` on torch tensors: the arguments'
    kinds and dtypes checked, then one call of the operator."""
    if not (isinstance(query, Tensor) and isinstance(key, Tensor) and isinstance(value, Tensor)):
        raise kind_error(query, key, value, Tensor)
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t)
    if not query.dtype == key.dtype == value.dtype:
        raise AttendTypeError(
            "Expected query, key, and value to have the same dtype, but got "
            f"query.dtype: {query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead"
        )
    attn_mask, is_causal = _causal_bias(attn_mask, is_causal, query)
    _check_mask(attn_mask, query.dtype)
    dropout_p, scale = check_options(dropout_p, is_causal, scale, enable_gqa)
    seed = torch.randint(0, 2**63 - 1, (), dtype=torch.int64) if dropout_p else None
    # Numbers go in as check_options returns them (an int or float as given): under
    # torch.compile(dynamic=True), float() of a constant would trace a symbolic float
    # and restart the analysis.
    out, _, _ = sdpa(query, key, value, attn_mask, dropout_p, bool(is_causal), scale, bool(enable_gqa), seed)
    return out
