//! `config.json` of a BERT-family checkpoint (BERT, DistilBERT, RoBERTa,
//! XLM-RoBERTa, MPNet).

use std::path::Path;

use serde_json::{Map, Value};

use super::family::{Family, SUPPORTED_MODEL_TYPES};
use attend_core::nn::Activation;
use attend_core::{Error, Result};

/// The hyper-parameters of a BERT-family encoder, as Hugging Face's `config.json`
/// gives them (DistilBERT's own names, `dim`, `n_layers`, …, are read into the
/// same fields).
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// The family (`model_type`; a config without one is BERT).
    pub family: Family,
    /// Rows of the word embedding.
    pub vocab_size: usize,
    /// Model width `d`.
    pub hidden_size: usize,
    /// Number of encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer (`d` must divide by it).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Feed-forward activation (`hidden_act`; DistilBERT's `activation`).
    pub hidden_act: Activation,
    /// Rows of the position embedding.
    pub max_position_embeddings: usize,
    /// Rows of the token-type (segment) embedding; 0 for families without one
    /// (DistilBERT, MPNet).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f32,
    /// Id of the padding token.
    pub pad_token_id: usize,
    /// DistilBERT's `sinusoidal_pos_embds`: the position table is the fixed
    /// sinusoids (used when the checkpoint does not store it).
    pub sinusoidal_positions: bool,
    /// Rows of MPNet's relative-position bias table
    /// (`relative_attention_num_buckets`); 0 for the other families.
    pub relative_attention_buckets: usize,
}

/// The fields of one `config.json` object, each read with a message naming it.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn size(&self, name: &str) -> Result<usize> {
        let field = self
            .0
            .get(name)
            .ok_or_else(|| Error::format(format!("missing field {name:?}")))?;
        field
            .as_u64()
            .filter(|&n| n > 0)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                Error::format(format!(
                    "field {name:?} must be a positive integer, got {field}"
                ))
            })
    }

    fn size_or(&self, name: &str, default: usize) -> Result<usize> {
        match self.0.get(name) {
            None => Ok(default),
            Some(_) => self.size(name),
        }
    }

    fn index_or(&self, name: &str, default: usize) -> Result<usize> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(p) => p
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    Error::format(format!("field {name:?} must be an integer ≥ 0, got {p}"))
                }),
        }
    }

    fn flag_or(&self, name: &str, default: bool) -> Result<bool> {
        match self.0.get(name) {
            None => Ok(default),
            Some(b) => b.as_bool().ok_or_else(|| {
                Error::format(format!("field {name:?} must be true or false, got {b}"))
            }),
        }
    }

    fn activation(&self, name: &str, default: Option<&str>) -> Result<Activation> {
        let act = match (self.0.get(name), default) {
            (Some(v), _) => v.as_str().ok_or_else(|| {
                Error::format(format!("field {name:?} must be a string, got {v}"))
            })?,
            (None, Some(d)) => d,
            (None, None) => return Err(Error::format(format!("missing field {name:?}"))),
        };
        Activation::from_hf_name(act).ok_or_else(|| {
            Error::format(format!(
                "{name} {act:?} is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish)"
            ))
        })
    }

    fn epsilon(&self) -> Result<f32> {
        match self.0.get("layer_norm_eps") {
            None => Ok(1e-12),
            // Checked after the conversion: 1e300 is a fine f64 but an infinite f32,
            // which would turn every normalised value into 0.
            Some(e) => e
                .as_f64()
                .map(|e| e as f32)
                .filter(|e| *e >= 0.0 && e.is_finite())
                .ok_or_else(|| {
                    Error::format(format!(
                        "field \"layer_norm_eps\" must be a finite float32 number ≥ 0, got {e}"
                    ))
                }),
        }
    }
}

