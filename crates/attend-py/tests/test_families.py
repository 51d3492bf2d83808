"""Every encoder family attend loads, against transformers and sentence-transformers.

For each family (BERT with other activations, DistilBERT, RoBERTa, XLM-RoBERTa,
MPNet) the test makes a tiny randomly initialised checkpoint with transformers,
wraps it in sentence-transformers' modules (several poolings, Dense layers,
Normalize) and saves it; then the real all-mpnet-base-v2. attend's sentence vectors
(``attend.SentenceEncoder``, the fused attention path) and every layer's and head's
attention weights (``attend attention --all``, the traced reference path) are judged
by docs/design.md's rule against a float64 run of the same model: attend's error at
most twice PyTorch float32's own error, plus the float32 rounding floor.

The tiny models' weights are drawn with a standard deviation of 0.2 rather than
transformers' 0.02, so that their attention is far from uniform and their positions
and relative-position biases change the result.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import attend

REPO = Path(__file__).resolve().parents[3]
ATTEND = REPO / "target" / "release" / "attend"
EPS = float(np.finfo(np.float32).eps)

SENTENCES = [
    "A cat sat on the mat.",
    "Dogs bark.",
    "The animal didn't cross the street because it was too tired.",
    "",
    "naïve café — unicode, emoji 🙂 and numbers 3.14159",
    # Past 64 tokens: MPNet's relative positions reach their logarithmic buckets.
    " ".join(["attention looks at every other word in the sentence"] * 8),
]
TRACED = [SENTENCES[2], SENTENCES[-1]]

# name: (model_type, config overrides, pooling modes, Dense activation or None, Normalize)
CASES = {
    "bert-gelu_new-cls-normalize": ("bert", dict(hidden_act="gelu_new"), "cls", None, True),
    "bert-relu-max": ("bert", dict(hidden_act="relu"), "max", None, False),
    "bert-gelu_pytorch_tanh-lasttoken": ("bert", dict(hidden_act="gelu_pytorch_tanh"), "lasttoken", None, False),
    "distilbert-sinusoidal-mean-dense-normalize": (
        "distilbert", dict(sinusoidal_pos_embds=True, activation="relu"), "mean", torch.nn.Tanh(), True),
    "distilbert-learned-mean_sqrt_len": ("distilbert", dict(), "mean_sqrt_len_tokens", None, False),
    "roberta-cls+mean-dense": ("roberta", dict(pad_token_id=0, type_vocab_size=1), ["cls", "mean"],
                               torch.nn.Identity(), False),
    "xlm-roberta-weightedmean": ("xlm-roberta", dict(), "weightedmean", None, False),
    "mpnet-mean-normalize": ("mpnet", dict(), "mean", None, True),
    "mpnet-max-dense": ("mpnet", dict(hidden_act="relu"), "max", torch.nn.ReLU(), False),
}


def _config(model_type: str, overrides: dict):
    from transformers import AutoConfig

    sizes = dict(vocab_size=30522, max_position_embeddings=130)
    if model_type == "distilbert":
        sizes.update(dim=32, n_layers=2, n_heads=4, hidden_dim=64)
    else:
        sizes.update(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    return AutoConfig.for_model(model_type, **sizes, **overrides)


def _randomise(model, seed: int) -> None:
    """Weights N(0, 0.2), LayerNorm scales around 1, MPNet's bias table N(0, 1);
    DistilBERT's sinusoidal table is left as transformers made it."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "position_embeddings" in name and getattr(model.config, "sinusoidal_pos_embds", False):
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if "LayerNorm" in name or "layer_norm" in name:
                p.copy_(1.0 + 0.1 * noise if name.endswith("weight") else 0.1 * noise)
            elif "relative_attention_bias" in name:
                p.copy_(noise)
            else:
                p.copy_(0.2 * noise)


def _make_checkpoint(root: Path, name: str, tokenizer_dir: Path) -> Path:
    from safetensors.torch import load_file, save_file
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models
    from transformers import AutoModel

    model_type, overrides, pooling, dense, normalize = CASES[name]
    config = _config(model_type, overrides)
    model = AutoModel.from_config(config)
    _randomise(model, seed=sum(map(ord, name)))
    raw = root / f"{name}-transformer"
    model.save_pretrained(raw)
    if model_type == "distilbert" and config.sinusoidal_pos_embds:
        # Without the table in the file, both sides must make the sinusoids themselves.
        weights = load_file(raw / "model.safetensors")
        del weights["embeddings.position_embeddings.weight"]
        save_file(weights, raw / "model.safetensors", metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (tokenizer_dir / f).is_file():
            shutil.copy(tokenizer_dir / f, raw / f)
    modules = [models.Transformer(str(raw), max_seq_length=128)]
    modules.append(models.Pooling(32, pooling_mode=pooling))
    width = 32 * (len(pooling) if isinstance(pooling, list) else 1)
    if dense is not None:
        torch.manual_seed(len(name))
        layer = models.Dense(width, 24, activation_function=dense)
        with torch.no_grad():
            layer.linear.weight.normal_(0.0, 0.3)
        modules.append(layer)
    if normalize:
        modules.append(models.Normalize())
    out = root / name
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, model_dir):
    """Each case's sentence-transformers directory (the tokenizer is MiniLM's)."""
    root = tmp_path_factory.mktemp("families")
    return {name: _make_checkpoint(root, name, model_dir) for name in CASES}


