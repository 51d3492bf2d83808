//! The BERT-family encoder: embeddings, then layers of self-attention and
//! feed-forward, each followed by a residual connection and LayerNorm (post-norm).
//! BERT, DistilBERT, RoBERTa, XLM-RoBERTa and MPNet all have this shape; what
//! differs between them is in [`Family`] (names, positions, token types) and, for
//! MPNet, a relative-position bias added to every layer's scores.

use std::path::Path;

use ndarray::{Array2, Array4, ArrayView2};

use super::family::{self, Family};
use super::positions::{mpnet_bias, position_ids, sinusoidal_table, MPNET_BUCKETS};
use super::probe::{Probe, Work};
use super::weights::Weights;
use super::{BertConfig, TokenBatch};
use attend_core::attention::Precision;
use attend_core::io::safetensors::SafeTensors;
use attend_core::nn::{LayerNorm, Linear, MultiHeadAttention};
use attend_core::{Error, Result};

/// Inputs of each token that the int8 query, key and value projection keeps out
/// of the token's quantization (`Linear::with_input_outliers`). In a simulation
/// on MiniLM and mpnet (docs/int8.md) two recovered nearly all that quantizing
/// the projection's inputs whole lost, and four to sixteen no more; each costs
/// its selection and a multiply-add per 16 outputs in the product's tile.
const QKV_OUTLIERS: usize = 2;

/// Weights an output of the feed-forward's second layer keeps at their full
/// levels when it is narrowed to ±63 (no VNNI): simulated, 2 took mpnet's mean
/// cosine to sentence-transformers from 0.99777 to 0.99831 and 4 to 0.99864
/// (`scripts/bench/py/int8_narrow_sim.py`, docs/int8.md).
const DOWN_CORRECTED: usize = 4;

/// Word, position and token-type embeddings, summed and normalised.
#[derive(Clone, Debug)]
pub struct BertEmbeddings {
    /// `[vocab_size, d]`.
    pub word: Array2<f32>,
    /// `[max_position_embeddings, d]`, read at the rows
    /// [`BertConfig::position_padding_idx`] says.
    pub position: Array2<f32>,
    /// `[type_vocab_size, d]`; `None` for families without token types
    /// (DistilBERT, MPNet).
    pub token_type: Option<Array2<f32>>,
    /// LayerNorm over the sum.
    pub norm: LayerNorm,
}

/// One encoder layer.
#[derive(Clone, Debug)]
pub struct BertLayer {
    /// Self-attention: `attention.self.{query,key,value}` are `q_proj`, `k_proj`,
    /// `v_proj` and `attention.output.dense` is `out_proj`.
    pub attention: MultiHeadAttention,
    /// The query, key and value projections stacked as one product
    /// ([`Linear::stacked`], `[3d, d]`), made at load: the fast forward computes
    /// all three with it; the traced forward and the walkthrough read the three
    /// in `attention`. Change those and this must be made again.
    pub qkv: Linear,
    /// `attention.output.LayerNorm`, after the residual.
    pub attention_norm: LayerNorm,
    /// `intermediate.dense`, `d → intermediate_size`.
    pub intermediate: Linear,
    /// `output.dense`, `intermediate_size → d`.
    pub output: Linear,
    /// `output.LayerNorm`, after the residual.
    pub output_norm: LayerNorm,
}

/// A BERT-family encoder (`transformers.BertModel`, `DistilBertModel`,
/// `RobertaModel`, `XLMRobertaModel` or `MPNetModel`, without the pooler).
#[derive(Clone, Debug)]
pub struct BertModel {
    /// The hyper-parameters.
    pub config: BertConfig,
    /// The embedding block.
    pub embeddings: BertEmbeddings,
    /// The encoder layers.
    pub layers: Vec<BertLayer>,
    /// MPNet's relative-position bias table `[buckets, H]`
    /// (`encoder.relative_attention_bias`), shared by every layer; `None` for the
    /// other families.
    pub relative_attention_bias: Option<Array2<f32>>,
    /// Precision of the encoder layers' dense products
    /// ([`Linear::for_inference_with`]); the embeddings, LayerNorms, activations
    /// and attention stay f32; in int8 the query, key and value projection runs
    /// in bf16 (the accuracy it costs is measured in docs/int8.md).
    pub precision: Precision,
}

