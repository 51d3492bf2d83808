//! docs/design.md's NaN rule restated as a predictor, for the NaN tests: which
//! entries of the output, the log-sum-exp and the gradients a NaN in the inputs
//! reaches, computed from the inputs themselves and [`Problem::sees`], so that the
//! f64 reference and every kernel are held to the same stated rule. Also the cases
//! (sizes, masks, where the NaNs go) the tests run.
#![allow(dead_code)]

use attend::attention::{AttentionOptions, Causal, Problem};
use ndarray::{Array, Array2, Array3, Array4, ArrayView4, Dimension};

/// What the rule says an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Nan,
    Finite,
    /// Exactly 0: an output row or a gradient nothing reaches (a fully masked row,
    /// a key no query sees).
    Zero,
    /// −∞: the log-sum-exp of a fully masked row.
    NegInf,
}

impl Want {
    fn holds(self, x: f32) -> bool {
        match self {
            Want::Nan => x.is_nan(),
            Want::Finite => x.is_finite(),
            Want::Zero => x == 0.0,
            Want::NegInf => x == f32::NEG_INFINITY,
        }
    }
}

/// Asserts that every entry of `got` is what `want` says, naming the first that is not.
pub fn assert_pattern<D: Dimension>(got: &Array<f32, D>, want: &Array<Want, D>, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    for ((at, &w), &x) in want.indexed_iter().zip(got.iter()) {
        assert!(w.holds(x), "{what}: at {at:?} want {w:?}, got {x}");
    }
}

/// Whether any of the `n` entries `f(e)` is NaN.
fn any_nan(n: usize, f: impl Fn(usize) -> f32) -> bool {
    (0..n).any(|e| f(e).is_nan())
}

/// Per `(b, h)`: which keys each query sees, which rows are live (see a key) and
/// which have a NaN score (a NaN in `q`, in a key they see, or in the additive term
/// of a key they see).
struct Head {
    sees: Array2<bool>,
    live: Vec<bool>,
    nan_score: Vec<bool>,
}

fn head(p: &Problem<'_>, b: usize, h: usize) -> Head {
    let d = p.dims();
    let kvh = h / (d.heads / d.kv_heads);
    let sees = Array2::from_shape_fn((d.q_len, d.kv_len), |(i, j)| p.sees(b, h, i, j));
    let live = (0..d.q_len)
        .map(|i| sees.row(i).iter().any(|&s| s))
        .collect();
    let nan_score = (0..d.q_len)
        .map(|i| {
            let q_nan = any_nan(d.head_dim, |e| p.q[[b, h, i, e]]);
            (0..d.kv_len).any(|j| {
                sees[[i, j]]
                    && (q_nan
                        || any_nan(d.head_dim, |e| p.k[[b, kvh, j, e]])
                        || p.bias_at(b, h, i, j).is_nan())
            })
        })
        .collect();
    Head {
        sees,
        live,
        nan_score,
    }
}

/// The forward's output `[B, H, L, Ev]` and log-sum-exp `[B, H, L]` under the rule:
/// a row with a NaN score is NaN throughout (and so is its log-sum-exp); a NaN in
/// `v[j, c]` makes column `c` NaN in the rows that see key `j`; a fully masked row is
/// 0 with a log-sum-exp of −∞; everything else is finite.
pub fn forward(p: &Problem<'_>) -> (Array4<Want>, Array3<Want>) {
    let d = p.dims();
    let group = d.heads / d.kv_heads;
    let mut out = Array4::from_elem((d.batch, d.heads, d.q_len, d.value_dim), Want::Finite);
    let mut lse = Array3::from_elem((d.batch, d.heads, d.q_len), Want::Finite);
    for b in 0..d.batch {
        for h in 0..d.heads {
            let hd = head(p, b, h);
            for i in 0..d.q_len {
                if !hd.live[i] {
                    lse[[b, h, i]] = Want::NegInf;
                    out.slice_mut(ndarray::s![b, h, i, ..]).fill(Want::Zero);
                    continue;
                }
                if hd.nan_score[i] {
                    lse[[b, h, i]] = Want::Nan;
                }
                for c in 0..d.value_dim {
                    let v_nan = (0..d.kv_len)
                        .any(|j| hd.sees[[i, j]] && p.v[[b, h / group, j, c]].is_nan());
                    if hd.nan_score[i] || v_nan {
                        out[[b, h, i, c]] = Want::Nan;
                    }
                }
            }
        }
    }
    (out, lse)
}

