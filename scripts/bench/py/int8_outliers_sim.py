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

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int8_sim import load, quantized_rows, report  # noqa: E402

st, texts, want = load(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1000)

mode = {}
orig = torch.nn.Linear.forward
def fwd(self, x):
    T = mode.get(id(self))
    if T is None:
        return orig(self, x)
    w = self.weight
    sw = w.abs().amax(1, keepdim=True) / 127
    wq = torch.round(w / sw).clamp(-127, 127) * sw
    xq, keep = quantized_rows(x, T)
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
    report(label, st, texts, want)
