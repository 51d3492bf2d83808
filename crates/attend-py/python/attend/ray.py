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

Ray Serve: the OpenAI embeddings API (``POST /v1/embeddings``, ``GET /v1/models``)
over replicas that each hold one ``SentenceEncoder`` on as many threads as the CPUs
Ray gave the replica. ``embeddings_app`` builds the application; Serve routes each
request to a replica, which batches the requests waiting for it into one
``encode`` call::

    from ray import serve
    import attend.ray

    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(attend.ray.embeddings_app("~/.cache/attend/all-minilm-l6-v2",
                                        num_replicas=2, num_cpus=1), route_prefix="/")
    # any OpenAI client: base_url="http://127.0.0.1:8000/v1", model="all-minilm-l6-v2"

The served model name is the directory's last component unless ``model_name=``
says otherwise; a request naming another model gets OpenAI's 404
``model_not_found``. ``build_app`` is the same application for Serve's config files
and command line (``serve run attend.ray:build_app model_dir=DIR num_replicas=2``).
docs/serving.md shows a deployment.

Running it needs ``ray[data]`` or ``ray[serve]`` (``pip install "attend[ray]"``); the
module itself imports Ray only where it is used (inside a worker, or to build the
Serve application), so ``Embedder`` and ``OpenAIEmbeddings`` also run without it.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, Union

from ._encoder import SentenceEncoder
from ._openai import APIError, EmbeddingsRequest, embeddings_response, model_not_found, model_object
from ._openai import models_response, parse_embeddings_request
from ._threads import set_num_threads

if TYPE_CHECKING:
    from ray.serve import Application

__all__ = ["Embedder", "OpenAIEmbeddings", "embeddings_app", "build_app"]


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



