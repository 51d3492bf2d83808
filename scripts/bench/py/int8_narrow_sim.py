"""Simulates attend's int8 encoder on a CPU without VNNI (docs/int8.md, "Without
VNNI") with the feed-forward down projection, and optionally the query/key/value
projection, quantized to +-63 instead of +-127, each output's C largest weights
corrected: the output's scale set by its (C+1)-th largest magnitude, so that the C
above it quantize to levels beyond 63, which a product would add as a sparse
correction (exact in i32). In PyTorch, `nn.Linear` replaced by the quantization
(weights symmetric per output, inputs per row with a zero point, the QKV input's two
largest entries a row kept out), sentence-transformers' own model otherwise. Prints
each variant's worst and mean cosine and top-10 neighbour overlap against
sentence-transformers in f32, on the sentences of bench_int8.py plus one long text
(its cosine printed apart), and how far each output's largest weight is above its
(C+1)-th in two layers.

    int8_narrow_sim.py MODEL_DIR [SENTENCES] [VARIANTS]   (default 1,000 sentences, all variants;
                                                           VARIANTS: comma-separated indices)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int8_sim import load, quantized_rows, report  # noqa: E402

QKV_OUTLIERS = 2
st, texts, want = load(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1000)


def quantized_weight(w, limit, corrected):
    """w [n, k] per output to +-limit, the scale from the (corrected+1)-th largest |w|
    (the `corrected` above it keep their own levels), and each output's largest |w|
    over that one."""
    ref = w.abs().topk(corrected + 1, dim=1).values[:, corrected:corrected + 1]
    s = ref / limit
    return torch.round(w / s) * s, w.abs().amax(1) / ref[:, 0]


mode, cache = {}, {}
plain = torch.nn.Linear.forward


def forward(self, x):
    how = mode.get(id(self))
    if how is None:
        return plain(self, x)
    kept, limit, corrected = how
    if id(self) not in cache:
        cache[id(self)] = quantized_weight(self.weight, limit, corrected)[0]
    w = cache[id(self)]
    xq, exact = quantized_rows(x, kept)
    return xq @ w.T + exact @ w.T + self.bias


torch.nn.Linear.forward = forward
encoder = st[0].auto_model.encoder


def kind(name):
    if any(name.endswith(s) for s in (".query", ".key", ".value", ".q", ".k", ".v")):
        return "qkv"
    if name.endswith("intermediate.dense"):
        return "up"
    if name.endswith("output.dense") and ".attention." not in name:
        return "down"
    return "out"


def setup(qkv, down):
    """(limit, corrected) of the QKV and FFN down projections; the attention output
    and FFN up at +-63 as attend packs them without VNNI."""
    mode.clear()
    cache.clear()
    for name, m in encoder.named_modules():
        if isinstance(m, torch.nn.Linear):
            mode[id(m)] = {"qkv": (QKV_OUTLIERS,) + qkv, "out": (0, 63, 0), "up": (0, 63, 0),
                           "down": (0,) + down}[kind(name)]


for name, m in encoder.named_modules():
    if isinstance(m, torch.nn.Linear) and name.endswith(("0.output.dense", "0.attention.self.query", "0.attn.q")) \
            and ".attention.output" not in name:
        for c in (1, 2, 4, 8, 16):
            ratio = quantized_weight(m.weight.detach(), 63, c)[1]
            print(f"{name} C={c}: largest over the (C+1)-th, median {ratio.median():.2f}", flush=True)

variants = [("FFN down +-127 (attend today)", (127, 0), (127, 0))]
variants += [(f"FFN down +-63, C={c}", (127, 0), (63, c)) for c in (0, 2, 4, 8, 16)]
variants += [(f"QKV and FFN down +-63, C={c}", (63, c), (63, c)) for c in (0, 2, 4, 8)]
variants += [(f"QKV +-63, C={c}, FFN down +-127", (63, c), (127, 0)) for c in (0, 2)]
only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
for i, (label, qkv, down) in enumerate(variants):
    if only and str(i) not in only:
        continue
    setup(qkv, down)
    report(f"{i} {label}", st, texts, want)
