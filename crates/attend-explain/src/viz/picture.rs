//! Heatmap pictures: one panel per head in a grid, token labels on both axes, a
//! colour bar. One layout ([`Scene`]) drawn by two back ends: SVG text, and a small
//! rasteriser with an embedded 8×8 bitmap font (public-domain `font8x8`) encoded as
//! PNG by the `png` crate, so no system font or renderer is needed.

use std::fmt::Write as _;
use std::path::Path;

use super::colormap::{contrast, viridis};
use super::AttentionMaps;
use crate::markup::escape;
use attend_core::{limits, Error, Result};

/// Pixels of one glyph at scale 1.
const GLYPH: i32 = 8;
/// Longest token label drawn in a picture (longer ones end in `..`).
const MAX_LABEL: usize = 12;
/// Longest title drawn (longer ones end in `..`): a title is one line, and a long
/// sentence in it would otherwise widen the canvas without bound.
const MAX_TITLE: usize = 100;
/// The largest canvas drawn, in pixels (3 bytes each in the PNG rasteriser): beyond
/// it, cells would be thinner than a pixel or the picture larger than any screen.
const MAX_PIXELS: i64 = 1 << 26;

/// Writes the heads of `layer` as a heatmap picture; the format follows the
/// extension of `path`: `.svg` or `.png`.
///
/// Errors: an unknown extension, a layer out of range, or a path that cannot be
/// written, each as one line naming the culprit.
pub fn write_heatmap(maps: &AttentionMaps, layer: usize, path: &Path) -> Result<()> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let bytes = match ext.as_deref() {
        Some("svg") => render_svg(maps, layer)?.into_bytes(),
        Some("png") => render_png(maps, layer)?,
        other => {
            return Err(Error::value(format!(
                "heatmap {}: unknown picture extension {} (use .svg or .png)",
                path.display(),
                other.map_or("(none)".to_string(), |e| format!("'.{e}'"))
            )))
        }
    };
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

/// The heatmap of `layer` as an SVG document.
pub fn render_svg(maps: &AttentionMaps, layer: usize) -> Result<String> {
    Ok(layout(maps, layer)?.to_svg())
}

/// The heatmap of `layer` as PNG bytes.
pub fn render_png(maps: &AttentionMaps, layer: usize) -> Result<Vec<u8>> {
    layout(maps, layer)?.to_png()
}

#[derive(Clone, Copy, PartialEq)]
enum Anchor {
    Start,
    Middle,
    End,
}

enum Item {
    /// A filled rectangle, with an optional tooltip (SVG only).
    Rect {
        x: i32,
        y: i32,
        w: i32,
        h: i32,
        fill: [u8; 3],
        tip: Option<String>,
    },
    /// Horizontal text whose box has top `y`; `x` is its left, centre or right edge.
    Text {
        x: i32,
        y: i32,
        scale: i32,
        anchor: Anchor,
        fill: [u8; 3],
        text: String,
    },
    /// Text reading upwards from its bottom-left corner `(x, y)`.
    UpText {
        x: i32,
        y: i32,
        scale: i32,
        fill: [u8; 3],
        text: String,
    },
    /// A vertical viridis colour bar, the top end being 1.
    Bar { x: i32, y: i32, w: i32, h: i32 },
}

struct Scene {
    width: i32,
    height: i32,
    items: Vec<Item>,
}

const INK: [u8; 3] = [34, 34, 34];
const GREY: [u8; 3] = [110, 110, 110];

/// `s` on one line, at most `max` characters (longer ones end in `..`).
fn shorten(s: &str, max: usize) -> String {
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.chars().count() <= max {
        s
    } else {
        let mut t: String = s.chars().take(max - 2).collect();
        t.push_str("..");
        t
    }
}

fn label(s: &str) -> String {
    shorten(s, MAX_LABEL)
}

