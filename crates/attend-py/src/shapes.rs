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

/// How a call's tensors map onto the library's rank-4 problem.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The output's leading axes (all but `L, Ev`), broadcast from the inputs'.
    lead: Vec<usize>,
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
}

/// The role of an input, which says which of its axes are heads and rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    Query,
    Key,
    Value,
}

/// The leading axes of `shape` (all but the last two), padded on the left to `rank`.
fn leading(shape: &[usize], rank: usize) -> Vec<usize> {
    let own = &shape[..shape.len() - 2];
    let mut lead = vec![1; rank - own.len()];
    lead.extend_from_slice(own);
    lead
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
                "query, key and value must be [..., L, E] (rank 2 or more): {}",
                shapes()
            )));
        }
        let rank = query.len().max(key.len()).max(value.len()) - 2;
        let (lq, mut lk, mut lv) = (
            leading(query, rank),
            leading(key, rank),
            leading(value, rank),
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
                if shape.len() >= 3 && h != hq {
                    if h == 0 || hq % h != 0 {
                        return Err(Error::shape(format!(
                            "with enable_gqa=True the key and value heads must divide the query's {hq}: {}",
                            shapes()
                        )));
                    }
                    lead[rank - 1] = hq;
                    *native = Some(h);
                }
            }
        }
        let lead = (0..rank)
            .map(|i| {
                let sizes = [lq[i], lk[i], lv[i]];
                let n = sizes.iter().copied().find(|&n| n != 1).unwrap_or(1);
                if sizes.iter().all(|&m| m == 1 || m == n) {
                    Ok(n)
                } else {
                    Err(Error::shape(format!(
                        "query, key and value do not broadcast (axis {} of their leading axes: {sizes:?}): {}",
                        i as isize - rank as isize,
                        shapes()
                    )))
                }
            })
            .collect::<Result<Vec<usize>>>()?;
        let mut padded = vec![1; 2usize.saturating_sub(rank)];
        padded.extend_from_slice(&lead);
        let (batch, heads) = padded.split_at(padded.len() - 1);
        let heads = heads[0];
        // Each key/value head serves heads / held consecutive query heads: held is
        // the grouped count, or the head count itself, or 1 when repeated.
        let held = |native: Option<usize>, lead: &[usize]| {
            native.unwrap_or(if rank > 0 { lead[rank - 1] } else { 1 })
        };
        let (key_heads, value_heads) = (held(key_heads, &lk), held(value_heads, &lv));
        let empty = lead.contains(&0);
        let b: usize = batch.iter().product();
        let (b, hq, hkv) = if empty {
            (0, 1, 1)
        } else {
            (b, heads, lcm(key_heads, value_heads))
        };
        let [l, e] = [query[query.len() - 2], query[query.len() - 1]];
        let [s, ek] = [key[key.len() - 2], key[key.len() - 1]];
        let [sv, ev] = [value[value.len() - 2], value[value.len() - 1]];
        let dims = Dims::check([b, hq, l, e], [b, hkv, s, ek], [b, hkv, sv, ev])?;
        if let Some(m) = mask {
            let mut weights = lead.clone();
            weights.extend([l, s]);
            let fits = m.len() <= weights.len()
                && m.iter()
                    .rev()
                    .zip(weights.iter().rev())
                    .all(|(&a, &w)| a == 1 || a == w);
            if !fits {
                return Err(Error::shape(format!(
                    "attn_mask of shape {m:?} does not broadcast to the attention weights' shape {weights:?} ([..., L, S])"
                )));
            }
        }
        Ok(Layout {
            lead,
            batch: batch.to_vec(),
            dims,
            key_heads,
            value_heads,
            empty,
        })
    }

    /// The output's shape, `[..., L, Ev]`.
    pub fn out_shape(&self) -> Vec<usize> {
        let mut shape = self.lead.clone();
        shape.extend([self.dims.q_len, self.dims.value_dim]);
        shape
    }

    /// The log-sum-exp's shape, `[..., L]`.
    pub fn lse_shape(&self) -> Vec<usize> {
        let mut shape = self.lead.clone();
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
        if (0..batch.len() - 1).rev().all(|i| merged.merge_axes(Axis(i), inner)) {
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
        let mut g = g
            .into_shape_with_order(unfolded)
            .map_err(|e| Error::shape(format!("gradient batch axes: {e}")))?;
        while g.ndim() > shape.len() {
            g = g.sum_axis(Axis(0));
        }
        for (axis, &n) in shape.iter().enumerate() {
            if n == 1 && g.shape()[axis] != 1 {
                g = g.sum_axis(Axis(axis)).insert_axis(Axis(axis));
            }
        }
        Ok(g)
    }
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