/// The gradients `dq`, `dk`, `dv` under the rule, for `dout`: with `D_i = dO_i · O_i`,
/// a live row whose score or `D_i` is NaN has a NaN `dS` at every key it sees, so its
/// `dq` row is NaN, and so are the `dk` rows of the keys it sees; `dv[j, c]` is NaN
/// where a row that sees key `j` has a NaN score or a NaN `dO[i, c]`. A row that sees
/// no key has `dq` 0, a key no row sees `dk` and `dv` 0.
pub fn backward(p: &Problem<'_>, dout: ArrayView4<'_, f32>) -> [Array4<Want>; 3] {
    let d = p.dims();
    let group = d.heads / d.kv_heads;
    let (out, _) = forward(p);
    let mut dq = Array4::from_elem(p.q.raw_dim(), Want::Zero);
    let mut dk = Array4::from_elem(p.k.raw_dim(), Want::Zero);
    let mut dv = Array4::from_elem(p.v.raw_dim(), Want::Zero);
    // A gradient entry is NaN once any contribution is; finite once one is and none
    // is NaN.
    let raise = |w: &mut Want, nan: bool| {
        *w = match (*w, nan) {
            (_, true) | (Want::Nan, _) => Want::Nan,
            _ => Want::Finite,
        }
    };
    for b in 0..d.batch {
        for h in 0..d.heads {
            let kvh = h / group;
            let hd = head(p, b, h);
            for i in 0..d.q_len {
                if !hd.live[i] {
                    continue;
                }
                let d_nan = (0..d.value_dim)
                    .any(|c| out[[b, h, i, c]] == Want::Nan || dout[[b, h, i, c]].is_nan());
                let ds_nan = hd.nan_score[i] || d_nan;
                for j in (0..d.kv_len).filter(|&j| hd.sees[[i, j]]) {
                    for e in 0..d.head_dim {
                        raise(&mut dq[[b, h, i, e]], ds_nan);
                        raise(&mut dk[[b, kvh, j, e]], ds_nan);
                    }
                    for c in 0..d.value_dim {
                        let nan = hd.nan_score[i] || dout[[b, h, i, c]].is_nan();
                        raise(&mut dv[[b, kvh, j, c]], nan);
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

/// The masks a case runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Masks {
    None,
    CausalTopLeft,
    CausalBottomRight,
    /// A boolean mask with scattered holes, and (from L = 4) a last row that sees
    /// nothing.
    Boolean,
    /// An additive mask with scattered −∞ terms, under top-left causality.
    AdditiveCausal,
}

impl Masks {
    pub const ALL: [Masks; 5] = [
        Masks::None,
        Masks::CausalTopLeft,
        Masks::CausalBottomRight,
        Masks::Boolean,
        Masks::AdditiveCausal,
    ];
}

/// The mask arrays of a case, `[L, S]`, broadcast over batch and heads.
pub struct MaskArrays {
    pub keep: Option<Array2<bool>>,
    pub bias: Option<Array2<f32>>,
    causal: Option<Causal>,
}

impl MaskArrays {
    pub fn new(masks: Masks, l: usize, s: usize) -> Self {
        let keep = (masks == Masks::Boolean).then(|| {
            Array2::from_shape_fn((l, s), |(i, j)| {
                (i * 7 + j * 3) % 5 != 0 && !(l >= 4 && i == l - 1)
            })
        });
        let bias = (masks == Masks::AdditiveCausal).then(|| {
            Array2::from_shape_fn((l, s), |(i, j)| {
                if (i + 2 * j) % 4 == 1 {
                    f32::NEG_INFINITY
                } else {
                    ((i * 3 + j * 5) % 7) as f32 * 0.25 - 0.75
                }
            })
        });
        let causal = match masks {
            Masks::CausalTopLeft | Masks::AdditiveCausal => Some(Causal::TopLeft),
            Masks::CausalBottomRight => Some(Causal::BottomRight),
            _ => None,
        };
        MaskArrays { keep, bias, causal }
    }

    pub fn options(&self) -> AttentionOptions<'_> {
        AttentionOptions {
            causal: self.causal,
            mask: self.keep.as_ref().map(|m| m.view().into_dyn()),
            bias: self.bias.as_ref().map(|m| m.view().into_dyn()),
            ..Default::default()
        }
    }
}

/// Where a case puts its NaNs, all in head 0 (head 1 must stay clean).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poison {
    /// One element of query row `L/2`.
    Query,
    /// One element of key `min(L, S)/2`, which causality hides from the rows before
    /// it (in the same tile as they are).
    Key,
    /// `v[min(L, S)/2, 2]` and `v[S − 1, 5]`: the first seen by some rows and hidden
    /// from others of its tile, the second hidden from every row under top-left
    /// causality when `S > L`.
    Values,
    /// The additive term of `(L/2, 0)`, seen, and of `(0, S − 1)`, hidden by
    /// causality when `S > 1` (only with an additive mask).
    Bias,
    /// One element of `dout` row `L/2` (backward only).
    Dout,
}

/// The query lengths the rule is tested at: under, at and over one and two vectors
/// of 16 lanes, and over the fused kernels' 64-query blocks and 128-key tiles.
pub const LENGTHS: [usize; 6] = [1, 4, 16, 17, 40, 129];

/// Key lengths for `l` queries: `l` itself, and `s_long`, which makes the fused
/// kernels' last tile (and the decode kernel's last chunk) partial.
pub fn key_lengths(l: usize, s_long: usize) -> Vec<usize> {
    if l == s_long {
        vec![l]
    } else {
        vec![l, s_long]
    }
}

/// Puts `poison`'s NaNs into `q`, `k`, `v`, the additive mask and `dout` (each as
/// far as they are given and the poison concerns them).
pub fn poison(
    which: Poison,
    (q, k, v): (&mut Array4<f32>, &mut Array4<f32>, &mut Array4<f32>),
    bias: Option<&mut Array2<f32>>,
    dout: Option<&mut Array4<f32>>,
) {
    let (l, s) = (q.dim().2, k.dim().2);
    let (i, j) = (l / 2, l.min(s) / 2);
    match which {
        Poison::Query => q[[0, 0, i, 3]] = f32::NAN,
        Poison::Key => k[[0, 0, j, 5]] = f32::NAN,
        Poison::Values => {
            v[[0, 0, j, 2]] = f32::NAN;
            v[[0, 0, s - 1, 5]] = f32::NAN;
        }
        Poison::Bias => {
            if let Some(bias) = bias {
                bias[[i, 0]] = f32::NAN;
                bias[[0, s - 1]] = f32::NAN;
            }
        }
        Poison::Dout => {
            if let Some(dout) = dout {
                dout[[0, 0, i, 1]] = f32::NAN;
            }
        }
    }
}
