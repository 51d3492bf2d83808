"""Driver of scripts/bench/openvino: attend's sentence embeddings against OpenVINO's
and ONNX Runtime's, texts in and embeddings out on every side.

The peers, for each checkpoint:
  * OpenVINO converts transformers' AutoModel with openvino.convert_model (an example
    batch; batch and sequence dimensions dynamic; last_hidden_state its one output) and
    compiles it for the CPU with INFERENCE_NUM_THREADS = --threads twice: with
    INFERENCE_PRECISION_HINT f32, and with OpenVINO's default, whose precision is read
    back from the compiled model and printed.
  * ONNX Runtime runs scripts/bench/py/bench_ort.py's export of the same model, optimised by
    onnxruntime's transformer optimiser, with bench_ort.py's session options.
  * Around both: the checkpoint's tokenizer (truncating at sentence-transformers'
    max_seq_length), texts sorted by token count into batches as attend sorts them, each
    batch padded to its longest text, and the modules.json pipeline rebuilt: mean over
    the real tokens (1_Pooling) and Normalize. Only that pipeline is accepted.
attend: `attend.SentenceEncoder.encode` in process, precision "f32" and "bf16", for
the 32 sentences and the one sentence; the corpus through `attend embed --input` (f32
and --precision bf16), timed as a whole run, start-up included.

Every side's embeddings of the 32 sentences and the one sentence are checked against
sentence-transformers' before anything is timed: cosine >= 0.9999 in f32, >= 0.99 in
bf16. After the timing, every side's corpus embeddings are checked against attend
f32's with the same bounds.

Accuracy (issue 28, printed per model before the table), on the 32 sentences against
sentence-transformers in float64 (model.double()): the max abs error of attend f32,
PyTorch f32 (sentence-transformers), OpenVINO f32 and ONNX Runtime, with the design
rule "attend f32's error <= 2x PyTorch f32's"; in bf16, attend's min cosine against
attend f32 (>= 0.999) and max abs error beside OpenVINO's default precision's (its
min cosine against OpenVINO f32), with "attend bf16's error <= OpenVINO bf16's". A
failed check is printed as FAIL; the script goes on.

Cases: (a) the corpus (--corpus; for a model with more dense FLOPs per token than
all-MiniLM-L6-v2, its first lines, cut so that it costs about as much), batches of 32;
(b) scripts/bench/py/bench_py_models.py's 32 sentences, unsorted, one batch; (c) one short
sentence. Each round times every side once (the corpus) or as the median of several
calls, in an order that flips every round; the table shows medians over rounds and
attend / peer speed as the median of the rounds' ratios (above 1: attend is faster).

Share of the peak: an encoder forward's FLOPs (2 per multiply-add of the dense layers,
2 * (4 d^2 + 2 d ff) per token and layer, plus 4 L^2 d per sequence and layer for
attention's two products), over real tokens for attend (it skips padding) and padded
ones for the peers, divided by the time and by the f32 FMA peak (--peak), or in bf16
by twice it on a CPU with AVX512-BF16 (scripts/peak/bf16-peak measures the ratio), or
by --bf16-peak where given (the AMX tiles' tdpbf16ps rate, on which attend's bf16 dense
layers run there; OpenVINO's run on the same tiles).

    bench_openvino.py MODEL_DIR... --attend BIN --corpus FILE --peak GFLOPS
                      [--rounds N] [--quick] [--threads N] [--f32-only]

--f32-only leaves out both bf16 sides (scripts/bench/openvino --max-isa avx2 passes
it: OpenVINO's default then still picks bf16, which its capped primitives cannot run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_ort import export, optimise, session  # noqa: E402
from bench_py_models import SENTENCES  # noqa: E402
from model_rounds import OtherLoad, cpu_name  # noqa: E402
import record  # noqa: E402
from timing import median_ms  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import openvino as ov  # noqa: E402
import sentence_transformers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from transformers import AutoConfig, AutoModel, AutoTokenizer  # noqa: E402

import attend  # noqa: E402

SHORT = "Where is the nearest pharmacy?"
BATCH = 32
COSINE = {"f32": 0.9999, "bf16": 0.99}
# Calls per round for the in-process cases (default, --quick).
REPS = {"batch32": (5, 3), "short": (50, 20)}
# attend bf16's floor on its cosine against attend f32 (issue 28's accuracy target).
BF16_COSINE_TO_F32 = 0.999

transformers.logging.set_verbosity_error()


def pipeline(model_dir):
    """Whether the checkpoint's modules.json ends in Normalize, after checking that it
    is Transformer, mean Pooling[, Normalize]: the pipeline the peers rebuild here."""
    with open(os.path.join(model_dir, "modules.json")) as f:
        modules = json.load(f)
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        sys.exit(f"error: {model_dir}: modules {kinds}; expected Transformer, Pooling[, Normalize]")
    with open(os.path.join(model_dir, modules[1]["path"], "config.json")) as f:
        modes = sorted(k for k, v in json.load(f).items() if k.startswith("pooling_mode_") and v)
    if modes != ["pooling_mode_mean_tokens"]:
        sys.exit(f"error: {model_dir}: pooling {modes}; expected pooling_mode_mean_tokens alone")
    return kinds[-1] == "Normalize"


def sorted_batches(lengths, batch_size):
    """Indices of the texts by decreasing token count (a stable sort, as attend's
    corpus path sorts), cut into batches."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def padded_lengths(lengths, batch_size):
    """The sequence length each text is computed at when its batch pads to its longest."""
    out = []
    for idx in sorted_batches(lengths, batch_size):
        out += [max(lengths[i] for i in idx)] * len(idx)
    return out


