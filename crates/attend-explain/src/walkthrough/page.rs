//! The walkthrough as one self-contained HTML page: a panel per step, every cell
//! linked to the cells it is computed from.
//!
//! The page embeds the steps exactly as `explain --format json` gives them (the
//! same `f32` values, masked scores as `null`) plus what the JSON leaves implicit:
//! the token labels, the scale, the softmax axis, the orientation the weights were
//! written in and why each masked score is masked. The page's script recomputes
//! products and softmaxes only to *show* them next to the printed values.

use ndarray::Array3;
use serde::Serialize;

use super::Step;
use crate::experiment::Named;
use crate::markup::escape;
use crate::print::format_tensor;
use crate::viz::html::script_json;
use attend_core::attention::SoftmaxAxis;
use attend_core::{Error, Result};

/// Mask reason bit: the key is a padding token.
pub const MASK_PADDING: u8 = 1;
/// Mask reason bit: the key comes after the query (causal masking).
pub const MASK_CAUSAL: u8 = 2;
/// Mask reason bit: the key is outside the query's sliding window.
pub const MASK_WINDOW: u8 = 4;

/// Above this many tokens the panels are heatmaps instead of tables of numbers.
pub const TABLE_TOKENS: usize = 32;

const TEMPLATE: &str = include_str!("page.html");

/// What the page shows besides the steps' values.
#[derive(Clone, Debug)]
pub struct PageContext {
    /// The page title.
    pub title: String,
    /// A label per token, per batch row.
    pub labels: Vec<Vec<String>>,
    /// The factor the scores were multiplied by.
    pub scale: f32,
    /// The axis the softmax normalised.
    pub softmax_axis: SoftmaxAxis,
    /// The projections were written `[in, out]` (`q = x W`) rather than PyTorch's
    /// `[out, in]`: the page shows them the way the initialiser wrote them.
    pub weights_in_out: bool,
    /// `[B, T, S]`: why each score is masked, as `MASK_*` bits (0: kept);
    /// `None` when nothing is masked.
    pub mask_reasons: Option<Array3<u8>>,
}

#[derive(Serialize)]
struct PageData<'a> {
    title: &'a str,
    labels: &'a [Vec<String>],
    scale: f32,
    axis: &'static str,
    #[serde(rename = "inOut")]
    in_out: bool,
    /// Per batch row, one digit (the reason bits) per score, row-major.
    masks: Option<Vec<String>>,
    #[serde(rename = "tableTokens")]
    table_tokens: usize,
    steps: Vec<StepData<'a>>,
}

#[derive(Serialize)]
struct StepData<'a> {
    key: &'a str,
    title: &'a str,
    shape: &'a [usize],
    /// Row-major values; non-finite ones (masked scores) are `null`, as in the JSON.
    data: Vec<Option<f32>>,
    /// The step as `explain` prints it.
    printed: String,
}

