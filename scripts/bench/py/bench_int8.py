"""Driver of scripts/bench/int8: attend's int8 encoders against ONNX Runtime's
`quantize_dynamic` model of the same checkpoint, accuracy and speed.

Accuracy, against sentence-transformers in f32 (the model's own vectors), on 1,000
sentences this script builds from its own word lists (not the tests' fixtures):
each text's cosine (worst and mean) and the overlap of each text's 10 nearest
neighbours among the 1,000 (mean share kept). Sides: attend int8 and ONNX Runtime
int8 (scripts/bench/py/bench_ort.py's export, optimised to the fused BERT graph,
then `quantize_dynamic` with per-channel QInt8 weights on its default operators:
the fused Attention's input projection and every MatMul), with attend bf16 and ONNX
Runtime f32 beside them for scale.

Speed, the same run, alternating rounds, 2 threads each: the corpus (scripts/bench/corpus
lines; for mpnet the first 384) through attend's `SentenceEncoder` in f32, int8 and
bf16 (on AMX bf16 runs on the same tiles as int8, so it is the precision int8 has
to beat there), ONNX Runtime int8 and f32 and OpenVINO int8, all in this process
with their models loaded beforehand (attend's `encode` and the peers' sentence-transformers tokenising,
sorted batches of 32, mean pooling): the ratios the issue asks for. Beside them, the
corpus through `attend embed --input` in f32 and int8, the command's whole run
(process start and the model's loading and quantizing included, which the in-process
sides do not pay). Then one short sentence in process.

OpenVINO int8 is NNCF's post-training quantization (`nncf.quantize` with
`ModelType.TRANSFORMER`, its recipe for transformers: int8 weights and activations
of the MatMuls, scales from a calibration set) of bench_openvino.py's conversion of
the checkpoint, calibrated on CALIBRATION sentences of the corpus file's own (the
lines after those timed, or the first ones when there are none), compiled with
OpenVINO's default precision for what stays unquantized (read back and printed).

Every peer is checked against sentence-transformers before it is timed: a mean
cosine below SAME_MODEL on the 1,000 sentences means it is not the same model
(a wrong pooling, a broken conversion), and the script stops; so it does when
attend's int8 misses the issue's accuracy bars (BAR_*), which the peers' int8 is
allowed to miss.

    bench_int8.py MODEL_DIR... --attend BIN --corpus FILE [--rounds N] [--threads N] [--notes TEXT]
"""
import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_openvino import BATCH, SHORT, Peer, alternate, attend_cli, openvino_model, pipeline  # noqa: E402
from bench_ort import export, optimise, session  # noqa: E402
from model_rounds import OtherLoad, cpu_name  # noqa: E402
import record  # noqa: E402
from timing import median_ms  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import openvino as ov  # noqa: E402
import torch  # noqa: E402
from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from transformers import AutoConfig, AutoModel, AutoTokenizer  # noqa: E402

import attend  # noqa: E402

MPNET_LINES = 384
CALIBRATION = 300
# A side's mean cosine to sentence-transformers below this is a different model, not
# a quantization's loss (ONNX Runtime's int8 of mpnet, the worst measured, is 0.886).
SAME_MODEL = 0.8
NEIGHBOURS = 10
# Issue 49's accuracy bars, which attend's int8 must meet before it is timed (the
# peers' int8 is printed against them, not held to them).
BAR_WORST, BAR_MEAN, BAR_OVERLAP = 0.99, 0.998, 0.9
# Other processes' share of the CPUs above which the record's notes say the machine
# was loaded (model_rounds.OtherLoad warns from 5 %).
LOADED = 0.05

SUBJECTS = ["The new manager", "My neighbour", "A young doctor", "The city council", "Our support team",
            "The old fisherman", "A group of students", "The airline", "Her grandfather", "The startup",
            "This recipe", "The museum", "A stray dog", "The weather service", "The hospital",
            "The football club", "The bank", "A local farmer", "The train operator", "The author"]