def dense_flops_per_token(layers, d, ff):
    """2 per multiply-add of Q, K, V, the output projection and the two feed-forward
    products."""
    return 2 * layers * (4 * d * d + 2 * d * ff)


MINILM_DENSE_FLOPS_PER_TOKEN = dense_flops_per_token(6, 384, 1536)


def encoder_flops(config, lengths):
    """An encoder forward over sequences of these lengths: the dense layers, and
    attention's two products (4 L^2 d per sequence and layer)."""
    layers, d = config.num_hidden_layers, config.hidden_size
    dense = dense_flops_per_token(layers, d, config.intermediate_size)
    return sum(dense * n + layers * 4 * n * n * d for n in lengths)


def kind(precision):
    """The bound and peak a precision is held to: f32's, or the 16-bit ones'."""
    return "f32" if precision == "f32" else "bf16"


def cosines(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def check(label, got, want, precision):
    worst, bound = float(cosines(got, want).min()), COSINE[precision]
    diff = float(np.abs(got.astype(np.float64) - want).max())
    print(f"  {label}: min cosine {worst:.7f}, max abs diff {diff:.2e} (bound {bound})")
    if not worst >= bound:
        sys.exit(f"error: {label}: min cosine {worst:.7f} < {bound}")


class Peer:
    """A compiled encoder (`run`: feed -> last hidden state) with sentence-transformers'
    work around it: tokenising, batches sorted by token count and padded, mean pooling
    over real tokens, Normalize."""

    def __init__(self, run, tok, names, max_length, normalize):
        self.run, self.tok, self.names = run, tok, names
        self.max_length, self.normalize = max_length, normalize

    def encode(self, texts):
        enc = self.tok(texts, truncation=True, max_length=self.max_length)
        lengths = [len(ids) for ids in enc["input_ids"]]
        out = None
        for idx in sorted_batches(lengths, BATCH):
            shape = (len(idx), lengths[idx[0]])
            feed = {n: np.full(shape, self.tok.pad_token_id if n == "input_ids" else 0, np.int64) for n in self.names}
            for j, i in enumerate(idx):
                for n in self.names:
                    feed[n][j, : lengths[i]] = enc[n][i]
            mask = feed["attention_mask"][:, :, None].astype(np.float32)
            vectors = (self.run(feed) * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
            if self.normalize:
                vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), np.float32)
            out[idx] = vectors
        return out


