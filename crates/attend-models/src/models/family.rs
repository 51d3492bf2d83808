//! The encoder families `attend` loads, and what tells them apart: tensor names,
//! position ids, token types, the relative-position bias.
//!
//! Every family here is the same post-norm encoder (self-attention, residual,
//! LayerNorm; feed-forward, residual, LayerNorm), so one forward path serves them
//! all; a family only says where its weights are and how positions are numbered.

/// An encoder family, chosen by `model_type` in `config.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `bert` (all-MiniLM-L6-v2, BGE, E5, GTE): learned absolute positions from 0,
    /// token-type embeddings.
    Bert,
    /// `distilbert`: no token types, learned or sinusoidal positions from 0, its own
    /// tensor names (`transformer.layer.N.attention.q_lin`, …).
    DistilBert,
    /// `roberta`: BERT's tensor names, positions numbered from `pad_token_id + 1`
    /// and skipping padding tokens.
    Roberta,
    /// `xlm-roberta`: RoBERTa's architecture and numbering.
    XlmRoberta,
    /// `mpnet` (all-mpnet-base-v2): RoBERTa-style positions (padding index 1),
    /// no token types, and a bias on every head's scores from relative position
    /// buckets, shared by all layers.
    MpNet,
}

/// The `model_type` values `attend` loads, for error messages.
pub const SUPPORTED_MODEL_TYPES: &str = "bert, distilbert, mpnet, roberta, xlm-roberta";

impl Family {
    /// The family of a `model_type` string, if `attend` supports it.
    pub fn from_model_type(name: &str) -> Option<Self> {
        Some(match name {
            "bert" => Family::Bert,
            "distilbert" => Family::DistilBert,
            "roberta" => Family::Roberta,
            "xlm-roberta" => Family::XlmRoberta,
            "mpnet" => Family::MpNet,
            _ => return None,
        })
    }

    /// The `model_type` string of this family.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::DistilBert => "distilbert",
            Family::Roberta => "roberta",
            Family::XlmRoberta => "xlm-roberta",
            Family::MpNet => "mpnet",
        }
    }

    /// The prefix a task model (`BertForMaskedLM`, …) puts before the encoder's
    /// tensor names; a bare encoder checkpoint has none.
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            Family::Bert => "bert.",
            Family::DistilBert => "distilbert.",
            Family::Roberta | Family::XlmRoberta => "roberta.",
            Family::MpNet => "mpnet.",
        }
    }

    /// Whether the family adds token-type (segment) embeddings.
    pub fn has_token_types(self) -> bool {
        matches!(self, Family::Bert | Family::Roberta | Family::XlmRoberta)
    }

    /// The tensor names of one encoder layer and the embeddings.
    pub(crate) fn names(self) -> &'static Names {
        match self {
            Family::Bert | Family::Roberta | Family::XlmRoberta => &BERT_NAMES,
            Family::DistilBert => &DISTILBERT_NAMES,
            Family::MpNet => &MPNET_NAMES,
        }
    }
}

/// Where a family keeps its weights, relative to the checkpoint's root (the
/// `{layers}.N.` prefix goes before each per-layer name).
pub(crate) struct Names {
    /// The encoder layers' common prefix (`encoder.layer`).
    pub layers: &'static str,
    /// The query projection (`.weight` and `.bias` under it, as for each linear map).
    pub query: &'static str,
    /// The key projection.
    pub key: &'static str,
    /// The value projection.
    pub value: &'static str,
    /// The attention's output projection.
    pub attention_output: &'static str,
    /// The LayerNorm after the attention's residual.
    pub attention_norm: &'static str,
    /// The feed-forward's first projection, `d → intermediate_size`.
    pub intermediate: &'static str,
    /// The feed-forward's second projection, `intermediate_size → d`.
    pub output: &'static str,
    /// The LayerNorm after the feed-forward's residual.
    pub output_norm: &'static str,
}

/// The embedding tensors, the same in every family here.
pub(crate) const WORD_EMBEDDINGS: &str = "embeddings.word_embeddings.weight";
pub(crate) const POSITION_EMBEDDINGS: &str = "embeddings.position_embeddings.weight";
pub(crate) const TOKEN_TYPE_EMBEDDINGS: &str = "embeddings.token_type_embeddings.weight";
pub(crate) const EMBEDDINGS_NORM: &str = "embeddings.LayerNorm";
/// MPNet's relative-position bias table, `[buckets, heads]`.
pub(crate) const RELATIVE_ATTENTION_BIAS: &str = "encoder.relative_attention_bias.weight";

const BERT_NAMES: Names = Names {
    layers: "encoder.layer",
    query: "attention.self.query",
    key: "attention.self.key",
    value: "attention.self.value",
    attention_output: "attention.output.dense",
    attention_norm: "attention.output.LayerNorm",
    intermediate: "intermediate.dense",
    output: "output.dense",
    output_norm: "output.LayerNorm",
};

const DISTILBERT_NAMES: Names = Names {
    layers: "transformer.layer",
    query: "attention.q_lin",
    key: "attention.k_lin",
    value: "attention.v_lin",
    attention_output: "attention.out_lin",
    attention_norm: "sa_layer_norm",
    intermediate: "ffn.lin1",
    output: "ffn.lin2",
    output_norm: "output_layer_norm",
};

const MPNET_NAMES: Names = Names {
    layers: "encoder.layer",
    query: "attention.attn.q",
    key: "attention.attn.k",
    value: "attention.attn.v",
    attention_output: "attention.attn.o",
    attention_norm: "attention.LayerNorm",
    intermediate: "intermediate.dense",
    output: "output.dense",
    output_norm: "output.LayerNorm",
};
