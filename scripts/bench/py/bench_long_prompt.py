#!/usr/bin/env python3
"""Driver of scripts/bench/long-prompt: one long prompt through a decoder in
transformers, attn_implementation="attend" against "sdpa".

The decoder is a Llama built from a config with random weights (seed 0): by default
2 layers, hidden 1024, 16 query heads and 4 key/value heads of 64, an MLP of 2816
(Llama's 8/3 · hidden, rounded up to a multiple of 256), a vocabulary of 32,000.
The two sides are the same weights under the two implementations; only the
attention differs. What is timed is a prefill as `generate` runs it: one forward pass
over the whole prompt (batch 1, no padding, so transformers hands both sides no mask
and the causal flag) filling a fresh DynamicCache, with the logits of the last
position only (`logits_to_keep=1`), in inference mode.

Before timing, the two must agree. attend's attention output of every layer, as the
model called it, is judged by the project's error rule (docs/design.md, "Numerical
tests") on 64 query rows spread over the prompt, all heads: its max error against the
float64 reference on the same inputs may be at most twice the yardstick's plus the
rounding floor. The yardstick is the naive float32 implementation in float32 and
PyTorch's own bf16 SDPA (what "sdpa" computes) in bfloat16; the floor and the
reference are the Python tests' own (crates/attend-py/tests/numerics.py), plus, in
bf16, one bf16 rounding unit of the largest output. A failure exits non-zero before
anything is timed.

Each side is called once more to warm up (and timed, to choose `--reps`), then each
round times both sides back to back, in alternating order, each the median of
`--reps` calls (by default as many as take `--min-time` seconds on the slower side, at
least one); the table shows the median over rounds and the ratio sdpa / attend
(above 1: attend is faster). `--profile` adds where one forward's time goes on each
side, by torch.profiler's self CPU time per operator, grouped as attention, dense
products, copies and dtype conversions, and the rest, with the attention's and the
dense products' GFLOP/s (FLOPs counted as `attend bench` counts them: 4·H·L·S·E for
attention, half of it causal) and their share of the machine's peak
(scripts/peak/fma-peak, run here; bf16 against twice it on AVX512-BF16).

  scripts/bench/long-prompt [--tokens 2048,8192] [--dtype f32,bf16] [--rounds N]
                            [--reps N | --min-time S] [--threads N] [--profile] [--quick]
                            [--layers N] [--hidden N] [--heads N] [--kv-heads N] [--intermediate N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Tuple

os.environ["HF_HUB_OFFLINE"] = "1"  # a config, never the hub

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

import attend  # noqa: E402
import attend.transformers  # noqa: E402
from model_rounds import OtherLoad, alternate, cpu_name  # noqa: E402
from timing import median_ms  # noqa: E402
import record  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "crates", "attend-py", "tests"))
import numerics  # noqa: E402  (the Python tests' error rule: one implementation of it)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
BF16_U = 2.0**-8  # bf16's unit roundoff: the rounding of a bf16 output, relative
ROWS = 64  # query rows the check computes in float64, spread over the prompt
VOCAB = 32000


def decoder_config(args: argparse.Namespace, tokens: int, impl: str) -> LlamaConfig:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=tokens,
        attention_dropout=0.0,
    )
    config._attn_implementation = impl
    return config


def decoders(args: argparse.Namespace, tokens: int, dtype: torch.dtype) -> Dict[str, LlamaForCausalLM]:
    """The same random weights (seed 0, then rounded to `dtype`) under "sdpa" and "attend"."""
    torch.manual_seed(0)
    base = LlamaForCausalLM(decoder_config(args, tokens, "sdpa")).eval().to(dtype)
    models = {"sdpa": base}
    attend_model = LlamaForCausalLM(decoder_config(args, tokens, "attend")).eval().to(dtype)
    attend_model.load_state_dict(base.state_dict())
    models["attend"] = attend_model
    assert attend_model.config._attn_implementation == "attend"
    return models


def prefill(model: LlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """One forward over the prompt as `generate`'s prefill runs it; the last logits."""
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    return out.logits


class Recorder:
    """attend.transformers' call of attend's kernel, wrapped to keep each layer's
    inputs, options and output for the check."""

    def __init__(self) -> None:
        self.calls: List[Tuple[tuple, dict, torch.Tensor]] = []
        self.kernel = attend.transformers.scaled_dot_product_attention

    def __enter__(self) -> "Recorder":
        def record(*args, **kwargs):
            out = self.kernel(*args, **kwargs)
            self.calls.append((args, kwargs, out))
            return out

        attend.transformers.scaled_dot_product_attention = record
        return self

    def __exit__(self, *exc) -> None:
        attend.transformers.scaled_dot_product_attention = self.kernel


def rows_mask(mask, is_causal: bool, rows: torch.Tensor, kv_length: int):
    """The mask of the sampled query rows, causality made explicit (top-left)."""
    if mask is not None:
        return mask[..., rows, :] if mask.shape[-2] > 1 else mask
    if is_causal:
        return torch.arange(kv_length)[None, :] <= rows[:, None]
    return None