def openvino_model(model_dir, tok, names):
    """transformers' AutoModel converted by OpenVINO, its last hidden state the only output."""
    model = AutoModel.from_pretrained(model_dir).eval()
    example = tok(["Hello world.", "A slightly longer example sentence."], padding=True, return_tensors="pt")
    inputs = [(n, ov.PartialShape([-1, -1]), ov.Type.i64) for n in names]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        converted = ov.convert_model(model, example_input={n: example[n] for n in names}, input=inputs)
    return ov.Model([converted.output("last_hidden_state")], converted.get_parameters())


def attend_cli(binary, model_dir, path, out, precision, threads):
    """Seconds of one `attend embed --input` run."""
    cmd = [binary, "embed", "--model", model_dir, "--precision", precision, "--input", path, "--output", out]
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def alternate(sides, rounds):
    """Each side's time per round (ms); the order of the sides flips every round."""
    names = list(sides)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names if r % 2 == 0 else reversed(names):
            times[n].append(sides[n]())
    return times


def make_peers(model_dir, config, tok, names, max_length, normalize, threads, tmp, f32_only):
    """OpenVINO f32, OpenVINO default (unless `f32_only`) and ONNX Runtime as Peers, and
    each one's precision."""
    t = time.perf_counter()
    model = openvino_model(model_dir, tok, names)
    core = ov.Core()
    peers, precision = {}, {}
    hints = {"OpenVINO f32": {"INFERENCE_PRECISION_HINT": "f32"}, "OpenVINO default": {}}
    if f32_only:
        del hints["OpenVINO default"]
    for side, hint in hints.items():
        compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads, **hint})
        request = compiled.create_infer_request()
        peers[side] = Peer(lambda feed, r=request: r.infer(feed)[0], tok, names, max_length, normalize)
        precision[side] = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        if compiled.get_property("INFERENCE_NUM_THREADS") != threads:
            sys.exit(f"error: {side} compiled for {compiled.get_property('INFERENCE_NUM_THREADS')} threads")
    if precision["OpenVINO f32"] != "f32":
        sys.exit(f"error: OpenVINO compiled the f32 hint as {precision['OpenVINO f32']}")
    default = precision.get("OpenVINO default", "not compiled (--f32-only)")
    print(f"OpenVINO: converted and compiled in {time.perf_counter() - t:.1f} s; "
          f"its default precision on this CPU: {default}")
    t = time.perf_counter()
    name = os.path.basename(os.path.normpath(model_dir))
    raw, opt = os.path.join(tmp, f"{name}.onnx"), os.path.join(tmp, f"{name}-opt.onnx")
    export(AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval(), names, raw)
    fused = optimise(raw, config, opt)
    sess = session(opt, threads)
    print(f"ONNX Runtime: exported and optimised in {time.perf_counter() - t:.1f} s: {fused}")
    peers["ONNX Runtime"] = Peer(lambda feed: sess.run(None, feed)[0], tok, names, max_length, normalize)
    precision["ONNX Runtime"] = "f32"
    return peers, precision


def check_sides(st, sides, precision, cases):
    """Every side's embeddings of the cases' texts against sentence-transformers'."""
    print("same embeddings as sentence-transformers (the 32 sentences and the short one):")
    with torch.inference_mode():
        want = np.concatenate([st.encode(texts, batch_size=BATCH, convert_to_numpy=True) for texts in cases.values()])
    for side, encode in sides.items():
        check(side, np.concatenate([encode(texts) for texts in cases.values()]), want, kind(precision[side]))