VERBS = ["announced", "complained about", "is looking for", "cancelled", "praised", "forgot",
         "will review", "quietly fixed", "refused to discuss", "photographed", "is selling",
         "asked about", "postponed", "recommended", "lost"]
OBJECTS = ["the delayed shipment", "a cheaper phone plan", "the broken heating system", "the summer festival",
           "its quarterly results", "a vegetarian lasagne", "the missing passport", "the flooded tunnel",
           "a second-hand bicycle", "the night shift schedule", "an unpaid invoice", "the vaccine trial",
           "a rare orchid", "the password reset link", "the chess tournament", "a leaking roof",
           "the new bus timetable", "an antique clock", "the exam results", "the hiking trail"]
TAILS = ["", " last Tuesday", " after the storm", " without telling anyone", " for the third time this year",
         " because of rising costs", " in front of the town hall", " despite the protests",
         " before the holidays", " on social media"]
QUESTIONS = ["How do I {}?", "Why would anyone {}?", "Is it possible to {} online?", "Who should I call to {}?"]
ACTIONS = ["renew a driving licence", "cancel a hotel booking", "repair a cracked windscreen",
           "transfer money abroad", "grow tomatoes indoors", "report a lost wallet", "learn Portuguese quickly",
           "train a puppy to sit", "file a tax return late", "change a flat tyre", "recover deleted photos",
           "book a table for twelve"]


def sentences(count, seed=49):
    """`count` distinct sentences from the word lists above: statements and questions."""
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < count:
        if rng.random() < 0.2:
            text = rng.choice(QUESTIONS).format(rng.choice(ACTIONS))
        else:
            text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(TAILS)}."
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def unit(v):
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def neighbours(v):
    """Each row's NEIGHBOURS nearest other rows by cosine."""
    sim = unit(v) @ unit(v).T
    np.fill_diagonal(sim, -np.inf)
    return np.argsort(-sim, axis=1)[:, :NEIGHBOURS]


def agreement(got, want):
    """(worst cosine, mean cosine, mean top-10 overlap) of `got` against `want`."""
    cos = (unit(got) * unit(want)).sum(1)
    a, b = neighbours(got), neighbours(want)
    overlap = np.mean([len(set(x) & set(y)) / NEIGHBOURS for x, y in zip(a, b)])
    return float(cos.min()), float(cos.mean()), float(overlap)