/// The page for `steps` (in walkthrough order). Checks that the mask reasons, when
/// given, have one entry per score of batch row and query and key, and that there
/// is a label per batch row.
pub fn walkthrough_page(steps: &[Step], ctx: &PageContext) -> Result<String> {
    let scores = steps
        .iter()
        .find(|s| s.key == "scores")
        .ok_or_else(|| Error::value("a walkthrough page needs a scores step"))?;
    // Scores are [B, H, T, S] for an experiment, [T, S] for one head of a model.
    let sh = scores.value.shape();
    let (batch, tq, tk) = match sh.len() {
        4 => (sh[0], sh[2], sh[3]),
        _ => (1, sh[0], sh[sh.len() - 1]),
    };
    if ctx.labels.len() != batch || ctx.labels.iter().any(|l| l.len() != tq) {
        return Err(Error::shape(format!(
            "walkthrough page: {} label rows for scores of shape {sh:?}",
            ctx.labels.len()
        )));
    }
    if let Some(m) = &ctx.mask_reasons {
        if m.dim() != (batch, tq, tk) {
            return Err(Error::shape(format!(
                "walkthrough page: mask reasons {:?} do not match scores {sh:?}",
                m.shape()
            )));
        }
    }
    let masks = ctx.mask_reasons.as_ref().map(|m| {
        m.outer_iter()
            .map(|row| row.iter().map(|&r| char::from(b'0' + r)).collect())
            .collect()
    });
    let data = PageData {
        title: &ctx.title,
        labels: &ctx.labels,
        scale: ctx.scale,
        axis: ctx.softmax_axis.name(),
        in_out: ctx.weights_in_out,
        masks,
        table_tokens: TABLE_TOKENS,
        steps: steps
            .iter()
            .map(|s| StepData {
                key: s.key,
                title: &s.title,
                shape: s.value.shape(),
                data: s
                    .value
                    .iter()
                    .map(|&v| v.is_finite().then_some(v))
                    .collect(),
                printed: format_tensor(s.value.view()),
            })
            .collect(),
    };
    let json = script_json(&data, "walkthrough page data")?;
    // The title goes into HTML text: escaped, and `/` as an entity for the same
    // reason as in the JSON.
    let title = escape(&ctx.title).replace('/', "&#47;");
    Ok(TEMPLATE
        .replacen("/*TITLE*/", &title, 1)
        .replacen("/*DATA*/", &json, 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, Array4};

    fn steps(t: usize) -> Vec<Step> {
        let scores = Array4::from_shape_fn((1, 1, t, t), |(_, _, i, j)| {
            if j > i {
                f32::NEG_INFINITY
            } else {
                (i * t + j) as f32
            }
        });
        vec![
            Step {
                key: "x",
                title: "x".into(),
                value: Array2::<f32>::ones((t, 2)).into_dyn(),
            },
            Step {
                key: "scores",
                title: "scores".into(),
                value: scores.into_dyn(),
            },
        ]
    }

    fn ctx(labels: Vec<Vec<String>>, reasons: Option<Array3<u8>>) -> PageContext {
        PageContext {
            title: "a </script> title, see https://example.invalid/".into(),
            labels,
            scale: 0.5,
            softmax_axis: SoftmaxAxis::Queries,
            weights_in_out: true,
            mask_reasons: reasons,
        }
    }

    fn data(page: &str) -> serde_json::Value {
        let open = "<script id=\"attend-data\" type=\"application/json\">";
        let start = page.find(open).unwrap() + open.len();
        let len = page[start..].find("</script>").unwrap();
        serde_json::from_str(&page[start..start + len]).unwrap()
    }

    #[test]
    fn embeds_the_steps_labels_and_reasons_and_references_nothing_outside() {
        let labels = vec![vec!["a".to_string(), "<b>".into(), "c".into()]];
        let reasons = Array3::from_shape_fn((1, 3, 3), |(_, i, j)| {
            u8::from(j > i) * MASK_CAUSAL + u8::from(j == 2) * MASK_PADDING
        });
        let page = walkthrough_page(&steps(3), &ctx(labels, Some(reasons))).unwrap();
        assert!(!page.contains("http://") && !page.contains("https://"));
        // One `</script>` per script element: the title's is escaped.
        assert_eq!(page.matches("</script>").count(), 2);
        let d = data(&page);
        assert_eq!(
            d["title"],
            "a </script> title, see https://example.invalid/"
        );
        assert_eq!(d["labels"][0][1], "<b>");
        assert_eq!(d["axis"], "queries");
        assert_eq!(d["inOut"], true);
        assert_eq!(d["masks"][0], "023003001");
        let scores = &d["steps"][1];
        assert_eq!(scores["shape"], serde_json::json!([1, 1, 3, 3]));
        assert_eq!(scores["data"][1], serde_json::Value::Null);
        assert_eq!(scores["data"][3], 3.0);
        assert!(scores["printed"].as_str().unwrap().contains("-inf"));
    }

    #[test]
    fn labels_and_reasons_must_match_the_scores() {
        let err = walkthrough_page(&steps(3), &ctx(vec![vec!["a".into()]], None)).unwrap_err();
        assert!(err.to_string().contains("1 label rows"), "{err}");
        let labels = vec![vec!["a".to_string(), "b".into(), "c".into()]];
        let reasons = Some(Array3::zeros((1, 2, 3)));
        let err = walkthrough_page(&steps(3), &ctx(labels, reasons)).unwrap_err();
        assert!(err.to_string().contains("mask reasons [1, 2, 3]"), "{err}");
        let err = walkthrough_page(&steps(3)[..1], &ctx(vec![], None)).unwrap_err();
        assert!(err.to_string().contains("needs a scores step"), "{err}");
    }
}
