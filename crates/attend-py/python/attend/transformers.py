"""attend as a transformers attention backend: ``attn_implementation="attend"``.

Usage::

    import attend.transformers; attend.transformers.register()
    model = AutoModel.from_pretrained(path, attn_implementation="attend")

Every model that goes through transformers' ``AttentionInterface`` (BERT, and
decoders such as Llama, Mistral or Qwen2 with grouped-query heads) then runs its
attention on attend's fused CPU kernels. The backend mirrors transformers' own
``sdpa_attention_forward``: the same masks (``register`` also registers the sdpa
mask format with ``AttentionMaskInterface``), the same ``is_causal`` rule, the same
folding of ``position_bias`` into the mask; grouped-query heads are read natively
(``enable_gqa=True``) rather than repeated. Float32 and bfloat16 models on the CPU
(``dtype=torch.bfloat16``: bf16 products and f32 sums, softmax statistics and
accumulators, the output rounded to bf16 once, as
:func:`attend.scaled_dot_product_attention` runs bf16 tensors); float16 and float64
models are refused with a ``TypeError``.

PyTorch's OpenMP threads spin for a few milliseconds after each operation and compete
with attend's threads for the cores; start Python with ``OMP_WAIT_POLICY=PASSIVE``
so that they sleep instead (the README's "From Python" has the measurements).
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple

try:
    import torch

    # Absolute imports: these name the real transformers package, never this module.
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface, PreTrainedModel
    from transformers.utils import logging as _hf_logging
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"attend.transformers needs torch and transformers>=4.56 (pip install 'attend[transformers]'): {e}"
    ) from e

try:  # continuous batching's paged cache (transformers >= 4.56); absent in some versions
    from transformers.generation.continuous_batching.cache import PagedAttentionCache as _PagedAttentionCache
except ImportError:  # pragma: no cover - depends on the transformers version
    _PagedAttentionCache = None

from ._sdpa import scaled_dot_product_attention

__all__ = ["NAME", "attend_attention_forward", "attend_mask", "is_registered", "register"]

NAME = "attend"
"""The ``attn_implementation`` name ``register()`` makes available."""

_logger = _hf_logging.get_logger(__name__)

# The dtypes attend's kernels run: float32, and bfloat16 (bf16 products, f32 sums).
# float16 and float64 would reach attend.scaled_dot_product_attention's widening and
# reference paths, a copy per call or a slow f64 kernel: not what a model wants.
_DTYPES = (torch.float32, torch.bfloat16)

# Options whose semantics attend's kernels do not have: refused rather than ignored.
_UNSUPPORTED = {
    "softcap": "logit soft-capping (softcap)",
    "s_aux": "attention sinks (s_aux)",
    "sinks": "attention sinks (sinks)",
}


def _position_bias_mask(
    position_bias: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    is_causal: bool,
    query: torch.Tensor,
    key: torch.Tensor,
) -> torch.Tensor:
    """``position_bias`` and the mask (or causality) as one additive float mask,
    exactly as transformers' ``create_position_bias_mask`` builds it for sdpa
    (masked entries get the dtype's minimum, not -inf)."""
    min_dtype = torch.finfo(key.dtype).min
    if attention_mask is None:
        if is_causal:
            q_length, kv_length = query.shape[2], key.shape[2]
            causal = torch.arange(q_length, device=key.device)[:, None] >= torch.arange(kv_length, device=key.device)
            mask = torch.where(causal.view(1, 1, q_length, kv_length), position_bias, min_dtype)
        else:
            mask = position_bias
    elif attention_mask.dtype == torch.bool:
        mask = torch.where(attention_mask, position_bias, min_dtype)
    else:
        mask = position_bias + attention_mask
    return mask.contiguous()


def attend_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    position_bias: Optional[torch.Tensor] = None,
    cache: Any = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, None]:
    """One attention layer for transformers, with ``sdpa_attention_forward``'s calling
    convention, on :func:`attend.scaled_dot_product_attention`.

    Args:
        module: the attention module (read for ``is_causal`` when the call does not say,
            and ``layer_idx`` for a paged cache).
        query: ``[B, H, L, D]`` float32 or bfloat16.
        key: ``[B, Hkv, S, D]``; ``H`` a multiple of ``Hkv`` (grouped-query heads are
            read natively, not repeated).
        value: ``[B, Hkv, S, Dv]``.
        attention_mask: sdpa's format (bool, ``True`` = attend, or an additive float
            mask) broadcastable to ``[B, H, L, S]``, or ``None``.
        dropout: attention dropout probability (transformers passes 0 in eval mode).
        scaling: multiplies ``q·k``; ``None`` for ``1/√D``.
        is_causal: overrides ``module.is_causal``; causality is only applied as a flag
            when there are several queries and no mask (the mask already encodes it
            otherwise), as sdpa does.
        position_bias: an additive ``[B or 1, H, L, S]`` bias (T5-style), folded into
            the mask as sdpa does. attend computes no gradient for it: a learned bias
            that requires grad is refused in training mode (``ValueError``) and
            detached, with a warning, in eval mode.
        cache: a continuous-batching ``PagedAttentionCache``, updated here as sdpa does.
        **kwargs: the model's other attention kwargs. ``softcap``, ``s_aux`` and
            ``sinks`` are refused (``ValueError``) when set; ``output_attentions``
            warns, as sdpa does, and no weights are returned.

    Returns:
        ``(attn_output [B, L, H, Dv] contiguous, None)``.
    """
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise ValueError(
                f'attn_implementation="{NAME}" does not support {what}: use attn_implementation="eager" for this model'
            )
    if kwargs.get("output_attentions", False):
        _logger.warning_once(
            f'attn_implementation="{NAME}" does not return attention weights (output_attentions=True): '
            'use attn_implementation="eager" to get them'
        )
    if query.dtype not in _DTYPES:
        raise TypeError(
            f'attn_implementation="{NAME}" runs float32 and bfloat16 models only, got {query.dtype} '
            "(load the model with dtype=torch.float32 or dtype=torch.bfloat16)"
        )

    # A paged cache is updated before anything else, as sdpa does. (transformers 5.23's
    # continuous batching refuses custom implementations, so this is not reached yet.)
    if _PagedAttentionCache is not None and isinstance(cache, _PagedAttentionCache):
        key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)

    q_length = query.shape[2]
    kv_length = key.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # sdpa's rule: the flag only when prefilling (several queries) without a mask; a
    # single query sees every cached key, and a given mask already holds causality.
    is_causal = bool(q_length > 1 and attention_mask is None and is_causal)

    # Prefill against an empty static cache: the keys past q_length are all masked by
    # causality (top-left aligned), so they are dropped, as sdpa does.
    if is_causal and kv_length > q_length:
        key = key[:, :, :q_length, :]
        value = value[:, :, :q_length, :]
        if position_bias is not None:
            position_bias = position_bias[:, :, :, :q_length]

    if position_bias is not None:
        if position_bias.requires_grad and torch.is_grad_enabled():
            # attend computes no gradient for the mask, so none for a learned bias (T5's
            # relative_attention_bias): refused in training, detached (and said) in eval.
            if module.training:
                raise ValueError(
                    f'attn_implementation="{NAME}" computes no gradient for a learned position_bias: '
                    'train this model with attn_implementation="sdpa" or "eager" (inference works)'
                )
            _logger.warning_once(
                f'attn_implementation="{NAME}" computes no gradient for position_bias: '
                "its parameters get none if you backpropagate through this eval-mode model"
            )
            position_bias = position_bias.detach()
        attention_mask = _position_bias_mask(position_bias, attention_mask, is_causal, query, key)
        is_causal = False

    # sdpa broadcasts the batch (e.g. learned queries with batch 1); expand is a view.
    if query.shape[0] != key.shape[0]:
        batch = torch.broadcast_shapes(query.shape[:1], key.shape[:1])[0]
        query = query.expand(batch, *query.shape[1:])
        key = key.expand(batch, *key.shape[1:])
        value = value.expand(batch, *value.shape[1:])

    attn_output = scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        is_causal=is_causal,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return attn_output.transpose(1, 2).contiguous(), None


