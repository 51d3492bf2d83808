//! PyTorch's shape rules for `scaled_dot_product_attention`, mapped onto the
//! library's rank-4 problems.
//!
//! PyTorch takes `query [..., L, E]`, `key [..., S, E]` and `value [..., S, Ev]` of
//! any rank ≥ 2 and broadcasts their leading axes as a matrix product does: a lower
//! rank gains leading axes of 1, an axis of 1 repeats. With `enable_gqa` the key and
//! value heads (axis −3) may divide the query's instead, each key/value head serving
//! consecutive query heads. The library takes `[B, Hq, L, E]`, `[B, Hkv, S, E]` and
//! `[B, Hkv, S, Ev]` with `Hkv` dividing `Hq`. A [`Layout`] says how one becomes the
//! other: the leading axes before the heads fold into `B`, repeated axes become
//! stride-0 views and grouped heads stay grouped, so nothing is copied unless the
//! strides cannot say it (leading axes that do not merge, or key and value heads that
//! are neither 1 nor the kernel's). The rank-4 shapes themselves are checked by the
//! library ([`attend::attention::Dims::check`]), so the fake tensors of PyTorch's
//! compiler and the kernels refuse the same calls with the same messages.

use attend::attention::Dims;
use attend::{Error, Result};
use ndarray::{Array, ArrayD, ArrayView4, ArrayViewD, Axis, CowArray, Ix4, IxDyn};
use num_traits::Zero;

/// Where a size of a call comes from, for PyTorch's compiler, which may keep sizes
/// symbolic: an axis of one of the arguments (0 query, 1 key, 2 value, 3 mask), or
/// the constant 1 of an axis that the shape rules add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `(argument, axis)`: that axis of that argument's shape.
    Axis(usize, usize),
    /// An axis of 1 that the shape rules add.
    One,
}

/// A size and where it comes from.
#[derive(Clone, Copy, Debug)]
struct Dim {
    n: usize,
    from: Source,
}

/// How a call's tensors map onto the library's rank-4 problem.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The output's leading axes (all but `L, Ev`), broadcast from the inputs'.
    lead: Vec<Dim>,
    /// `lead` without its head axis (the one before `L`): the axes that fold into `B`.
    /// Never empty: inputs of rank 2 or 3 get a batch axis of 1.
    batch: Vec<usize>,
    /// The rank-4 problem. An empty output folds into `B = 0` with one head, so that
    /// no kernel sees zero heads.
    pub dims: Dims,
    /// The key's and the value's heads as they hold them: 1 when repeated over the
    /// query heads, else a divisor of [`Dims::kv_heads`].
    key_heads: usize,
    value_heads: usize,
    /// Whether the output has no elements.
    empty: bool,
    /// Where the output's last two sizes come from: the query's `L`, the value's `Ev`.
    rows: Source,
    width: Source,
    /// Pairs of sizes the call needs equal: what a compiler that keeps sizes
    /// symbolic must assume of them.
    pub equal: Vec<(Source, Source)>,
    /// Pairs `(multiple, divisor)` of sizes (grouped heads), likewise.
    pub divides: Vec<(Source, Source)>,
}

/// The role of an input, which says which of its axes are heads and rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// `[..., L, E]`.
    Query,
    /// `[..., S, E]`, its heads grouped or repeated over the query's.
    Key,
    /// `[..., S, Ev]`, likewise.
    Value,
}

/// The leading axes of argument `arg`'s `shape` (all but the last two), padded on
/// the left to `rank` with axes of 1.
fn leading(shape: &[usize], arg: usize, rank: usize) -> Vec<Dim> {
    let own = shape.len() - 2;
    let mut lead = vec![
        Dim {
            n: 1,
            from: Source::One
        };
        rank - own
    ];
    lead.extend((0..own).map(|a| Dim {
        n: shape[a],
        from: Source::Axis(arg, a),
    }));
    lead
}

/// Axis `back` from the end of argument `arg`'s `shape` (1 is the last).
fn axis(shape: &[usize], arg: usize, back: usize) -> Dim {
    let a = shape.len() - back;
    Dim {
        n: shape[a],
        from: Source::Axis(arg, a),
    }
}

