//! The loss curve as a small self-contained SVG.

use crate::markup::escape;

/// An SVG line chart of `losses` (one per step), with axes labelled.
pub fn loss_curve_svg(losses: &[f32], title: &str) -> String {
    let (w, h, left, bottom, top, right) = (640.0, 360.0, 60.0, 40.0, 30.0, 20.0);
    let n = losses.len().max(2);
    let max = losses
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(0.0f32, f32::max)
        .max(1e-6);
    let x = |i: usize| left + (w - left - right) * i as f64 / (n - 1) as f64;
    let y = |v: f32| top + (h - top - bottom) * (1.0 - (v / max) as f64);
    let points: Vec<String> = losses
        .iter()
        .enumerate()
        .map(|(i, &v)| format!("{:.1},{:.1}", x(i), y(v)))
        .collect();
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n\
         <line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n",
        w / 2.0,
        escape(title),
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for k in 0..=4 {
        let v = max * k as f32 / 4.0;
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.2}</text>\n",
            left - 6.0,
            y(v) + 4.0
        );
    }
    s += &format!(
        "<text x=\"{left}\" y=\"{}\">0</text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{} steps</text>\n\
         <text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">cross-entropy</text>\n",
        h - bottom + 16.0,
        w - right,
        h - bottom + 16.0,
        losses.len(),
        h / 2.0,
        h / 2.0
    );
    s += &format!(
        "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n</svg>\n",
        points.join(" ")
    );
    s
}