fn too_large(heads: usize, tq: usize, tk: usize) -> Error {
    Error::value(format!(
        "a heatmap of {heads} heads of {tq} × {tk} tokens is too large to draw (at most {MAX_PIXELS} pixels); pick fewer tokens or view it as --html"
    ))
}

fn text_width(s: &str, scale: i32) -> i32 {
    s.chars().count() as i32 * GLYPH * scale
}

/// Short number for ticks and cells.
fn short(v: f32) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 0.01 && v.abs() < 100.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1e}")
    }
}

fn layout(maps: &AttentionMaps, layer: usize) -> Result<Scene> {
    maps.validate()?;
    maps.check_layer(layer)?;
    let w = &maps.layers[layer];
    let (heads, tq, tk) = w.dim();
    // Every cell is at least a pixel: refuse before any size is computed in i32.
    let cells = limits::array_bytes(&[heads, tq, tk], 1);
    if cells > MAX_PIXELS as u128 {
        return Err(too_large(heads, tq, tk));
    }
    let t = tq.max(tk) as i32;
    let (lo, hi) = super::range_of(w.iter().copied());

    // Cell size: big enough to label every token up to 64 of them, then shrinking.
    let cell = if t <= 64 {
        (576 / t).clamp(12, 48)
    } else {
        (768 / t).max(1)
    };
    let s = if cell >= 24 { 2 } else { 1 };
    let gh = GLYPH * s;
    // Every k-th label when cells are thinner than a glyph.
    let every = ((gh + 1 + cell - 1) / cell).max(1) as usize;
    let qlabels: Vec<String> = maps.query_tokens.iter().map(|x| label(x)).collect();
    let klabels: Vec<String> = maps.key_tokens.iter().map(|x| label(x)).collect();
    let row_w = qlabels.iter().map(|l| text_width(l, s)).max().unwrap_or(0) + 6;
    let col_h = klabels.iter().map(|l| text_width(l, s)).max().unwrap_or(0) + 6;
    let grid_c = if heads <= 4 {
        heads
    } else {
        (heads as f64).sqrt().ceil() as usize
    };
    let grid_r = heads.div_ceil(grid_c);
    let heat_w = tk as i32 * cell;
    let heat_h = tq as i32 * cell;
    let head_title = gh + 8;
    let panel_w = row_w + heat_w + 16;
    let panel_h = head_title + col_h + heat_h + 16;
    let margin = 16;
    let title_h = 2 * GLYPH * 2 + 12;
    let bar_w = 18;
    let tick_w = text_width(&short(hi), 1).max(text_width(&short(lo), 1)) + 8;
    let title = if maps.title.is_empty() {
        format!("attention, layer {layer}")
    } else {
        format!("{}, layer {layer}", shorten(&maps.title, MAX_TITLE))
    };
    // In i64: panels repeat per head, and many small heads can still overflow i32.
    let width = (2 * margin as i64 + grid_c as i64 * panel_w as i64 + (bar_w + tick_w + 8) as i64)
        .max((margin * 2 + text_width(&title, 2)) as i64);
    let height = 2 * margin as i64 + title_h as i64 + grid_r as i64 * panel_h as i64;
    if width.saturating_mul(height) > MAX_PIXELS {
        return Err(too_large(heads, tq, tk));
    }
    let (width, height) = (width as i32, height as i32);

    let mut items = Vec::new();
    items.push(Item::Text {
        x: margin,
        y: margin,
        scale: 2,
        anchor: Anchor::Start,
        fill: INK,
        text: title,
    });
    items.push(Item::Text {
        x: margin,
        y: margin + 2 * GLYPH + 6,
        scale: 1,
        anchor: Anchor::Start,
        fill: GREY,
        text: "rows: queries (attending)  columns: keys (attended to)".into(),
    });
    let values = cell >= 40;
    for h in 0..heads {
        let px = margin + (h % grid_c) as i32 * panel_w;
        let py = margin + title_h + (h / grid_c) as i32 * panel_h;
        let hx = px + row_w;
        let hy = py + head_title + col_h;
        items.push(Item::Text {
            x: hx + heat_w / 2,
            y: py,
            scale: s,
            anchor: Anchor::Middle,
            fill: INK,
            text: format!("head {h}"),
        });
        for (j, l) in klabels.iter().enumerate() {
            if j % every == 0 {
                items.push(Item::UpText {
                    x: hx + j as i32 * cell + (cell - gh) / 2,
                    y: hy - 4,
                    scale: s,
                    fill: INK,
                    text: l.clone(),
                });
            }
        }
        for (i, l) in qlabels.iter().enumerate() {
            if i % every == 0 {
                items.push(Item::Text {
                    x: hx - 4,
                    y: hy + i as i32 * cell + (cell - gh) / 2,
                    scale: s,
                    anchor: Anchor::End,
                    fill: INK,
                    text: l.clone(),
                });
            }
        }
        let tips = tq * tk <= 64 * 64;
        for i in 0..tq {
            for j in 0..tk {
                let v = w[[h, i, j]];
                let fill = viridis((v - lo) / (hi - lo));
                items.push(Item::Rect {
                    x: hx + j as i32 * cell,
                    y: hy + i as i32 * cell,
                    w: cell,
                    h: cell,
                    fill,
                    tip: tips.then(|| {
                        format!(
                            "{} \u{2192} {}: {v:.4}",
                            maps.query_tokens[i], maps.key_tokens[j]
                        )
                    }),
                });
                let text = format!("{v:.2}");
                if values && text_width(&text, 1) <= cell - 4 {
                    items.push(Item::Text {
                        x: hx + j as i32 * cell + cell / 2,
                        y: hy + i as i32 * cell + (cell - GLYPH) / 2,
                        scale: 1,
                        anchor: Anchor::Middle,
                        fill: contrast(fill),
                        text,
                    });
                }
            }
        }
    }
    // Colour bar beside the first row of panels.
    let bx = margin + grid_c as i32 * panel_w;
    let by = margin + title_h + head_title + col_h;
    let bh = heat_h.clamp(96, 320);
    items.push(Item::Bar {
        x: bx,
        y: by,
        w: bar_w,
        h: bh,
    });
    for (frac, v) in [(0.0, hi), (0.5, (lo + hi) / 2.0), (1.0, lo)] {
        items.push(Item::Text {
            x: bx + bar_w + 4,
            y: by + ((bh - GLYPH) as f32 * frac) as i32,
            scale: 1,
            anchor: Anchor::Start,
            fill: INK,
            text: short(v),
        });
    }
    Ok(Scene {
        width,
        height,
        items,
    })
}

