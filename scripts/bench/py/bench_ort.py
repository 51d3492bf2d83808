"""Driver of scripts/bench/ort: ONNX Runtime against attend, encoder only.

Exports the checkpoint's encoder with transformers to ONNX (input_ids,
attention_mask[, token_type_ids] -> last_hidden_state, dynamic batch and sequence
axes), optimises it with onnxruntime's transformer optimiser (model_type "bert":
fused attention, LayerNorm and GELU), checks that ONNX Runtime and attend both give
transformers' last hidden state, then times both on the same token ids, alternating
rounds: ONNX Runtime in this process, attend through its `encoder_bench` example.
Neither side tokenises or pools inside the timed region.

    bench_ort.py MODEL_DIR ENCODER_BENCH [--rounds N] [--threads N]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers
from onnxruntime.transformers.optimizer import optimize_model
from transformers import AutoConfig, AutoModel, AutoTokenizer
from model_rounds import cpu_name
import record
from timing import median_ms

# 32 sentences of the lengths people embed (a search corpus, support tickets, news):
# 6 to 45 tokens, padded to the longest as a batch.
SENTENCES = [
    "How do I reset my password?",
    "The meeting has been moved to Thursday afternoon.",
    "Rust's ownership model prevents data races at compile time.",
    "Where is the nearest train station?",
    "Quarterly revenue rose by eight percent, beating analysts' expectations.",
    "A cat is sleeping on the windowsill in the sun.",
    "Please send the signed contract back before the end of the month.",
    "What are the side effects of this medication?",
    "The new library reads safetensors files and runs BERT encoders on the CPU.",
    "Heavy rain is expected across the north of the country tomorrow.",
    "I ordered the blue one but received a red jacket instead.",
    "Attention lets every token look at every other token in the sentence.",
    "The museum is closed on Mondays.",
    "Can I return an item without the original receipt?",
    "Scientists found water ice in craters near the moon's south pole.",
    "Our flight was delayed by three hours because of a storm over the Atlantic, "
    "and we missed the connection to Lisbon.",
    "Add two cups of flour and stir until the batter is smooth.",
    "The update fixed the crash but the app still drains the battery.",
    "Who won the football match last night?",
    "Interest rates were left unchanged at the central bank's latest meeting.",
    "This laptop's keyboard feels great, but the screen is too dim outdoors.",
    "Translate this paragraph into French, keeping the technical terms in English.",
    "The river burst its banks after a week of rain.",
    "Sentence embeddings map texts with similar meanings to nearby vectors.",
    "My package says delivered but nothing arrived.",
    "The committee will publish its final report, with recommendations on funding, "
    "staffing and the timeline for the new hospital, early next year.",
    "Good morning!",
    "Which plan includes unlimited data and international calls?",
    "The orchestra played Beethoven's fifth symphony to a full hall.",
    "Solar panels on the roof now cover most of the building's electricity.",
    "Is the swimming pool open to visitors who are not staying at the hotel?",
    "He finished the marathon in just under four hours.",
]
CASES = {"short": ["Hello world."], "batch32": SENTENCES}
REPS = {"short": 200, "batch32": 10}


def export(model, names, path):
    """torch.onnx export of the encoder: `names` -> last_hidden_state, dynamic axes."""
    dummy = {n: torch.ones((2, 8), dtype=torch.long) for n in names}
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}

    class Encoder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(**dict(zip(names, args))).last_hidden_state

    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        # The TorchScript exporter's graph is the one onnxruntime's BERT fusions know.
        torch.onnx.export(
            Encoder(model),
            tuple(dummy[n] for n in names),
            path,
            input_names=list(names),
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )
    onnx.checker.check_model(path)


def optimise(path, config, out):
    heads = config.num_attention_heads
    hidden = config.hidden_size
    opt = optimize_model(path, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=1)
    opt.save_model_to_file(out)
    return {k: v for k, v in opt.get_fused_operator_statistics().items() if v}


def session(path, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def max_error(a, b, lengths):
    """Largest |a - b| over the real (non-padding) tokens of `[B, T, d]` arrays."""
    return max(float(np.abs(a[i, :n] - b[i, :n]).max()) for i, n in enumerate(lengths))


def check(name, outputs, reference64, lengths):
    """Each f32 output against the float64 model, by docs/design.md's rule: at most
    twice the error of transformers in float32, plus the f32 rounding floor (a few
    ulps of the largest entry)."""
    scale = max(float(np.abs(reference64[i, :n]).max()) for i, n in enumerate(lengths))
    floor = 4 * float(np.spacing(np.float32(scale)))
    naive = max_error(outputs["transformers"], reference64, lengths)
    bound = 2 * naive + floor
    line = [f"  {name}: vs float64, transformers f32 {naive:.2e}"]
    ok = True
    for who in ("onnxruntime", "attend"):
        err = max_error(outputs[who], reference64, lengths)
        line.append(f"{who} {err:.2e}")
        ok &= err <= bound
    print(", ".join(line) + f" (bound {bound:.2e})")
    if not ok:
        sys.exit(f"error: {name}: an output is further from the float64 model than {bound:.2e}")


def attend_run(bench, model_dir, ids_path, reps, threads, dump=None):
    cmd = [bench, model_dir, ids_path, str(reps)] + ([dump] if dump else [])
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)


def ort_median_ms(sess, feed, reps):
    for _ in range(2):
        sess.run(None, feed)
    return median_ms(lambda: sess.run(None, feed), reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("encoder_bench")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config = AutoConfig.from_pretrained(args.model_dir)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModel.from_pretrained(args.model_dir, attn_implementation="eager").eval()
    probe = tok(["a b"], return_tensors="np")
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in probe]

    print(f"CPU: {cpu_name()}; load average before: {os.getloadavg()}")
    print(
        f"onnxruntime {ort.__version__}, onnx {onnx.__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}; {args.threads} threads each "
        f"(ORT intra_op {args.threads}, inter_op 1; attend RAYON_NUM_THREADS={args.threads})"
    )
    with tempfile.TemporaryDirectory() as tmp:
        raw, opt = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "model-opt.onnx")
        # Exported from its own copy: tracing leaves the module unfit to give the
        # reference outputs below (they moved by ~1 in a trial run).
        fresh = AutoModel.from_pretrained(args.model_dir, attn_implementation="eager").eval()
        export(fresh, names, raw)
        del fresh
        fused = optimise(raw, config, opt)
        print(f"optimised graph ({config.model_type}, model_type='bert'): {fused}")
        sess = session(opt, args.threads)
        cases = {}
        for name, texts in CASES.items():
            enc = tok(texts, padding=True, truncation=True, max_length=512, return_tensors="np")
            feed = {n: enc[n].astype(np.int64) for n in names}
            lengths = [int(x) for x in enc["attention_mask"].sum(axis=1)]
            ids_path = os.path.join(tmp, f"{name}.json")
            with open(ids_path, "w") as f:
                json.dump({"ids": enc["input_ids"].tolist(), "lengths": lengths}, f)
            cases[name] = (feed, lengths, ids_path)

        print("same computation (last hidden state, real tokens):")
        model64 = AutoModel.from_pretrained(args.model_dir, attn_implementation="eager").double().eval()
        for name, (feed, lengths, ids_path) in cases.items():
            pt = {n: torch.from_numpy(v) for n, v in feed.items()}
            with torch.inference_mode():
                ref64 = model64(**pt).last_hidden_state.numpy()
                ref32 = model(**pt).last_hidden_state.numpy()
            dump = os.path.join(tmp, f"{name}.npy")
            attend_run(args.encoder_bench, args.model_dir, ids_path, 1, args.threads, dump)
            outputs = {
                "transformers": ref32,
                "onnxruntime": sess.run(None, feed)[0],
                "attend": np.load(dump),
            }
            check(name, outputs, ref64, lengths)
        del model64

        rows = []
        for name, (feed, lengths, ids_path) in cases.items():
            o, a, parts = [], [], []
            for _ in range(args.rounds):
                o.append(ort_median_ms(sess, feed, REPS[name]))
                r = attend_run(args.encoder_bench, args.model_dir, ids_path, REPS[name], args.threads)
                a.append(r["forward_ms"])
                parts.append(r["breakdown_ms"])
            ratios = [x / y for x, y in zip(o, a)]
            b, t = feed["input_ids"].shape
            part = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
            rows.append((name, b, t, sum(lengths), statistics.median(o), statistics.median(a),
                         statistics.median(ratios), part))
    print(f"load average after: {os.getloadavg()}")
    print()
    print(f"{config.model_type} encoder, median of {args.rounds} alternating rounds "
          f"(each the median of {REPS['short']} or {REPS['batch32']} calls):")
    print()
    print("| case | batch × padded length (real tokens) | ONNX Runtime ms | attend ms | ORT / attend |")
    print("|---|---|---|---|---|")
    for name, b, t, n, o, a, ratio, _ in rows:
        print(f"| {name} | {b} × {t} ({n}) | {o:.2f} | {a:.2f} | {ratio:.2f}× |")
    print()
    for name, *_, part in rows:
        print(f"attend {name} breakdown (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in part.items()))
    out = []
    for name, b, t, n, o, a, ratio, _ in rows:
        r = record.row(f"{os.path.basename(os.path.normpath(args.model_dir))}, {name}, {b} × {t} ({n} real tokens)", a, "onnxruntime", o)
        r["ratio"] = ratio  # the median of the rounds' ratios, as printed
        out.append(r)
    record.write("ort", f"the {config.model_type} encoder alone on the same token ids against ONNX Runtime's optimised export, f32",
                 unit="ms", better="lower", threads=args.threads,
                 peers={"onnxruntime": ort.__version__, "onnx": onnx.__version__}, rows=out)


if __name__ == "__main__":
    main()
