"""``attend.SentenceEncoder``: sentence-transformers' ``encode`` on attend's encoders
(BERT, DistilBERT, RoBERTa, XLM-RoBERTa, MPNet)."""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, List, Optional, Sequence, Union

import numpy as np

from . import _attend
from ._threads import get_num_threads

_log = logging.getLogger("attend")


def _progress(total: int, enabled: bool):
    """A progress bar over ``total`` sentences: tqdm's when installed, else none."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Batches", unit="sentence")


class SentenceEncoder:
    """A sentence-transformers checkpoint directory (e.g. all-MiniLM-L6-v2 or
    all-mpnet-base-v2; ``model_type`` bert, distilbert, roberta, xlm-roberta or mpnet)
    run by attend's own encoder: no torch needed.

    ``precision="bf16"`` runs the encoder's dense layers as PyTorch's autocast to
    bf16 does (weights and inputs rounded to bf16, f32 sums; ``vdpbf16ps`` where
    the CPU has AVX512-BF16): about twice as fast there, with vectors within a
    cosine of 0.999 of f32's. ``precision="int8"`` quantizes their weights to int8
    at load (one scale per output) and each token's inputs to bytes at run time,
    with exact integer sums (``vpdpbusd`` where the CPU has AVX512-VNNI): vectors
    within a cosine of about 0.998 of f32's (docs/int8.md). The vectors are
    float32 either way.

    Example::

        enc = attend.SentenceEncoder("~/.cache/attend/all-minilm-l6-v2")
        vectors = enc.encode(["A cat sat on the mat.", "Dogs bark."])   # (2, 384) float32
        fast = attend.SentenceEncoder("~/.cache/attend/all-minilm-l6-v2", precision="bf16")
    """

    def __init__(self, model_dir: Union[str, os.PathLike], precision: str = "f32") -> None:
        path = os.path.expanduser(os.fspath(model_dir))
        self._inner = _attend.SentenceEncoder(path, precision, get_num_threads())
        self.model_dir = path

    @property
    def precision(self) -> str:
        """The precision of the encoder's dense products: ``"f32"``, ``"bf16"`` or ``"int8"``."""
        return self._inner.precision

    @property
    def dimension(self) -> int:
        """The embedding width (384 for all-MiniLM-L6-v2, 768 for all-mpnet-base-v2;
        a Dense module's output width when the checkpoint has one)."""
        return self._inner.dimension

    def get_embedding_dimension(self) -> int:
        """The embedding width, under sentence-transformers' name."""
        return self._inner.dimension

    get_sentence_embedding_dimension = get_embedding_dimension

    @property
    def vocab_size(self) -> int:
        """The number of token ids the model knows (``encode_ids`` takes 0 to one less)."""
        return self._inner.vocab_size

    @property
    def max_seq_length(self) -> int:
        """Texts longer than this many tokens are truncated, as sentence-transformers does."""
        return self._inner.max_seq_length

    def encode(
        self,
        sentences: Union[str, Sequence[str]],
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
        normalize_embeddings: bool = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        truncate_dim: Optional[int] = None,
        prompt: Optional[str] = None,
    ):
        """Sentence embeddings, with ``SentenceTransformer.encode``'s arguments and results.

        Args:
            sentences: one text or a sequence of texts.
            batch_size: texts per forward pass. Texts are sorted by length first, as
                sentence-transformers sorts them, so that a batch pads little.
            show_progress_bar: a tqdm bar over the texts (when tqdm is installed).
            normalize_embeddings: scale each vector to unit length.
            convert_to_numpy: return one ``np.ndarray`` (else a list of 1-D arrays).
            convert_to_tensor: return one ``torch.Tensor`` (needs torch).
            truncate_dim: keep the first ``truncate_dim`` dimensions (before normalising).
            prompt: text put in front of every sentence.

        Returns:
            ``float32`` ``[n, d]`` (``[d]`` for a single string).
        """
        single = isinstance(sentences, str)
        texts: List[str] = [sentences] if single else list(_strings(sentences))
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if truncate_dim is not None and (
            isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or truncate_dim < 1
        ):
            raise ValueError(f"truncate_dim must be a positive int or None, got {truncate_dim!r}")
        if prompt:
            texts = [prompt + t for t in texts]

        order = np.argsort([-len(t) for t in texts], kind="stable")
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        bar = _progress(len(texts), bool(show_progress_bar))
        threads = get_num_threads()
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            batch, warnings = self._inner.embed([texts[i] for i in idx], threads)
            vectors[idx] = batch
            for w in warnings:
                _log.info(w)
            if bar is not None:
                bar.update(len(idx))
        if bar is not None:
            bar.close()

        if truncate_dim is not None:
            vectors = np.ascontiguousarray(vectors[:, :truncate_dim])
        if normalize_embeddings:
            vectors = _normalized(vectors)
        if convert_to_tensor:
            import torch

            result = torch.from_numpy(vectors)
            return result[0] if single else result
        if not convert_to_numpy:
            rows = list(vectors)
            return rows[0] if single else rows
        return vectors[0] if single else vectors

    def encode_ids(
        self,
        sequences: Sequence[Sequence[int]],
        batch_size: int = 32,
        normalize_embeddings: bool = False,
    ) -> np.ndarray:
        """Sentence embeddings of texts already tokenised: each sequence holds token ids
        of the model's vocabulary, special tokens included (as the checkpoint's
        tokenizer gives them), and is embedded as it is, without truncation.

        Args:
            sequences: lists of ids, each 1 to ``max_seq_length`` long.
            batch_size: sequences per forward pass, sorted by length as in ``encode``.
            normalize_embeddings: scale each vector to unit length.

        Returns:
            ``float32`` ``[n, d]``; the vector of a text's ids equals ``encode``'s of
            the text.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        seqs = [_token_ids(i, s, self.max_seq_length, self._inner.vocab_size) for i, s in enumerate(sequences)]
        order = np.argsort([-len(s) for s in seqs], kind="stable")
        vectors = np.empty((len(seqs), self.dimension), dtype=np.float32)
        threads = get_num_threads()
        for start in range(0, len(seqs), batch_size):
            idx = order[start : start + batch_size]
            vectors[idx] = self._inner.embed_ids([seqs[i] for i in idx], threads)
        return _normalized(vectors) if normalize_embeddings else vectors

    def count_tokens(self, sentences: Sequence[str]) -> List[int]:
        """The number of tokens ``encode`` runs for each text: special tokens
        included, after truncation to ``max_seq_length``."""
        return self._inner.token_counts(list(_strings(sentences)))


def _normalized(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit length (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(1e-12))


def _token_ids(index: int, ids: Sequence[int], max_len: int, vocab_size: int) -> List[int]:
    """Sequence ``index`` as a list of ints, checked: 1 to ``max_len`` ids, each
    from 0 to ``vocab_size - 1``."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"sequences[{index}] must be a list of token ids, got {type(ids).__name__}")
    out = list(ids)
    if not 1 <= len(out) <= max_len:
        raise ValueError(f"sequences[{index}] has {len(out)} token ids; it must have 1 to {max_len} (max_seq_length)")
    for j, t in enumerate(out):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab_size:
            raise ValueError(
                f"sequences[{index}][{j}] must be a token id from 0 to {vocab_size - 1} "
                f"(the vocabulary's size is {vocab_size}), got {t!r}"
            )
    return [int(t) for t in out]


def _strings(items: Any) -> Iterable[str]:
    """The texts of ``sentences``: a sequence of ``str``, each checked."""
    if isinstance(items, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"sentences must be a str or a sequence of str, got {type(items).__name__} (decode it first: .decode())"
        )
    if not isinstance(items, Iterable):
        raise TypeError(f"sentences must be a str or a sequence of str, got {type(items).__name__}")
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise TypeError(f"sentences[{i}] must be a str, got {type(t).__name__}")
        yield t