fn hex(c: [u8; 3]) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

impl Scene {
    fn to_svg(&self) -> String {
        let mut o = String::new();
        let _ = write!(
            o,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" \
             font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
            w = self.width,
            h = self.height
        );
        let mut gradient = false;
        for item in &self.items {
            match item {
                Item::Rect {
                    x,
                    y,
                    w,
                    h,
                    fill,
                    tip,
                } => {
                    let _ = write!(
                        o,
                        "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\" fill=\"{}\"",
                        hex(*fill)
                    );
                    match tip {
                        Some(t) => {
                            let _ = writeln!(o, "><title>{}</title></rect>", escape(t));
                        }
                        None => o.push_str("/>\n"),
                    }
                }
                Item::Text {
                    x,
                    y,
                    scale,
                    anchor,
                    fill,
                    text,
                } => {
                    let size = GLYPH * scale;
                    let a = match anchor {
                        Anchor::Start => "start",
                        Anchor::Middle => "middle",
                        Anchor::End => "end",
                    };
                    let _ = writeln!(
                        o,
                        "<text x=\"{x}\" y=\"{}\" font-size=\"{}\" text-anchor=\"{a}\" fill=\"{}\">{}</text>",
                        y + size * 7 / 8,
                        size + size / 4,
                        hex(*fill),
                        escape(text)
                    );
                }
                Item::UpText {
                    x,
                    y,
                    scale,
                    fill,
                    text,
                } => {
                    let size = GLYPH * scale;
                    let _ = writeln!(
                        o,
                        "<text transform=\"translate({},{y}) rotate(-90)\" font-size=\"{}\" fill=\"{}\">{}</text>",
                        x + size * 7 / 8,
                        size + size / 4,
                        hex(*fill),
                        escape(text)
                    );
                }
                Item::Bar { x, y, w, h } => {
                    if !gradient {
                        gradient = true;
                        o.push_str("<defs><linearGradient id=\"viridis\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">");
                        for k in 0..=8 {
                            let t = k as f32 / 8.0;
                            let _ = write!(
                                o,
                                "<stop offset=\"{t}\" stop-color=\"{}\"/>",
                                hex(viridis(t))
                            );
                        }
                        o.push_str("</linearGradient></defs>\n");
                    }
                    let _ = writeln!(
                        o,
                        "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\" fill=\"url(#viridis)\" stroke=\"#444\" stroke-width=\"0.5\"/>"
                    );
                }
            }
        }
        o.push_str("</svg>\n");
        o
    }

    fn to_png(&self) -> Result<Vec<u8>> {
        let mut c = Canvas {
            w: self.width,
            h: self.height,
            px: vec![255; (self.width * self.height * 3) as usize],
        };
        for item in &self.items {
            match item {
                Item::Rect {
                    x, y, w, h, fill, ..
                } => c.fill(*x, *y, *w, *h, *fill),
                Item::Text {
                    x,
                    y,
                    scale,
                    anchor,
                    fill,
                    text,
                } => {
                    let tw = text_width(text, *scale);
                    let x0 = match anchor {
                        Anchor::Start => *x,
                        Anchor::Middle => x - tw / 2,
                        Anchor::End => x - tw,
                    };
                    for (k, ch) in text.chars().enumerate() {
                        c.glyph(x0 + k as i32 * GLYPH * scale, *y, *scale, false, ch, *fill);
                    }
                }
                Item::UpText {
                    x,
                    y,
                    scale,
                    fill,
                    text,
                } => {
                    for (k, ch) in text.chars().enumerate() {
                        c.glyph(*x, y - k as i32 * GLYPH * scale, *scale, true, ch, *fill);
                    }
                }
                Item::Bar { x, y, w, h } => {
                    for r in 0..*h {
                        let t = 1.0 - r as f32 / (*h - 1).max(1) as f32;
                        c.fill(*x, y + r, *w, 1, viridis(t));
                    }
                    c.outline(*x, *y, *w, *h, [68, 68, 68]);
                }
            }
        }
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, self.width as u32, self.height as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_compression(png::Compression::Best);
        let mut wr = enc
            .write_header()
            .map_err(|e| Error::format(format!("PNG encoding failed: {e}")))?;
        wr.write_image_data(&c.px)
            .map_err(|e| Error::format(format!("PNG encoding failed: {e}")))?;
        wr.finish()
            .map_err(|e| Error::format(format!("PNG encoding failed: {e}")))?;
        Ok(out)
    }
}

struct Canvas {
    w: i32,
    h: i32,
    px: Vec<u8>,
}

impl Canvas {
    fn put(&mut self, x: i32, y: i32, c: [u8; 3]) {
        if x >= 0 && y >= 0 && x < self.w && y < self.h {
            let i = ((y * self.w + x) * 3) as usize;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    fn fill(&mut self, x: i32, y: i32, w: i32, h: i32, c: [u8; 3]) {
        for yy in y.max(0)..(y + h).min(self.h) {
            for xx in x.max(0)..(x + w).min(self.w) {
                self.put(xx, yy, c);
            }
        }
    }

    fn outline(&mut self, x: i32, y: i32, w: i32, h: i32, c: [u8; 3]) {
        self.fill(x, y, w, 1, c);
        self.fill(x, y + h - 1, w, 1, c);
        self.fill(x, y, 1, h, c);
        self.fill(x + w - 1, y, 1, h, c);
    }

    /// One glyph; upright with top-left `(x, y)`, or (`up`) turned to read upwards
    /// with bottom-left `(x, y)`.
    fn glyph(&mut self, x: i32, y: i32, s: i32, up: bool, ch: char, c: [u8; 3]) {
        let bits = glyph_bits(ch);
        for (r, row) in bits.iter().enumerate() {
            for b in 0..8 {
                if row & (1 << b) != 0 {
                    let (gx, gy) = if up {
                        (x + r as i32 * s, y - (b + 1) * s)
                    } else {
                        (x + b * s, y + r as i32 * s)
                    };
                    self.fill(gx, gy, s, s, c);
                }
            }
        }
    }
}

/// The 8×8 bitmap of `ch`: ASCII, Latin-1, Greek, box drawing, block elements and
/// Hiragana from `font8x8`; `?` for anything else, and for the code points of those
/// blocks that the font leaves blank.
fn glyph_bits(ch: char) -> [u8; 8] {
    use font8x8::legacy::{
        BASIC_LEGACY, BLOCK_LEGACY, BOX_LEGACY, GREEK_LEGACY, HIRAGANA_LEGACY, LATIN_LEGACY,
    };
    let unknown = BASIC_LEGACY[b'?' as usize];
    let u = ch as u32;
    let at = |block: &[[u8; 8]], first: u32| {
        let bits = block[(u - first) as usize];
        if bits == [0; 8] {
            unknown
        } else {
            bits
        }
    };
    match u {
        0x20..=0x7e => BASIC_LEGACY[u as usize],
        0xa0..=0xff => LATIN_LEGACY[(u - 0xa0) as usize],
        0x390..=0x3c9 => at(&GREEK_LEGACY, 0x390),
        0x2500..=0x257f => at(&BOX_LEGACY, 0x2500),
        0x2580..=0x259f => at(&BLOCK_LEGACY, 0x2580),
        0x3040..=0x309f => at(&HIRAGANA_LEGACY, 0x3040),
        0x2192 => BASIC_LEGACY[b'>' as usize],
        _ => unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::{glyph_bits, render_png, render_svg, AttentionMaps};

    #[test]
    fn canvases_beyond_the_pixel_budget_are_refused_before_drawing() {
        // Few cells, but a panel per head: the canvas, not the cell count, is
        // what would overflow i32 and exhaust memory.
        let many_heads = ndarray::Array3::from_elem((70_000, 1, 1), 1.0);
        let maps =
            AttentionMaps::new(vec!["a".into()], vec!["b".into()], vec![many_heads], "t").unwrap();
        for err in [
            render_png(&maps, 0).err().unwrap(),
            render_svg(&maps, 0).err().unwrap(),
        ] {
            assert!(
                err.to_string()
                    .starts_with("a heatmap of 70000 heads of 1 × 1 tokens is too large to draw"),
                "{err}"
            );
        }
    }

    #[test]
    fn greek_box_and_hiragana_have_glyphs_and_the_rest_is_a_question_mark() {
        let question = glyph_bits('?');
        for ch in ['α', 'Ω', 'λ', '─', '█', 'あ', 'é', 'A'] {
            let bits = glyph_bits(ch);
            assert_ne!(bits, question, "{ch}");
            assert_ne!(bits, [0; 8], "{ch}");
        }
        assert_ne!(glyph_bits('α'), glyph_bits('β'));
        // Outside the font, and a code point inside a block that the font leaves blank.
        for ch in ['漢', '😀', '\u{3040}'] {
            assert_eq!(glyph_bits(ch), question, "{ch:?}");
        }
        assert_eq!(glyph_bits(' '), [0; 8]);
    }
}
