#!/usr/bin/env python3
"""What torch.ops.attend.sdpa costs per call beyond attend's kernel, on shapes so small
that the kernel's own work is negligible, next to PyTorch's SDPA.

A sample is 100 calls of one path, timed with time.perf_counter; the paths take
turns sample by sample (so that other load on the machine falls on all of them
alike), and each figure is the median of a path's samples, in microseconds per
call. The paths:

  kernel    attend._attend.sdpa_forward_tensors, what the op's kernels call: the
            compiled half alone (the tensors read through DLPack, the shape rules,
            the hand-over to attend's thread pool and back, the results made tensors)
  numpy     attend._attend.sdpa_forward on NumPy views made once (attend's NumPy path)
  op        torch.ops.attend.scaled_dot_product_attention: the dispatcher's trip into
            the op's autograd kernel (attend._attend.ForwardShortcut, which takes
            these plain calls to the kernel itself), then the kernel
  floor     an operator of the same schema, defined here, whose autograd kernel is a
            Python function that only calls the kernel: what PyTorch's dispatcher
            costs for any kernel written in Python, the least a Python package's
            operator can add
  op+grad   the same with inputs that require grad (the op records its backward)
  public    attend.scaled_dot_product_attention: argument checks, then the op
  torch     torch.nn.functional.scaled_dot_product_attention
  compiled  torch.compile(fullgraph=True) of a function making one call, for attend
            and for torch: the compiled call's guards and wrappers around the op

  scripts/bench/op-overhead [--samples N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import attend
from attend import _attend
from bench_py import cpu_name
import record

CALLS = 100
SHAPES = [(1, 1, 4, 8), (1, 8, 16, 64)]


def sample_us(fn) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - start) / CALLS * 1e6


def floor_op():
    """``overhead_floor::sdpa``: attend's schema (its outputs too: a kernel returning
    more tensors than the schema names crashes the dispatcher), an autograd kernel that
    only calls the kernel (no checks; every call runs it as if plain and gradient-free)."""
    lib = torch.library.Library("overhead_floor", "DEF")
    lib.define(
        "sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, float dropout_p, "
        "bool is_causal, float? scale, bool enable_gqa, Tensor? seed) -> (Tensor, Tensor, Tensor)"
    )
    threads = attend.get_num_threads()

    def kernel(keyset, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, seed):
        return _attend.sdpa_forward_tensors(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, seed, threads)

    lib.impl("sdpa", kernel, "Autograd", with_keyset=True)
    return lib, torch.ops.overhead_floor.sdpa.default


def paths(shape, floor):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g) for _ in range(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    views = (q.numpy(), k.numpy(), v.numpy())
    options = _attend.Options(is_causal=False, scale=None, dropout_p=0.0, enable_gqa=False, seed=0)
    threads = attend.get_num_threads()
    op = torch.ops.attend.scaled_dot_product_attention.default
    attend_compiled = torch.compile(lambda q, k, v: attend.scaled_dot_product_attention(q, k, v), fullgraph=True)
    torch_compiled = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), fullgraph=True)
    return {
        "kernel": lambda: _attend.sdpa_forward_tensors(q, k, v, None, 0.0, False, None, False, None, threads),
        "numpy": lambda: _attend.sdpa_forward(views, None, options, threads),
        "floor": lambda: floor(q, k, v, None, 0.0, False, None, False, None),
        "op": lambda: op(q, k, v, None, 0.0, False, None, False, None),
        "op+grad": lambda: op(*leaves, None, 0.0, False, None, False, None),
        "public": lambda: attend.scaled_dot_product_attention(q, k, v),
        "torch": lambda: F.scaled_dot_product_attention(q, k, v),
        "compiled attend": lambda: attend_compiled(q, k, v),
        "compiled torch": lambda: torch_compiled(q, k, v),
    }


def threads_by_size(samples: int) -> None:
    """The kernel on one thread and on two, by size: a call of fewer multiply-adds than
    the extension's threshold runs on the calling thread whatever it asks, so there
    the columns time the same path; from the threshold up, two threads should win.
    Each thread count's samples run as one block; the last column times samples on
    two threads each right after a sample on one (on the calling thread), the case
    where the pool's workers start cold."""
    print(f"one thread or two, by size (q, k, v 1×8×L×64; under {_attend.SMALL_WORK:,} multiply-adds "
          "a call runs on the calling thread whatever thread count it asks for):")
    print("| L | multiply-adds | 1 thread µs | 2 threads µs | 2 threads after 1-thread samples µs |")
    print("|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    n = max(samples // 10, 5)
    for length in (16, 24, 32, 48, 64):
        q, k, v = (torch.randn(1, 8, length, 64, generator=g) for _ in range(3))
        one, two = ((lambda th=th: _attend.sdpa_forward_tensors(q, k, v, None, 0.0, False, None, False, None, th))
                    for th in (1, 2))
        blocks = {fn: statistics.median(sample_us(fn) for _ in range(n)) for fn in (two, one)}
        after = []
        for _ in range(n):
            sample_us(one)
            after.append(sample_us(two))
        print(f"| {length} | {8 * length * length * 128:,} | {blocks[one]:.1f} | {blocks[two]:.1f} | {statistics.median(after):.1f} |")
    print()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200, help="samples of each path (default 200)")
    a = p.parse_args()
    print(f"{cpu_name()}, torch {torch.__version__}, attend threads {attend.get_num_threads()}, "
          f"torch threads {torch.get_num_threads()}, {a.samples} samples of {CALLS} calls a path, "
          "microseconds per call (medians)")
    print()
    _lib, floor = floor_op()
    rows = []
    for shape in SHAPES:
        fns = paths(shape, floor)
        for fn in fns.values():  # compile and warm up before any timing
            fn()
        times = {name: [] for name in fns}
        for _ in range(a.samples):
            for name, fn in fns.items():
                times[name].append(sample_us(fn))
        us = {name: statistics.median(t) for name, t in times.items()}
        print(f"q, k, v {list(shape)}:")
        print("| path | µs per call | over the kernel |")
        print("|---|---|---|")
        for name, t in us.items():
            print(f"| {name} | {t:.1f} | {t - us['kernel']:+.1f} |")
        print(f"the op adds {us['op'] - us['kernel']:.1f} µs to the kernel ({us['floor'] - us['kernel']:.1f} µs "
              f"for PyTorch's trip into a Python kernel alone), the public function "
              f"{us['public'] - us['op']:.1f} µs to the op; compiled, attend costs "
              f"{us['compiled attend'] - us['compiled torch']:+.1f} µs against torch's compiled SDPA")
        print()
        label = "q, k, v " + "×".join(str(x) for x in shape)
        rows += [record.row(f"{label}, eager", us["public"], "torch", us["torch"]),
                 record.row(f"{label}, compiled", us["compiled attend"], "torch compiled", us["compiled torch"])]
    threads_by_size(a.samples)
    record.write("op-overhead", "the cost of one call on tiny shapes, µs: attend.scaled_dot_product_attention against PyTorch's SDPA",
                 unit="µs", better="lower", threads=torch.get_num_threads(), peers={"torch": torch.__version__}, rows=rows)


if __name__ == "__main__":
    main()