def accuracy(st, sides, precision, texts):
    """Issue 28's accuracy lines for `texts`: each side's error against
    sentence-transformers in float64, and the checks on attend f32 and bf16. Turns
    `st` to float64."""
    with torch.inference_mode():
        got = {"PyTorch f32": st.encode(texts, batch_size=BATCH, convert_to_numpy=True)}
        st.double()
        want = st.encode(texts, batch_size=BATCH, convert_to_tensor=True).numpy()
    got.update((side, encode(texts)) for side, encode in sides.items())
    err = {side: float(np.abs(v.astype(np.float64) - want).max()) for side, v in got.items()}

    def verdict(ok):
        return "pass" if ok else "FAIL"

    f32_lines = [
        f"max abs error against sentence-transformers in float64 (model.double()), the {len(texts)} sentences:",
        "  f32: " + ", ".join(f"{side} {err[side]:.2e}" for side in ("attend", "PyTorch f32", "OpenVINO f32", "ONNX Runtime")),
        f"  check attend f32 error <= 2x PyTorch f32's: {err['attend']:.2e} <= {2 * err['PyTorch f32']:.2e}: "
        f"{verdict(err['attend'] <= 2 * err['PyTorch f32'])}",
    ]
    if "attend bf16" not in sides:
        return f32_lines
    cos = {side: float(cosines(got[side], got[f32]).min())
           for side, f32 in (("attend bf16", "attend"), ("OpenVINO default", "OpenVINO f32"))}
    ov16 = f"OpenVINO default ({precision['OpenVINO default']})"
    return f32_lines + [
        f"  bf16: attend bf16 max abs error {err['attend bf16']:.2e}, min cosine against attend f32 "
        f"{cos['attend bf16']:.6f}; {ov16} max abs error {err['OpenVINO default']:.2e}, min cosine against "
        f"OpenVINO f32 {cos['OpenVINO default']:.6f}",
        f"  check attend bf16 min cosine against attend f32 >= {BF16_COSINE_TO_F32}: {cos['attend bf16']:.6f}: "
        f"{verdict(cos['attend bf16'] >= BF16_COSINE_TO_F32)}",
        f"  check attend bf16 max abs error <= {ov16}'s: {err['attend bf16']:.2e} <= {err['OpenVINO default']:.2e}: "
        f"{verdict(err['attend bf16'] <= err['OpenVINO default'])}",
    ]


def corpus_sides(args, model_dir, corpus_path, corpus, peers, outputs, tmp):
    """The corpus case's sides, each returning its time (ms) and leaving its embeddings
    in `outputs` (an array, or the .npy attend wrote)."""

    def cli(side, precision):
        outputs[side] = os.path.join(tmp, f"corpus-{precision}.npy")
        return lambda: attend_cli(args.attend, model_dir, corpus_path, outputs[side], precision, args.threads) * 1e3

    def python(side):
        def run():
            t = time.perf_counter()
            outputs[side] = peers[side].encode(corpus)
            return (time.perf_counter() - t) * 1e3

        return run

    ours = {"attend": cli("attend", "f32")}
    if not args.f32_only:
        ours["attend bf16"] = cli("attend bf16", "bf16")
    return {**ours, **{s: python(s) for s in peers}}


def call_sides(sides, texts, reps):
    """The sides of a case of one call (the 32 sentences, the one sentence): medians of
    `reps` calls in process."""
    return {s: (lambda encode=encode: median_ms(lambda: encode(texts), reps)) for s, encode in sides.items()}


