from typing import Any, Callable, List, Optional, Tuple, Union, final

import numpy as np

__all__ = [
    "__version__",
    "SMALL_WORK",
    "Options",
    "sdpa_shapes",
    "sdpa_forward",
    "sdpa_forward_tensors",
    "sdpa_backward_tensors",
    "ForwardShortcut",
    "isa",
    "explain_experiment",
    "explain_model",
    "SentenceEncoder",
    "Walkthrough",
]
__version__: str
SMALL_WORK: int
"""Multiply-adds under which a call runs on the calling thread, whatever thread count it asks for."""

def isa() -> str: ...
_Qkv = Tuple[np.ndarray, np.ndarray, np.ndarray]

@final
class Options:
    """A call's options; refuses a dropout probability outside [0, 1] (1 drops every weight)."""

    def __new__(
        cls, *, is_causal: bool, scale: Optional[float], dropout_p: float, enable_gqa: bool, seed: int
    ) -> Options: ...

_Source = Union[int, Tuple[int, int]]

def sdpa_shapes(
    query: List[int], key: List[int], value: List[int], mask: Optional[List[int]], options: Options
) -> Tuple[List[_Source], List[_Source], List[Tuple[_Source, _Source]], List[Tuple[_Source, _Source]]]:
    """``(out, lse, equal, divides)`` of a call from its shapes alone, or its error:
    where each size of the output and of the log-sum-exp comes from (``(argument,
    axis)``, 0 query, 1 key, 2 value, 3 mask, or 1), the pairs of sizes the call needs
    equal and the ``(multiple, divisor)`` pairs."""

def sdpa_forward(
    inputs: _Qkv, mask: Optional[np.ndarray], options: Options, threads: int
) -> Tuple[np.ndarray, np.ndarray]:
    """float32 ``(query, key, value)`` (any rank, any strides) → ``(out, lse)``."""

def sdpa_forward_tensors(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Optional[Any],
    dropout_p: float,
    is_causal: bool,
    scale: Optional[float],
    enable_gqa: bool,
    seed: Optional[Any],
    threads: int,
) -> Tuple[Any, Any, Any]:
    """The CPU kernel of ``torch.ops.attend.scaled_dot_product_attention`` on CPU
    tensors (float32, bfloat16 or float64; the mask bool or float32), read in place:
    ``(out, lse, lse_residual)`` as new tensors."""

def sdpa_backward_tensors(
    grad_out: Any,
    query: Any,
    key: Any,
    value: Any,
    out: Any,
    lse: Any,
    lse_residual: Any,
    attn_mask: Optional[Any],
    dropout_p: float,
    is_causal: bool,
    scale: Optional[float],
    enable_gqa: bool,
    seed: Optional[Any],
    threads: int,
    mask_grad: bool = False,
) -> Tuple[Any, Any, Any, Optional[Any]]:
    """The CPU kernel of ``torch.ops.attend.scaled_dot_product_attention_backward``:
    ``(dq, dk, dv)`` as new tensors shaped like ``query``, ``key`` and ``value``, and
    with ``mask_grad`` the additive mask's gradient shaped like it (else ``None``)."""

@final
class ForwardShortcut:
    """The forward operator's autograd kernel for the common case (plain CPU
    tensors, no forward-mode AD, no functorch transform); every other call goes to
    ``kernel``."""

    def __new__(
        cls,
        *,
        kernel: Callable[..., Any],
        cpu_keys: int,
        forward_ad: Any,
        grad_enabled: Callable[[], bool],
        transforms_active: Callable[[], bool],
        threads: Callable[[], int],
    ) -> ForwardShortcut: ...
    def __call__(self, *args: Any) -> Any: ...

@final
class SentenceEncoder:
    def __new__(cls, model_dir: str, precision: str = "f32", threads: int = 1) -> SentenceEncoder: ...
    @property
    def precision(self) -> str: ...
    def embed(self, texts: List[str], threads: int) -> Tuple[np.ndarray, List[str]]: ...
    @property
    def dimension(self) -> int: ...
    @property
    def max_seq_length(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def normalizes(self) -> bool: ...
    def token_counts(self, texts: List[str]) -> List[int]: ...
    def embed_ids(self, sequences: List[List[int]], threads: int) -> np.ndarray: ...

@final
class Walkthrough:
    def steps(self) -> List[Tuple[str, str, np.ndarray]]: ...
    @property
    def text(self) -> str: ...
    @property
    def tokens(self) -> List[str]: ...
    def svg(self) -> str: ...
    def html(self) -> str: ...
    def page(self) -> str: ...

def explain_experiment(
    *,
    input: Optional[np.ndarray] = None,
    sentence: Optional[str] = None,
    tokens: Optional[np.ndarray] = None,
    vocab_size: Optional[int] = None,
    embed_dim: Optional[int] = None,
    padding_idx: Optional[int] = None,
    seed: Optional[int] = None,
    reseed: Optional[int] = None,
    skip_draws: int = 0,
    init: str = "linear",
    wq: Optional[np.ndarray] = None,
    wk: Optional[np.ndarray] = None,
    wv: Optional[np.ndarray] = None,
    d_out: Optional[int] = None,
    d_k: Optional[int] = None,
    d_v: Optional[int] = None,
    heads: int = 1,
    qkv: str = "separate",
    bias: bool = False,
    out_proj: bool = False,
    causal: bool = False,
    window: Optional[Tuple[int, int]] = None,
    mask_padding: bool = False,
    softmax_dim: str = "keys",
    scale: Optional[float] = None,
) -> Walkthrough: ...
def explain_model(model: str, text: str, *, layer: int, head: int) -> Walkthrough: ...
