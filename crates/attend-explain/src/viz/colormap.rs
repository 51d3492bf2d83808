//! The colour scale shared by terminal, pictures and pages.

/// Viridis (matplotlib's default, perceptually uniform, readable in grey and by
/// most colour-blind readers), sampled at nine points and interpolated.
const VIRIDIS: [[u8; 3]; 9] = [
    [68, 1, 84],
    [71, 44, 122],
    [59, 81, 139],
    [44, 113, 142],
    [33, 144, 141],
    [39, 173, 129],
    [92, 200, 99],
    [170, 220, 50],
    [253, 231, 37],
];

/// The viridis colour of `t` in `[0, 1]` (clamped; NaN maps to 0) as RGB.
pub fn viridis(t: f32) -> [u8; 3] {
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) };
    let x = t * (VIRIDIS.len() - 1) as f32;
    let i = (x.floor() as usize).min(VIRIDIS.len() - 2);
    let f = x - i as f32;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    std::array::from_fn(|c| (a[c] as f32 + (b[c] as f32 - a[c] as f32) * f).round() as u8)
}

/// The viridis control points as a JavaScript array literal, for the HTML page.
pub(crate) fn viridis_js() -> String {
    let pts: Vec<String> = VIRIDIS
        .iter()
        .map(|c| format!("[{},{},{}]", c[0], c[1], c[2]))
        .collect();
    format!("[{}]", pts.join(","))
}

/// Black or white, whichever reads better on `bg`.
pub(crate) fn contrast(bg: [u8; 3]) -> [u8; 3] {
    let l = 0.299 * bg[0] as f32 + 0.587 * bg[1] as f32 + 0.114 * bg[2] as f32;
    if l > 140.0 {
        [0, 0, 0]
    } else {
        [255, 255, 255]
    }
}
