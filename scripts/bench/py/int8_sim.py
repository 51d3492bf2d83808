"""What the int8 simulations (int8_outliers_sim.py, int8_narrow_sim.py) share: the
model and its f32 vectors for the sentences of bench_int8.py plus one long text,
attend's quantization of a layer's input rows, and the line each variant prints."""
import numpy as np
import torch
from bench_int8 import sentences, agreement
from sentence_transformers import SentenceTransformer

LONG = " ".join(["the committee postponed the vote on the new bus timetable after the storm"] * 30)


def load(model_dir, count):
    """(model, texts, f32 vectors): `count` sentences of bench_int8.py and the long text."""
    torch.set_num_threads(1)
    st = SentenceTransformer(model_dir, device="cpu")
    texts = sentences(count) + [LONG]
    with torch.inference_mode():
        want = st.encode(texts, batch_size=32, convert_to_numpy=True)
    return st, texts, want


def quantized_rows(x, kept):
    """x [..., k] per row to bytes over its range and 0, the `kept` largest |x| exact:
    (the dequantized rest, the exact entries)."""
    x = x.clone()
    exact = torch.zeros_like(x)
    if kept:
        idx = x.abs().topk(kept, dim=-1).indices
        exact.scatter_(-1, idx, x.gather(-1, idx))
        x.scatter_(-1, idx, 0.0)
    hi = x.amax(-1, keepdim=True).clamp(min=0)
    lo = x.amin(-1, keepdim=True).clamp(max=0)
    s = (hi - lo) / 255
    s[s == 0] = 1
    z = torch.round(-lo / s)
    q = torch.clamp(torch.round(x / s) + z, 0, 255)
    return (q - z) * s, exact


def report(label, st, texts, want):
    """Encodes `texts` as `st` now computes and prints the agreement with `want`."""
    with torch.inference_mode():
        got = st.encode(texts, batch_size=32, convert_to_numpy=True)
    worst, mean, overlap = agreement(got[:-1], want[:-1])
    cos_long = float((got[-1] @ want[-1]) / np.linalg.norm(got[-1]) / np.linalg.norm(want[-1]))
    print(f"{label}: worst {worst:.5f} mean {mean:.5f} overlap {overlap:.3f}  long {cos_long:.5f}", flush=True)
