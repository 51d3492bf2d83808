//! The self-contained HTML attention view.

use std::path::Path;

use serde::Serialize;

use super::colormap::viridis_js;
use super::AttentionMaps;
use crate::markup::escape;
use attend_core::{Error, Result};

/// Above this many tokens (on either side) the page opens on the heatmap view rather
/// than the lines between tokens, so it stays responsive.
pub const HEATMAP_ABOVE: usize = 256;

/// Above this many weights in all, they are embedded with 8 bits instead of 16.
const WIDE_LIMIT: usize = 8 << 20;
/// Largest side of the pooled pictures in the model view.
const THUMB: usize = 48;

const TEMPLATE: &str = include_str!("view.html");

#[derive(Serialize)]
struct PageData<'a> {
    title: &'a str,
    q: &'a [String],
    k: &'a [String],
    layers: usize,
    heads: usize,
    lo: f32,
    hi: f32,
    bits: u32,
    /// `[layer][head]`: base64 of little-endian u16 (or u8) fractions of `[lo, hi]`.
    w: Vec<Vec<String>>,
    thumb: Thumbs,
    #[serde(rename = "heatmapAbove")]
    heatmap_above: usize,
}

#[derive(Serialize)]
struct Thumbs {
    rows: usize,
    cols: usize,
    data: Vec<Vec<String>>,
}

/// One self-contained HTML page (no network, no CDN; the weights are embedded as
/// JSON) showing `maps`:
///
/// - a head view in the spirit of bertviz: query tokens on the left, key tokens on
///   the right, one line per pair with the weight as its opacity; hovering a token
///   focuses its lines; layer and head are chosen from menus;
/// - above [`HEATMAP_ABOVE`] tokens it opens on a heatmap (canvas) instead, with a
///   readout of the weight under the pointer;
/// - a model view, a grid of layers × heads drawn small, when there is more than one
///   head or layer; clicking one opens it in the head view.
///
/// Heatmaps and the model view's small pictures colour each head from 0 to its own
/// largest weight; the lines use the weight itself as opacity, as bertviz does.
///
/// Weights are embedded as 16-bit fractions of the value range (8-bit above about
/// 8 million weights, where the page marks readouts as approximate).
pub fn html_view(maps: &AttentionMaps) -> Result<String> {
    maps.validate()?;
    let (lo, hi) = maps.value_range();
    let (tq, tk) = (maps.query_tokens.len(), maps.key_tokens.len());
    let heads = maps.heads();
    let total = maps.layers.len() * heads * tq * tk;
    let bits = if total > WIDE_LIMIT { 8 } else { 16 };
    let scale = 1.0 / (hi - lo);
    let (trows, tcols) = (tq.min(THUMB), tk.min(THUMB));
    let mut w = Vec::new();
    let mut thumbs = Vec::new();
    for layer in &maps.layers {
        let mut wl = Vec::with_capacity(heads);
        let mut tl = Vec::with_capacity(heads);
        for head in layer.outer_iter() {
            let mut bytes = Vec::with_capacity(tq * tk * bits as usize / 8);
            for &v in head.iter() {
                let f = ((v - lo) * scale).clamp(0.0, 1.0);
                if bits == 16 {
                    bytes.extend_from_slice(&((f * 65535.0).round() as u16).to_le_bytes());
                } else {
                    bytes.push((f * 255.0).round() as u8);
                }
            }
            wl.push(base64(&bytes));
            // Mean-pooled picture for the model view.
            let mut means = vec![0f32; trows * tcols];
            for r in 0..trows {
                let (r0, r1) = (
                    r * tq / trows,
                    ((r + 1) * tq / trows).max(r * tq / trows + 1),
                );
                for c in 0..tcols {
                    let (c0, c1) = (
                        c * tk / tcols,
                        ((c + 1) * tk / tcols).max(c * tk / tcols + 1),
                    );
                    let mut sum = 0.0f32;
                    for i in r0..r1 {
                        for j in c0..c1 {
                            sum += head[[i, j]];
                        }
                    }
                    means[r * tcols + c] = sum / ((r1 - r0) * (c1 - c0)) as f32 - lo;
                }
            }
            // Scaled to its own largest mean, like the heatmap view.
            let top = means.iter().cloned().fold(0.0f32, f32::max);
            let top = if top > 0.0 { top } else { 1.0 };
            let t: Vec<u8> = means
                .iter()
                .map(|m| ((m / top).clamp(0.0, 1.0) * 255.0).round() as u8)
                .collect();
            tl.push(base64(&t));
        }
        w.push(wl);
        thumbs.push(tl);
    }
    let data = PageData {
        title: &maps.title,
        q: &maps.query_tokens,
        k: &maps.key_tokens,
        layers: maps.layers.len(),
        heads,
        lo,
        hi,
        bits,
        w,
        thumb: Thumbs {
            rows: trows,
            cols: tcols,
            data: thumbs,
        },
        heatmap_above: HEATMAP_ABOVE,
    };
    let json = script_json(&data, "attention page data")?;
    let title = if maps.title.is_empty() {
        "Attention".to_string()
    } else {
        escape(&maps.title)
    };
    Ok(TEMPLATE
        .replacen("/*TITLE*/", &title, 1)
        .replacen("/*VIRIDIS*/", &viridis_js(), 1)
        .replacen("/*DATA*/", &json, 1))
}

/// Writes [`html_view`] of `maps` to `path`.
pub fn write_html(maps: &AttentionMaps, path: &Path) -> Result<()> {
    let page = html_view(maps)?;
    std::fs::write(path, page).map_err(|e| Error::io(path, e))
}

/// `data` as JSON that can sit inside a `<script>` element: `<` and `/` only occur
/// inside JSON strings, where `\u003c` and `\/` mean the same, cannot close the
/// element, and keep text such as a URL in a title from appearing as `http://`
/// in a page that promises to reference nothing outside itself.
pub(crate) fn script_json(data: &impl Serialize, what: &str) -> Result<String> {
    Ok(serde_json::to_string(data)
        .map_err(|e| Error::format(format!("{what}: {e}")))?
        .replace('<', "\\u003c")
        .replace('/', "\\/"))
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut o = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for ch in bytes.chunks(3) {
        let n = (ch[0] as u32) << 16
            | (*ch.get(1).unwrap_or(&0) as u32) << 8
            | *ch.get(2).unwrap_or(&0) as u32;
        o.push(A[(n >> 18) as usize & 63] as char);
        o.push(A[(n >> 12) as usize & 63] as char);
        o.push(if ch.len() > 1 {
            A[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        o.push(if ch.len() > 2 {
            A[n as usize & 63] as char
        } else {
            '='
        });
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }
}
