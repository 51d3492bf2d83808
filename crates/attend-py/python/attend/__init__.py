"""attend: self-attention, faithful to PyTorch and fast on CPU.

The one-line swaps::

    import attend
    out = attend.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # F.scaled_dot_product_attention

    attend.transformers.register()                                      # imports transformers then
    model = AutoModel.from_pretrained(path, attn_implementation="attend")

    vectors = attend.SentenceEncoder(model_dir).encode(sentences)       # SentenceTransformer.encode

    attend.explain(sentence="Life is short, eat dessert first", embed_dim=16)  # the notebooks' walkthrough

    ds = ds.map_batches(attend.ray.Embedder, fn_constructor_args=(model_dir,),   # Ray Data (needs ray[data])
                        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=4))

The submodules ``attend.transformers``, ``attend.ray`` and ``attend.ops`` (the PyTorch
custom operators) are imported when first used, so ``import attend`` imports neither
torch, transformers nor ray.
"""

import importlib
import sys

from ._attend import __version__, isa
from ._encoder import SentenceEncoder
from ._errors import AttendTypeError, AttendValueError
from ._explain import Explanation, explain
from ._sdpa import scaled_dot_product_attention
from ._threads import get_num_threads, set_num_threads

__all__ = [
    "AttendTypeError",
    "AttendValueError",
    "Explanation",
    "SentenceEncoder",
    "__version__",
    "explain",
    "get_num_threads",
    "isa",
    "scaled_dot_product_attention",
    "set_num_threads",
]

_SUBMODULES = ("ops", "ray", "transformers")

if sys.modules.get("torch") is not None:
    # Exported programs name torch.ops.attend.*: with torch already loaded this
    # costs little and lets torch.export.load find them after a plain import attend.
    # (A None there is torch blocked, sys.modules["torch"] = None: the torch-free
    # parts work without it.)
    from . import ops  # noqa: F401


def __getattr__(name: str):
    """``attend.transformers``, ``attend.ray`` and ``attend.ops``, imported on first
    use (PEP 562): they import transformers, ray and torch."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES))