impl Layout {
    /// Checks `query`, `key` and `value` shapes (and the mask's, broadcastable to the
    /// weights `[..., L, S]`) as PyTorch does and as the library does.
    pub fn new(
        query: &[usize],
        key: &[usize],
        value: &[usize],
        mask: Option<&[usize]>,
        enable_gqa: bool,
    ) -> Result<Layout> {
        let shapes = || format!("query {query:?}, key {key:?}, value {value:?}");
        if query.len() < 2 || key.len() < 2 || value.len() < 2 {
            return Err(Error::shape(format!(
                "Expected query, key, and value to all be at least 2 dimensional ([..., L, E]), but got {}",
                shapes()
            )));
        }
        let (mut equal, mut divides) = (Vec::new(), Vec::new());
        let rank = query.len().max(key.len()).max(value.len()) - 2;
        let (lq, mut lk, mut lv) = (
            leading(query, 0, rank),
            leading(key, 1, rank),
            leading(value, 2, rank),
        );
        // Grouped-query heads: a key or value head count that divides the query's
        // serves Hq / Hk consecutive query heads, as if repeated to Hq.
        let (mut key_heads, mut value_heads) = (None, None);
        if enable_gqa && query.len() >= 3 {
            let hq = lq[rank - 1];
            for (shape, lead, native) in [
                (key, &mut lk, &mut key_heads),
                (value, &mut lv, &mut value_heads),
            ] {
                let h = lead[rank - 1];
                if shape.len() >= 3 && h.n != hq.n {
                    if h.n == 0 || hq.n % h.n != 0 {
                        return Err(Error::shape(format!(
                            "Number of heads in key and value must divide the number of heads in query ({}, enable_gqa=True): {}",
                            hq.n,
                            shapes()
                        )));
                    }
                    divides.push((hq.from, h.from));
                    lead[rank - 1] = hq;
                    *native = Some(h.n);
                }
            }
        }
        let mut lead = Vec::with_capacity(rank);
        for i in 0..rank {
            let dims = [lq[i], lk[i], lv[i]];
            let chosen = dims.iter().copied().find(|d| d.n != 1).unwrap_or(dims[0]);
            for d in dims.iter().filter(|d| d.n != 1 && d.from != chosen.from) {
                if d.n != chosen.n {
                    return Err(Error::shape(format!(
                        "query, key and value do not broadcast (axis {} of their leading axes: {:?}): {}",
                        i as isize - rank as isize,
                        dims.map(|d| d.n),
                        shapes()
                    )));
                }
                equal.push((d.from, chosen.from));
            }
            lead.push(chosen);
        }
        let sizes: Vec<usize> = lead.iter().map(|d| d.n).collect();
        let mut padded = vec![1; 2usize.saturating_sub(rank)];
        padded.extend_from_slice(&sizes);
        let (batch, heads) = padded.split_at(padded.len() - 1);
        let heads = heads[0];
        // Each key/value head serves heads / held consecutive query heads: held is
        // the grouped count, or the head count itself, or 1 when repeated.
        let held = |native: Option<usize>, lead: &[Dim]| {
            native.unwrap_or(if rank > 0 { lead[rank - 1].n } else { 1 })
        };
        let (key_heads, value_heads) = (held(key_heads, &lk), held(value_heads, &lv));
        let empty = sizes.contains(&0);
        let b: usize = batch.iter().product();
        let (b, hq, hkv) = if empty {
            (0, 1, 1)
        } else {
            (b, heads, lcm(key_heads, value_heads))
        };
        let (l, e) = (axis(query, 0, 2), axis(query, 0, 1));
        let (s, ek) = (axis(key, 1, 2), axis(key, 1, 1));
        let (sv, ev) = (axis(value, 2, 2), axis(value, 2, 1));
        let dims = Dims::check([b, hq, l.n, e.n], [b, hkv, s.n, ek.n], [b, hkv, sv.n, ev.n])?;
        equal.extend([(ek.from, e.from), (sv.from, s.from)]);
        if let Some(m) = mask {
            let mut weights = lead.clone();
            weights.extend([l, s]);
            let fits = m.len() <= weights.len()
                && m.iter()
                    .rev()
                    .zip(weights.iter().rev())
                    .all(|(&a, w)| a == 1 || a == w.n);
            if !fits {
                return Err(Error::shape(format!(
                    "attn_mask of shape {m:?} does not broadcast to the attention weights' shape {:?} ([..., L, S])",
                    weights.iter().map(|w| w.n).collect::<Vec<_>>()
                )));
            }
            let aligned = weights[weights.len() - m.len()..].iter();
            for (j, (&a, w)) in m.iter().zip(aligned).enumerate() {
                if a != 1 {
                    equal.push((Source::Axis(3, j), w.from));
                }
            }
        }
        Ok(Layout {
            lead,
            batch: batch.to_vec(),
            dims,
            key_heads,
            value_heads,
            empty,
            rows: l.from,
            width: ev.from,
            equal,
            divides,
        })
    }