class OpenAIEmbeddings:
    """A Ray Serve deployment's class: the OpenAI embeddings API on one
    ``SentenceEncoder``. Serve calls it with each HTTP request (a Starlette
    ``Request``); ``embeddings_app`` wraps it in a deployment.

    Routes: ``POST /v1/embeddings``, ``GET /v1/models``, ``GET /v1/models/{model}``;
    anything else is OpenAI's 404 (or 405 for a known route's wrong method). Every
    error is JSON in OpenAI's shape. Each response names the replica that made it in
    the ``x-attend-replica`` header.

    Args:
        model_dir: a sentence-transformers checkpoint directory, present at this
            path on every node that runs a replica.
        model_name: the name clients pass as ``model``; by default the directory's
            last component (``all-minilm-l6-v2``).
        precision: ``"f32"``, ``"bf16"`` or ``"int8"``, as ``SentenceEncoder``'s.
        num_threads: attend's threads in this replica; by default the CPUs Ray
            reserved for it (``num_cpus``, at least 1).
        batch_size: texts per forward pass.
        max_batch_requests: requests waiting on a replica that one ``encode`` call
            serves together.
        batch_wait_s: how long a request waits for others to share its call.
    """

    def __init__(
        self,
        model_dir: Union[str, os.PathLike],
        model_name: Optional[str] = None,
        precision: str = "f32",
        num_threads: Optional[int] = None,
        batch_size: int = 32,
        max_batch_requests: int = 32,
        batch_wait_s: float = 0.002,
    ) -> None:
        threads = num_threads if num_threads is not None else _assigned_cpus()
        if threads is not None:
            set_num_threads(threads)
        self.threads = threads
        self.encoder = SentenceEncoder(model_dir, precision)
        self.model_name = model_name or os.path.basename(os.path.normpath(self.encoder.model_dir))
        self.batch_size = batch_size
        self.created = int(time.time())
        self.replica = _replica_tag()
        self._embed_batched = _batched(self._embed_many, max_batch_requests, batch_wait_s)

    async def __call__(self, request: Any) -> Any:
        """The HTTP response (a Starlette ``Response``) to ``request``."""
        from starlette.responses import JSONResponse

        try:
            status, body = await self.respond(request.method, _route_path(request.scope), request.body)
        except Exception as e:  # every failure, a bug included, is answered in OpenAI's shape
            error = APIError(500, f"attend: internal error: {type(e).__name__}: {e}", type="server_error")
            status, body = error.status, error.body()
        headers = {"x-attend-replica": self.replica} if self.replica else None
        return JSONResponse(body, status_code=status, headers=headers)

    async def respond(self, method: str, path: str, read_body: Any) -> Tuple[int, Dict[str, Any]]:
        """``(status, JSON body)`` for ``method path``; ``read_body`` is awaited for
        the request's bytes when the route takes a body."""
        path = path.rstrip("/") or "/"
        try:
            if path == "/v1/embeddings":
                _allow(method, "POST", path)
                return 200, await self._embeddings(await read_body())
            if path == "/v1/models":
                _allow(method, "GET", path)
                return 200, models_response(self.model_name, self.created)
            if path.startswith("/v1/models/"):
                _allow(method, "GET", path)
                name = path[len("/v1/models/") :]
                if name != self.model_name:
                    raise model_not_found(name)
                return 200, model_object(self.model_name, self.created)
            raise APIError(404, f"Invalid URL ({method} {path})")
        except APIError as e:
            return e.status, e.body()

    async def _embeddings(self, body: bytes) -> Dict[str, Any]:
        req = parse_embeddings_request(
            body,
            model=self.model_name,
            dimension=self.encoder.dimension,
            max_tokens=self.encoder.max_seq_length,
            vocab_size=self.encoder.vocab_size,
        )
        vectors, tokens = await self._embed_batched(req)
        return embeddings_response(vectors, req, self.model_name, tokens)

    async def _embed_many(self, requests: List[EmbeddingsRequest]) -> List[Tuple[Any, int]]:
        """Each request's ``(vectors, prompt tokens)``, from one ``encode`` call for
        all their texts and one ``encode_ids`` call for all their token ids, run off
        the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._embed_many_blocking, requests)

    def _embed_many_blocking(self, requests: List[EmbeddingsRequest]) -> List[Tuple[Any, int]]:
        out: List[Any] = [None] * len(requests)
        kinds = (
            ("texts", self._encode_texts, self.encoder.count_tokens),
            ("token_ids", self._encode_ids, lambda seqs: [len(s) for s in seqs]),
        )
        for field, encode, count in kinds:
            members = [i for i, r in enumerate(requests) if getattr(r, field) is not None]
            items = [x for i in members for x in getattr(requests[i], field)]
            if not items:
                continue
            vectors, counts = encode(items), count(items)
            start = 0
            for i in members:
                stop = start + len(requests[i])
                out[i] = (vectors[start:stop], sum(counts[start:stop]))
                start = stop
        return out

    def _encode_texts(self, texts: List[str]) -> Any:
        return self.encoder.encode(texts, batch_size=self.batch_size)

    def _encode_ids(self, sequences: List[List[int]]) -> Any:
        return self.encoder.encode_ids(sequences, batch_size=self.batch_size)


def _allow(method: str, allowed: str, path: str) -> None:
    if method != allowed:
        raise APIError(405, f"Method {method} is not allowed for {path}; it takes {allowed}")


def _route_path(scope: Mapping[str, Any]) -> str:
    """The request's path below the application's route prefix."""
    path, root = scope.get("path", "/"), scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _replica_tag() -> Optional[str]:
    """The Serve replica this code runs in, or None outside one."""
    try:
        from ray import serve
        from ray.serve.exceptions import RayServeException
    except ImportError:
        return None
    try:
        return serve.get_replica_context().replica_tag
    except RayServeException:
        return None


def _batched(handler: Any, max_requests: int, wait_s: float) -> Any:
    """``handler`` (an async function of a list) as an async function of one item:
    inside a Serve replica through Serve's request batching, which gathers the
    items that arrive within ``wait_s`` (at most ``max_requests``) into one call;
    elsewhere one call per item."""
    if _replica_tag() is None:

        async def one(item: Any) -> Any:
            return (await handler([item]))[0]

        return one
    from ray import serve

    return serve.batch(max_batch_size=max_requests, batch_wait_timeout_s=wait_s)(handler)


def embeddings_app(
    model_dir: Union[str, os.PathLike],
    *,
    model_name: Optional[str] = None,
    precision: str = "f32",
    num_replicas: Union[int, str] = 1,
    num_cpus: float = 1.0,
    batch_size: int = 32,
    max_ongoing_requests: int = 64,
    **deployment_options: Any,
) -> "Application":
    """The Ray Serve application serving ``model_dir`` through ``OpenAIEmbeddings``:
    ``num_replicas`` replicas (or ``"auto"``), each reserving ``num_cpus`` CPUs and
    running attend on that many threads (at least one). ``deployment_options`` go to
    ``serve.deployment`` (e.g. ``autoscaling_config``). Deploy it with
    ``serve.run(app, route_prefix="/")``."""
    from ray import serve

    deployment = serve.deployment(
        OpenAIEmbeddings,
        name="attend-embeddings",
        num_replicas=num_replicas,
        ray_actor_options={"num_cpus": num_cpus},
        max_ongoing_requests=max_ongoing_requests,
        **deployment_options,
    )
    return deployment.bind(
        os.fspath(model_dir), model_name=model_name, precision=precision, batch_size=batch_size
    )


_BUILD_ARGS = {
    "model_dir": str,
    "model_name": str,
    "precision": str,
    "num_replicas": lambda v: v if v == "auto" else int(v),
    "num_cpus": float,
    "batch_size": int,
    "max_ongoing_requests": int,
}


def build_app(args: Mapping[str, Any]) -> "Application":
    """``embeddings_app`` from Serve's application arguments (the ``key=value``
    pairs of ``serve run attend.ray:build_app``, or a config file's ``args``), which
    arrive as strings: ``model_dir`` (required), ``model_name``, ``precision``,
    ``num_replicas``, ``num_cpus``, ``batch_size``, ``max_ongoing_requests``."""
    unknown = sorted(set(args) - set(_BUILD_ARGS))
    if unknown:
        raise ValueError(f"attend.ray.build_app: unknown argument(s) {', '.join(unknown)}; it takes {', '.join(_BUILD_ARGS)}")
    if "model_dir" not in args:
        raise ValueError("attend.ray.build_app: model_dir=DIR is required")
    kwargs: Dict[str, Any] = {}
    for key, value in args.items():
        try:
            kwargs[key] = _BUILD_ARGS[key](value)
        except ValueError:
            raise ValueError(f"attend.ray.build_app: {key}={value!r} is not a valid value") from None
    return embeddings_app(kwargs.pop("model_dir"), **kwargs)
