"""attend.ray's Ray Serve deployment on a local Ray cluster (two CPUs, two replicas of
half a CPU each), reached over HTTP on loopback with the official ``openai`` client.

The tolerance. all-MiniLM-L6-v2 ends in a Normalize module, so every vector is unit
length and every entry at most 1 in magnitude. The server's vectors and
sentence-transformers' are two float32 evaluations of the same six-layer network,
each a few float32 roundings per product away from the exact vector; the issue's
1e-5 on unit vectors is about 80 float32 ulps of 1, room for those roundings through
six layers (test_ray.py measures their actual size: a few 1e-7) and not for any
mistake that changes a vector (a wrong token, a wrong pooling, a swapped row).

The test stops by itself: the cluster is shut down in the fixture's teardown, each
wait has a deadline, and the client's requests time out.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

import attend.ray  # noqa: E402
from conftest import REPO  # noqa: E402

TOL = 1e-5
NAME = "all-minilm-l6-v2"
DEPLOY_TIMEOUT_S = 300
TEXTS = [
    "A cat sat on the mat.",
    "Dogs bark at the postman every single morning.",
    "attention",
    "The bank raised its rates because inflation did not cross the river. " * 3,
    # 400 words: more than the model's 256 tokens, so the server truncates as
    # sentence-transformers does.
    " ".join(["encoders embed every sentence quickly"] * 80),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(model_dir):
    """The base URL of the application, deployed with ``build_app`` (as Serve's
    command line and config files do) under the name ``NAME``."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = attend.ray.build_app(
            {"model_dir": str(model_dir), "model_name": NAME, "num_replicas": "2", "num_cpus": "0.5"}
        )
        # serve.run waits until every replica is up, without a deadline of its own.
        deployed = threading.Thread(target=serve.run, args=(app,), kwargs={"route_prefix": "/"}, daemon=True)
        deployed.start()
        deployed.join(DEPLOY_TIMEOUT_S)
        assert not deployed.is_alive(), f"the deployment was not running after {DEPLOY_TIMEOUT_S} s"
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="not-checked", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(model_dir) -> np.ndarray:
    """sentence-transformers' float32 vectors of ``TEXTS``."""
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(model_dir), device="cpu")
    return model.encode(TEXTS, convert_to_numpy=True)


@pytest.fixture(scope="module")
def token_counts(model_dir) -> list[int]:
    """Each text's tokens by the checkpoint's own tokenizer (transformers'),
    special tokens included, truncated to the model's 256."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    return [len(ids) for ids in tok(TEXTS, truncation=True, max_length=256)["input_ids"]]


def post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    return _send(req)


def get(url: str) -> tuple[int, dict]:
    return _send(urllib.request.Request(url, method="GET"))


def _send(req: urllib.request.Request) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def assert_openai_error(body: dict, param) -> dict:
    """``body`` is OpenAI's error object; returns its ``error``."""
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert error["param"] == param, error
    return error


def test_float_equals_sentence_transformers(client, reference, token_counts):
    resp = client.embeddings.create(model=NAME, input=TEXTS, encoding_format="float")
    assert resp.object == "list" and resp.model == NAME
    assert [d.index for d in resp.data] == list(range(len(TEXTS)))
    assert all(d.object == "embedding" for d in resp.data)
    got = np.array([d.embedding for d in resp.data], dtype=np.float64)
    assert got.shape == reference.shape
    worst = float(np.abs(got - reference).max())
    print(f"float: max |server - sentence-transformers| = {worst:.3g}")
    assert worst <= TOL
    assert resp.usage.prompt_tokens == sum(token_counts) == resp.usage.total_tokens


def test_base64_equals_sentence_transformers(client, reference):
    resp = client.embeddings.create(model=NAME, input=TEXTS, encoding_format="base64")
    # Asked for base64, the client hands the strings over as they came.
    got = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in resp.data])
    assert got.shape == reference.shape
    assert float(np.abs(got - reference).max()) <= TOL
    # Asked for nothing, the client requests base64 itself and decodes it to floats.
    default = client.embeddings.create(model=NAME, input=TEXTS[0])
    assert len(default.data) == 1
    np.testing.assert_array_equal(np.asarray(default.data[0].embedding, dtype=np.float32), got[0])


def test_dimensions_truncate_and_renormalise(client, reference):
    resp = client.embeddings.create(model=NAME, input=TEXTS, encoding_format="float", dimensions=64)
    got = np.array([d.embedding for d in resp.data])
    want = reference[:, :64] / np.linalg.norm(reference[:, :64], axis=1, keepdims=True)
    assert got.shape == (len(TEXTS), 64)
    assert float(np.abs(got - want).max()) <= TOL


def test_token_ids_equal_their_texts(client, model_dir, reference):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    ids = tok(TEXTS[:3])["input_ids"]
    many = client.embeddings.create(model=NAME, input=ids, encoding_format="float")
    got = np.array([d.embedding for d in many.data])
    assert float(np.abs(got - reference[:3]).max()) <= TOL
    assert many.usage.prompt_tokens == sum(len(s) for s in ids)
    one = client.embeddings.create(model=NAME, input=ids[1], encoding_format="float")
    assert len(one.data) == 1
    assert float(np.abs(np.array(one.data[0].embedding) - reference[1]).max()) <= TOL


