#!/usr/bin/env python3
"""PyTorch's time for notebook 000's module forward (3 tokens, width 2, seed 42),
the peer of `cargo bench -p attend --bench notebook_module`. Prints one JSON line."""
import json, statistics, time

import torch
import torch.nn as nn

torch.set_num_threads(2)
torch.manual_seed(42)
w_q, w_k, w_v = (nn.Linear(2, 2, bias=False) for _ in range(3))
x = torch.tensor([[1.16, 0.23], [0.57, 1.36], [4.41, -2.16]])


def forward():
    q, k, v = w_q(x), w_k(x), w_v(x)
    return torch.softmax(q @ k.T / k.size(1) ** 0.5, dim=1) @ v


with torch.no_grad():
    for _ in range(1000):
        forward()
    times = []
    for _ in range(20):
        t = time.perf_counter()
        for _ in range(1000):
            forward()
        times.append((time.perf_counter() - t) / 1000)
print(json.dumps({"what": "notebook_000_forward", "torch": torch.__version__, "us": statistics.median(times) * 1e6}))
