from typing import List, Optional, Tuple, Union

import numpy as np

__version__: str

def isa() -> str: ...
_Qkv = Tuple[np.ndarray, np.ndarray, np.ndarray]

class Options:
    """A call's options; refuses a dropout probability outside [0, 1)."""

    def __init__(
        self, *, is_causal: bool, scale: Optional[float], dropout_p: float, enable_gqa: bool, seed: int
    ) -> None: ...

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

def sdpa_backward(
    inputs: _Qkv,
    mask: Optional[np.ndarray],
    saved: Tuple[np.ndarray, np.ndarray],
    dout: np.ndarray,
    options: Options,
    threads: int,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dq, dk, dv)`` shaped like ``inputs`` from ``saved = (out, lse)`` and ``dout``."""

def sdpa_forward_bf16(
    inputs: _Qkv, mask: Optional[np.ndarray], options: Options, threads: int
) -> Tuple[np.ndarray, np.ndarray]:
    """As ``sdpa_forward`` on int16 arrays of bfloat16 bits; ``out`` as bits, ``lse`` float32."""

def sdpa_backward_bf16(
    inputs: _Qkv,
    mask: Optional[np.ndarray],
    saved: Tuple[np.ndarray, np.ndarray],
    dout: np.ndarray,
    options: Options,
    threads: int,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As ``sdpa_backward`` on bfloat16 bits; the gradients as bfloat16 bits."""

def sdpa_forward_f64(
    inputs: _Qkv, mask: Optional[np.ndarray], options: Options, threads: int
) -> Tuple[np.ndarray, np.ndarray]:
    """As ``sdpa_forward`` on float64 arrays, by the f64 reference."""

def sdpa_backward_f64(
    inputs: _Qkv,
    mask: Optional[np.ndarray],
    saved: Tuple[np.ndarray, np.ndarray],
    dout: np.ndarray,
    options: Options,
    threads: int,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As ``sdpa_backward`` on float64 arrays, by the f64 reference."""

class SentenceEncoder:
    def __init__(self, model_dir: str, precision: str = "f32", threads: int = 1) -> None: ...
    @property
    def precision(self) -> str: ...
    def embed(self, texts: List[str], threads: int) -> Tuple[np.ndarray, List[str]]: ...
    @property
    def dimension(self) -> int: ...
    @property
    def max_seq_length(self) -> int: ...
    @property
    def normalizes(self) -> bool: ...
    def token_counts(self, texts: List[str]) -> List[int]: ...

class Walkthrough:
    def steps(self) -> List[Tuple[str, str, np.ndarray]]: ...
    @property
    def text(self) -> str: ...
    @property
    def tokens(self) -> List[str]: ...
    def svg(self) -> str: ...
    def html(self) -> str: ...

def explain_experiment(**kwargs: object) -> Walkthrough: ...
def explain_model(model: str, text: str, *, layer: int, head: int) -> Walkthrough: ...
