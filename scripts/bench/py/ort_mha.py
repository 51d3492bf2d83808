#!/usr/bin/env python3
"""ONNX Runtime's CPU attention operator timed on one shape, as one JSON line: the
peer that scripts/bench/vs-ort runs against `attend bench`, as
scripts/bench/py/torch_sdpa.py is PyTorch's.

A one-node graph is built in-process with onnx's helper API: the
com.microsoft.MultiHeadAttention contrib operator (MLAS's flash attention on CPU)
with `num_heads`, and `unidirectional` for causal, on float32 query [B, L, H*E];
onnxruntime runs it on `--threads` intra-op threads. FLOPs and bytes are counted
as torch_sdpa.py counts them.

Key and value are [B, S, H*E] (`--kv-layout sequence`) for the forward and
[B, H, S, E] (`--kv-layout cache`) for decoding, each mode's faster layout:
the cache layout is a KV cache's, as attend's is, which the operator reads in
place; given [B, S, H*E] when decoding it first transposes the whole cache on
every call, which would flatter attend. `--kv-layout` times the other layout
(the cache layout without a causal mask only).

  ort_mha.py --heads 8 --seq 2048 --head-dim 64 [--causal] [--threads 2]
  ort_mha.py --decode --heads 32 --kv-len 16384 --head-dim 128 [--kv-layout sequence]
  ort_mha.py --decode --heads 8 --kv-heads 2 --kv-len 32768 --head-dim 128

Grouped-query decoding (`--kv-heads` below `--heads`) runs com.microsoft.
GroupQueryAttention instead, whose CPU kernel takes the new token's key and value
with a KV cache [B, Hkv, S, E]: the cache is bound as both the past and the present
buffer (I/O binding), so each call appends the token in place at position S − 1
and attends over S keys, as `attend bench --decode` does, without copying the
cache (a fresh present cache would be a copy of it on every call). The first
call's output is checked against NumPy before timing.
"""
import argparse, json

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from timing import median_seconds