def check_layer(layer: int, args: tuple, kwargs: dict, got: torch.Tensor) -> str:
    """The error rule on ROWS query rows of one layer's attention; exits on failure."""
    q, k, v = args
    mask, is_causal, scale = kwargs["attn_mask"], kwargs["is_causal"], kwargs["scale"]
    length = q.shape[-2]
    rows = torch.linspace(0, length - 1, min(ROWS, length)).round().long().unique()
    m = rows_mask(mask, is_causal, rows, k.shape[-2])
    qr = q[..., rows, :]
    want, _, _ = numerics.naive(qr, k, v, m, False, scale, torch.float64)
    floor = numerics.floor(qr.float(), k.float(), v.float(), m, False, scale)
    if q.dtype == torch.bfloat16:
        theirs = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=kwargs["enable_gqa"]
        )[..., rows, :]
        yardstick = "PyTorch's bf16 SDPA"
        floor += BF16_U * want.abs().max().item()
    else:
        theirs, _, _ = numerics.naive(qr, k, v, m, False, scale, torch.float32)
        yardstick = "naive f32"
    err = numerics.max_err(got[..., rows, :], want)
    base = numerics.max_err(theirs, want)
    bound = 2 * base + floor
    if not err <= bound:
        sys.exit(
            f"bench-long-prompt: layer {layer}: attend's attention error {err:.3g} exceeds "
            f"2 x {yardstick}'s {base:.3g} + floor {floor:.3g}: the sides disagree, nothing timed"
        )
    return f"layer {layer}: {err:.2g} <= {bound:.2g}"


def check(models: Dict[str, LlamaForCausalLM], ids: torch.Tensor, layers: int) -> Tuple[float, List[str]]:
    """Runs each side once (also its first warm-up call) and checks attend's attention
    layer by layer; returns the max abs difference of the two sides' last logits and
    the per-layer verdicts."""
    with Recorder() as rec:
        ours = prefill(models["attend"], ids)
    if len(rec.calls) != layers:
        sys.exit(f"bench-long-prompt: attend's kernel ran {len(rec.calls)} times for {layers} layers")
    verdicts = [check_layer(i, a, kw, out) for i, (a, kw, out) in enumerate(rec.calls)]
    rec.calls.clear()
    theirs = prefill(models["sdpa"], ids)
    return (ours.double() - theirs.double()).abs().max().item(), verdicts


