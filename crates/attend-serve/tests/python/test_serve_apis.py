"""`attend serve`'s two APIs against the libraries their clients use: the official
`openai` client on /v1/embeddings (float and base64) and TEI-shaped requests on
/embed, /embed_all, /tokenize and /info, each answer compared with
sentence-transformers (or transformers' tokenizer) on the same model.

The tolerance, 1e-5: attend's float32 encoder against sentence-transformers'
float32 PyTorch, the same arithmetic in another order. The outputs are unit
vectors of 384 entries, so each entry's rounding error is a few float32 ulps of
numbers below 1 per layer, accumulated over six layers (the Rust model tests hold
attend to about 1e-6 of the same vectors); 1e-5 leaves a factor of ten.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
import requests

openai = pytest.importorskip("openai")
st = pytest.importorskip("sentence_transformers")

TEXTS = [
    "A cat sat on the mat.",
    "Dogs bark at the postman every morning.",
    "The bank raised its interest rates again.",
    "x",
    "Attention is all you need, " * 20,
]
TOL = 1e-5


@pytest.fixture(scope="module")
def reference(model_dir):
    return st.SentenceTransformer(str(model_dir), device="cpu")


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_float_and_base64_match_sentence_transformers(shared, reference, model_dir):
    want = reference.encode(TEXTS, convert_to_numpy=True)
    name = model_dir.name
    # "float", and the client's default, which asks for base64 and decodes it.
    for fmt in ("float", None, "base64"):
        kwargs = {"encoding_format": fmt} if fmt else {}
        got = client(shared).embeddings.create(model=name, input=TEXTS, **kwargs)
        if fmt == "base64":  # asked for explicitly, the client hands the string over
            vectors = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in got.data])
        else:
            vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
        assert [d.index for d in got.data] == list(range(len(TEXTS)))
        assert vectors.shape == want.shape
        assert np.abs(vectors - want).max() < TOL, fmt
        tokens = sum(len(reference.tokenizer(t, truncation=True, max_length=256)["input_ids"]) for t in TEXTS)
        assert got.usage.prompt_tokens == tokens and got.usage.total_tokens == tokens
        assert got.model == name


def test_openai_inputs_of_every_form(shared, reference, model_dir):
    tok = reference.tokenizer
    ids = [tok(t)["input_ids"] for t in TEXTS[:2]]
    want = reference.encode(TEXTS[:2], convert_to_numpy=True)
    url = shared.url + "/v1/embeddings"
    one = requests.post(url, json={"input": TEXTS[0]}).json()
    assert np.abs(np.array(one["data"][0]["embedding"]) - want[0]).max() < TOL
    single_ids = requests.post(url, json={"input": ids[0]}).json()
    assert np.abs(np.array(single_ids["data"][0]["embedding"]) - want[0]).max() < TOL
    many_ids = requests.post(url, json={"input": ids}).json()
    got = np.array([d["embedding"] for d in many_ids["data"]])
    assert np.abs(got - want).max() < TOL


def test_dimensions_truncate_and_renormalise(shared, reference):
    full = reference.encode(TEXTS[:2], convert_to_numpy=True)
    want = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    got = client(shared).embeddings.create(model="all-minilm-l6-v2", input=TEXTS[:2], dimensions=64)
    vectors = np.array([d.embedding for d in got.data])
    assert vectors.shape == (2, 64)
    assert np.abs(vectors - want).max() < TOL
    tei = np.array(requests.post(shared.url + "/embed", json={"inputs": TEXTS[:2], "dimensions": 64}).json())
    assert np.abs(tei - want).max() < TOL
    bad = requests.post(shared.url + "/v1/embeddings", json={"input": "x", "dimensions": 385})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "dimensions"


def test_a_wrong_model_name_is_openais_404(shared):
    with pytest.raises(openai.NotFoundError) as e:
        client(shared).embeddings.create(model="text-embedding-3-small", input="hi")
    body = e.value.response.json()
    assert body["error"]["code"] == "model_not_found"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    models = requests.get(shared.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["all-minilm-l6-v2"]


def test_tei_embed_normalize_truncate_and_direction(shared, reference, model_dir):
    want = reference.encode(TEXTS, convert_to_numpy=True)
    got = requests.post(shared.url + "/embed", json={"inputs": TEXTS})
    assert got.status_code == 200
    for header in ("x-compute-time", "x-compute-tokens", "x-queue-time", "x-inference-time", "x-tokenization-time"):
        assert header in got.headers, header
    assert np.abs(np.array(got.json()) - want).max() < TOL
    # normalize: false skips the model's Normalize module: the mean-pooled vector.
    tokens = reference.encode(TEXTS[:2], output_value="token_embeddings", convert_to_numpy=False)
    pooled = np.stack([t.numpy().mean(axis=0) for t in tokens])
    unnormalized = np.array(requests.post(shared.url + "/embed", json={"inputs": TEXTS[:2], "normalize": False}).json())
    assert np.abs(np.linalg.norm(unnormalized, axis=1) - 1).max() > 1e-3
    assert np.abs(unnormalized - pooled).max() < 1e-4  # unnormalised, |x| up to ~1
    # A text over 256 tokens: refused with its token count when truncate is false.
    long = "word " * 400
    refused = requests.post(shared.url + "/embed", json={"inputs": long, "truncate": False})
    assert refused.status_code == 422
    body = refused.json()
    assert body["error_type"] == "Validation" and "402 tokens" in body["error"] and "256" in body["error"]
    # truncation_direction Left keeps the last tokens: the same as embedding them.
    tok = reference.tokenizer
    text = " ".join(f"w{i}" for i in range(300))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tail = [tok.cls_token_id] + ids[-254:] + [tok.sep_token_id]
    left = requests.post(shared.url + "/embed", json={"inputs": text, "truncate": True, "truncation_direction": "Left"})
    by_ids = requests.post(shared.url + "/embed", json={"inputs": [tail]})
    assert left.status_code == 200 and by_ids.status_code == 200
    assert np.abs(np.array(left.json()) - np.array(by_ids.json())).max() < TOL


def test_tei_embed_all_and_tokenize(shared, reference):
    got = requests.post(shared.url + "/embed_all", json={"inputs": TEXTS[:2]}).json()
    want = reference.encode(TEXTS[:2], output_value="token_embeddings", convert_to_numpy=False)
    for g, w in zip(got, want):
        g = np.array(g)
        assert g.shape == tuple(w.shape)
        assert np.abs(g - w.numpy()).max() < 1e-4  # unnormalised hidden states, |x| up to ~10
    pieces = requests.post(shared.url + "/tokenize", json={"inputs": ["Hello world"]}).json()
    ids = [p["id"] for p in pieces[0]]
    assert ids == reference.tokenizer("Hello world")["input_ids"]
    assert pieces[0][0]["special"] and pieces[0][0]["start"] is None
    assert pieces[0][1]["text"] == "hello" and (pieces[0][1]["start"], pieces[0][1]["stop"]) == (0, 5)
    info = requests.get(shared.url + "/info").json()
    assert info["max_input_length"] == 256 and info["model_id"] == "all-minilm-l6-v2"


def test_prompt_name_from_the_model_config(serve, model_dir, reference, tmp_path):
    model = tmp_path / "prompted"
    model.mkdir()
    for f in model_dir.iterdir():
        if f.name != "config_sentence_transformers.json":
            (model / f.name).symlink_to(f)
    (model / "config_sentence_transformers.json").write_text('{"prompts": {"query": "query: "}}')
    s = serve(model=model)
    got = requests.post(s.url + "/embed", json={"inputs": "what is attention", "prompt_name": "query"}).json()
    want = reference.encode(["query: what is attention"], convert_to_numpy=True)
    assert np.abs(np.array(got) - want).max() < TOL
    unknown = requests.post(s.url + "/embed", json={"inputs": "x", "prompt_name": "passage"})
    assert unknown.status_code == 422 and "query" in unknown.json()["error"]