def test_unknown_model_is_model_not_found(client, server):
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="text-embedding-3-small", input="hello")
    assert caught.value.status_code == 404
    assert caught.value.code == "model_not_found"
    status, body = post(server + "/v1/embeddings", json.dumps({"model": "nope", "input": "x"}).encode())
    assert status == 404
    error = assert_openai_error(body, None)
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
    assert "`nope`" in error["message"]


def test_models_route(client, server):
    assert [m.id for m in client.models.list().data] == [NAME]
    status, body = get(server + "/v1/models/" + NAME)
    assert status == 200 and body["id"] == NAME and body["object"] == "model"
    status, body = get(server + "/v1/models/other")
    assert status == 404 and assert_openai_error(body, None)["code"] == "model_not_found"


@pytest.mark.parametrize(
    "body, param, says",
    [
        (b"{not json", None, "could not parse the JSON body"),
        (b"[1, 2]", None, "must be a JSON object, got array"),
        (json.dumps({"input": "x"}).encode(), "model", "provide a model"),
        (json.dumps({"model": NAME}).encode(), "input", "'input' is a required property"),
        (json.dumps({"model": NAME, "input": []}).encode(), "input", "got an empty array"),
        (json.dumps({"model": NAME, "input": ""}).encode(), "input", "'input[0]' is an empty string"),
        (json.dumps({"model": NAME, "input": ["a", 3]}).encode(), "input", "got a mix (number, string)"),
        (json.dumps({"model": NAME, "input": [[101, 102], [101, -4]]}).encode(), "input", "'input[1]' has token id -4 at position 1; this model's ids run from 0 to 30521"),
        (json.dumps({"model": NAME, "input": [101, 30522]}).encode(), "input", "'input' has token id 30522 at position 1"),
        (json.dumps({"model": NAME, "input": [[1], list(range(1, 300))]}).encode(), "input", "'input[1]' holds 299 token ids; this model takes 1 to 256"),
        (json.dumps({"model": NAME, "input": [[101], []]}).encode(), "input", "'input[1]' holds 0 token ids"),
        (json.dumps({"model": NAME, "input": [[101], ["a"]]}).encode(), "input", "'input[1]' must be an array of token ids, got an array of string"),
        (json.dumps({"model": NAME, "input": ["x"] * 2049}).encode(), "input", "at most 2048"),
        (json.dumps({"model": NAME, "input": "x", "encoding_format": "int8"}).encode(), "encoding_format", "int8"),
        (json.dumps({"model": NAME, "input": "x", "dimensions": 385}).encode(), "dimensions", "from 1 to 384"),
        (json.dumps({"model": NAME, "input": "x", "dimensions": True}).encode(), "dimensions", "got true"),
    ],
)
def test_bad_requests_get_openai_errors(server, body, param, says):
    status, answer = post(server + "/v1/embeddings", body)
    assert status == 400, answer
    error = assert_openai_error(answer, param)
    assert error["type"] == "invalid_request_error"
    assert says in error["message"], error["message"]


def test_unknown_routes_and_methods(server):
    status, body = get(server + "/v1/embeddings")
    assert status == 405 and "takes POST" in assert_openai_error(body, None)["message"]
    status, body = post(server + "/v1/chat/completions", b"{}")
    assert status == 404 and assert_openai_error(body, None)["message"] == "Invalid URL (POST /v1/chat/completions)"


def test_both_replicas_answer(client):
    def replica(i: int) -> str:
        raw = client.embeddings.with_raw_response.create(model=NAME, input=f"text {i}", encoding_format="float")
        raw.parse()
        return raw.headers["x-attend-replica"]

    seen: set[str] = set()
    deadline = time.monotonic() + 120
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for start in range(0, 400, 8):
            seen.update(pool.map(replica, range(start, start + 8)))
            if len(seen) == 2 or time.monotonic() > deadline:
                break
    assert len(seen) == 2, f"answers came from {sorted(seen)} only"
    status = serve.status().applications["default"].deployments["attend-embeddings"]
    assert status.replica_states == {"RUNNING": 2}


def test_docs_config_file_is_one_serve_accepts():
    yaml = pytest.importorskip("yaml")
    from ray.serve.schema import ServeDeploySchema

    page = (REPO / "docs" / "serving.md").read_text()
    block = re.search(r"```yaml\n# serve deploy serve.yaml\n(.*?)```", page, re.S).group(1)
    config = ServeDeploySchema.model_validate(yaml.safe_load(block))
    (app,) = config.applications
    assert app.import_path == "attend.ray:build_app"
    built = attend.ray.build_app(app.args)
    options = built._bound_deployment
    assert options.num_replicas == 4 and options.ray_actor_options["num_cpus"] == 2.0
    with pytest.raises(ValueError, match="unknown argument.*num_gpus"):
        attend.ray.build_app({**app.args, "num_gpus": "1"})
    with pytest.raises(ValueError, match="num_replicas='four' is not a valid value"):
        attend.ray.build_app({**app.args, "num_replicas": "four"})