GROUPS = (
    ("attention", ("attend::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                   "aten::_scaled_dot_product_attention_math")),
    ("dense products", ("aten::mm", "aten::addmm", "aten::bmm")),
    ("copies and conversions", ("aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone")),
)


def flops(args: argparse.Namespace, tokens: int) -> Dict[str, float]:
    """One prefill's FLOPs in the attention (causal: half the square) and in the dense
    products (the projections, the MLP and the last position's logits)."""
    head = args.hidden // args.heads
    attention = args.layers * 4 * args.heads * head * tokens * tokens / 2
    per_token = 2 * args.hidden * args.hidden + 2 * args.hidden * args.kv_heads * head + 3 * args.hidden * args.intermediate
    return {"attention": attention, "dense products": args.layers * 2 * tokens * per_token + 2 * args.hidden * VOCAB}


def fma_peak(threads: int) -> float:
    """The f32 FMA peak in GFLOP/s, by scripts/peak/fma-peak."""
    out = subprocess.run(
        [os.path.join(ROOT, "scripts", "peak", "fma-peak"), str(threads)], capture_output=True, text=True
    )
    if out.returncode != 0:
        sys.exit(f"bench-long-prompt: scripts/peak/fma-peak failed: {out.stderr.strip()}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["gflops"])


def profile(fn: Callable[[], object]) -> Dict[str, float]:
    """Self CPU ms of one call of `fn` by GROUPS, the rest, and the wall time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    t = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    wall = (time.perf_counter() - t) * 1e3
    spent = {name: 0.0 for name, _ in GROUPS}
    spent["the rest"] = 0.0
    for event in p.key_averages():
        group = next((name for name, ops in GROUPS if event.key in ops), "the rest")
        spent[group] += event.self_cpu_time_total / 1e3
    spent["wall (profiled)"] = wall
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="2048,8192", help="prompt lengths, comma-separated")
    parser.add_argument("--dtype", default="f32,bf16", help="f32, bf16 or both, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, help="calls per side per round (default: from --min-time)")
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds per side per round, for the default --reps")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--profile", action="store_true", help="also where one forward's time goes, per side")
    parser.add_argument("--quick", action="store_true", help="the 2,048-token prompt, one round")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.rounds, args.reps = "2048", 1, args.reps or 1
    try:
        lengths = [int(n) for n in args.tokens.split(",")]
        dtypes = [DTYPES[d] for d in args.dtype.split(",")]
    except (ValueError, KeyError):
        sys.exit(f"bench-long-prompt: --tokens takes integers and --dtype f32/bf16, got {args.tokens!r}, {args.dtype!r}")
    if min(lengths) < 1 or args.rounds < 1 or (args.reps is not None and args.reps < 1):
        sys.exit("bench-long-prompt: --tokens, --rounds and --reps must be at least 1")

    torch.set_num_threads(args.threads)
    attend.set_num_threads(args.threads)
    attend.transformers.register()
    transformers.logging.set_verbosity_error()

    print(f"CPU: {cpu_name()}")
    print(
        f"threads: {args.threads} (torch {torch.get_num_threads()}, attend {attend.get_num_threads()}), "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, attend {attend.__version__} ({attend.isa()}) "
        f"from {os.path.dirname(attend.__file__)}"
    )
    print(
        f"decoder: Llama, random weights (seed 0), {args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} query heads and {args.kv_heads} key/value heads of {args.hidden // args.heads}, "
        f"MLP {args.intermediate}, vocabulary {VOCAB}; prefill: one forward, batch 1, no padding "
        f"(causal flag, no mask), a fresh DynamicCache, logits_to_keep=1; {args.rounds} rounds x "
        + (f"{args.reps} calls per side" if args.reps else f"as many calls per side as take {args.min_time:g} s")
    )
    print(f"load average before: {os.getloadavg()}")
    others = OtherLoad()

    results = []
    for dtype in dtypes:
        for tokens in lengths:
            models = decoders(args, tokens, dtype)
            ids = torch.randint(0, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(1))
            diff, verdicts = check(models, ids, args.layers)
            name = "f32" if dtype == torch.float32 else "bf16"
            print(f"check {name} {tokens} tokens (attend's max error <= bound): " + "; ".join(verdicts))
            sides = {impl: (lambda m=m: prefill(m, ids)) for impl, m in models.items()}
            spent = {impl: profile(fn) for impl, fn in sides.items()} if args.profile else None
            first = {impl: median_ms(fn, 1) for impl, fn in sides.items()}  # the warm-up
            reps = args.reps or max(1, math.ceil(args.min_time * 1e3 / max(first.values())))
            ms = alternate(sides, args.rounds, reps, warmup=0)
            results.append((name, tokens, reps, ms, diff, spent))
            del models, sides

    others.report()

    print(
        "\n| dtype | prompt tokens | calls per round | sdpa median (ms) | attend median (ms) | sdpa / attend "
        "| last logits max abs diff |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, tokens, reps, ms, diff, _ in results:
        s, a = statistics.median(ms["sdpa"]), statistics.median(ms["attend"])
        print(f"| {name} | {tokens:,} | {reps} | {s:.0f} | {a:.0f} | {s / a:.2f}x | {diff:.2g} |")
    record.write(
        "long-prompt", "a prefill through a Llama from a config (random weights) in transformers: \"attend\" against \"sdpa\"",
        unit="ms", better="lower", threads=args.threads,
        peers={"torch": torch.__version__, "transformers": transformers.__version__},
        rows=[record.row(f"{name}, {tokens:,} tokens", statistics.median(ms["attend"]), "transformers \"sdpa\"",
                         statistics.median(ms["sdpa"])) for name, tokens, reps, ms, diff, _ in results],
        other_load=others.share(),
    )
    if args.profile:
        peak = fma_peak(args.threads)
        bf16_peak = 2 * peak if attend.isa() in ("avx512bf16", "amx") else peak
        print(
            f"\nwhere one forward's time goes (torch.profiler, self CPU ms per operator group; one call per side); "
            f"f32 FMA peak {peak:.1f} GFLOP/s (scripts/peak/fma-peak {args.threads}), bf16 peak {bf16_peak:.1f}:\n"
        )
        groups = [name for name, _ in GROUPS] + ["the rest", "wall (profiled)"]
        rated = ("attention", "dense products")
        print(
            "| dtype | prompt tokens | side | " + " | ".join(groups) + " | "
            + " | ".join(f"{g} GFLOP/s (share of peak)" for g in rated) + " |"
        )
        print("|---|---:|---|" + "---:|" * (len(groups) + len(rated)))
        for name, tokens, _, _, _, spent in results:
            work = flops(args, tokens)
            top = peak if name == "f32" else bf16_peak
            for impl, row in spent.items():
                rates = [work[g] / (row[g] * 1e6) for g in rated]
                print(
                    f"| {name} | {tokens:,} | {impl} | " + " | ".join(f"{row[g]:.0f}" for g in groups) + " | "
                    + " | ".join(f"{r:.0f} ({100 * r / top:.0f} %)" for r in rates) + " |"
                )
    print("\nper-round medians (ms):")
    for name, tokens, _, ms, _, _ in results:
        for impl, values in ms.items():
            print(f"  {name:4s} {tokens:6d} {impl:6s} " + " ".join(f"{v:.0f}" for v in values))


if __name__ == "__main__":
    main()
