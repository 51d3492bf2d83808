#!/usr/bin/env python3
"""Driver of scripts/bench/py-models: all-MiniLM-L6-v2 through attend's Python package
against PyTorch, on one batch of 32 sentences of realistic, varied length.

  (i)  transformers' BertModel forward, attn_implementation="attend" against "sdpa"
       (the same model and weights; only the attention differs), inference mode;
  (ii) attend.SentenceEncoder(dir).encode against
       sentence_transformers.SentenceTransformer(dir, device="cpu").encode
       (attend's own BERT, tokeniser and pooling against the whole PyTorch stack),
       and the embeddings must agree.

Both sides run on the same number of threads (torch.set_num_threads; attend follows
it). Each round times both sides back to back, in alternating order, each as the
median of several calls; the table shows the median over rounds and the ratio
PyTorch / attend (above 1: attend is faster).

  scripts/bench/py-models [--rounds N] [--reps N] [--threads N] [MODEL_DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Callable, Tuple

os.environ["HF_HUB_OFFLINE"] = "1"  # the local directory only, never the hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

import attend  # noqa: E402
import attend.transformers  # noqa: E402
from model_rounds import OtherLoad, alternate, cpu_name  # noqa: E402
import record  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# 32 sentences as a search or clustering workload sees them: queries, titles, reviews,
# news and documentation, from one word to a paragraph (4 to 53 tokens with [CLS] and
# [SEP], 17 on average: a batch padded to 3x its real tokens, as such batches are).
SENTENCES = [
    "Thanks!",
    "Where is the nearest pharmacy?",
    "How do I reset my password if I no longer have access to my email account?",
    "Best budget laptop for students",
    "The battery lasts two days with moderate use, but the screen is too dim outdoors.",
    "A man is playing a guitar on a street corner while people walk past.",
    "Stock markets fell sharply on Tuesday after the central bank signalled that interest rates "
    "would stay higher for longer than investors had expected.",
    "Is it safe to eat raw cookie dough?",
    "Python list comprehension with an if-else condition",
    "The museum will be closed on Monday for maintenance.",
    "I ordered the medium size based on the chart, and it fits perfectly across the shoulders, "
    "although the sleeves are a little long for my arms.",
    "What is the difference between a virus and a bacterium?",
    "Two children are building a sandcastle on the beach.",
    "Researchers have developed a new battery chemistry that could double the range of electric "
    "vehicles while reducing the use of cobalt, a metal whose mining raises environmental and "
    "human-rights concerns. The team expects the first commercial cells within five years, "
    "pending safety tests at scale.",
    "Cancel my subscription",
    "The recipe calls for two cups of flour, one egg, and a pinch of salt.",
    "Why does my sourdough starter smell like acetone after a few days in the fridge?",
    "Quarterly revenue grew 12% year over year, driven by strong demand in cloud services.",
    "A woman is slicing tomatoes in a kitchen.",
    "To configure the proxy, set the HTTPS_PROXY environment variable before starting the "
    "service, then restart the daemon so that it picks up the new value.",
    "Can dogs eat grapes?",
    "The hotel staff were friendly and the room was spotless, but the street noise kept us awake "
    "most of the night, so we would not stay there again in summer.",
    "Flights to Lisbon in October",
    "The committee postponed its vote on the new zoning rules until next month.",
    "How many hours of sleep does a teenager need?",
    "A cyclist rides through a forest trail covered in autumn leaves.",
    "After three years of negotiations, the two countries signed a trade agreement that removes "
    "tariffs on most agricultural goods, although several farming associations warned that "
    "small producers would struggle to compete with cheaper imports in the first years.",
    "Error: connection refused on port 5432",
    "She finished the marathon in under four hours despite the heat.",
    "What are the symptoms of vitamin D deficiency?",
    "The printer keeps jamming whenever I use recycled paper.",
    "Good morning",
]
assert len(SENTENCES) == 32

# all-MiniLM-L6-v2's embeddings are unit vectors (its Normalize module) with entries of
# about 0.05; float32 rounding through 6 layers and the pooling moves them by about
# 1e-7 to 1e-6 (the package's tests measure 2e-6 on the unnormalised hidden states,
# which are up to 6 in size). A masking, pooling or tokenising mistake moves them by
# 1e-3 or more. 1e-5 sits between the two.
EMBEDDING_TOLERANCE = 1e-5


def fetch_model() -> str:
    out = subprocess.run([os.path.join(ROOT, "scripts", "fetch-model")], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench-py-models: scripts/fetch-model failed: {out.stderr.strip()}")
    return out.stdout.strip().splitlines()[-1]


def encoders(model_dir: str) -> Tuple[Callable[[], np.ndarray], Callable[[], np.ndarray]]:
    """sentence-transformers' and attend's encode of SENTENCES (one batch of 32),
    each a call of no arguments, for the model in `model_dir`."""
    st = SentenceTransformer(model_dir, device="cpu")
    enc = attend.SentenceEncoder(model_dir)

    def st_encode():
        with torch.inference_mode():
            return st.encode(SENTENCES, batch_size=32, convert_to_numpy=True)

    def attend_encode():
        return enc.encode(SENTENCES, batch_size=32)

    return st_encode, attend_encode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="?", help="all-MiniLM-L6-v2 directory (default: scripts/fetch-model)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=5, help="calls per side per round")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")))
    args = parser.parse_args()
    model_dir = args.model_dir or fetch_model()

    torch.set_num_threads(args.threads)
    attend.set_num_threads(args.threads)
    attend.transformers.register()

    print(f"CPU: {cpu_name()}")
    print(
        f"threads: {args.threads} (torch {torch.get_num_threads()}, attend {attend.get_num_threads()}); "
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"sentence-transformers {sentence_transformers.__version__}, attend {attend.__version__} ({attend.isa()})"
    )
    print(f"model: {model_dir}; {args.rounds} rounds x {args.reps} calls per side")
    print(f"load average before: {os.getloadavg()}")
    others = OtherLoad()

    # (i) the transformers model, sdpa against attend.
    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = tok(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    real = batch["attention_mask"].sum(1)
    models = {
        impl: AutoModel.from_pretrained(model_dir, attn_implementation=impl).eval() for impl in ("sdpa", "attend")
    }
    assert models["attend"].config._attn_implementation == "attend"

    def forward(impl: str):
        with torch.inference_mode():
            return models[impl](**batch).last_hidden_state

    keep = batch["attention_mask"].bool()
    forward_diff = (forward("attend") - forward("sdpa"))[keep].abs().max().item()
    forward_ms = alternate({"sdpa": lambda: forward("sdpa"), "attend": lambda: forward("attend")}, args.rounds, args.reps)

    # (ii) sentence embeddings: sentence-transformers against attend.SentenceEncoder.
    st_encode, attend_encode = encoders(model_dir)
    st_vec, attend_vec = st_encode(), attend_encode()
    assert st_vec.shape == attend_vec.shape == (32, 384), (st_vec.shape, attend_vec.shape)
    embed_diff = float(np.abs(st_vec.astype(np.float64) - attend_vec.astype(np.float64)).max())
    assert embed_diff <= EMBEDDING_TOLERANCE, (
        f"embeddings disagree: max abs diff {embed_diff:.3g} > {EMBEDDING_TOLERANCE:g}"
    )
    encode_ms = alternate({"sentence-transformers": st_encode, "attend": attend_encode}, args.rounds, args.reps)

    others.report()
    print(
        f"\nbatch: 32 sentences, {int(real.min())} to {int(real.max())} tokens "
        f"(mean {real.float().mean().item():.0f}), padded to {tuple(batch['input_ids'].shape)}\n"
    )
    print("| comparison | PyTorch median (ms) | attend median (ms) | ratio PyTorch / attend | max abs diff |")
    print("|---|---:|---:|---:|---:|")
    rows = [
        ('transformers BertModel forward: `"sdpa"` vs `"attend"`', forward_ms["sdpa"], forward_ms["attend"], forward_diff),
        (
            "`SentenceTransformer.encode` vs `attend.SentenceEncoder.encode`",
            encode_ms["sentence-transformers"],
            encode_ms["attend"],
            embed_diff,
        ),
    ]
    for label, base, ours, diff in rows:
        b, a = statistics.median(base), statistics.median(ours)
        print(f"| {label} | {b:.2f} | {a:.2f} | {b / a:.2f}x | {diff:.2g} |")
    record.write(
        "py-models", "all-MiniLM-L6-v2 from Python: transformers with attn_implementation \"attend\", and SentenceEncoder.encode, f32",
        unit="ms", better="lower", threads=args.threads,
        peers={"torch": torch.__version__, "transformers": transformers.__version__,
               "sentence-transformers": sentence_transformers.__version__},
        rows=[record.row("32 sentences, BertModel forward", statistics.median(forward_ms["attend"]), "transformers \"sdpa\"",
                         statistics.median(forward_ms["sdpa"])),
              record.row("32 sentences, encode", statistics.median(encode_ms["attend"]), "sentence-transformers",
                         statistics.median(encode_ms["sentence-transformers"]))],
        other_load=others.share(),
    )
    print("\nper-round medians (ms):")
    for label, series in (("forward", forward_ms), ("encode", encode_ms)):
        for name, values in series.items():
            print(f"  {label:8s} {name:22s} " + " ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()