def session(heads, causal, threads, cache_layout):
    node = helper.make_node(
        "MultiHeadAttention",
        ["query", "key", "value"],
        ["output"],
        domain="com.microsoft",
        num_heads=heads,
        unidirectional=int(causal),
    )
    tensor = lambda name, length: helper.make_tensor_value_info(
        name, TensorProto.FLOAT, ["batch", length, "hidden"]
    )
    cache = lambda name: helper.make_tensor_value_info(
        name, TensorProto.FLOAT, ["batch", "heads", "S", "head_dim"]
    )
    kv = (cache("key"), cache("value")) if cache_layout else (tensor("key", "S"), tensor("value", "S"))
    graph = helper.make_graph(
        [node],
        "attention",
        [tensor("query", "L"), *kv],
        [tensor("output", "L")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    return ort.InferenceSession(model.SerializeToString(), options(threads), providers=["CPUExecutionProvider"])


def grouped_decode(B, H, Hkv, S, E, threads, rng):
    """A timed call of GroupQueryAttention over a shared KV cache of S keys, after
    checking its output against NumPy."""
    f = TensorProto.FLOAT
    info = helper.make_tensor_value_info
    node = helper.make_node(
        "GroupQueryAttention",
        ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
        ["output", "present_key", "present_value"],
        domain="com.microsoft",
        num_heads=H,
        kv_num_heads=Hkv,
    )
    cache = ["batch", Hkv, "S", E]
    graph = helper.make_graph(
        [node],
        "grouped_decode",
        [info("query", f, ["batch", 1, H * E]), info("key", f, ["batch", 1, Hkv * E]),
         info("value", f, ["batch", 1, Hkv * E]), info("past_key", f, cache),
         info("past_value", f, cache), info("seqlens_k", TensorProto.INT32, ["batch"]),
         info("total_sequence_length", TensorProto.INT32, [])],
        [info("output", f, ["batch", 1, H * E]), info("present_key", f, cache),
         info("present_value", f, cache)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    sess = ort.InferenceSession(model.SerializeToString(), options(threads), providers=["CPUExecutionProvider"])
    k = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
    feeds = {
        "query": rng.standard_normal((B, 1, H * E), dtype=np.float32),
        "key": rng.standard_normal((B, 1, Hkv * E), dtype=np.float32),
        "value": rng.standard_normal((B, 1, Hkv * E), dtype=np.float32),
        "past_key": k,
        "past_value": v,
        "seqlens_k": np.full(B, S - 1, dtype=np.int32),
        "total_sequence_length": np.array(S, dtype=np.int32),
    }
    io = sess.io_binding()
    for name, x in feeds.items():
        io.bind_cpu_input(name, x)
    io.bind_output("output", "cpu")
    io.bind_ortvalue_output("present_key", ort.OrtValue.ortvalue_from_numpy(k))
    io.bind_ortvalue_output("present_value", ort.OrtValue.ortvalue_from_numpy(v))
    sess.run_with_iobinding(io)
    got = io.copy_outputs_to_cpu()[0].reshape(B, H, E)
    # The reference reads the cache after the call appended the token in place.
    q = feeds["query"].reshape(B, Hkv, H // Hkv, E)
    scores = np.einsum("bkge,bkse->bkgs", q, k) / np.sqrt(E)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bkgs,bkse->bkge", w / w.sum(-1, keepdims=True), v).reshape(B, H, E)
    if not np.allclose(got, want, rtol=1e-3, atol=1e-4):
        raise SystemExit(f"GroupQueryAttention disagrees with NumPy: max diff {np.abs(got - want).max()}")
    return median_seconds(lambda: sess.run_with_iobinding(io))


def options(threads):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return opts


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=None, help="grouped-query decoding (default: --heads)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--kv-len", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--decode", action="store_true", help="one query token against --kv-len keys")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-layout", choices=["cache", "sequence"], default=None,
                   help="[B, H, S, E] or [B, S, H*E] (default: cache when decoding, else sequence)")
    a = p.parse_args()
    cache_layout = (a.kv_layout or ("cache" if a.decode else "sequence")) == "cache"
    if cache_layout and a.causal:
        raise SystemExit("--kv-layout cache is timed without --causal only")
    B, H, E = a.batch, a.heads, a.head_dim
    L = 1 if a.decode else a.seq
    S = a.kv_len or (a.seq if not a.decode else 4096)
    Hkv = a.kv_heads or H
    if H % Hkv:
        raise SystemExit(f"--heads ({H}) must be a multiple of --kv-heads ({Hkv})")
    if Hkv != H and not a.decode:
        raise SystemExit("grouped-query shapes are timed for --decode only")
    rng = np.random.default_rng(0)
    if Hkv != H:
        s = grouped_decode(B, H, Hkv, S, E, a.threads, rng)
    else:
        kv_shape = (B, H, S, E) if cache_layout else (B, S, H * E)
        feeds = {
            "query": rng.standard_normal((B, L, H * E), dtype=np.float32),
            "key": rng.standard_normal(kv_shape, dtype=np.float32),
            "value": rng.standard_normal(kv_shape, dtype=np.float32),
        }
        sess = session(H, a.causal, a.threads, cache_layout)
        s = median_seconds(lambda: sess.run(None, feeds))
    flops = 4 * B * H * L * S * E / (2 if a.causal else 1)
    out = {"impl": "onnxruntime", "version": ort.__version__, "batch": B, "heads": H,
           "seq": L, "kv_len": S, "head_dim": E, "causal": a.causal, "threads": a.threads,
           "kv_layout": "cache" if cache_layout else "sequence", "ms": s * 1e3,
           "gflops": flops / s / 1e9}
    if a.decode:
        out["kv_heads"] = Hkv
        out["gbps"] = 2 * B * Hkv * S * E * 4 / s / 1e9
    print(json.dumps(out))


if __name__ == "__main__":
    main()
