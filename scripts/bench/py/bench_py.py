#!/usr/bin/env python3
"""attend.scaled_dot_product_attention from Python against the same kernels from the
command line and against torch.nn.functional.scaled_dot_product_attention, alternating
within one run, on scripts/bench/vs-torch's shapes: forward, and forward + backward
through autograd.

The boundary must add no copies and no measurable cost: the Python ratio
(torch / attend-py) is printed next to the command line's (torch / attend-cli), and
their difference is attend-cli / attend-py - 1. Timings use the same rule on every
side (torch_sdpa.py's: a warm-up call, then at least 5 runs and 0.5 s, the median).

  scripts/bench/py-sdpa [--quick | --backward]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import torch

import attend
from model_rounds import cpu_name
import record
from timing import median_seconds

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# batch heads kv_heads seq head_dim causal, as scripts/bench/vs-torch.
GRID = [
    (1, 8, 8, 512, 64, False), (1, 8, 8, 512, 64, True),
    (1, 8, 8, 2048, 64, False), (1, 8, 8, 2048, 64, True),
    (1, 8, 8, 4096, 64, False), (1, 8, 8, 4096, 64, True),
    (1, 8, 8, 1024, 128, False),
    (1, 1, 1, 4096, 64, False),
    (1, 8, 2, 2048, 64, False),
]
QUICK = [(1, 8, 8, 512, 64, False), (1, 8, 8, 512, 64, True)]
BACKWARD = [(1, 8, 8, 1024, 64, False), (1, 1, 1, 4096, 64, False)]


def flags(shape, threads, backward):
    b, h, hkv, n, d, causal = shape
    f = ["--batch", b, "--heads", h, "--kv-heads", hkv, "--seq", n, "--head-dim", d, "--threads", threads]
    f = [str(x) for x in f]
    if causal:
        f.append("--causal")
    if backward:
        f.append("--backward")
    return f


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def attend_py_ms(shape, backward):
    b, h, hkv, n, d, causal = shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, n, d, generator=g, requires_grad=backward)
    k = torch.randn(b, hkv, n, d, generator=g, requires_grad=backward)
    v = torch.randn(b, hkv, n, d, generator=g, requires_grad=backward)
    kw = dict(is_causal=causal, enable_gqa=hkv != h)
    if backward:
        grad = torch.randn(b, h, n, d, generator=g)

        def step():
            q.grad = k.grad = v.grad = None
            attend.scaled_dot_product_attention(q, k, v, **kw).backward(grad)
    else:
        def step():
            with torch.no_grad():
                attend.scaled_dot_product_attention(q, k, v, **kw)
    return median_seconds(step) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--backward", action="store_true")
    p.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", 2)))
    p.add_argument("--repeats", type=int, default=int(os.environ.get("REPEATS", 3)))
    a = p.parse_args()
    grid = BACKWARD if a.backward else QUICK if a.quick else GRID
    attend_bin = os.environ.get("ATTEND_BIN", os.path.join(ROOT, "target", "release", "attend"))
    torch_sdpa = os.path.join(HERE, "torch_sdpa.py")
    torch.set_num_threads(a.threads)
    attend.set_num_threads(a.threads)

    print(f"{cpu_name()}, attend kernels: {attend.isa()}, threads={a.threads}, repeats={a.repeats}, "
          f"torch {torch.__version__}, {'forward + backward' if a.backward else 'forward'}")
    print()
    print("| B | H | Hkv | N | d | causal | attend-cli ms | attend-py ms | torch ms | torch/cli | torch/py | cli/py - 1 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    rows = []
    for shape in grid:
        cli, py, th = [], [], []
        f = flags(shape, a.threads, a.backward)
        for _ in range(a.repeats):
            cli.append(run_json([attend_bin, "bench", *f, "--format", "json"])["ms"])
            py.append(attend_py_ms(shape, a.backward))
            th.append(run_json([sys.executable, torch_sdpa, *f])["ms"])
        c, y, t = statistics.median(cli), statistics.median(py), statistics.median(th)
        gap = c / y - 1
        b, h, hkv, n, d, causal = shape
        if b * h * n > 8 * 512:
            worst = min(worst, gap)
        print(f"| {b} | {h} | {hkv} | {n} | {d} | {'yes' if causal else 'no'} | {c:.2f} | {y:.2f} | {t:.2f} "
              f"| {t / c:.2f} | {t / y:.2f} | {gap:+.1%} |")
        label = f"B{b} H{h}{f' Hkv{hkv}' if hkv != h else ''} N{n} d{d}{' causal' if causal else ''}"
        rows += [record.row(label, y, "torch", t), record.row(label, y, "attend command line", c)]
    print()
    print(f"largest Python overhead above B*H*N = 8*512: {-worst:.1%} (the issue's bound: 5%)")
    record.write("py-sdpa", f"attend.scaled_dot_product_attention from Python, {'forward + backward' if a.backward else 'forward'}, "
                 "against PyTorch's SDPA and attend's command line, f32", unit="ms", better="lower", threads=a.threads,
                 peers={"torch": torch.__version__}, rows=rows)


if __name__ == "__main__":
    main()
