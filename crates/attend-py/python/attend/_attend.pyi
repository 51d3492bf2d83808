from typing import List, Optional, Tuple

import numpy as np

__version__: str

def isa() -> str: ...
def sdpa_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    mask: Optional[np.ndarray] = ...,
    bias: Optional[np.ndarray] = ...,
    causal: bool = ...,
    scale: Optional[float] = ...,
    dropout_p: float = ...,
    seed: int = ...,
    threads: int = ...,
) -> Tuple[np.ndarray, np.ndarray]: ...
def sdpa_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    dout: np.ndarray,
    *,
    mask: Optional[np.ndarray] = ...,
    bias: Optional[np.ndarray] = ...,
    causal: bool = ...,
    scale: Optional[float] = ...,
    dropout_p: float = ...,
    seed: int = ...,
    threads: int = ...,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]: ...

class SentenceEncoder:
    def __init__(self, model_dir: str) -> None: ...
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
