"""Ray Data: a corpus embedded across the cores of a machine or the nodes of a cluster.

``Embedder`` is a callable class for ``ray.data.Dataset.map_batches``: Ray starts a
pool of actors, each builds one ``SentenceEncoder`` when it starts and then embeds
batch after batch, adding the vectors as a column::

    import ray
    import attend.ray

    ds = ray.data.read_text("corpus.txt")                      # a "text" column
    ds = ds.map_batches(
        attend.ray.Embedder,
        fn_constructor_args=("~/.cache/attend/all-minilm-l6-v2",),
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=4),  # up to four encoders
        batch_size=512,
    )
    ds.write_parquet("embedded/")                              # text + embedding

Running it needs ``ray[data]`` (``pip install "attend[ray]"``); the module itself
imports Ray only to ask, inside a worker, how many CPUs the worker was given.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Union

from ._encoder import SentenceEncoder
from ._threads import set_num_threads

__all__ = ["Embedder"]


def _assigned_cpus() -> Optional[int]:
    """The CPUs Ray reserved for this worker (1 unless ``num_cpus=`` said more), or
    None outside a Ray worker."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    return max(1, int(cpus)) if cpus else None


class Embedder:
    """Embeds the ``column`` of each batch with one ``SentenceEncoder`` per worker.

    Args:
        model_dir: a sentence-transformers checkpoint directory, present at this
            path on every node that runs a worker.
        column: the column holding the texts (``str``).
        output_column: the column the ``float32 [rows, dim]`` vectors go in; it must
            not exist yet.
        batch_size: texts per forward pass inside one Ray batch (texts of similar
            length share one, as ``SentenceEncoder.encode`` sorts them).
        normalize_embeddings: scale each vector to unit length.
        num_threads: attend's threads in this worker; by default the CPUs Ray
            reserved for it (``num_cpus=`` of ``map_batches``, 1 if not given), so
            that the actors on a node share its cores instead of each taking all.

    Batches may be NumPy dicts (Ray Data's default ``batch_format``) or pandas
    DataFrames; the other columns pass through unchanged.
    """

    def __init__(
        self,
        model_dir: Union[str, os.PathLike],
        column: str = "text",
        output_column: str = "embedding",
        batch_size: int = 32,
        normalize_embeddings: bool = False,
        num_threads: Optional[int] = None,
    ) -> None:
        threads = num_threads if num_threads is not None else _assigned_cpus()
        if threads is not None:
            set_num_threads(threads)
        self.threads = threads
        self.encoder = SentenceEncoder(model_dir)
        self.column = column
        self.output_column = output_column
        self.batch_size = batch_size
        self.normalize_embeddings = normalize_embeddings

    def __call__(self, batch: Any) -> Any:
        """The batch with ``output_column`` added: row ``i``'s vector for row ``i``'s text."""
        if self.column not in batch:
            raise KeyError(f"attend.ray.Embedder: the batch has no column {self.column!r} (column= names the texts)")
        if self.output_column in batch:
            raise ValueError(
                f"attend.ray.Embedder: the batch already has a column {self.output_column!r}; "
                "pass output_column= to name another"
            )
        texts = list(batch[self.column])
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(
                    f"attend.ray.Embedder: column {self.column!r} row {i} holds {type(t).__name__}, not str"
                )
        vectors = self.encoder.encode(
            texts, batch_size=self.batch_size, normalize_embeddings=self.normalize_embeddings
        )
        if isinstance(batch, dict):
            out: Dict[str, Any] = dict(batch)
            out[self.output_column] = vectors
            return out
        if hasattr(batch, "assign"):  # pandas
            return batch.assign(**{self.output_column: list(vectors)})
        raise TypeError(
            f"attend.ray.Embedder takes NumPy-dict or pandas batches, got {type(batch).__name__} "
            '(use batch_format="numpy" or "pandas")'
        )

