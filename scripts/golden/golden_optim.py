#!/usr/bin/env python3
"""Writes crates/attend/tests/data/optim.json: parameters after each of four steps of
torch.optim.SGD and torch.optim.AdamW on fixed gradients (float32, CPU)."""
import json, sys
import torch

torch.manual_seed(0)
p0 = torch.randn(3, 4)
grads = [torch.randn(3, 4) for _ in range(4)]
configs = [
    ("sgd", dict(lr=0.1)),
    ("sgd", dict(lr=0.05, momentum=0.9)),
    ("sgd", dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("adamw", dict(lr=1e-3)),
    ("adamw", dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
]
cases = []
for name, kw in configs:
    p = torch.nn.Parameter(p0.clone())
    opt = (torch.optim.SGD if name == "sgd" else torch.optim.AdamW)([p], **kw)
    steps = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        steps.append(p.detach().flatten().tolist())
    cases.append({"optimizer": name, "options": kw, "steps": steps})
json.dump({"torch": torch.__version__, "param": p0.flatten().tolist(), "shape": [3, 4],
           "grads": [g.flatten().tolist() for g in grads], "cases": cases},
          open(sys.argv[1], "w"), indent=1)
