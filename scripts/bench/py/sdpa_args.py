"""The flags the per-operation peers share (torch_sdpa.py, openvino_sdpa.py), spelled
as `attend bench` spells them, so that a bench script passes one flag list to every
side: the problem's shape and the timing rule (timing.median_seconds)."""


def add_problem_args(ap, kv_len_help="key length S (default: L)",
                     causal_help="top-left causal mask"):
    ap.add_argument("--batch", type=int, default=1, help="batch size B")
    ap.add_argument("--heads", type=int, default=8, help="query heads H")
    ap.add_argument("--kv-heads", type=int, help="key/value heads (default: H)")
    ap.add_argument("--seq", type=int, default=2048, help="query length L")
    ap.add_argument("--kv-len", type=int, help=kv_len_help)
    ap.add_argument("--head-dim", type=int, default=64, help="head width E")
    ap.add_argument("--causal", action="store_true", help=causal_help)


def add_timing_args(ap):
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-runs", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds")