def bench_model(model_dir, args, corpus, tmp):
    """Checks every side and times the three cases; returns the model's table rows
    (model, case label, real tokens, padded tokens, times, FLOPs, precisions) and its
    accuracy lines."""
    config = AutoConfig.from_pretrained(model_dir)
    name = os.path.basename(os.path.normpath(model_dir))
    normalize = pipeline(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tok(["a b"])]
    st = SentenceTransformer(model_dir, device="cpu")
    enc = attend.SentenceEncoder(model_dir)
    enc16 = None if args.f32_only else attend.SentenceEncoder(model_dir, precision="bf16")
    if enc.precision != "f32" or (enc16 is not None and enc16.precision != "bf16"):
        sys.exit(f"error: attend.SentenceEncoder precisions {enc.precision}, {enc16 and enc16.precision}; "
                 "expected f32, bf16")
    max_length = enc.max_seq_length
    if st.max_seq_length != max_length:
        sys.exit(f"error: {name}: max_seq_length {st.max_seq_length} (sentence-transformers) != {max_length} (attend)")
    dense = dense_flops_per_token(config.num_hidden_layers, config.hidden_size, config.intermediate_size)
    corpus = corpus[: min(len(corpus), BATCH * math.ceil(len(corpus) * MINILM_DENSE_FLOPS_PER_TOKEN / dense / BATCH))]
    corpus_path = os.path.join(tmp, "corpus.txt")
    with open(corpus_path, "w") as f:
        f.write("\n".join(corpus) + "\n")
    print(f"\n## {name}: {config.model_type}, {config.num_hidden_layers} layers, d {config.hidden_size}, "
          f"ff {config.intermediate_size}, max_seq_length {max_length}, Normalize {normalize}")

    peers, precision = make_peers(model_dir, config, tok, names, max_length, normalize, args.threads, tmp,
                                  args.f32_only)
    precision.update({"attend": "f32", "attend bf16": "bf16"})
    quick = int(args.quick)
    cases = {"batch32": SENTENCES, "short": [SHORT]}
    ours = {"attend": lambda texts: enc.encode(texts, batch_size=BATCH)}
    if enc16 is not None:
        ours["attend bf16"] = lambda texts: enc16.encode(texts, batch_size=BATCH)
    in_process = {**ours, **{side: peer.encode for side, peer in peers.items()}}
    check_sides(st, in_process, precision, cases)
    accuracy_lines = accuracy(st, in_process, precision, SENTENCES)
    del st

    labels = {"corpus": f"corpus, {len(corpus)} lines in batches of {BATCH}",
              "batch32": "32 sentences, one batch", "short": "one sentence"}
    rows, outputs = [], {}
    for case, texts in {"corpus": corpus, **cases}.items():
        if case == "corpus":
            sides = corpus_sides(args, model_dir, corpus_path, corpus, peers, outputs, tmp)
        else:
            sides = call_sides(in_process, texts, REPS[case][quick])
        times = alternate(sides, args.rounds)
        print(f"  {case}, per-round ms: " + "; ".join(f"{s} " + " ".join(f"{v:.1f}" for v in vs) for s, vs in times.items()))
        real = [len(ids) for ids in tok(texts, truncation=True, max_length=max_length)["input_ids"]]
        padded = padded_lengths(real, BATCH)
        flops = {s: encoder_flops(config, real if s.startswith("attend") else padded) for s in sides}
        rows.append((name, labels[case], sum(real), sum(padded), times, flops, precision))
        if case == "corpus":
            print("corpus embeddings against attend f32's (last round):")
            reference = np.load(outputs.pop("attend"))
            for side, out in outputs.items():
                check(side, np.load(out) if isinstance(out, str) else out, reference, kind(precision[side]))
    return rows, accuracy_lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dirs", nargs="+")
    ap.add_argument("--attend", required=True, help="the attend binary (target/release/attend)")
    ap.add_argument("--corpus", required=True, help="one text per line (scripts/bench/corpus N)")
    ap.add_argument("--peak", type=float, required=True, help="the f32 FMA peak, GFLOP/s, at --threads")
    ap.add_argument("--bf16-peak", type=float, help="the bf16 peak, GFLOP/s, at --threads, where it is not "
                    "twice --peak's (AMX tiles: scripts/peak/dpbf16_peak.c amx)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer calls per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--f32-only", action="store_true",
                    help="attend f32 against OpenVINO f32 and ONNX Runtime only (no bf16 sides)")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("error: --rounds must be at least 1")
    with open(args.corpus) as f:
        corpus = f.read().splitlines()

    torch.set_num_threads(args.threads)
    attend.set_num_threads(args.threads)
    with open("/proc/cpuinfo") as f:
        bf16_pairs = "avx512_bf16" in f.read()
    peaks = {"f32": args.peak, "bf16": args.bf16_peak or args.peak * (2 if bf16_pairs else 1)}
    bf16_source = ("AMX tdpbf16ps" if args.bf16_peak
                   else "AVX512-BF16: twice" if bf16_pairs else "no AVX512-BF16: the same")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {cpu_name()}; f32 FMA peak {peaks['f32']:.0f} GFLOP/s on {args.threads} threads, bf16 "
          f"{peaks['bf16']:.0f} ({bf16_source})")
    print(f"openvino {ov.__version__}, onnxruntime {ort.__version__}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, sentence-transformers {sentence_transformers.__version__}, "
          f"attend {attend.__version__} ({attend.isa()})")
    caps = [f"{v}={os.environ[v]}" for v in ("ATTEND_MAX_ISA", "ONEDNN_MAX_CPU_ISA") if v in os.environ]
    if caps:
        print(f"instruction sets capped: {', '.join(caps)} (ONNX Runtime has no cap and runs its best path)")
    print(f"{args.threads} threads each (OpenVINO INFERENCE_NUM_THREADS, ORT intra_op, attend "
          f"set_num_threads and RAYON_NUM_THREADS); {args.rounds} rounds; load average before: {os.getloadavg()}")
    others = OtherLoad()
    rows, accuracies = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for model_dir in args.model_dirs:
            model_rows, accuracies[model_dir] = bench_model(model_dir, args, corpus, tmp)
            rows += model_rows
    print()
    others.report()

    for model_dir, lines in accuracies.items():
        print(f"\n## accuracy, {os.path.basename(os.path.normpath(model_dir))}")
        print("\n".join(lines))
    print_table(rows, peaks)
    write_record(rows, peaks, args, others)


