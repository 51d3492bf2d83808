#!/usr/bin/env python3
"""ONNX Runtime's CPU attention operator timed on one shape, as one JSON line: the
peer that scripts/bench-vs-ort runs against `attend bench`, as
shared/bench/torch_sdpa.py is PyTorch's.

A one-node graph is built in-process with onnx's helper API: the
com.microsoft.MultiHeadAttention contrib operator (MLAS's flash attention on CPU)
with `num_heads`, and `unidirectional` for causal, on float32 query [B, L, H*E] and
key and value [B, S, H*E]; onnxruntime runs it on `--threads` intra-op threads.
FLOPs and bytes are counted as torch_sdpa.py counts them.

  ort_mha.py --heads 8 --seq 2048 --head-dim 64 [--causal] [--threads 2]
  ort_mha.py --decode --heads 32 --kv-len 16384 --head-dim 128
"""
import argparse, json, statistics, time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def median_seconds(fn, min_runs=5, min_time=0.5):
    fn()
    times, t_end = [], time.perf_counter() + min_time
    while len(times) < min_runs or time.perf_counter() < t_end:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def session(heads, causal, threads):
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
    graph = helper.make_graph(
        [node],
        "attention",
        [tensor("query", "L"), tensor("key", "S"), tensor("value", "S")],
        [tensor("output", "L")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--kv-len", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--decode", action="store_true", help="one query token against --kv-len keys")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    B, H, E = a.batch, a.heads, a.head_dim
    L = 1 if a.decode else a.seq
    S = a.kv_len or (a.seq if not a.decode else 4096)
    rng = np.random.default_rng(0)
    feeds = {
        "query": rng.standard_normal((B, L, H * E), dtype=np.float32),
        "key": rng.standard_normal((B, S, H * E), dtype=np.float32),
        "value": rng.standard_normal((B, S, H * E), dtype=np.float32),
    }
    sess = session(H, a.causal, a.threads)
    s = median_seconds(lambda: sess.run(None, feeds))
    flops = 4 * B * H * L * S * E / (2 if a.causal else 1)
    out = {"impl": "onnxruntime", "version": ort.__version__, "batch": B, "heads": H,
           "seq": L, "kv_len": S, "head_dim": E, "causal": a.causal, "threads": a.threads,
           "ms": s * 1e3, "gflops": flops / s / 1e9}
    if a.decode:
        out["gbps"] = 2 * B * H * S * E * 4 / s / 1e9
    print(json.dumps(out))


if __name__ == "__main__":
    main()
