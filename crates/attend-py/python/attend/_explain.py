"""``attend.explain``: the notebooks' walkthrough, as objects a notebook can show."""

from __future__ import annotations

import html
import os
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from . import _attend

_MODEL_ONLY = ("layer", "head", "text")

_COUNTS = ("vocab_size", "embed_dim", "seed", "reseed", "skip_draws", "d_out", "d_k", "d_v", "heads", "layer", "head")
"""The arguments the compiled half takes as unsigned integers: a negative one would
reach it as an ``OverflowError`` that names no argument."""


def _check_counts(arguments: Dict[str, Any]) -> None:
    """Refuses a count (or a ``window`` side) that is not an int of 0 or more."""
    window = arguments.get("window")
    sides = [("window", side) for side in window] if isinstance(window, (tuple, list)) else []
    for name, value in [(name, arguments.get(name)) for name in _COUNTS] + sides:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be 0 or more, got {value}")


class Explanation:
    """Every intermediate of one attention computation.

    Attributes are the steps' names (``x``, ``w_q``, ``q``, ``k``, ``v``, ``scores``,
    ``scaled``, ``weights``, ``context``, …) as NumPy arrays; ``str()`` is the
    PyTorch-style walkthrough ``attend explain`` prints; in Jupyter the object shows
    the heatmaps and the walkthrough page (:meth:`page`).
    """

    def __init__(self, walkthrough: Any) -> None:
        self._walkthrough = walkthrough
        self.steps: List[tuple] = walkthrough.steps()
        self.arrays: Dict[str, np.ndarray] = {key: value for key, _, value in self.steps}
        self.tokens: List[str] = walkthrough.tokens

    def __getattr__(self, name: str) -> np.ndarray:
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        raise AttributeError(f"no step named {name!r}; the steps are {', '.join(arrays)}")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.arrays))

    def __str__(self) -> str:
        return self._walkthrough.text

    def __repr__(self) -> str:
        return f"<attend.Explanation of {len(self.tokens)} tokens: {', '.join(self.arrays)}>"

    def svg(self) -> str:
        """The heatmaps as one SVG picture."""
        return self._walkthrough.svg()

    def html(self) -> str:
        """The self-contained HTML attention view (save it, or open it in a browser)."""
        return self._walkthrough.html()

    def page(self) -> str:
        """The walkthrough as one self-contained HTML page, every number linked to the
        numbers it is made of (what ``attend explain --html`` writes)."""
        return self._walkthrough.page()

    def _repr_html_(self) -> str:
        # The page has its own script and styles: an iframe keeps them from touching
        # the notebook's.
        page = html.escape(self.page(), quote=True)
        return (
            f'<div class="attend-explanation">{self.svg()}'
            f'<iframe srcdoc="{page}" style="width:100%;height:760px;border:0" '
            f'title="attend explain walkthrough"></iframe></div>'
        )


def _tokens_array(tokens: Union[str, Sequence]) -> np.ndarray:
    """``"1,2,0;1,2,3"`` (the command line's form) or nested lists, as ``[B, T]`` ids."""
    if isinstance(tokens, str):
        try:
            rows = [[int(t) for t in row.split(",")] for row in tokens.split(";")]
        except ValueError:
            raise ValueError(f"tokens: {tokens!r} is not ids separated by ',' and rows by ';'") from None
    else:
        rows = tokens
    try:
        ids = np.array(rows, dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        raise ValueError("tokens must be rows of integer ids of equal length") from None
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise ValueError(f"tokens must be [T] or [B, T] ids, got shape {ids.shape}")
    return ids


def _float_array(name: str, value, rank: Optional[int] = None) -> np.ndarray:
    try:
        a = np.asarray(value, dtype=np.float32)
    except (ValueError, TypeError):
        raise ValueError(f"{name} must be a (nested) array of numbers") from None
    if rank is not None and a.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {a.shape}")
    return a


def explain(
    *,
    model: Optional[Union[str, os.PathLike]] = None,
    text: Optional[str] = None,
    layer: Optional[int] = None,
    head: Optional[int] = None,
    input=None,
    sentence: Optional[str] = None,
    tokens=None,
    wq=None,
    wk=None,
    wv=None,
    **flags: Any,
) -> Explanation:
    """One attention computation, step by step, as ``attend explain`` does it.

    Notebook experiments take the command line's flags as keyword arguments
    (``--d-out`` is ``d_out``; choices keep their spelling, e.g. ``init="uniform-out-in"``)::

        attend.explain(input=[[1.16, 0.23], [0.57, 1.36], [4.41, -2.16]], seed=42, d_out=2)
        attend.explain(sentence="Life is short, eat dessert first", embed_dim=16, seed=123,
                       reseed=123, init="uniform-out-in", heads=3, d_k=72, d_v=84, skip_draws=1216)

    A real model's head: ``attend.explain(model=DIR, text="...", layer=2, head=3)``.

    Flags: input, sentence, tokens, vocab_size, embed_dim, padding_idx, seed, reseed,
    skip_draws, init, wq/wk/wv, d_out, d_k, d_v, heads, qkv, bias, out_proj, causal,
    window (``(left, right)``), mask_padding, softmax_dim, scale.
    """
    _check_counts({"layer": layer, "head": head, **flags})
    if model is not None:
        given = [k for k, v in (("input", input), ("sentence", sentence), ("tokens", tokens), ("wq", wq)) if v is not None]
        given += sorted(flags)
        if given:
            raise ValueError(f"{', '.join(given)} do(es) not apply with model=: a real model has its own weights and input")
        if text is None or layer is None or head is None:
            raise ValueError("model= needs text=, layer= and head=")
        path = os.path.expanduser(os.fspath(model))
        return Explanation(_attend.explain_model(path, text, layer=layer, head=head))
    stray = [name for name, v in (("text", text), ("layer", layer), ("head", head)) if v is not None]
    if stray:
        raise ValueError(f"{', '.join(stray)} only apply with model=")
    arrays: Dict[str, Any] = {}
    if input is not None:
        arrays["input"] = _float_array("input", input)
    if tokens is not None:
        arrays["tokens"] = _tokens_array(tokens)
    for name, w in (("wq", wq), ("wk", wk), ("wv", wv)):
        if w is not None:
            arrays[name] = _float_array(name, w, rank=2)
    try:
        walkthrough = _attend.explain_experiment(sentence=sentence, **arrays, **flags)
    except TypeError as e:
        if "unexpected keyword argument" in str(e):
            raise TypeError(f"explain: {e}; the arguments are attend explain's flags") from None
        raise
    return Explanation(walkthrough)