_USES_INTERFACE: Dict[type, bool] = {}


def _uses_attention_interface(config: Any) -> bool:
    """Whether the model family of ``config`` runs its attention through
    ``AttentionInterface``; ``True`` when that cannot be told.

    transformers accepts any registered ``attn_implementation`` for every model, but
    families with attention code of their own (MPNet, Bloom, ...) never call the
    backend and add its boolean masks to their scores as if they were additive: their
    outputs would be silently wrong. A family counts as using the interface when its
    modeling module imports ``ALL_ATTENTION_FUNCTIONS`` or declares a model with
    ``_supports_attention_backend`` (composite models whose inner model attends).
    """
    cls = type(config)
    known = _USES_INTERFACE.get(cls)
    if known is not None:
        return known
    module = sys.modules.get(cls.__module__.replace(".configuration_", ".modeling_"))
    if module is None or module.__name__ == cls.__module__:
        uses = True
    else:
        uses = "ALL_ATTENTION_FUNCTIONS" in vars(module) or any(
            isinstance(obj, type)
            and issubclass(obj, PreTrainedModel)
            and obj.__module__ == module.__name__
            and getattr(obj, "_supports_attention_backend", False)
            for obj in vars(module).values()
        )
    _USES_INTERFACE[cls] = uses
    return uses


def attend_mask(*args: Any, **kwargs: Any) -> Optional[torch.Tensor]:
    """transformers' sdpa mask format (``sdpa_mask``: boolean, ``True`` = attend, or
    ``None`` when the ``is_causal`` flag or no mask suffices), after refusing model
    families that would never call :func:`attend_attention_forward`."""
    config = kwargs.get("config")
    if config is not None and not _uses_attention_interface(config):
        raise ValueError(
            f'attn_implementation="{NAME}" cannot run {type(config).__name__.removesuffix("Config")} models: '
            "their attention does not go through transformers' AttentionInterface "
            '(and would misread its masks): load them with attn_implementation="eager"'
        )
    return sdpa_mask(*args, **kwargs)


def register() -> None:
    """Make ``attn_implementation="attend"`` available to every transformers model
    that supports attention backends. Idempotent.

    Registers :func:`attend_attention_forward` with ``AttentionInterface`` and the
    sdpa mask format (:func:`attend_mask`: boolean, ``True`` = attend, or ``None``
    when ``is_causal`` or no mask suffices) with ``AttentionMaskInterface``; without
    the latter, transformers would hand the backend no mask and padded batches would
    be wrong. Models whose attention bypasses the interface (MPNet, Bloom, ...) raise
    ``ValueError`` on their first forward instead of running eager code on the wrong
    masks.
    """
    AttentionInterface.register(NAME, attend_attention_forward)
    AttentionMaskInterface.register(NAME, attend_mask)


def is_registered() -> bool:
    """Whether ``register()`` has made ``"attend"`` known to both interfaces."""
    return (
        AttentionInterface._global_mapping.get(NAME) is attend_attention_forward
        and AttentionMaskInterface._global_mapping.get(NAME) is attend_mask
    )
