"""Driver of scripts/bench/bert: PyTorch and attend on the same texts, alternating."""
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sentence_transformers
import torch
import transformers
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer, BertModel
import record
from timing import median_ms

WORDS = (
    "the a cat dog sat on mat attention encoder model quickly slowly under over between "
    "river bank money interest rates rose fell yesterday today people think language "
    "learning machines vectors heads layers tokens"
).split()


def batch_texts():
    """32 sentences of 30 to 44 tokens (about 40 with [CLS] and [SEP])."""
    rng = random.Random(0)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(28, 42))).capitalize() + "."
        for _ in range(32)
    ]


CASES = {"short": ["Hello world."], "batch32": batch_texts()}
REPS = {"short": 50, "batch32": 10}


def main():
    model_dir, bench_bin, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    print(f"load average before: {os.getloadavg()}")
    st = SentenceTransformer(model_dir, device="cpu")
    tok = AutoTokenizer.from_pretrained(model_dir)
    bert = BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval()
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
        f"{transformers.__version__}, sentence-transformers {sentence_transformers.__version__}; "
        f"attention implementation: {bert.config._attn_implementation}"
    )
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, texts in CASES.items():
            path = os.path.join(tmp, f"{name}.json")
            with open(path, "w") as f:
                json.dump(texts, f)
            enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
            r = {"torch_encode": [], "torch_forward": [], "attend": []}
            with torch.inference_mode():
                for _ in range(3):
                    st.encode(texts, batch_size=32)
                    bert(**enc)
                for _ in range(rounds):
                    r["torch_encode"].append(median_ms(lambda: st.encode(texts, batch_size=32), REPS[name]))
                    r["torch_forward"].append(median_ms(lambda: bert(**enc), REPS[name]))
                    out = subprocess.run(
                        [bench_bin, model_dir, path, str(REPS[name])],
                        check=True, capture_output=True, text=True,
                    ).stdout
                    r["attend"].append(json.loads(out))
            results[name] = (r, tuple(enc["input_ids"].shape))
    print(f"load average after: {os.getloadavg()}; attend threads: {r['attend'][0]['threads']}")
    rows = []
    for name, (r, shape) in results.items():
        te = statistics.median(r["torch_encode"])
        tf = statistics.median(r["torch_forward"])
        ae = statistics.median(x["embed_ms"] for x in r["attend"])
        af = statistics.median(x["forward_ms"] for x in r["attend"])
        tokens = r["attend"][0]["tokens"]
        parts = {
            k: statistics.median(x["breakdown_ms"][k] for x in r["attend"])
            for k in r["attend"][0]["breakdown_ms"]
        }
        print(f"\n{name}: {len(CASES[name])} texts, {tokens} real tokens (PyTorch pads to {shape})")
        print(f"  embed   (tokenise + encode + pool): PyTorch {te:8.2f} ms  attend {ae:8.2f} ms  ratio {te / ae:5.2f}x")
        print(f"  forward (encoder only):             PyTorch {tf:8.2f} ms  attend {af:8.2f} ms  ratio {tf / af:5.2f}x")
        total = sum(parts.values())
        print("  attend forward breakdown: " + ", ".join(
            f"{k} {v:.2f} ms ({100 * v / total:.0f}%)" for k, v in parts.items()))
        rows.append(record.row(f"{name}, embed", ae, "sentence-transformers", te))
        rows.append(record.row(f"{name}, encoder forward", af, "transformers", tf))
    record.write("bert", "all-MiniLM-L6-v2 against sentence-transformers' encode and transformers' forward (SDPA attention), f32",
                 unit="ms", better="lower", threads=torch.get_num_threads(),
                 peers={"torch": torch.__version__, "transformers": transformers.__version__,
                        "sentence-transformers": sentence_transformers.__version__},
                 rows=rows, args=sys.argv[3:])


if __name__ == "__main__":
    main()