def ort_sides(model_dir, config, tok, names, max_length, normalize, threads, tmp):
    """ONNX Runtime f32 (the optimised fused graph) and int8 (quantize_dynamic of it)."""
    name = os.path.basename(os.path.normpath(model_dir))
    raw, opt, q8 = (os.path.join(tmp, f"{name}{s}.onnx") for s in ("", "-opt", "-int8"))
    export(AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval(), names, raw)
    fused = optimise(raw, config, opt)
    # The fused graph's com.microsoft operators leave shape inference without types:
    # the default tensor type is f32, as every tensor of this model is.
    quantize_dynamic(opt, q8, per_channel=True, weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    print(f"ONNX Runtime: {fused}; quantize_dynamic(per_channel=True, weight_type=QInt8)")
    peers = {}
    for side, path in (("ORT f32", opt), ("ORT int8", q8)):
        sess = session(path, threads)
        peers[side] = Peer(lambda feed, s=sess: s.run(None, feed)[0], tok, names, max_length, normalize)
    return peers


def openvino_int8(model_dir, tok, names, max_length, normalize, threads, calibration):
    """OpenVINO int8: NNCF's transformer recipe on bench_openvino.py's conversion,
    calibrated on `calibration` (texts), compiled for `threads` threads."""
    import nncf  # only this side needs it

    model = openvino_model(model_dir, tok, names)

    def feed(text):
        enc = tok([text], truncation=True, max_length=max_length, return_tensors="np")
        return {n: enc[n].astype(np.int64) for n in names}

    t = time.perf_counter()
    quantized = nncf.quantize(model, nncf.Dataset(calibration, feed), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(calibration))
    compiled = ov.Core().compile_model(quantized, "CPU", {"INFERENCE_NUM_THREADS": threads})
    if compiled.get_property("INFERENCE_NUM_THREADS") != threads:
        sys.exit(f"error: OpenVINO int8 compiled for {compiled.get_property('INFERENCE_NUM_THREADS')} threads")
    rest = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    print(f"OpenVINO int8: nncf {nncf.__version__} quantize(ModelType.TRANSFORMER) on {len(calibration)} corpus "
          f"sentences in {time.perf_counter() - t:.1f} s; the rest in {rest}")
    request = compiled.create_infer_request()
    return Peer(lambda f, r=request: r.infer(f)[0], tok, names, max_length, normalize)


def bench_model(model_dir, args, corpus, tmp):
    config = AutoConfig.from_pretrained(model_dir)
    name = os.path.basename(os.path.normpath(model_dir))
    normalize = pipeline(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tok(["a b"])]
    st = SentenceTransformer(model_dir, device="cpu")
    encoders = {p: attend.SentenceEncoder(model_dir, precision=p) for p in ("f32", "bf16", "int8")}
    max_length = encoders["f32"].max_seq_length
    peers = ort_sides(model_dir, config, tok, names, max_length, normalize, args.threads, tmp)
    lines = corpus if "mpnet" not in name else corpus[:MPNET_LINES]
    spare = corpus[len(lines):]
    calibration = (spare if len(spare) >= CALIBRATION else corpus)[:CALIBRATION]
    peers["OpenVINO int8"] = openvino_int8(model_dir, tok, names, max_length, normalize, args.threads, calibration)
    print(f"\n## {name}")

    texts = sentences(1000)
    with torch.inference_mode():
        want = st.encode(texts, batch_size=BATCH, convert_to_numpy=True)
    sides = {f"attend {p}": (lambda t, e=e: e.encode(t, batch_size=BATCH)) for p, e in encoders.items()}
    sides.update((s, p.encode) for s, p in peers.items())
    print(f"accuracy against sentence-transformers f32, {len(texts)} sentences "
          f"(cosine worst / mean, top-{NEIGHBOURS} neighbour overlap):")
    for side, encode in sides.items():
        worst, mean, overlap = agreement(encode(texts), want)
        print(f"  | {name} | {side} | {worst:.4f} | {mean:.5f} | {overlap:.3f} |")
        if not mean >= SAME_MODEL:
            sys.exit(f"error: {side}: mean cosine {mean:.4f} to sentence-transformers < {SAME_MODEL}: not the same model")
        if side == "attend int8" and not (worst >= BAR_WORST and mean >= BAR_MEAN and overlap >= BAR_OVERLAP):
            sys.exit(f"error: attend int8 misses issue 49's accuracy bars (worst cosine >= {BAR_WORST}, "
                     f"mean >= {BAR_MEAN}, top-{NEIGHBOURS} overlap >= {BAR_OVERLAP}): "
                     f"{worst:.4f}, {mean:.5f}, {overlap:.3f}")
    del st

    path = os.path.join(tmp, "corpus.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = os.path.join(tmp, "out.npy")
    timed = {
        f"attend {p}": (lambda e=e: _seconds(lambda: e.encode(lines, batch_size=BATCH)))
        for p, e in encoders.items()
    }
    timed.update({
        f"attend {p} command": (lambda p=p: attend_cli(args.attend, model_dir, path, out, p, args.threads))
        for p in ("f32", "int8")
    })
    for side, peer in peers.items():
        timed[side] = lambda p=peer: _seconds(lambda: p.encode(lines))
    times = alternate(timed, args.rounds)
    med = {s: float(np.median(v)) for s, v in times.items()}
    print(f"corpus, {len(lines)} lines, seconds per round: "
          + "; ".join(f"{s} " + " ".join(f"{x:.2f}" for x in v) for s, v in times.items()))
    print(f"  medians: " + ", ".join(f"{s} {v:.2f} s" for s, v in med.items()))
    print(f"  attend int8 is {med['ORT int8'] / med['attend int8']:.2f}x ORT int8, "
          f"{med['OpenVINO int8'] / med['attend int8']:.2f}x OpenVINO int8, "
          f"{med['attend f32'] / med['attend int8']:.2f}x attend f32, {med['attend bf16'] / med['attend int8']:.2f}x attend bf16, "
          f"{med['ORT f32'] / med['attend int8']:.2f}x ORT f32 (in process); "
          f"the command: {med['attend f32 command'] / med['attend int8 command']:.2f}x attend f32's, "
          f"{med['OpenVINO int8'] / med['attend int8 command']:.2f}x OpenVINO int8")

    short = {"attend int8": lambda: encoders["int8"].encode([SHORT]), "attend f32": lambda: encoders["f32"].encode([SHORT]),
             "ORT int8": lambda: peers["ORT int8"].encode([SHORT]),
             "OpenVINO int8": lambda: peers["OpenVINO int8"].encode([SHORT])}
    ms = alternate({s: (lambda f=f: median_ms(f, 30)) for s, f in short.items()}, args.rounds)
    print("one short sentence, median ms: " + ", ".join(f"{s} {np.median(v):.2f}" for s, v in ms.items()))
    corpus = f"{name}, corpus of {len(lines)} lines"
    return [record.row(f"{corpus}, int8 in process", med["attend int8"], peer, med[peer])
            for peer in ("ORT int8", "OpenVINO int8", "attend f32", "attend bf16", "ORT f32")] + [
        record.row(f"{corpus}, int8 through `attend embed` (loading included)", med["attend int8 command"],
                   peer, med[peer]) for peer in ("attend f32 command", "OpenVINO int8")] + [
        record.row(f"{name}, one short sentence, int8", float(np.median(ms["attend int8"])), peer,
                   float(np.median(ms[peer]))) for peer in ("ORT int8", "OpenVINO int8")]


def _seconds(run):
    t = time.perf_counter()
    run()
    return time.perf_counter() - t


def load_note(share):
    """A sentence for the record's notes when other processes took a noticeable
    share of the CPUs while it ran (its times are then not a quiet machine's)."""
    if share is None or share < LOADED:
        return None
    return f"Loaded machine: other processes took {100 * share:.0f} % of the CPUs during the run."


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dirs", nargs="+")
    ap.add_argument("--attend", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--notes", help="what the record should say about the run (how it was made, the machine)")
    args = ap.parse_args()
    with open(args.corpus) as f:
        corpus = f.read().splitlines()
    torch.set_num_threads(args.threads)
    attend.set_num_threads(args.threads)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {cpu_name()}; {args.threads} threads each; "
          f"onnxruntime {ort.__version__}; openvino {ov.__version__}; attend {attend.__version__} ({attend.isa()}); "
          f"load average before: {os.getloadavg()}")
    others = OtherLoad()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_dir in args.model_dirs:
            rows += bench_model(model_dir, args, corpus, tmp)
    share = others.share()
    notes = " ".join(n for n in (args.notes, load_note(share)) if n) or None
    # A capped attend is no comparison with the peers' own kernels: a title of its
    # own keeps such a record out of the uncapped ones' tables and charts.
    cap = os.environ.get("ATTEND_MAX_ISA")
    capped = f", attend capped at ATTEND_MAX_ISA={cap}" if cap else ""
    # Seconds for the corpora and milliseconds for the short sentence: one record each.
    for unit, what, part in (("s", "a corpus", [r for r in rows if "corpus" in r["workload"]]),
                             ("ms", "one short sentence", [r for r in rows if "corpus" not in r["workload"]])):
        record.write("int8", f"int8 encoders on {what} against ONNX Runtime's and OpenVINO's int8, and f32{capped}", unit=unit, better="lower",
                     threads=args.threads, peers={"onnxruntime": ort.__version__, "openvino": ov.__version__,
                                                                      "nncf": record.version("nncf")}, rows=part, other_load=share, notes=notes)
    if share is not None:
        print(f"other processes took {100 * share:.0f} % of the CPUs while this ran")


if __name__ == "__main__":
    main()
