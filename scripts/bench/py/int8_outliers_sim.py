"""Simulates keeping each token's T largest inputs of the query/key/value projection
out of its int8 quantization (docs/int8.md, "The outlier split"), in PyTorch, for
T in 0, 2, 4, 8 and 16 and without quantizing that projection at all; the other
dense layers quantized as attend quantizes them (weights symmetric per output,
inputs per row with a zero point). Prints each variant's worst and mean cosine and
top-10 neighbour overlap against sentence-transformers in f32, on the sentences of
bench_int8.py plus one long text (its cosine printed apart).

    int8_outliers_sim.py MODEL_DIR [SENTENCES]   (default 1,000; docs/int8.md used 400 for mpnet)
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_int8 import sentences, agreement
from sentence_transformers import SentenceTransformer
torch.set_num_threads(1)
model_dir = sys.argv[1]
st = SentenceTransformer(model_dir, device="cpu")
texts = sentences(int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
long = " ".join(["the committee postponed the vote on the new bus timetable after the storm"] * 30)
texts = texts + [long]
with torch.inference_mode():
    want = st.encode(texts, batch_size=32, convert_to_numpy=True)

def qrow(x, T):
    # x [..., k]: per row asym u8 over range and 0, with the T largest |x| kept exact
    x = x.clone()
    keep = torch.zeros_like(x)
    if T:
        idx = x.abs().topk(T, dim=-1).indices
        keep.scatter_(-1, idx, x.gather(-1, idx))
        x.scatter_(-1, idx, 0.0)
    hi = x.amax(-1, keepdim=True).clamp(min=0); lo = x.amin(-1, keepdim=True).clamp(max=0)
    s = (hi - lo) / 255; s[s == 0] = 1
    z = torch.round(-lo / s)
    q = torch.clamp(torch.round(x / s) + z, 0, 255)
    return (q - z) * s, keep

mode = {}
orig = torch.nn.Linear.forward
def fwd(self, x):
    T = mode.get(id(self))
    if T is None:
        return orig(self, x)
    w = self.weight
    sw = w.abs().amax(1, keepdim=True) / 127
    wq = torch.round(w / sw).clamp(-127, 127) * sw
    xq, keep = qrow(x, T)
    return xq @ wq.T + keep @ wq.T + self.bias
torch.nn.Linear.forward = fwd
enc = st[0].auto_model.encoder
def setup(T_qkv, T_rest=0):
    mode.clear()
    for name, m in enc.named_modules():
        if isinstance(m, torch.nn.Linear):
            is_qkv = any(name.endswith(s) for s in (".query", ".key", ".value", ".q", ".k", ".v"))
            mode[id(m)] = (T_qkv if is_qkv else T_rest) if not (is_qkv and T_qkv < 0) else None
for label, t in [("qkv unquantized", -1), ("T=0", 0), ("T=2", 2), ("T=4", 4), ("T=8", 8), ("T=16", 16)]:
    setup(t)
    with torch.inference_mode():
        got = st.encode(texts, batch_size=32, convert_to_numpy=True)
    w, m, o = agreement(got[:-1], want[:-1])
    cl = float((got[-1] @ want[-1]) / np.linalg.norm(got[-1]) / np.linalg.norm(want[-1]))
    print(f"{label}: worst {w:.5f} mean {m:.5f} overlap {o:.3f}  long {cl:.5f}", flush=True)
