//! Seeing attention: terminal heatmaps, pictures (SVG, PNG) and a self-contained
//! HTML attention view.
//!
//! Everything here starts from [`AttentionMaps`], which does not care where the
//! weights came from: a notebook module's [`trace`](attend_core::nn::MultiHeadAttention::trace)
//! (one layer), a real model (one entry per layer), or a JSON file.
//!
//! - [`terminal_heatmap`] colours a `[Tq, Tk]` matrix for a terminal
//!   ([`ColorMode::detect`] picks truecolor, 256 colours or plain numbers);
//! - [`write_heatmap`] draws one layer as a grid of per-head panels to `.svg` or `.png`;
//! - [`html_view`] builds one offline HTML page with a head view and a model view
//!   (the page of `explain`'s steps is the walkthrough's own,
//!   [`walkthrough_page`](crate::walkthrough::walkthrough_page)).

mod colormap;
pub(crate) mod html;
mod picture;
mod terminal;

use std::io::Read;
use std::path::Path;

use ndarray::{Array3, ArrayView4, Axis};
use serde::{Deserialize, Serialize};

use attend_core::{Error, Result};
use attend_models::models::SentenceTrace;

pub use colormap::viridis;
pub use html::{html_view, write_html, HEATMAP_ABOVE};
pub use picture::{render_png, render_svg, write_heatmap};
pub use terminal::{terminal_heatmap, ColorMode};

/// Attention weights of one input, for every layer and head, with the tokens on
/// both sides.
///
/// `layers[l]` is `[heads, Tq, Tk]`: row `i` of head `h` holds how much query token
/// `i` attends to each key token. All layers have the same number of heads.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionMaps {
    /// Labels of the rows (the attending tokens), `Tq` of them.
    pub query_tokens: Vec<String>,
    /// Labels of the columns (the attended tokens), `Tk` of them.
    pub key_tokens: Vec<String>,
    /// Per layer, the weights `[heads, Tq, Tk]`.
    pub layers: Vec<Array3<f32>>,
    /// A title shown above pictures and pages.
    pub title: String,
}

/// The largest attention-maps JSON file read: 1 GiB, some 100 million weights
/// (every layer and head of a 12-layer, 12-head model over 800 tokens).
pub const MAX_JSON_BYTES: u64 = 1 << 30;

/// The JSON form of [`AttentionMaps`]: `layers` is nested lists `[layer][head][q][k]`.
#[derive(Serialize, Deserialize)]
struct MapsJson {
    #[serde(default)]
    title: String,
    query_tokens: Vec<String>,
    #[serde(default)]
    key_tokens: Option<Vec<String>>,
    layers: Vec<Vec<Vec<Vec<f32>>>>,
}

impl AttentionMaps {
    /// Every layer's and head's weights of a real encoder's run on one text (what
    /// the heatmaps and the HTML view draw; `attend view --input-json` reads its JSON
    /// form).
    pub fn of_trace(trace: &SentenceTrace, title: &str) -> Result<AttentionMaps> {
        let layers = trace
            .trace
            .attention
            .iter()
            .map(|m| {
                m.attention
                    .weights
                    .slice(ndarray::s![0, .., .., ..])
                    .to_owned()
            })
            .collect();
        AttentionMaps::new(trace.tokens.clone(), trace.tokens.clone(), layers, title)
    }

    /// Builds and [validates](Self::validate) maps from per-layer `[heads, Tq, Tk]` arrays.
    pub fn new(
        query_tokens: Vec<String>,
        key_tokens: Vec<String>,
        layers: Vec<Array3<f32>>,
        title: impl Into<String>,
    ) -> Result<Self> {
        let maps = AttentionMaps {
            query_tokens,
            key_tokens,
            layers,
            title: title.into(),
        };
        maps.validate()?;
        Ok(maps)
    }

    /// One layer taken from attention weights `[B, H, Tq, Tk]` (the layout of
    /// [`AttentionTrace`](attend_core::kernels::reference) weights) at batch index `batch`.
    pub fn from_weights(
        weights: ArrayView4<'_, f32>,
        batch: usize,
        query_tokens: Vec<String>,
        key_tokens: Vec<String>,
        title: impl Into<String>,
    ) -> Result<Self> {
        let b = weights.dim().0;
        if batch >= b {
            return Err(Error::value(format!(
                "batch index {batch} is out of range for weights {:?} (batch size {b})",
                weights.shape()
            )));
        }
        let layer = weights.index_axis(Axis(0), batch).to_owned();
        Self::new(query_tokens, key_tokens, vec![layer], title)
    }

    /// Number of heads per layer.
    pub fn heads(&self) -> usize {
        self.layers.first().map_or(0, |l| l.dim().0)
    }

    /// Checks that there is at least one layer, that every layer is
    /// `[heads, Tq, Tk]` with the same head count and the token counts of the labels,
    /// and that every weight is finite.
    pub fn validate(&self) -> Result<()> {
        let (tq, tk) = (self.query_tokens.len(), self.key_tokens.len());
        if tq == 0 || tk == 0 {
            return Err(Error::value(format!(
                "attention maps need at least one query and one key token (got {tq} and {tk})"
            )));
        }
        let Some(first) = self.layers.first() else {
            return Err(Error::value("attention maps have no layer"));
        };
        let heads = first.dim().0;
        if heads == 0 {
            return Err(Error::value("attention maps have layers with no head"));
        }
        for (l, layer) in self.layers.iter().enumerate() {
            if layer.dim() != (heads, tq, tk) {
                return Err(Error::shape(format!(
                    "layer {l} weights {:?} do not match [heads {heads}, query tokens {tq}, key tokens {tk}]",
                    layer.shape()
                )));
            }
            if let Some(pos) = layer.iter().position(|w| !w.is_finite()) {
                let (h, r) = (pos / (tq * tk), pos % (tq * tk));
                return Err(Error::value(format!(
                    "layer {l} head {h} weight [{}, {}] is {} (weights must be finite)",
                    r / tk,
                    r % tk,
                    layer.iter().nth(pos).copied().unwrap_or(f32::NAN)
                )));
            }
        }
        Ok(())
    }

