"""The OpenAI embeddings API on the wire, apart from any web framework: a request's
JSON body in, the inputs to embed out; vectors in, the response's JSON out; every
refusal as an ``APIError`` carrying OpenAI's status and error object. ``attend.ray``'s
Ray Serve deployment speaks HTTP through it.

The shapes follow OpenAI's reference for ``POST /v1/embeddings`` and
``GET /v1/models``: ``input`` is a string, a list of strings, a list of token ids or
a list of such lists; ``encoding_format`` is ``"float"`` or ``"base64"`` (the
little-endian float32 bytes of each vector, as OpenAI sends them and its client
decodes them); ``dimensions`` keeps the first that many entries and scales them back
to unit length. Token ids are ids of the served model's vocabulary.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import numpy as np

__all__ = ["APIError", "EmbeddingsRequest", "parse_embeddings_request", "embeddings_response", "models_response"]

MAX_INPUTS = 2048
"""OpenAI's limit on the inputs of one request."""


class APIError(Exception):
    """A refusal, sent as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> Dict[str, Any]:
        """The JSON object OpenAI sends with this status."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def model_not_found(name: object) -> APIError:
    """OpenAI's answer to a model it does not serve."""
    return APIError(
        404,
        f"The model `{name}` does not exist or you do not have access to it.",
        code="model_not_found",
    )


@dataclass(frozen=True)
class EmbeddingsRequest:
    """What one ``POST /v1/embeddings`` asks for: either ``texts`` or ``token_ids``."""

    texts: Optional[List[str]]
    token_ids: Optional[List[List[int]]]
    encoding_format: str
    dimensions: Optional[int]

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or [])


def parse_embeddings_request(
    body: bytes, *, model: str, dimension: int, max_tokens: int, vocab_size: int
) -> EmbeddingsRequest:
    """The request in ``body``, checked against the served model: its name, its
    embedding width ``dimension``, the most tokens it takes and the size of its
    vocabulary (token ids run from 0 to ``vocab_size - 1``, ``max_tokens`` at most
    to a sequence). Raises ``APIError`` naming what is wrong."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"We could not parse the JSON body of your request: {e}") from None
    if not isinstance(payload, dict):
        raise APIError(400, f"The request body must be a JSON object, got {_json_type(payload)}")
    if "model" not in payload:
        raise APIError(400, "you must provide a model parameter", param="model")
    if payload["model"] != model:
        raise model_not_found(payload["model"])
    if "input" not in payload:
        raise APIError(400, "'input' is a required property", param="input")
    texts, token_ids = _inputs(payload["input"], max_tokens, vocab_size)
    encoding_format = payload.get("encoding_format")
    if encoding_format is None:
        encoding_format = "float"
    if encoding_format not in ("float", "base64"):
        raise APIError(
            400,
            f"'encoding_format' must be 'float' or 'base64', got {json.dumps(encoding_format)}",
            param="encoding_format",
        )
    dimensions = payload.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= dimension
    ):
        raise APIError(
            400,
            f"'dimensions' must be an integer from 1 to {dimension} (this model's width), "
            f"got {json.dumps(dimensions)}",
            param="dimensions",
        )
    return EmbeddingsRequest(texts, token_ids, encoding_format, dimensions)


def _inputs(
    value: object, max_tokens: int, vocab_size: int
) -> "tuple[Optional[List[str]], Optional[List[List[int]]]]":
    """``input`` as texts or as token-id sequences (exactly one is not None)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise APIError(
            400,
            "'input' must be a non-empty string, a non-empty array of strings, "
            f"an array of token ids or an array of such arrays, got {_describe(value)}",
            param="input",
        )
    if len(value) > MAX_INPUTS:
        raise APIError(400, f"'input' holds {len(value)} items; at most {MAX_INPUTS} are allowed", param="input")
    if all(isinstance(v, str) for v in value):
        for i, v in enumerate(value):
            if not v:
                raise APIError(400, f"'input[{i}]' is an empty string", param="input")
        return value, None
    if all(_is_int(v) for v in value):
        _check_ids("'input'", value, max_tokens, vocab_size)
        return None, [value]
    if all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            if not all(_is_int(t) for t in ids):
                raise APIError(400, f"'input[{i}]' must be an array of token ids, got {_describe(ids)}", param="input")
            _check_ids(f"'input[{i}]'", ids, max_tokens, vocab_size)
        return None, value
    raise APIError(
        400,
        "'input' must be all strings, all token ids or all arrays of token ids, "
        f"got a mix ({', '.join(sorted({_json_type(v) for v in value}))})",
        param="input",
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ids(name: str, ids: List[int], max_tokens: int, vocab_size: int) -> None:
    if not 1 <= len(ids) <= max_tokens:
        raise APIError(
            400,
            f"{name} holds {len(ids)} token ids; this model takes 1 to {max_tokens}",
            param="input",
        )
    for j, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise APIError(
                400,
                f"{name} has token id {t} at position {j}; this model's ids run from 0 to {vocab_size - 1}",
                param="input",
            )


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _describe(value: object) -> str:
    if isinstance(value, (list, str)) and not value:
        return "an empty " + _json_type(value)
    if isinstance(value, list):
        return "an array of " + ", ".join(sorted({_json_type(v) for v in value}))
    return "a " + _json_type(value) if value is not None else "null"


def embeddings_response(
    vectors: np.ndarray, request: EmbeddingsRequest, model: str, prompt_tokens: int
) -> Dict[str, Any]:
    """The response body for ``vectors`` (``float32 [n, d]``, row ``i`` for input
    ``i``), cut to ``request.dimensions`` and rescaled to unit length when it asks."""
    if request.dimensions is not None:
        cut = np.ascontiguousarray(vectors[:, : request.dimensions])
        norms = np.linalg.norm(cut, axis=1, keepdims=True)
        vectors = cut / np.maximum(norms, np.float32(1e-12))
    rows = np.asarray(vectors, dtype="<f4")
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(row, request.encoding_format)}
        for i, row in enumerate(rows)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def _encoded(row: np.ndarray, encoding_format: str) -> Union[str, List[float]]:
    if encoding_format == "base64":
        return base64.b64encode(row.tobytes()).decode("ascii")
    return row.tolist()


def models_response(model: str, created: int) -> Dict[str, Any]:
    """``GET /v1/models``: the one model served."""
    return {"object": "list", "data": [model_object(model, created)]}


def model_object(model: str, created: int) -> Dict[str, Any]:
    """OpenAI's description of a model (``GET /v1/models/{model}``)."""
    return {"id": model, "object": "model", "created": created, "owned_by": "attend"}
