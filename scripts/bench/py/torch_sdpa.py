#!/usr/bin/env python3
"""PyTorch's side of `attend bench`: times torch.nn.functional.scaled_dot_product_attention
on the shape `attend bench` takes (the same flags and defaults), with the timing rule of
timing.py, and prints one JSON line with the keys `attend bench --format json` uses.

    torch_sdpa.py --heads 8 --seq 2048 --head-dim 64 [--causal] [--backward] [--dtype bf16]
    torch_sdpa.py --decode --heads 32 --kv-heads 8 --kv-len 16384 --head-dim 128
    torch_sdpa.py --gemm 2048      # an n x n matrix product instead: the BLAS's GFLOP/s

FLOPs are counted as `attend bench` counts them: 4·B·H·L·S·E for the forward (half of
it when causal), 3.5 times that for forward + backward. `gbps` is the K and V bytes
read once per call (what bounds decoding, L = 1). `cpu_capability` is the
instruction set ATen's own kernels dispatch to (torch.backends.cpu.get_cpu_capability();
ATEN_CPU_CAPABILITY=avx2 caps it, as scripts/bench/vs-torch --isa avx2 does).
"""
import argparse
import json

import torch
import torch.nn.functional as F

from sdpa_args import add_problem_args, add_timing_args
from timing import median_seconds

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_problem_args(ap, kv_len_help="key length S (default: L; 4096 with --decode)",
                     causal_help="top-left causal mask (is_causal)")
    ap.add_argument("--mask", choices=["bool", "additive"],
                    help="an [L, S] attn_mask as `attend bench --mask` makes it: bool drops "
                    "score (i, j) where (7i + 13j) mod 10 = 0, additive adds -0.25 * ((i + j) mod 5)")
    ap.add_argument("--backward", action="store_true", help="time forward + backward")
    ap.add_argument("--decode", action="store_true", help="one query token against --kv-len keys")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    add_timing_args(ap)
    ap.add_argument("--gemm", type=int, metavar="N", help="time an N x N matrix product instead")
    a = ap.parse_args()
    if a.decode and (a.backward or a.mask):
        ap.error("--decode excludes --backward and --mask")
    return a


def gemm(a, dtype):
    n = a.gemm
    x, y = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    s = median_seconds(lambda: x @ y, a.min_runs, a.min_time)
    return {"what": "gemm", "n": n, "ms": s * 1e3, "gflops": 2 * n**3 / s / 1e9}


def mask(kind, l, s, dtype):
    i, j = torch.arange(l)[:, None], torch.arange(s)[None, :]
    if kind == "bool":
        return (7 * i + 13 * j) % 10 != 0
    if kind == "additive":
        return ((i + j) % 5).to(dtype) * -0.25
    return None


def sdpa(a, dtype):
    b, h, e = a.batch, a.heads, a.head_dim
    hkv = a.kv_heads or h
    l = 1 if a.decode else a.seq
    s_len = a.kv_len or (4096 if a.decode else a.seq)
    gen = torch.Generator().manual_seed(0)

    def tensor(*shape):
        return torch.randn(*shape, dtype=dtype, generator=gen).requires_grad_(a.backward)

    q, k, v = tensor(b, h, l, e), tensor(b, hkv, s_len, e), tensor(b, hkv, s_len, e)
    kwargs = {"is_causal": a.causal, "enable_gqa": hkv != h, "attn_mask": mask(a.mask, l, s_len, dtype)}
    if a.backward:
        dout = torch.randn(b, h, l, e, dtype=dtype, generator=gen)

        def call():
            q.grad = k.grad = v.grad = None
            F.scaled_dot_product_attention(q, k, v, **kwargs).backward(dout)
    else:
        def call():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, **kwargs)

    secs = median_seconds(call, a.min_runs, a.min_time)
    flops = 4 * b * h * l * s_len * e * (0.5 if a.causal else 1.0) * (3.5 if a.backward else 1.0)
    kv_bytes = 2 * b * hkv * s_len * e * q.element_size()
    return {
        "what": "sdpa", "batch": b, "heads": h, "kv_heads": hkv, "q_len": l, "kv_len": s_len,
        "head_dim": e, "causal": a.causal, "mask": a.mask, "backward": a.backward,
        "ms": secs * 1e3, "gflops": flops / secs / 1e9, "gbps": kv_bytes / secs / 1e9,
    }


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    dtype = DTYPES[a.dtype]
    row = gemm(a, dtype) if a.gemm else sdpa(a, dtype)
    row.update(torch=torch.__version__, threads=a.threads, dtype=a.dtype,
               cpu_capability=torch.backends.cpu.get_cpu_capability())
    print(json.dumps(row))


if __name__ == "__main__":
    main()