def _attend_maps(model: Path, text: str) -> np.ndarray:
    """Every layer's and head's weights ``[layers, H, T, T]`` from ``attend attention --all``."""
    run = subprocess.run([str(ATTEND), "attention", "--model", str(model), "--all", text],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    return np.array(json.loads(run.stdout)["layers"], dtype=np.float64)


def _torch_maps(model: Path, text: str, dtype) -> tuple[np.ndarray, list[str]]:
    """transformers' eager attention weights ``[layers, H, T, T]`` and the tokens."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    net = AutoModel.from_pretrained(str(model), attn_implementation="eager").to(dtype).eval()
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        out = net(**enc, output_attentions=True)
    maps = torch.stack([a[0] for a in out.attentions]).double().numpy()
    return maps, tok.convert_ids_to_tokens(enc["input_ids"][0])


def _check_rule(got: np.ndarray, f32: np.ndarray, f64: np.ndarray, floor: float, what: str) -> None:
    assert got.shape == f64.shape, f"{what}: shape {got.shape} != {f64.shape}"
    err = np.abs(got - f64).max()
    torch_err = np.abs(f32 - f64).max()
    assert err <= 2 * torch_err + floor, f"{what}: attend {err:.3e} against PyTorch float32's {torch_err:.3e}"


def _check_embeddings(model: Path, texts: list[str]) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model), device="cpu")
    f32 = st.encode(texts, batch_size=4)
    f64 = SentenceTransformer(str(model), device="cpu").double().encode(
        texts, batch_size=4, convert_to_tensor=True).numpy()
    enc = attend.SentenceEncoder(model)
    assert enc.get_embedding_dimension() == st.get_embedding_dimension()
    assert enc.max_seq_length == st.max_seq_length
    got = enc.encode(texts, batch_size=4)
    # The floor: a few float32 ulps of the largest entry (1 for unit vectors).
    _check_rule(got, f32, f64, 4 * EPS * max(1.0, np.abs(f64).max()), f"{model.name} embeddings")


def _check_attention(model: Path, text: str) -> None:
    want, tokens = _torch_maps(model, text, torch.float64)
    f32, _ = _torch_maps(model, text, torch.float32)
    got = _attend_maps(model, text)
    # Weights are at most 1: their floor is a few float32 ulps of 1.
    _check_rule(got, f32, want, 4 * EPS, f"{model.name} attention on {text[:30]!r} ({len(tokens)} tokens)")


@pytest.mark.parametrize("name", list(CASES))
def test_tiny_checkpoint_embeddings(checkpoints, name):
    _check_embeddings(checkpoints[name], SENTENCES)


@pytest.mark.parametrize("name", list(CASES))
def test_tiny_checkpoint_attention(checkpoints, name):
    for text in TRACED:
        _check_attention(checkpoints[name], text)


def test_tiny_checkpoints_batch_like_one_by_one(checkpoints):
    # Padding keys are masked and MPNet's bias is the same for every sequence of
    # the batch, so a text's vector does not depend on what it is batched with
    # beyond float32 reassociation.
    for name, path in checkpoints.items():
        enc = attend.SentenceEncoder(path)
        whole = enc.encode(SENTENCES, batch_size=32)
        one_by_one = np.stack([enc.encode(s) for s in SENTENCES])
        scale = max(1.0, np.abs(whole).max())
        assert np.abs(whole - one_by_one).max() < 1e-5 * scale, name


def test_unsupported_model_type_is_one_clear_line(checkpoints, tmp_path):
    src = checkpoints["bert-relu-max"]
    bad = tmp_path / "t5ish"
    shutil.copytree(src, bad)
    config = json.loads((bad / "config.json").read_text())
    config["model_type"] = "t5"
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as info:
        attend.SentenceEncoder(bad)
    message = str(info.value)
    assert "model_type \"t5\" is not supported (supported: bert, distilbert, mpnet, roberta, xlm-roberta)" in message
    assert "\n" not in message
    run = subprocess.run([str(ATTEND), "embed", "--model", str(bad), "hello"], capture_output=True, text=True)
    assert run.returncode != 0 and "not supported" in run.stderr and "panicked" not in run.stderr


# The real all-mpnet-base-v2: the most used sentence-transformers quality model.
MPNET_SENTENCES = SENTENCES + [" ".join(["a very long sentence"] * 120)]  # past 384 tokens: truncated


def test_all_mpnet_base_v2_embeddings(mpnet_dir):
    _check_embeddings(mpnet_dir, MPNET_SENTENCES)


@pytest.mark.parametrize("text", TRACED)
def test_all_mpnet_base_v2_attention(mpnet_dir, text):
    _check_attention(mpnet_dir, text)


@pytest.mark.parametrize("name", ["distilbert-learned-mean_sqrt_len", "roberta-cls+mean-dense", "mpnet-max-dense"])
def test_explain_walks_through_any_family(checkpoints, name):
    # One head's walkthrough recomputes its weights from its own q, k (and MPNet's
    # position bias, a step of its own): softmax(q kᵀ / √d_head + bias).
    text = TRACED[0]
    ex = attend.explain(model=checkpoints[name], text=text, layer=1, head=2)
    q, k = ex.q.astype(np.float64), ex.k.astype(np.float64)
    scaled = q @ k.T / np.sqrt(q.shape[1])
    if name.startswith("mpnet"):
        scaled = scaled + ex.position_bias
        assert "scaled = scores / √d_head + position bias" in str(ex)
    else:
        assert "position_bias" not in dir(ex)
    w = np.exp(scaled - scaled.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    assert np.abs(w - ex.weights).max() < 1e-5
    assert np.array_equal(ex.weights, _attend_maps(checkpoints[name], text)[1, 2].astype(np.float32))