def write_record(rows, peaks, args, others):
    """The table's comparisons as one record (scripts/bench/py/record.py): each
    attend side against each peer it is compared with, the ratio the median of the
    rounds' ratios, attend's share of the peak in its precision."""
    out = []
    pairs = [("attend", "OpenVINO f32"), ("attend", "ONNX Runtime"), ("attend bf16", "OpenVINO default")]
    for name, label, real, padded, times, flops, precision in rows:
        for ours, peer in pairs:
            if ours not in times or peer not in times:
                continue
            mine = statistics.median(times[ours])
            r = record.row(f"{name}, {label}, {precision[ours]}", mine, f"{peer} ({precision[peer]})",
                           statistics.median(times[peer]),
                           share_of_peak=flops[ours] / (mine * 1e-3) / (peaks[kind(precision[ours])] * 1e9))
            r["ratio"] = statistics.median(p / a for p, a in zip(times[peer], times[ours]))
            out.append(r)
    record.write("openvino", "sentence embeddings, texts in and vectors out, against OpenVINO and ONNX Runtime",
                 unit="ms", better="lower", threads=args.threads,
                 peers={"openvino": ov.__version__, "onnxruntime": ort.__version__}, rows=out,
                 peaks={"f32_gflops": peaks["f32"], "bf16_gflops": peaks["bf16"]}, other_load=others.share())


def print_table(rows, peaks):
    def fmt(ms):
        return f"{ms / 1e3:.2f} s" if ms >= 1e3 else f"{ms:.2f} ms"

    print("\nattend ÷ peer = peer time / attend time, the median of the rounds' ratios (above 1: attend is "
          "faster); share of the peak in the side's precision; attend's corpus times are whole "
          "`attend embed --input` runs, start-up included, the other cases in process\n")
    print("| model | case | tokens real (padded) | precision | attend | OpenVINO | ONNX Runtime "
          "| attend ÷ OpenVINO | attend ÷ ORT | share of peak: attend / OpenVINO / ORT |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, label, real, padded, times, flops, precision in rows:
        med = {s: statistics.median(v) for s, v in times.items()}

        def ratio(peer, ours):
            return f"{statistics.median(p / a for p, a in zip(times[peer], times[ours])):.2f}×"

        def share(side):
            return f"{100 * flops[side] / (med[side] * 1e-3) / (peaks[kind(precision[side])] * 1e9):.0f} %"

        pairs = [("attend", "OpenVINO f32", "ONNX Runtime"), ("attend bf16", "OpenVINO default", None)]
        for ours, ov_side, ort_side in (pair for pair in pairs if pair[0] in times):
            cells = [
                f"{precision[ours]} (OpenVINO {precision[ov_side]})",
                fmt(med[ours]),
                fmt(med[ov_side]),
                fmt(med[ort_side]) if ort_side else "–",
                ratio(ov_side, ours),
                ratio(ort_side, ours) if ort_side else "–",
                " / ".join([share(ours), share(ov_side), share(ort_side) if ort_side else "–"]),
            ]
            print(f"| {name} | {label} | {real:,} ({padded:,}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