impl BertModel {
    /// Loads `config.json` and `model.safetensors` from a checkpoint directory.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(dir, Precision::F32)
    }

    /// [`load`](Self::load) with the encoder layers' dense products in
    /// `precision` (see [`from_safetensors_with`](Self::from_safetensors_with)).
    pub fn load_with(dir: impl AsRef<Path>, precision: Precision) -> Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(Error::io(
                dir,
                "model directory not found (scripts/fetch-model fetches all-MiniLM-L6-v2)",
            ));
        }
        let config = BertConfig::from_file(dir.join("config.json"))?;
        let weights = SafeTensors::open(dir.join("model.safetensors"))?;
        Self::from_safetensors_with(config, &weights, precision)
    }

    /// Builds the model from Hugging Face tensor names of `config.family` (with or
    /// without a task model's prefix, `bert.`, `roberta.`, …), checking every shape
    /// against `config`.
    pub fn from_safetensors(config: BertConfig, file: &SafeTensors) -> Result<Self> {
        Self::from_safetensors_with(config, file, Precision::F32)
    }

    /// [`from_safetensors`](Self::from_safetensors) with the encoder layers' dense
    /// products in `precision`: with [`Precision::Bf16`] their weights are rounded
    /// to bf16 and kept packed as bf16 for a product with bf16 inputs and f32 sums
    /// (PyTorch's autocast to bf16), in 2 bytes a weight (the f32 layers take 8
    /// where the CPU runs `nn::matmul`'s AVX2 product, the weight and its packing,
    /// and 4 elsewhere).
    pub fn from_safetensors_with(
        config: BertConfig,
        file: &SafeTensors,
        precision: Precision,
    ) -> Result<Self> {
        let family = config.family;
        let names = family.names();
        let weights = Weights::new(file, family)?;
        let d = config.hidden_size;
        let norm = |w: &Weights<'_>, name: &str| w.norm(name, d, config.layer_norm_eps);
        // In int8 the query, key and value projection keeps each token's
        // QKV_OUTLIERS largest inputs out of its quantization: its input is a
        // LayerNorm's output, whose few outlier channels would set each token's
        // scale and leave the other channels a handful of levels. Quantized
        // whole, it was the layer that lost most (docs/int8.md: keeping it f32
        // took MiniLM's mean cosine against f32 from 0.9988 to 0.9994 and mpnet's
        // worst from 0.992 to 0.996, where keeping any other layer f32 gained at
        // most half as much).
        let projection = |l: Linear| match precision {
            Precision::Int8 => l
                .for_inference_with(precision)
                .with_input_outliers(QKV_OUTLIERS),
            _ => l.for_inference_with(precision),
        };
        // Without VNNI, int8 weights of ±63 let the product use `vpmaddubsw`, twice
        // the exact widening's rate on AVX2, for twice the weights' rounding. The
        // attention output and the feed-forward's first layer take it; the
        // feed-forward's second takes it with each output's DOWN_CORRECTED largest
        // weights corrected: all three narrowed plainly, mpnet's mean cosine
        // to sentence-transformers fell from 0.99879 to 0.99780 (below issue 49's
        // 0.998), and the second kept ±127 brought it back to 0.99847, where
        // keeping the first instead gave 0.99809 and the output 0.99792; its loss
        // sits in each output's few largest weights (docs/int8.md).
        let narrowed = |w: &Weights<'_>,
                        name: &str,
                        out: usize,
                        inp: usize,
                        corrected: usize|
         -> Result<Linear> {
            let layer = w.linear(name, out, inp)?;
            Ok(match precision {
                Precision::Int8 => layer.for_inference_int8_narrowed(corrected),
                other => layer.for_inference_with(other),
            })
        };
        let position =
            if config.sinusoidal_positions && !weights.contains(family::POSITION_EMBEDDINGS) {
                // The only table sized by config.json alone, not by a tensor in the file.
                let rows = config.max_position_embeddings;
                attend_core::limits::check_memory(
                    "config.json's max_position_embeddings (the sinusoidal position table)",
                    attend_core::limits::array_bytes(&[rows, d], 4),
                )?;
                sinusoidal_table(rows, d)
            } else {
                weights.matrix(
                    family::POSITION_EMBEDDINGS,
                    config.max_position_embeddings,
                    d,
                )?
            };
        let embeddings = BertEmbeddings {
            word: weights.matrix(family::WORD_EMBEDDINGS, config.vocab_size, d)?,
            position,
            token_type: if family.has_token_types() {
                Some(weights.matrix(family::TOKEN_TYPE_EMBEDDINGS, config.type_vocab_size, d)?)
            } else {
                None
            },
            norm: norm(&weights, family::EMBEDDINGS_NORM)?,
        };
        let relative_attention_bias = if family == Family::MpNet {
            if config.relative_attention_buckets < MPNET_BUCKETS {
                return Err(Error::format(format!(
                    "relative_attention_num_buckets is {}, fewer than the {MPNET_BUCKETS} buckets MPNet's relative positions use",
                    config.relative_attention_buckets
                )));
            }
            Some(weights.matrix(
                family::RELATIVE_ATTENTION_BIAS,
                config.relative_attention_buckets,
                config.num_attention_heads,
            )?)
        } else {
            None
        };
        // Grown layer by layer: the count comes from config.json, and reserving it up
        // front would let a wrong count claim memory before a missing tensor is found.
        let mut layers = Vec::new();
        for i in 0..config.num_hidden_layers {
            let layer = weights.at(&format!("{}.{i}.", names.layers));
            let heads = config.num_attention_heads;
            // The attention's weights and the feed-forward's are read and packed
            // on both threads at once (start-up).
            let (attention, feed_forward) = rayon::join(
                || -> Result<_> {
                    let [q, k, v] =
                        [names.query, names.key, names.value].map(|name| layer.linear(name, d, d));
                    let (q, k, v) = (q?, k?, v?);
                    // The checks of the stacked layer, the attention module and the
                    // LayerNorms know the tensors but not the file: the file is added.
                    let qkv = projection(
                        Linear::stacked(&[&q, &k, &v]).map_err(|e| e.context(weights.origin()))?,
                    );
                    // The three alone serve the traced forward, so in bf16 and int8
                    // they are rounded as the stacked product is (each output's
                    // rounding is its own: the stacked layer's outputs are theirs,
                    // and a row's outliers are the row's);
                    // in f32 they stay unpacked (the fast forward does not read them).
                    let alone = |l: Linear| match precision {
                        Precision::Bf16 | Precision::Int8 => projection(l),
                        Precision::F32 => l,
                    };
                    let attention = MultiHeadAttention::new(
                        alone(q),
                        alone(k),
                        alone(v),
                        Some(narrowed(&layer, names.attention_output, d, d, 0)?),
                        heads,
                        heads,
                    )
                    .map_err(|e| e.context(weights.origin()))?;
                    Ok((attention, qkv))
                },
                || -> Result<_> {
                    let intermediate =
                        narrowed(&layer, names.intermediate, config.intermediate_size, d, 0)?;
                    let output = narrowed(
                        &layer,
                        names.output,
                        d,
                        config.intermediate_size,
                        DOWN_CORRECTED,
                    )?;
                    Ok((intermediate, output))
                },
            );
            let (attention, qkv) = attention?;
            let (intermediate, output) = feed_forward?;
            layers.push(BertLayer {
                attention,
                qkv,
                attention_norm: norm(&layer, names.attention_norm)?,
                intermediate,
                output,
                output_norm: norm(&layer, names.output_norm)?,
            });
        }
        Ok(BertModel {
            config,
            embeddings,
            layers,
            relative_attention_bias,
            precision,
        })
    }

    pub(super) fn check(&self, batch: &TokenBatch) -> Result<()> {
        let (b, t) = batch.ids.dim();
        if batch.type_ids.dim() != (b, t) || batch.lengths.len() != b {
            return Err(Error::shape(format!(
                "token batch: ids {:?}, type_ids {:?} and {} lengths do not fit together",
                batch.ids.shape(),
                batch.type_ids.shape(),
                batch.lengths.len()
            )));
        }
        if t > self.config.max_tokens() {
            return Err(Error::value(format!(
                "sequences of {t} tokens are longer than the model's maximum of {}",
                self.config.max_tokens()
            )));
        }
        let types = self
            .embeddings
            .token_type
            .as_ref()
            .map_or(0, |table| table.nrows());
        for (bi, &len) in batch.lengths.iter().enumerate() {
            if len > t {
                return Err(Error::value(format!(
                    "length {len} of sequence {bi} exceeds the padded length {t}"
                )));
            }
            for ti in 0..len {
                let (id, ty) = (batch.ids[[bi, ti]], batch.type_ids[[bi, ti]]);
                if id as usize >= self.config.vocab_size {
                    return Err(Error::value(format!(
                        "token id {id} at [{bi}, {ti}] is out of range for a vocabulary of {}",
                        self.config.vocab_size
                    )));
                }
                // Families without token types ignore them, as transformers does.
                if types > 0 && ty as usize >= types {
                    return Err(Error::value(format!(
                        "token type {ty} at [{bi}, {ti}] is out of range for {types} types"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Embedding-block output for the given `(batch, position)` pairs, one row each.
    pub(super) fn embed_rows(
        &self,
        batch: &TokenBatch,
        rows: &[(usize, usize)],
    ) -> Result<Array2<f32>> {
        let e = &self.embeddings;
        let padding_idx = self.config.position_padding_idx();
        let positions: Vec<Vec<usize>> = batch
            .ids
            .rows()
            .into_iter()
            .map(|ids| position_ids(ids.iter().copied(), padding_idx))
            .collect();
        let mut x = Array2::zeros((rows.len(), self.config.hidden_size));
        for (r, &(bi, ti)) in rows.iter().enumerate() {
            let id = (batch.ids[[bi, ti]] as usize).min(self.config.vocab_size - 1);
            let mut row = x.row_mut(r);
            row.assign(&e.word.row(id));
            // `check` bounds the length by the rows the numbering can reach.
            row += &e
                .position
                .row(positions[bi][ti].min(e.position.nrows() - 1));
            if let Some(table) = &e.token_type {
                let ty = (batch.type_ids[[bi, ti]] as usize).min(table.nrows() - 1);
                row += &table.row(ty);
            }
        }
        e.norm.forward_inplace(x.view_mut(), None)?;
        Ok(x)
    }
    /// One encoder layer on rows `h [n, d]`: self-attention (run by the probe),
    /// then the feed-forward block, each added to its input and normalised. Both
    /// forwards are loops over this function; only their probes differ.
    pub(super) fn layer<P: Probe>(
        &self,
        layer: &BertLayer,
        h: ArrayView2<'_, f32>,
        probe: &mut P,
    ) -> Result<Array2<f32>> {
        let qkv = layer.qkv.forward(h)?;
        probe.done(Work::Matmul);
        let context = probe.attention(&layer.attention, &qkv)?;
        probe.done(Work::Attention);
        let out_proj = layer.attention.out_proj.as_ref().ok_or_else(no_out_proj)?;
        let a = out_proj.forward_residual_norm(context.view(), h, &layer.attention_norm)?;
        probe.done(Work::Matmul);
        // The activation is applied to each block of the product while in cache.
        let inter = layer
            .intermediate
            .forward_activated(a.view(), self.config.hidden_act)?;
        probe.done(Work::Matmul);
        let out = layer
            .output
            .forward_residual_norm(inter.view(), a.view(), &layer.output_norm)?;
        probe.done(Work::Matmul);
        Ok(out)
    }

    /// MPNet's relative-position bias `[1, H, t, t]` for sequences padded to `t`
    /// tokens: made once per call, shared by every layer, and broadcast over the
    /// batch by the attention call (no `[B, H, t, t]` copy). `None` for the other
    /// families.
    pub(super) fn position_bias(&self, t: usize) -> Option<Array4<f32>> {
        self.relative_attention_bias
            .as_ref()
            .map(|table| mpnet_bias(table.view(), t))
    }
}

fn no_out_proj() -> Error {
    Error::value("an encoder layer's attention needs an output projection (out_proj is None)")
}

#[cfg(test)]
mod tests {
    use super::super::forward::sequence_groups;
    use super::*;
    use attend_core::io::safetensors::serialize;
    use ndarray::{s, ArrayD, IxDyn};

    /// A two-layer BERT of width 8 with arbitrary weights, in memory.
    fn tiny() -> BertModel {
        tiny_of(Family::Bert)
    }

    /// A two-layer model of `family`, width 8, with arbitrary weights, in memory.
    fn tiny_of(family: Family) -> BertModel {
        let (config, tensors) = tiny_family_weights(family, |x| x);
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.view()))
            .collect();
        let file = SafeTensors::from_bytes(serialize(&views, None).unwrap(), "tiny").unwrap();
        BertModel::from_safetensors(config, &file).unwrap()
    }

    /// The configuration and named weights of [`tiny`], each value passed through `f`.
    fn tiny_weights(f: impl Fn(f32) -> f32) -> (BertConfig, Vec<(String, ArrayD<f32>)>) {
        tiny_family_weights(Family::Bert, f)
    }

    /// The configuration and named weights of [`tiny_of`], each value passed through
    /// `f`, under the family's own tensor names.
    fn tiny_family_weights(
        family: Family,
        f: impl Fn(f32) -> f32,
    ) -> (BertConfig, Vec<(String, ArrayD<f32>)>) {
        let config = BertConfig::from_json(&if family == Family::DistilBert {
            r#"{"model_type": "distilbert", "vocab_size": 11, "dim": 8, "n_layers": 2,
                "n_heads": 2, "hidden_dim": 12, "activation": "relu",
                "max_position_embeddings": 16, "sinusoidal_pos_embds": true}"#
                .to_string()
        } else {
            format!(
                r#"{{"model_type": "{}", "vocab_size": 11, "hidden_size": 8,
                    "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 12,
                    "hidden_act": "gelu", "max_position_embeddings": 16, "type_vocab_size": 2}}"#,
                family.model_type()
            )
        })
        .unwrap();
        let mut tensors: Vec<(String, ArrayD<f32>)> = Vec::new();
        let mut seed = 1u32;
        let mut add = |name: &str, shape: &[usize]| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    f(((seed >> 8) % 1000) as f32 / 1000.0 - 0.5)
                })
                .collect();
            tensors.push((
                name.to_string(),
                ArrayD::from_shape_vec(IxDyn(shape), v).unwrap(),
            ));
        };
        add(family::WORD_EMBEDDINGS, &[11, 8]);
        // DistilBERT's sinusoidal table is computed when the file lacks it.
        if family != Family::DistilBert {
            add(family::POSITION_EMBEDDINGS, &[16, 8]);
        }
        if family.has_token_types() {
            add(family::TOKEN_TYPE_EMBEDDINGS, &[2, 8]);
        }
        add(&format!("{}.weight", family::EMBEDDINGS_NORM), &[8]);
        add(&format!("{}.bias", family::EMBEDDINGS_NORM), &[8]);
        if family == Family::MpNet {
            add(family::RELATIVE_ATTENTION_BIAS, &[32, 2]);
        }
        let names = family.names();
        for l in 0..2 {
            let p = format!("{}.{l}", names.layers);
            for (name, shape) in [
                (names.query, [8, 8]),
                (names.key, [8, 8]),
                (names.value, [8, 8]),
                (names.attention_output, [8, 8]),
                (names.intermediate, [12, 8]),
                (names.output, [8, 12]),
            ] {
                add(&format!("{p}.{name}.weight"), &shape);
                add(&format!("{p}.{name}.bias"), &shape[..1]);
            }
            for ln in [names.attention_norm, names.output_norm] {
                add(&format!("{p}.{ln}.weight"), &[8]);
                add(&format!("{p}.{ln}.bias"), &[8]);
            }
        }
        (config, tensors)
    }

    #[test]
    fn a_bf16_checkpoint_gives_the_same_model_as_its_f32_values() {
        // Weights rounded to BF16's precision, stored once as F32 and once as BF16.
        let to_bf16 = |x: f32| f32::from_bits(x.to_bits() & 0xffff_0000);
        let (config, tensors) = tiny_weights(to_bf16);
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.view()))
            .collect();
        let f32_file = SafeTensors::from_bytes(serialize(&views, None).unwrap(), "f32").unwrap();
        let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
        for (name, t) in &tensors {
            let begin = data.len();
            for x in t.iter() {
                data.extend_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes());
            }
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": "BF16", "shape": t.shape(), "data_offsets": [begin, data.len()]}),
            );
        }
        let json = serde_json::Value::Object(header).to_string();
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes.extend_from_slice(&data);
        let bf16_file = SafeTensors::from_bytes(bytes, "bf16").unwrap();
        let a = BertModel::from_safetensors(config.clone(), &f32_file).unwrap();
        let b = BertModel::from_safetensors(config, &bf16_file).unwrap();
        let batch = TokenBatch::from_sequences(&[(vec![1, 5, 7, 2], vec![0, 0, 1, 1])], 0).unwrap();
        assert_eq!(a.forward(&batch).unwrap(), b.forward(&batch).unwrap());
    }

    #[test]
    fn batches_equal_single_sequences_and_the_traced_path() {
        for family in [
            Family::Bert,
            Family::DistilBert,
            Family::Roberta,
            Family::XlmRoberta,
            Family::MpNet,
        ] {
            batches_equal_single_sequences(&tiny_of(family), family);
        }
    }

    /// The batched forward (fused attention, padding keys masked, MPNet's bias
    /// broadcast over the batch) equals each sequence alone and the traced path
    /// (reference attention) on the padded batch.
    fn batches_equal_single_sequences(m: &BertModel, family: Family) {
        let seqs = vec![
            (vec![1, 5, 7, 2], vec![0, 0, 1, 1]),
            (vec![1, 2], vec![0, 0]),
            (vec![1, 3, 4, 9, 10, 2], vec![0; 6]),
        ];
        let batch = TokenBatch::from_sequences(&seqs, 0).unwrap();
        let all = m.forward(&batch).unwrap();
        let traced = m.trace(&batch).unwrap();
        for (i, s) in seqs.iter().enumerate() {
            let one = m
                .forward(&TokenBatch::from_sequences(std::slice::from_ref(s), 0).unwrap())
                .unwrap();
            let n = s.0.len();
            let a = all.slice(s![i, ..n, ..]);
            let err = (&a - &one.slice(s![0, .., ..]))
                .mapv(f32::abs)
                .fold(0.0f32, |x, &y| x.max(y));
            assert!(err < 1e-5, "{family:?} sequence {i}: {err}");
            let err = (&a - &traced.hidden.slice(s![i, ..n, ..]))
                .mapv(f32::abs)
                .fold(0.0f32, |x, &y| x.max(y));
            assert!(err < 1e-5, "{family:?} traced {i}: {err}");
            assert!(all.slice(s![i, n.., ..]).iter().all(|&x| x == 0.0));
        }
        assert_eq!(traced.attention.len(), 2);
        assert_eq!(traced.attention[0].attention.weights.dim(), (3, 2, 6, 6));
    }

    #[test]
    fn a_batch_shared_out_over_threads_gives_each_sequence_its_own_bits() {
        // 16 sequences, 147 tokens: two groups of at least GROUP_TOKENS on two
        // threads, one group on one thread.
        let seqs: Vec<(Vec<u32>, Vec<u32>)> = (0..16)
            .map(|i| {
                let len = 4 + (i * 5) % 11;
                let ids = (0..len).map(|j| 1 + ((i * 7 + j * 3) % 9) as u32).collect();
                (ids, vec![0; len])
            })
            .collect();
        let tokens: usize = seqs.iter().map(|s| s.0.len()).sum();
        assert_eq!(sequence_groups(&vec![1; tokens], 2).len(), 2);
        let batch = TokenBatch::from_sequences(&seqs, 0).unwrap();
        for family in [Family::Bert, Family::MpNet] {
            let m = tiny_of(family);
            for threads in [1, 2] {
                let all = attend_core::threads::install(Some(threads), || m.forward(&batch))
                    .unwrap()
                    .unwrap();
                for (i, s) in seqs.iter().enumerate() {
                    let one = m
                        .forward(&TokenBatch::from_sequences(std::slice::from_ref(s), 0).unwrap())
                        .unwrap();
                    let n = s.0.len();
                    assert_eq!(
                        all.slice(s![i, ..n, ..]),
                        one.slice(s![0, .., ..]),
                        "{family:?}, {threads} threads, sequence {i}"
                    );
                    assert!(all.slice(s![i, n.., ..]).iter().all(|&x| x == 0.0));
                }
            }
        }
    }

    #[test]
    fn each_family_reads_its_own_positions_and_bias() {
        let one = TokenBatch::from_sequences(&[(vec![3, 4, 5], vec![0; 3])], 0).unwrap();
        // DistilBERT without a stored table uses the sinusoids.
        let m = tiny_of(Family::DistilBert);
        assert_eq!(m.embeddings.position, sinusoidal_table(16, 8));
        assert!(m.embeddings.token_type.is_none());
        // RoBERTa numbers positions from padding_idx + 1 (here 2), so the table's
        // last two rows are out of reach: 14 tokens fit, 15 do not.
        let m = tiny_of(Family::Roberta);
        assert_eq!(m.config.max_tokens(), 14);
        let long = TokenBatch::from_sequences(&[(vec![3; 15], vec![0; 15])], 1).unwrap();
        assert!(m
            .forward(&long)
            .unwrap_err()
            .to_string()
            .contains("maximum of 14"));
        // MPNet's scaled scores are the scaled dot products plus its bias.
        let m = tiny_of(Family::MpNet);
        let traced = m.trace(&one).unwrap();
        let bias = m.position_bias(3).unwrap();
        let a = &traced.attention[1].attention;
        let scale = 1.0 / 2f32;
        let err = (&a.scaled - &(&a.scores * scale + &bias))
            .mapv(f32::abs)
            .fold(0.0f32, |x, &y| x.max(y));
        assert!(err < 1e-6, "{err}");
        assert!(bias.iter().any(|&x| x != 0.0));
    }

    #[test]
    fn an_absurd_sinusoidal_table_is_refused_before_it_is_made() {
        let (mut config, tensors) = tiny_family_weights(Family::DistilBert, |x| x);
        config.max_position_embeddings = 1 << 40;
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.view()))
            .collect();
        let file = SafeTensors::from_bytes(serialize(&views, None).unwrap(), "tiny").unwrap();
        let err = BertModel::from_safetensors(config, &file)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "config.json's max_position_embeddings (the sinusoidal position table) would need"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_checkpoint_of_another_family_is_a_clear_error() {
        let (_, tensors) = tiny_family_weights(Family::Bert, |x| x);
        let views: Vec<_> = tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.view()))
            .collect();
        let file = SafeTensors::from_bytes(serialize(&views, None).unwrap(), "bert.st").unwrap();
        let (distil, _) = tiny_family_weights(Family::DistilBert, |x| x);
        let err = BertModel::from_safetensors(distil, &file)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "bert.st: has no tensor named \"transformer.layer.0.attention.q_lin.weight\""
            ),
            "{err}"
        );
        let (mpnet, _) = tiny_family_weights(Family::MpNet, |x| x);
        let err = BertModel::from_safetensors(mpnet, &file)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("encoder.relative_attention_bias.weight"),
            "{err}"
        );
    }

    #[test]
    fn empty_batches_and_bad_ids() {
        let m = tiny();
        let empty = TokenBatch::from_sequences(&[], 0).unwrap();
        assert_eq!(m.forward(&empty).unwrap().dim(), (0, 0, 8));
        let zero_len = TokenBatch::from_sequences(&[(vec![], vec![])], 0).unwrap();
        assert_eq!(m.forward(&zero_len).unwrap().dim(), (1, 0, 8));
        let bad = TokenBatch::from_sequences(&[(vec![1, 11], vec![0, 0])], 0).unwrap();
        let err = m.forward(&bad).unwrap_err().to_string();
        assert_eq!(
            err,
            "token id 11 at [0, 1] is out of range for a vocabulary of 11"
        );
        let bad = TokenBatch::from_sequences(&[(vec![1, 2], vec![0, 2])], 0).unwrap();
        assert!(m
            .trace(&bad)
            .unwrap_err()
            .to_string()
            .contains("token type 2"));
        let long = TokenBatch::from_sequences(&[(vec![1; 17], vec![0; 17])], 0).unwrap();
        assert!(m
            .forward(&long)
            .unwrap_err()
            .to_string()
            .contains("maximum of 16"));
        assert!(TokenBatch::from_sequences(&[(vec![1], vec![])], 0).is_err());
        let mut no_out = m.clone();
        no_out.layers[0].attention.out_proj = None;
        let one = TokenBatch::from_sequences(&[(vec![1, 2], vec![0, 0])], 0).unwrap();
        assert!(no_out
            .forward(&one)
            .unwrap_err()
            .to_string()
            .contains("output projection"));
    }
}