impl BertConfig {
    /// Reads and checks `config.json` at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text).map_err(|e| match e {
            Error::Io { .. } => e,
            other => Error::format(format!("{}: {other}", path.display())),
        })
    }

    /// Parses and checks the text of a `config.json`.
    ///
    /// Fails on a missing or mistyped field, an activation this crate does not
    /// implement, a `model_type` outside [`Family`], or relative position
    /// embeddings in a BERT or RoBERTa config. Optional fields take transformers'
    /// defaults for the family.
    pub fn from_json(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::format(format!("config is not valid JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::format("config is not a JSON object"))?;
        let family = match obj.get("model_type") {
            None => Family::Bert,
            Some(t) => t
                .as_str()
                .and_then(Family::from_model_type)
                .ok_or_else(|| {
                    Error::format(format!(
                        "model_type {t} is not supported (supported: {SUPPORTED_MODEL_TYPES})"
                    ))
                })?,
        };
        if let Some(p) = obj.get("position_embedding_type") {
            if p.as_str() != Some("absolute") {
                return Err(Error::format(format!(
                    "position_embedding_type {p} is not supported (only \"absolute\")"
                )));
            }
        }
        let f = Fields(obj);
        let config = match family {
            Family::DistilBert => BertConfig {
                family,
                vocab_size: f.size("vocab_size")?,
                hidden_size: f.size("dim")?,
                num_hidden_layers: f.size("n_layers")?,
                num_attention_heads: f.size("n_heads")?,
                intermediate_size: f.size("hidden_dim")?,
                hidden_act: f.activation("activation", Some("gelu"))?,
                max_position_embeddings: f.size("max_position_embeddings")?,
                type_vocab_size: 0,
                // DistilBERT's LayerNorms have a fixed epsilon.
                layer_norm_eps: 1e-12,
                pad_token_id: f.index_or("pad_token_id", 0)?,
                sinusoidal_positions: f.flag_or("sinusoidal_pos_embds", false)?,
                relative_attention_buckets: 0,
            },
            Family::Bert | Family::Roberta | Family::XlmRoberta | Family::MpNet => {
                let bert = family == Family::Bert;
                BertConfig {
                    family,
                    vocab_size: f.size("vocab_size")?,
                    hidden_size: f.size("hidden_size")?,
                    num_hidden_layers: f.size("num_hidden_layers")?,
                    num_attention_heads: f.size("num_attention_heads")?,
                    intermediate_size: f.size("intermediate_size")?,
                    hidden_act: f.activation("hidden_act", (!bert).then_some("gelu"))?,
                    max_position_embeddings: f.size("max_position_embeddings")?,
                    type_vocab_size: if family.has_token_types() {
                        f.size_or("type_vocab_size", 2)?
                    } else {
                        0
                    },
                    layer_norm_eps: f.epsilon()?,
                    pad_token_id: f.index_or("pad_token_id", if bert { 0 } else { 1 })?,
                    sinusoidal_positions: false,
                    relative_attention_buckets: if family == Family::MpNet {
                        f.size_or("relative_attention_num_buckets", 32)?
                    } else {
                        0
                    },
                }
            }
        };
        if !config
            .hidden_size
            .is_multiple_of(config.num_attention_heads)
        {
            return Err(Error::format(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                config.hidden_size, config.num_attention_heads
            )));
        }
        if config.max_tokens() < 2 {
            return Err(Error::format(format!(
                "max_position_embeddings {} leaves no room for two tokens after the {} positions a {} model skips",
                config.max_position_embeddings,
                config.position_offset(),
                family.model_type()
            )));
        }
        Ok(config)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// The padding index that RoBERTa-style position ids count from: a real token
    /// at position `i` (with no padding before it) has id `padding_idx + 1 + i`.
    /// `None` for families whose positions are `0, 1, 2, …`.
    pub fn position_padding_idx(&self) -> Option<usize> {
        match self.family {
            Family::Bert | Family::DistilBert => None,
            Family::Roberta | Family::XlmRoberta => Some(self.pad_token_id),
            // transformers' MPNetEmbeddings fixes its padding index at 1.
            Family::MpNet => Some(1),
        }
    }

    /// Position-table rows that no token reaches (`padding_idx + 1` for
    /// RoBERTa-style numbering).
    fn position_offset(&self) -> usize {
        self.position_padding_idx()
            .map_or(0, |p| p.saturating_add(1))
    }

    /// The longest sequence, in tokens, that the position table covers.
    pub fn max_tokens(&self) -> usize {
        self.max_position_embeddings
            .saturating_sub(self.position_offset())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINILM: &str = r#"{"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu", "hidden_size": 384, "intermediate_size": 1536,
        "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
        "num_attention_heads": 12, "num_hidden_layers": 6, "pad_token_id": 0,
        "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522}"#;

    #[test]
    fn parses_minilm() {
        let c = BertConfig::from_json(MINILM).unwrap();
        assert_eq!(c.hidden_size, 384);
        assert_eq!(c.head_dim(), 32);
        assert_eq!(c.hidden_act, Activation::Gelu);
        assert_eq!(c.layer_norm_eps, 1e-12);
    }

    #[test]
    fn bad_configs_have_one_line_errors() {
        let cases = [
            (
                MINILM.replace("\"gelu\"", "\"mish\""),
                "hidden_act \"mish\" is not supported",
            ),
            (
                MINILM.replace("\"hidden_size\": 384,", ""),
                "missing field \"hidden_size\"",
            ),
            (
                MINILM.replace("\"hidden_size\": 384", "\"hidden_size\": \"big\""),
                "must be a positive integer",
            ),
            (
                MINILM.replace("\"num_attention_heads\": 12", "\"num_attention_heads\": 7"),
                "not divisible",
            ),
            (
                MINILM.replace("\"bert\"", "\"t5\""),
                "model_type \"t5\" is not supported (supported: bert, distilbert, mpnet, roberta, xlm-roberta)",
            ),
            (
                MINILM.replace("\"bert\"", "7"),
                "model_type 7 is not supported",
            ),
            (
                MINILM.replace("\"absolute\"", "\"relative_key\""),
                "position_embedding_type",
            ),
            ("{".to_string(), "not valid JSON"),
            ("[]".to_string(), "not a JSON object"),
            (
                MINILM.replace("\"layer_norm_eps\": 1e-12", "\"layer_norm_eps\": 1e300"),
                "\"layer_norm_eps\" must be a finite float32",
            ),
        ];
        for (text, want) in cases {
            let err = BertConfig::from_json(&text).unwrap_err().to_string();
            assert!(err.contains(want), "{err} (wanted {want})");
            assert!(!err.contains('\n'));
        }
    }

    // The fields of real checkpoints' config.json (distilbert-base-uncased,
    // roberta-base, xlm-roberta-base, all-mpnet-base-v2), trimmed to what matters.
    const DISTILBERT: &str = r#"{"activation": "gelu", "dim": 768, "dropout": 0.1,
        "hidden_dim": 3072, "max_position_embeddings": 512, "model_type": "distilbert",
        "n_heads": 12, "n_layers": 6, "pad_token_id": 0, "sinusoidal_pos_embds": false,
        "vocab_size": 30522}"#;
    const ROBERTA: &str = r#"{"hidden_act": "gelu", "hidden_size": 768,
        "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
        "model_type": "roberta", "num_attention_heads": 12, "num_hidden_layers": 12,
        "pad_token_id": 1, "type_vocab_size": 1, "vocab_size": 50265}"#;
    const MPNET: &str = r#"{"hidden_act": "gelu", "hidden_size": 768,
        "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
        "model_type": "mpnet", "num_attention_heads": 12, "num_hidden_layers": 12,
        "pad_token_id": 1, "relative_attention_num_buckets": 32, "vocab_size": 30527}"#;

    #[test]
    fn parses_each_family() {
        let c = BertConfig::from_json(DISTILBERT).unwrap();
        assert_eq!(c.family, Family::DistilBert);
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.num_attention_heads),
            (768, 6, 12)
        );
        assert_eq!((c.intermediate_size, c.type_vocab_size), (3072, 0));
        assert_eq!(c.position_padding_idx(), None);
        assert_eq!(c.max_tokens(), 512);
        assert!(!c.sinusoidal_positions);
        let c = BertConfig::from_json(&DISTILBERT.replace(
            "\"sinusoidal_pos_embds\": false",
            "\"sinusoidal_pos_embds\": true",
        ))
        .unwrap();
        assert!(c.sinusoidal_positions);
        let c = BertConfig::from_json(&DISTILBERT.replace("\"gelu\"", "\"relu\"")).unwrap();
        assert_eq!(c.hidden_act, Activation::Relu);

        let c = BertConfig::from_json(ROBERTA).unwrap();
        assert_eq!(c.family, Family::Roberta);
        assert_eq!((c.type_vocab_size, c.pad_token_id), (1, 1));
        assert_eq!(c.layer_norm_eps, 1e-5);
        // Rows 0 and 1 are never reached: positions start at padding_idx + 1 = 2.
        assert_eq!(c.position_padding_idx(), Some(1));
        assert_eq!(c.max_tokens(), 512);
        let c = BertConfig::from_json(&ROBERTA.replace("\"roberta\"", "\"xlm-roberta\"")).unwrap();
        assert_eq!(c.family, Family::XlmRoberta);
        assert_eq!(c.max_tokens(), 512);

        let c = BertConfig::from_json(MPNET).unwrap();
        assert_eq!(c.family, Family::MpNet);
        assert_eq!((c.type_vocab_size, c.relative_attention_buckets), (0, 32));
        assert_eq!(c.position_padding_idx(), Some(1));
        assert_eq!(c.max_tokens(), 512);

        // A config without model_type is BERT; BERT's activations include the
        // tanh-approximated GELU and ReLU.
        let c = BertConfig::from_json(
            &MINILM
                .replace("\"model_type\": \"bert\",", "")
                .replace("\"gelu\"", "\"gelu_new\""),
        )
        .unwrap();
        assert_eq!(
            (c.family, c.hidden_act),
            (Family::Bert, Activation::GeluTanh)
        );
    }

    #[test]
    fn optional_fields_take_the_familys_defaults() {
        let c = BertConfig::from_json(
            r#"{"model_type": "mpnet", "vocab_size": 10, "hidden_size": 8,
                "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16,
                "max_position_embeddings": 20}"#,
        )
        .unwrap();
        assert_eq!(c.hidden_act, Activation::Gelu);
        assert_eq!((c.pad_token_id, c.relative_attention_buckets), (1, 32));
        assert_eq!(c.max_tokens(), 18);
    }

    #[test]
    fn malformed_family_fields_have_one_line_errors() {
        let cases = [
            (
                DISTILBERT.replace("\"dim\": 768,", ""),
                "missing field \"dim\"",
            ),
            (
                DISTILBERT.replace("\"sinusoidal_pos_embds\": false", "\"sinusoidal_pos_embds\": \"no\""),
                "field \"sinusoidal_pos_embds\" must be true or false, got \"no\"",
            ),
            (
                DISTILBERT.replace("\"activation\": \"gelu\"", "\"activation\": \"mish\""),
                "activation \"mish\" is not supported",
            ),
            (
                DISTILBERT.replace("\"n_heads\": 12", "\"n_heads\": 5"),
                "not divisible",
            ),
            (
                ROBERTA.replace("\"pad_token_id\": 1", "\"pad_token_id\": -1"),
                "field \"pad_token_id\" must be an integer ≥ 0, got -1",
            ),
            (
                ROBERTA.replace("\"pad_token_id\": 1", "\"pad_token_id\": 600"),
                "max_position_embeddings 514 leaves no room for two tokens after the 601 positions a roberta model skips",
            ),
            (
                ROBERTA.replace("\"type_vocab_size\": 1", "\"type_vocab_size\": 0"),
                "field \"type_vocab_size\" must be a positive integer, got 0",
            ),
            (
                MPNET.replace("\"relative_attention_num_buckets\": 32", "\"relative_attention_num_buckets\": 2.5"),
                "field \"relative_attention_num_buckets\" must be a positive integer, got 2.5",
            ),
            (
                MPNET.replace("\"hidden_act\": \"gelu\"", "\"hidden_act\": null"),
                "field \"hidden_act\" must be a string, got null",
            ),
        ];
        for (text, want) in cases {
            let err = BertConfig::from_json(&text).unwrap_err().to_string();
            assert!(err.contains(want), "{err} (wanted {want})");
            assert!(!err.contains('\n'));
        }
    }
}
