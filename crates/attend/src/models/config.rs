//! `config.json` of a BERT-style checkpoint.

use std::path::Path;

use serde_json::Value;

use crate::nn::Activation;
use crate::{Error, Result};

/// The hyper-parameters of a BERT encoder, as Hugging Face's `config.json` gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
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
    /// Feed-forward activation (`hidden_act`).
    pub hidden_act: Activation,
    /// Rows of the position embedding: the longest input the model takes.
    pub max_position_embeddings: usize,
    /// Rows of the token-type (segment) embedding.
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f32,
    /// Id of the padding token.
    pub pad_token_id: usize,
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
    /// implement, a model type other than BERT, or relative position embeddings.
    pub fn from_json(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::format(format!("config is not valid JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::format("config is not a JSON object"))?;
        if let Some(t) = obj.get("model_type") {
            let t = t.as_str().unwrap_or_default();
            if t != "bert" {
                return Err(Error::format(format!(
                    "model_type {t:?} is not supported (only \"bert\")"
                )));
            }
        }
        if let Some(p) = obj.get("position_embedding_type") {
            if p.as_str() != Some("absolute") {
                return Err(Error::format(format!(
                    "position_embedding_type {p} is not supported (only \"absolute\")"
                )));
            }
        }
        let size = |name: &str| -> Result<usize> {
            let field = obj
                .get(name)
                .ok_or_else(|| Error::format(format!("missing field {name:?}")))?;
            field
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| {
                    Error::format(format!(
                        "field {name:?} must be a positive integer, got {field}"
                    ))
                })
        };
        let act_name = obj
            .get("hidden_act")
            .ok_or_else(|| Error::format("missing field \"hidden_act\""))?;
        let act_str = act_name.as_str().ok_or_else(|| {
            Error::format(format!(
                "field \"hidden_act\" must be a string, got {act_name}"
            ))
        })?;
        let hidden_act = Activation::from_hf_name(act_str).ok_or_else(|| {
            Error::format(format!(
                "hidden_act {act_str:?} is not supported (supported: gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish)"
            ))
        })?;
        let layer_norm_eps = match obj.get("layer_norm_eps") {
            None => 1e-12,
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
                })?,
        };
        let pad_token_id = match obj.get("pad_token_id") {
            None | Some(Value::Null) => 0,
            Some(p) => p.as_u64().ok_or_else(|| {
                Error::format(format!(
                    "field \"pad_token_id\" must be an integer, got {p}"
                ))
            })? as usize,
        };
        let config = BertConfig {
            vocab_size: size("vocab_size")?,
            hidden_size: size("hidden_size")?,
            num_hidden_layers: size("num_hidden_layers")?,
            num_attention_heads: size("num_attention_heads")?,
            intermediate_size: size("intermediate_size")?,
            hidden_act,
            max_position_embeddings: size("max_position_embeddings")?,
            type_vocab_size: match obj.get("type_vocab_size") {
                None => 2,
                Some(_) => size("type_vocab_size")?,
            },
            layer_norm_eps,
            pad_token_id,
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
        Ok(config)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
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
            (MINILM.replace("\"bert\"", "\"t5\""), "model_type \"t5\""),
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
}