    /// Checks that `layer` exists, naming the valid range otherwise.
    pub fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.layers.len() {
            return Err(Error::value(format!(
                "layer {layer} is out of range: the maps have {} layer(s), 0..={}",
                self.layers.len(),
                self.layers.len().saturating_sub(1)
            )));
        }
        Ok(())
    }

    /// Checks that `head` exists, naming the valid range otherwise.
    pub fn check_head(&self, head: usize) -> Result<()> {
        let heads = self.heads();
        if head >= heads {
            return Err(Error::value(format!(
                "head {head} is out of range: the maps have {heads} head(s), 0..={}",
                heads.saturating_sub(1)
            )));
        }
        Ok(())
    }

    /// Reads maps from JSON: `{"title": .., "query_tokens": [..], "key_tokens": [..],
    /// "layers": [[[[w]]]]}` (`key_tokens` defaults to `query_tokens`).
    pub fn from_json(text: &str) -> Result<Self> {
        let j: MapsJson = serde_json::from_str(text)
            .map_err(|e| Error::format(format!("attention maps JSON: {e}")))?;
        Self::from_parsed(j)
    }

    /// The maps of a parsed document, checked.
    fn from_parsed(j: MapsJson) -> Result<Self> {
        let key_tokens = j.key_tokens.unwrap_or_else(|| j.query_tokens.clone());
        let (tq, tk) = (j.query_tokens.len(), key_tokens.len());
        let mut layers = Vec::with_capacity(j.layers.len());
        for (l, layer) in j.layers.into_iter().enumerate() {
            let heads = layer.len();
            // Not reserved from the counts: heads × tq × tk may be far more than the
            // document holds, and the rows below are checked as they come.
            let mut flat = Vec::new();
            for (h, head) in layer.into_iter().enumerate() {
                if head.len() != tq {
                    return Err(Error::shape(format!(
                        "attention maps JSON: layer {l} head {h} has {} rows but there are {tq} query tokens",
                        head.len()
                    )));
                }
                for (i, row) in head.into_iter().enumerate() {
                    if row.len() != tk {
                        return Err(Error::shape(format!(
                            "attention maps JSON: layer {l} head {h} row {i} has {} values but there are {tk} key tokens",
                            row.len()
                        )));
                    }
                    flat.extend(row);
                }
            }
            let arr = Array3::from_shape_vec((heads, tq, tk), flat)
                .map_err(|e| Error::shape(format!("attention maps JSON: layer {l}: {e}")))?;
            layers.push(arr);
        }
        Self::new(j.query_tokens, key_tokens, layers, j.title)
    }

    /// Reads maps from a JSON file (see [`from_json`](Self::from_json)), parsed as
    /// it is read: a file that is not JSON (`/dev/zero`) fails at its first byte,
    /// and one larger than [`MAX_JSON_BYTES`] is refused when it gets there.
    pub fn read_json(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let mut input = std::io::BufReader::new(file).take(MAX_JSON_BYTES + 1);
        let parsed = serde_json::from_reader(&mut input);
        let named = |e: Error| Error::format(format!("{}: {e}", path.display()));
        if input.limit() == 0 {
            return Err(named(Error::format(format!(
                "attention maps JSON larger than {} MiB",
                MAX_JSON_BYTES >> 20
            ))));
        }
        let j: MapsJson = parsed.map_err(|e| match e.io_error_kind() {
            Some(_) => Error::io(path, e),
            None => named(Error::format(format!("attention maps JSON: {e}"))),
        })?;
        Self::from_parsed(j).map_err(named)
    }

    /// The JSON form read by [`from_json`](Self::from_json).
    pub fn to_json(&self) -> String {
        let j = MapsJson {
            title: self.title.clone(),
            query_tokens: self.query_tokens.clone(),
            key_tokens: Some(self.key_tokens.clone()),
            layers: self
                .layers
                .iter()
                .map(|l| {
                    l.outer_iter()
                        .map(|h| h.outer_iter().map(|r| r.to_vec()).collect())
                        .collect()
                })
                .collect(),
        };
        serde_json::to_string(&j).expect("attention maps serialise")
    }

    /// Smallest and largest weight over all layers, with the low end at most 0 and a
    /// non-empty range: the colour scale used by pictures and pages.
    pub(crate) fn value_range(&self) -> (f32, f32) {
        range_of(self.layers.iter().flat_map(|l| l.iter().copied()))
    }
}

/// `(min(0, lowest), highest)`, widened to a non-empty range.
pub(crate) fn range_of(values: impl Iterator<Item = f32>) -> (f32, f32) {
    let (mut lo, mut hi) = (0.0f32, f32::NEG_INFINITY);
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !hi.is_finite() || hi <= lo {
        hi = lo + 1.0;
    }
    (lo, hi)
}
