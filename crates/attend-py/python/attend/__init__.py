"""attend: self-attention, faithful to PyTorch and fast on CPU.

The one-line swaps::

    import attend
    out = attend.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # F.scaled_dot_product_attention

    import attend.transformers
    attend.transformers.register()
    model = AutoModel.from_pretrained(path, attn_implementation="attend")

    vectors = attend.SentenceEncoder(model_dir).encode(sentences)       # SentenceTransformer.encode

    attend.explain(sentence="Life is short, eat dessert first", embed_dim=16)  # the notebooks' walkthrough

    import attend.ray                                                    # Ray Data (needs ray[data])
    ds = ds.map_batches(attend.ray.Embedder, fn_constructor_args=(model_dir,),
                        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=4))
"""

from ._attend import __version__, isa
from ._encoder import SentenceEncoder
from ._explain import Explanation, explain
from ._sdpa import scaled_dot_product_attention
from ._threads import get_num_threads, set_num_threads

__all__ = [
    "Explanation",
    "SentenceEncoder",
    "__version__",
    "explain",
    "get_num_threads",
    "isa",
    "scaled_dot_product_attention",
    "set_num_threads",
]