    /// Where each of the output's sizes comes from, as [`Layout::out_shape`] lists
    /// them.
    pub fn out_sources(&self) -> Vec<Source> {
        let mut sources: Vec<Source> = self.lead.iter().map(|d| d.from).collect();
        sources.extend([self.rows, self.width]);
        sources
    }

    /// Where each of the log-sum-exp's sizes comes from.
    pub fn lse_sources(&self) -> Vec<Source> {
        let mut sources: Vec<Source> = self.lead.iter().map(|d| d.from).collect();
        sources.push(self.rows);
        sources
    }

    /// The output's shape, `[..., L, Ev]`.
    pub fn out_shape(&self) -> Vec<usize> {
        let mut shape: Vec<usize> = self.lead.iter().map(|d| d.n).collect();
        shape.extend([self.dims.q_len, self.dims.value_dim]);
        shape
    }

    /// The log-sum-exp's shape, `[..., L]`.
    pub fn lse_shape(&self) -> Vec<usize> {
        let mut shape: Vec<usize> = self.lead.iter().map(|d| d.n).collect();
        shape.push(self.dims.q_len);
        shape
    }

    /// Whether the output has no elements (nothing to compute, every gradient 0).
    pub fn is_empty(&self) -> bool {
        self.empty
    }

    /// `x`, an input of `role`, as the kernels read it: `[B, Hq, L, E]` for the
    /// query, `[B, Hkv, S, E]` or `[B, Hkv, S, Ev]` for the key and value.
    pub fn input<'a, T: Clone>(
        &self,
        x: &'a ArrayViewD<'_, T>,
        role: Input,
    ) -> Result<CowArray<'a, T, Ix4>> {
        let d = &self.dims;
        let rows = &x.shape()[x.ndim() - 2..];
        let own = match role {
            Input::Query => return self.fold(x, &[d.heads, rows[0], rows[1]])?.into_4(),
            Input::Key => self.key_heads,
            Input::Value => self.value_heads,
        };
        if self.empty || own == d.kv_heads || own == 1 {
            // Held heads (or one head, repeated with stride 0) are read in place.
            return self.fold(x, &[d.kv_heads, rows[0], rows[1]])?.into_4();
        }
        // Key and value hold different divisors of Hq (neither 1): each is copied
        // to the kernel's Hkv, the least common multiple, head by head.
        let held = self.fold(x, &[own, rows[0], rows[1]])?.into_4()?;
        let repeat = d.kv_heads / own;
        let (b, _, s, w) = held.dim();
        Ok(CowArray::from(Array::from_shape_fn(
            (b, d.kv_heads, s, w),
            |(i, h, j, c)| held[[i, h / repeat, j, c]].clone(),
        )))
    }

    /// The mask `m` as a rank-4 array broadcastable to `[B, Hq, L, S]` (the
    /// library broadcasts its heads and rows; only its leading axes fold here).
    pub fn mask<'a, T: Clone>(&self, m: &'a ArrayViewD<'_, T>) -> Result<CowArray<'a, T, Ix4>> {
        let rank = self.batch.len() + 3;
        let mut rest = vec![1; rank.saturating_sub(m.ndim())];
        rest.extend_from_slice(m.shape());
        let rest = rest[rest.len() - 3..].to_vec();
        self.fold(m, &rest)?.into_4()
    }

    /// An output-shaped array (`[..., L, Ev]`, the forward's output or its gradient)
    /// as `[B, Hq, L, Ev]`.
    pub fn output<'a, T: Clone>(&self, x: &'a ArrayViewD<'_, T>) -> Result<CowArray<'a, T, Ix4>> {
        let d = &self.dims;
        self.fold(x, &[d.heads, d.q_len, d.value_dim])?.into_4()
    }

    /// The forward's log-sum-exp (`[..., L]`) as `[B, Hq, L]`.
    pub fn lse<'a, T: Clone>(
        &self,
        x: &'a ArrayViewD<'_, T>,
    ) -> Result<CowArray<'a, T, ndarray::Ix3>> {
        let d = &self.dims;
        let folded = self.fold(x, &[d.heads, d.q_len])?;
        folded
            .into_dimensionality()
            .map_err(|e| Error::shape(format!("lse: {e}")))
    }

    /// `x` broadcast to `batch ++ rest` with the batch axes merged into one,
    /// `[B] ++ rest`: a view of `x`'s memory when its strides allow, else a copy.
    fn fold<'a, T: Clone>(
        &self,
        x: &'a ArrayViewD<'_, T>,
        rest: &[usize],
    ) -> Result<CowArray<'a, T, IxDyn>> {
        let batch: &[usize] = if self.empty { &[0] } else { &self.batch };
        let b: usize = batch.iter().product();
        let mut folded = vec![b];
        folded.extend_from_slice(rest);
        if self.empty {
            return Array::from_shape_vec(folded, Vec::new())
                .map(CowArray::from)
                .map_err(|e| Error::shape(format!("empty attention: {e}")));
        }
        let target: Vec<usize> = batch.iter().chain(rest).copied().collect();
        let view = x.broadcast(target.as_slice()).ok_or_else(|| {
            Error::shape(format!(
                "shape {:?} does not broadcast to {target:?}",
                x.shape()
            ))
        })?;
        let inner = Axis(batch.len() - 1);
        let mut merged = view.clone();
        if (0..batch.len() - 1)
            .rev()
            .all(|i| merged.merge_axes(Axis(i), inner))
        {
            for _ in 1..batch.len() {
                merged.index_axis_inplace(Axis(0), 0);
            }
            return Ok(CowArray::from(merged));
        }
        view.to_owned()
            .into_shape_with_order(folded)
            .map(CowArray::from)
            .map_err(|e| Error::shape(format!("folding the batch axes: {e}")))
    }

    /// The gradient of an input of `role` and `shape` from the kernels' rank-4
    /// gradient `g`: summed over the heads, leading axes and rows that the input
    /// was repeated along, so that it has the input's own shape. Not for an empty
    /// output, whose gradients are zeros.
    pub fn reduce<F>(&self, g: ArrayView4<'_, F>, role: Input, shape: &[usize]) -> Result<ArrayD<F>>
    where
        F: Clone + Zero + std::ops::Add<Output = F>,
    {
        let (_, h, rows, width) = g.dim();
        let own = match role {
            Input::Query => h,
            Input::Key => self.key_heads,
            Input::Value => self.value_heads,
        };
        // The kernel's heads back to the ones the input holds: consecutive groups
        // of h / own heads read the same input head.
        let g = g
            .to_shape((self.dims.batch, own, h / own, rows, width))
            .map_err(|e| Error::shape(format!("gradient heads: {e}")))?
            .sum_axis(Axis(2));
        let mut unfolded = self.batch.clone();
        unfolded.extend([own, rows, width]);
        let g = g
            .into_shape_with_order(unfolded)
            .map_err(|e| Error::shape(format!("gradient batch axes: {e}")))?;
        Ok(sum_to(g, shape))
    }

    /// The additive mask's gradient in the caller's mask `shape` from the
    /// library's, shaped like the rank-4 mask [`Layout::mask`] made (its batch
    /// axes folded into one): unfolded, then summed as [`Layout::reduce`] sums.
    pub fn reduce_mask<F>(&self, g: ArrayD<F>, shape: &[usize]) -> Result<ArrayD<F>>
    where
        F: Clone + Zero + std::ops::Add<Output = F>,
    {
        let mut unfolded = self.batch.clone();
        unfolded.extend_from_slice(&g.shape()[1..]);
        let g = g
            .into_shape_with_order(unfolded)
            .map_err(|e| Error::shape(format!("mask gradient batch axes: {e}")))?;
        Ok(sum_to(g, shape))
    }
}

/// `g` summed over the leading axes `shape` lacks and the axes where `shape` has 1
/// (those it was broadcast along), so that it has `shape`.
fn sum_to<F: Clone + Zero + std::ops::Add<Output = F>>(
    mut g: ArrayD<F>,
    shape: &[usize],
) -> ArrayD<F> {
    while g.ndim() > shape.len() {
        g = g.sum_axis(Axis(0));
    }
    for (axis, &n) in shape.iter().enumerate() {
        if n == 1 && g.shape()[axis] != 1 {
            g = g.sum_axis(Axis(axis)).insert_axis(Axis(axis));
        }
    }
    g
}

/// A folded array's rank-4 form.
trait Into4<'a, T> {
    fn into_4(self) -> Result<CowArray<'a, T, Ix4>>;
}

impl<'a, T> Into4<'a, T> for CowArray<'a, T, IxDyn> {
    fn into_4(self) -> Result<CowArray<'a, T, Ix4>> {
        self.into_dimensionality()
            .map_err(|e| Error::shape(format!("rank-4 form: {e}")))
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The least common multiple of two head counts, both ≥ 1.
fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}
