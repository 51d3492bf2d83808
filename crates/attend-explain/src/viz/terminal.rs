//! Coloured heatmaps for a terminal.

use std::fmt::Write as _;
use std::io::IsTerminal;

use ndarray::ArrayView2;

use super::colormap::{contrast, viridis};
use super::range_of;
use attend_core::{Error, Result};

/// How [`terminal_heatmap`] colours its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColorMode {
    /// 24-bit colour escapes (`COLORTERM=truecolor` or `24bit`).
    TrueColor,
    /// The xterm 256-colour palette.
    Ansi256,
    /// No escapes at all: a plain table of numbers.
    Plain,
}

impl ColorMode {
    /// The mode for standard output: [`Plain`](Self::Plain) when it is not a terminal
    /// or `NO_COLOR` is set (to anything non-empty), [`TrueColor`](Self::TrueColor)
    /// when `COLORTERM` says so, [`Ansi256`](Self::Ansi256) otherwise.
    pub fn detect() -> Self {
        Self::from_env(
            std::env::var("NO_COLOR").ok().as_deref(),
            std::env::var("COLORTERM").ok().as_deref(),
            std::io::stdout().is_terminal(),
        )
    }

    /// The decision of [`detect`](Self::detect) from explicit values of `NO_COLOR`,
    /// `COLORTERM` and whether the output is a terminal.
    pub fn from_env(no_color: Option<&str>, colorterm: Option<&str>, is_tty: bool) -> Self {
        if !is_tty || no_color.is_some_and(|v| !v.is_empty()) {
            return ColorMode::Plain;
        }
        match colorterm.map(str::to_ascii_lowercase).as_deref() {
            Some("truecolor") | Some("24bit") => ColorMode::TrueColor,
            _ => ColorMode::Ansi256,
        }
    }
}

/// Width of one cell: `" 0.123"`.
const CELL: usize = 6;
/// Widest row label.
const LABEL: usize = 12;

/// The weights `[rows, cols]` as a table with the row labels on the left and the
/// column labels on top, each cell showing its value on a viridis background scaled
/// from `min(0, lowest)` to the highest weight (plain numbers in
/// [`ColorMode::Plain`]). Labels longer than the column are cut with `…`.
pub fn terminal_heatmap(
    weights: ArrayView2<'_, f32>,
    rows: &[String],
    cols: &[String],
    style: ColorMode,
) -> Result<String> {
    let (r, c) = weights.dim();
    if rows.len() != r || cols.len() != c {
        return Err(Error::shape(format!(
            "heatmap weights {:?} need {r} row labels and {c} column labels, got {} and {}",
            weights.shape(),
            rows.len(),
            cols.len()
        )));
    }
    let (lo, hi) = range_of(weights.iter().copied().filter(|v| v.is_finite()));
    let lw = rows
        .iter()
        .map(|s| s.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(1, LABEL);
    let mut out = String::new();
    let _ = write!(out, "{:lw$}", "");
    for col in cols {
        let _ = write!(out, " {:>w$}", fit(col, CELL - 1), w = CELL - 1);
    }
    out.push('\n');
    for (i, row) in weights.outer_iter().enumerate() {
        let _ = write!(out, "{:<lw$}", fit(&rows[i], lw));
        for &v in row.iter() {
            let text = format_cell(v);
            match style {
                ColorMode::Plain => out.push_str(&text),
                _ => {
                    let bg = viridis((v - lo) / (hi - lo));
                    let fg = contrast(bg);
                    out.push_str(&escape(style, bg, fg));
                    out.push_str(&text);
                    out.push_str("\x1b[0m");
                }
            }
        }
        out.push('\n');
    }
    Ok(out)
}

/// `" 0.123"`, always [`CELL`] characters wide.
fn format_cell(v: f32) -> String {
    let s = if !v.is_finite() {
        format!("{v}")
    } else if v.abs() < 10.0 {
        format!("{v:.3}")
    } else if v.abs() < 1e4 {
        format!("{v:.0}")
    } else {
        format!("{v:.0e}")
    };
    format!("{:>CELL$}", fit(&s, CELL - 1))
}

/// `s` cut to at most `n` characters, ending in `…` when cut.
fn fit(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn escape(style: ColorMode, bg: [u8; 3], fg: [u8; 3]) -> String {
    match style {
        ColorMode::TrueColor => format!(
            "\x1b[48;2;{};{};{}m\x1b[38;2;{};{};{}m",
            bg[0], bg[1], bg[2], fg[0], fg[1], fg[2]
        ),
        ColorMode::Ansi256 => format!("\x1b[48;5;{}m\x1b[38;5;{}m", ansi256(bg), ansi256(fg)),
        ColorMode::Plain => String::new(),
    }
}

/// The nearest colour of the xterm 6×6×6 cube.
fn ansi256(c: [u8; 3]) -> u8 {
    let q = |v: u8| ((v as u16 * 5 + 127) / 255) as u8;
    16 + 36 * q(c[0]) + 6 * q(c[1]) + q(c[2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    fn labels(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plain_has_no_escapes_and_all_values() {
        let w = array![[0.25f32, 0.75], [1.0, 0.0]];
        let s = terminal_heatmap(
            w.view(),
            &labels(&["a", "bb"]),
            &labels(&["x", "y"]),
            ColorMode::Plain,
        )
        .unwrap();
        assert!(!s.contains('\x1b'));
        assert_eq!(s.lines().count(), 3);
        assert!(s.contains("0.250") && s.contains("0.750") && s.contains("1.000"));
        assert!(s.lines().nth(2).unwrap().starts_with("bb"));
    }

    #[test]
    fn colour_modes_use_their_escapes() {
        let w = array![[0.0f32, 1.0]];
        let l = labels(&["q"]);
        let c = labels(&["a", "b"]);
        let t = terminal_heatmap(w.view(), &l, &c, ColorMode::TrueColor).unwrap();
        assert!(t.contains("\x1b[48;2;68;1;84m") && t.contains("\x1b[48;2;253;231;37m"));
        let a = terminal_heatmap(w.view(), &l, &c, ColorMode::Ansi256).unwrap();
        assert!(a.contains("\x1b[48;5;") && !a.contains("48;2;"));
    }

    #[test]
    fn label_count_mismatch_is_an_error() {
        let w = array![[0.5f32, 0.5]];
        let e = terminal_heatmap(w.view(), &labels(&["q"]), &labels(&["a"]), ColorMode::Plain)
            .unwrap_err();
        assert!(e.to_string().contains("[1, 2]"), "{e}");
    }

    #[test]
    fn mode_from_env() {
        assert_eq!(
            ColorMode::from_env(None, Some("truecolor"), false),
            ColorMode::Plain
        );
        assert_eq!(
            ColorMode::from_env(Some("1"), Some("truecolor"), true),
            ColorMode::Plain
        );
        assert_eq!(
            ColorMode::from_env(Some(""), Some("24bit"), true),
            ColorMode::TrueColor
        );
        assert_eq!(ColorMode::from_env(None, None, true), ColorMode::Ansi256);
    }

    #[test]
    fn long_labels_are_cut() {
        assert_eq!(fit("dessertification", 5), "dess…");
        assert_eq!(fit("eat", 5), "eat");
    }
}
