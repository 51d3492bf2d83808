//! `nn.Linear`: `y = x Wᵀ + b`.

use ndarray::{Array, Array1, Array2, ArrayView, ArrayView2, Axis, Dimension, Ix2};

use super::matmul::{Epilogue, PackedBf16, PackedInt8, PackedWeight, Weight};
use super::{Activation, LayerNorm};
use crate::attention::Precision;
use crate::{Error, Result};

/// A dense layer with PyTorch's `[out, in]` weight orientation.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`. Empty (`[0, 0]`) in a layer made by
    /// [`for_inference_with`](Self::for_inference_with) that keeps its weight only
    /// packed for its product (in bf16 or int8, or in f32 where `nn::matmul`'s
    /// kernel runs; [`weight_f32`](Self::weight_f32) gives it back); a weight
    /// assigned to such a layer afterwards is used, rounded to the layer's
    /// precision.
    pub weight: Array2<f32>,
    /// `[out]`, if the layer has a bias.
    pub bias: Option<Array1<f32>>,
    /// The weight packed for this CPU's f32 product, made by
    /// [`for_inference`](Self::for_inference): the layer's weight while `weight`
    /// is empty, else used while it still matches `weight`.
    packed: Option<std::sync::Arc<PackedWeight>>,
    /// The weight rounded to bf16 or quantized to int8 and packed for that
    /// product, made by [`for_inference_with`](Self::for_inference_with): its
    /// presence makes the layer compute in that precision, and while `weight` is
    /// empty it is the layer's weight.
    reduced: Option<Reduced>,
}

/// Layers are equal when their weights and biases are (however they are stored).
impl PartialEq for Linear {
    fn eq(&self, other: &Self) -> bool {
        self.bias == other.bias && *self.weight_f32() == *other.weight_f32()
    }
}

impl Linear {
    /// A layer from its weight `[out, in]` and optional bias `[out]`.
    pub fn new(weight: Array2<f32>, bias: Option<Array1<f32>>) -> Result<Self> {
        if let Some(b) = &bias {
            if b.len() != weight.nrows() {
                return Err(Error::shape(format!(
                    "bias of length {} does not match weight {:?} (needs {})",
                    b.len(),
                    weight.shape(),
                    weight.nrows()
                )));
            }
        }
        Ok(Linear {
            weight,
            bias,
            packed: None,
            reduced: None,
        })
    }

    /// One layer computing `layers` side by side: their weights stacked along the
    /// outputs (`[Σ out, in]`), and their biases likewise. Its output is theirs
    /// concatenated, to the same bits (each output's sum does not depend on its
    /// neighbours), in one product: an encoder's query, key and value projections
    /// read the input once and split the work between threads once. The result
    /// holds f32 weights; make it [`for_inference_with`](Self::for_inference_with)
    /// the layers' precision.
    pub fn stacked(layers: &[&Linear]) -> Result<Self> {
        let Some(first) = layers.first() else {
            return Err(Error::value("Linear::stacked needs at least one layer"));
        };
        let inputs = first.in_features();
        if let Some(l) = layers.iter().find(|l| l.in_features() != inputs) {
            return Err(Error::shape(format!(
                "Linear::stacked: a layer takes {} inputs, the first {inputs}",
                l.in_features()
            )));
        }
        if layers
            .iter()
            .any(|l| l.bias.is_some() != first.bias.is_some())
        {
            return Err(Error::value(
                "Linear::stacked: either every layer has a bias or none has",
            ));
        }
        let weights: Vec<_> = layers.iter().map(|l| l.weight_f32()).collect();
        let views: Vec<_> = weights.iter().map(|w| w.view()).collect();
        let weight = ndarray::concatenate(Axis(0), &views).expect("same input width");
        let bias = first.bias.as_ref().map(|_| {
            let views: Vec<_> = layers
                .iter()
                .map(|l| l.bias.as_ref().expect("checked").view())
                .collect();
            ndarray::concatenate(Axis(0), &views).expect("vectors concatenate")
        });
        Linear::new(weight, bias)
    }

    /// The same layer with its weight stored column-major (still the `[out, in]`
    /// matrix, transposed in memory). The matrix product then reads the weight
    /// without repacking it on every call, which is much faster for few rows (one
    /// short sentence) and somewhat faster for many. Results are unchanged.
    pub fn column_major(mut self) -> Self {
        if self.weight.t().is_standard_layout() {
            return self;
        }
        let t = self.weight.t().as_standard_layout().into_owned();
        self.weight = t.reversed_axes();
        self
    }

    /// The same layer made ready for inference: on CPUs where `nn::matmul`'s
    /// kernel runs (AVX2 or AVX-512), the weight is kept only packed in that
    /// kernel's layout (each 16-output panel one sequential stream; `weight` is
    /// left empty and [`weight_f32`](Self::weight_f32) unpacks it, to the bit),
    /// else it is made [`column_major`](Self::column_major) for the `gemm` crate.
    /// For weights loaded once and used many times. A weight assigned afterwards
    /// is used (packed again at every call: slow), as is one changed in place on a
    /// CPU without the kernel.
    pub fn for_inference(self) -> Self {
        self.for_inference_with(Precision::F32)
    }

    /// [`for_inference`](Self::for_inference) in the given precision. With
    /// [`Precision::Bf16`] the layer computes as PyTorch's autocast to bf16 does:
    /// the weight is rounded to bf16 (to nearest, ties to even) and kept only so,
    /// packed for the bf16 product (`vdpbf16ps` where the CPU has AVX512-BF16, two
    /// fused multiply-adds per pair elsewhere); each input is rounded to bf16,
    /// products are summed in f32 and the output, bias and activation stay f32.
    /// The layer then holds 2 bytes per weight, against 4 for an f32 inference
    /// layer; `weight` is left empty.
    ///
    /// With [`Precision::Int8`] the weight is quantized to int8 (symmetric, one
    /// scale per output) and kept only so, a quarter of the f32 weight's bytes;
    /// each input row is quantized to unsigned bytes with its own scale and zero
    /// point, the products are summed exactly in i32 and the output, bias and
    /// activation stay f32 (`nn::matmul`'s int8 product: `vpdpbusd` where the CPU
    /// has AVX512-VNNI, bytes widened to 16 bits elsewhere: the same bits).
    pub fn for_inference_with(self, precision: Precision) -> Self {
        self.reduce(precision, None)
    }

    /// [`for_inference_with`](Self::for_inference_with)`(Precision::Int8)`, but on
    /// a CPU without VNNI the weight is quantized to ±63 instead of ±127, so that
    /// the product can multiply bytes with `vpmaddubsw` (whose 16-bit pair sums
    /// cannot then saturate): twice the rate of the exact widening on AVX2, for
    /// twice the weights' rounding error (docs/int8.md). With VNNI it is the same
    /// ±127 layer. For layers measured to keep their accuracy so.
    ///
    /// Each output's `corrected` largest weights keep their full levels: its
    /// scale is set by its (`corrected` + 1)-th largest magnitude, and the
    /// weights beyond ±63 are packed clamped with the rest added back, exactly,
    /// to the product's i32 sums (`residual · x̂` for each row). Most of the ±63
    /// loss sits in each output's largest weights (docs/int8.md); 0 corrects none.
    pub fn for_inference_int8_narrowed(self, corrected: usize) -> Self {
        self.reduce(Precision::Int8, Some(corrected))
    }

    /// The inference layer in `precision`; in int8, `narrow` as
    /// [`PackedInt8::new`] takes it (`Some(corrected)` for a narrowed one).
    fn reduce(self, precision: Precision, narrow: Option<usize>) -> Self {
        let weight = match self.unpacked() {
            Some(w) => w,
            None => self.weight,
        };
        let layer = Linear {
            weight,
            packed: None,
            reduced: None,
            ..self
        };
        match precision {
            Precision::Bf16 | Precision::Int8 => Linear {
                reduced: Some(Reduced::new(precision, narrow, layer.weight.view())),
                weight: Array2::zeros((0, 0)),
                ..layer
            },
            Precision::F32 if super::matmul::available() => {
                let packed = PackedWeight::new(layer.weight.view(), true);
                Linear {
                    packed: Some(std::sync::Arc::new(packed)),
                    weight: Array2::zeros((0, 0)),
                    ..layer
                }
            }
            Precision::F32 => layer.column_major(),
        }
    }

    /// This layer with each input row's `count` entries of largest magnitude
    /// kept out of the row's int8 quantization: they are multiplied in f32 by the
    /// quantized weights (`ŵ · scale`) and added to the product, and the row's
    /// scale is set by the rest. For inputs with a few channels far larger than
    /// the others (a LayerNorm's output), whose every row's scale they would
    /// otherwise set; which entries they are is each row's own, so a row's output
    /// does not depend on the others in its batch. A layer of another precision
    /// is returned as it is: its inputs are not quantized.
    pub fn with_input_outliers(mut self, count: usize) -> Self {
        if let Some(Reduced::Int8 { outliers, .. }) = &mut self.reduced {
            *outliers = count;
        }
        self
    }

    /// The precision of the layer's products: the one given to
    /// [`for_inference_with`](Self::for_inference_with), else f32.
    pub fn precision(&self) -> Precision {
        self.reduced
            .as_ref()
            .map_or(Precision::F32, Reduced::precision)
    }

    /// The weight `[out, in]` as f32: `weight`, or, in a layer that keeps its
    /// weight only packed, its packing unpacked (to the bit for f32 and bf16;
    /// `ŵ · scale` for int8).
    pub fn weight_f32(&self) -> std::borrow::Cow<'_, Array2<f32>> {
        match self.unpacked() {
            Some(w) => std::borrow::Cow::Owned(w),
            None => std::borrow::Cow::Borrowed(&self.weight),
        }
    }

    /// The packing that stands for the weight (`weight` left empty), unpacked.
    fn unpacked(&self) -> Option<Array2<f32>> {
        match (self.reduced_weight(), self.packed_weight()) {
            (Some(r), _) => Some(r.unpack()),
            (None, Some(p)) => Some(p.unpack()),
            (None, None) => None,
        }
    }

    /// The bf16 or int8 packing when it stands for the weight (`weight` left
    /// empty).
    fn reduced_weight(&self) -> Option<&Reduced> {
        self.reduced.as_ref().filter(|_| self.weight.is_empty())
    }

    /// The f32 packing when it stands for the weight (`weight` left empty).
    fn packed_weight(&self) -> Option<&PackedWeight> {
        self.packed.as_deref().filter(|_| self.weight.is_empty())
    }

    /// `(out, in)`, wherever the weight is kept.
    fn dim(&self) -> (usize, usize) {
        match (self.reduced_weight(), self.packed_weight()) {
            (Some(r), _) => r.dim(),
            (None, Some(p)) => p.dim(),
            (None, None) => self.weight.dim(),
        }
    }

    /// Bytes of the layer's parameters and of the packed copies it keeps for
    /// the products.
    pub fn bytes(&self) -> usize {
        let f32s = self.weight.len() + self.bias.as_ref().map_or(0, |b| b.len());
        let packed = self.packed.as_ref().map_or(0, |p| p.bytes());
        let reduced = self.reduced.as_ref().map_or(0, Reduced::bytes);
        f32s * std::mem::size_of::<f32>() + packed + reduced
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.dim().1
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.dim().0
    }

    /// Applies the layer to the last axis of `x` (any number of leading axes).
    pub fn forward<D: Dimension>(&self, x: ArrayView<'_, f32, D>) -> Result<Array<f32, D>> {
        self.forward_then(x, Epilogue::None)
    }

    /// `act(forward(x))`, with the activation applied to each block of the product
    /// while it is still in cache (a feed-forward layer's first half).
    pub fn forward_activated<D: Dimension>(
        &self,
        x: ArrayView<'_, f32, D>,
        act: Activation,
    ) -> Result<Array<f32, D>> {
        self.forward_then(x, Epilogue::Act(act))
    }

    /// `norm(forward(x) + residual)` on rows `x [rows, in]`, `residual [rows, out]`:
    /// a post-norm encoder's sub-layer output, with the residual added and the
    /// LayerNorm applied to each block of rows while it is still in cache. The
    /// same numbers as [`forward`](Self::forward) followed by
    /// [`LayerNorm::forward_inplace`].
    pub fn forward_residual_norm(
        &self,
        x: ArrayView2<'_, f32>,
        residual: ArrayView2<'_, f32>,
        norm: &LayerNorm,
    ) -> Result<Array2<f32>> {
        let out = self.out_features();
        if residual.dim() != (x.nrows(), out) || norm.dim() != out {
            return Err(Error::shape(format!(
                "residual {:?} and LayerNorm of width {} do not fit a Linear layer's output [{}, {out}]",
                residual.shape(),
                norm.dim(),
                x.nrows()
            )));
        }
        let residual = residual.as_standard_layout();
        let residual = residual.as_slice().expect("standard layout is contiguous");
        self.forward_then(x, Epilogue::ResidualNorm { residual, norm })
    }

    fn forward_then<D: Dimension>(
        &self,
        x: ArrayView<'_, f32, D>,
        epilogue: Epilogue<'_>,
    ) -> Result<Array<f32, D>> {
        let width = x.shape().last().copied().unwrap_or(0);
        if x.ndim() == 0 || width != self.in_features() {
            return Err(Error::shape(format!(
                "input of shape {:?} does not fit a Linear layer with weight {:?} (last axis must be {})",
                x.shape(),
                [self.out_features(), self.in_features()],
                self.in_features()
            )));
        }
        let rows = x.len() / width.max(1);
        let x = x.as_standard_layout();
        let flat = x
            .view()
            .into_shape_with_order((rows, width))
            .expect("standard layout reshapes");
        let y = self.forward_rows(flat, epilogue);
        let mut shape = x.raw_dim();
        shape[x.ndim() - 1] = self.out_features();
        // `forward_rows` always returns a row-major product, so this reshape is free.
        Ok(y.into_shape_with_order(shape).expect("same element count"))
    }

    /// `epilogue(x [rows, in] · weightᵀ + bias)` for `x` of any strides: in bf16
    /// or int8 through `nn::matmul`'s product in that precision (every CPU) for
    /// such a layer; else
    /// through this crate's kernel (`nn::matmul`) when the CPU has AVX2 or
    /// AVX-512, else through the `gemm` crate. All are parallel over output
    /// blocks with rayon, so the result does not depend on the thread count.
    fn forward_rows(&self, x: ArrayView<'_, f32, Ix2>, epilogue: Epilogue<'_>) -> Array2<f32> {
        let bias = self.bias.as_ref().map(|b| match b.as_slice() {
            Some(slice) => std::borrow::Cow::Borrowed(slice),
            None => std::borrow::Cow::Owned(b.to_vec()),
        });
        let bias = bias.as_deref();
        let w = self.weight.view();
        if let Some(reduced) = &self.reduced {
            return match self.weight.is_empty() || reduced.matches(w) {
                true => reduced.forward(x, bias, epilogue),
                // Changed since it was packed: pack the weight as it is now.
                false => reduced.repacked(w).forward(x, bias, epilogue),
            };
        }
        if super::matmul::available() {
            let weight = match self.packed_weight() {
                Some(p) => Weight::Packed(p),
                None => Weight::Plain(w, self.packed.as_deref().filter(|p| p.matches(w))),
            };
            return super::matmul::linear(x, weight, bias, epilogue);
        }
        // Without the kernel nothing was packed (`available` does not change in a
        // process): the weight is where it lies.
        let mut y = self.forward_gemm(x);
        epilogue.apply_all(y.view_mut());
        y
    }

    /// `x [rows, in] · weightᵀ + bias` through the `gemm` crate (runtime-dispatched
    /// AVX-512/AVX2/NEON kernels).
    fn forward_gemm(&self, x: ArrayView<'_, f32, Ix2>) -> Array2<f32> {
        let (m, k) = x.dim();
        let n = self.out_features();
        let mut y = match &self.bias {
            Some(b) => b
                .view()
                .insert_axis(Axis(0))
                .broadcast((m, n))
                .expect("bias fits")
                .to_owned(),
            None => Array2::zeros((m, n)),
        };
        if m == 0 || n == 0 {
            return y;
        }
        if k == 0 {
            return y;
        }
        let w = self.weight.view();
        let (xs, ws) = (x.strides(), w.strides());
        // Below ~4 M multiply-adds, splitting the work costs more than it saves.
        let parallelism = if m * n * k >= 1 << 22 && rayon::current_num_threads() > 1 {
            gemm::Parallelism::Rayon(rayon::current_num_threads())
        } else {
            gemm::Parallelism::None
        };
        // SAFETY: the pointers and strides describe `x [m, k]`, `weightᵀ [k, n]`
        // (element (kk, j) = weight[j, kk]) and `y [m, n]`, all alive and in bounds;
        // `y` is owned and written only here.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                y.as_mut_ptr(),
                1,
                n as isize,
                self.bias.is_some(),
                x.as_ptr(),
                xs[1],
                xs[0],
                w.as_ptr(),
                ws[0],
                ws[1],
                1.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
        y
    }
}

/// A layer's weight in a precision below f32, packed for its product.
#[derive(Clone, Debug)]
enum Reduced {
    /// Rounded to bf16.
    Bf16(std::sync::Arc<PackedBf16>),
    /// Quantized to int8, with each input row's `outliers` largest magnitudes
    /// kept out of its quantization.
    Int8 {
        weight: std::sync::Arc<PackedInt8>,
        outliers: usize,
    },
}

impl Reduced {
    /// `w` packed for `precision`'s product (bf16 or int8, without outliers; in
    /// int8 `narrow` as `Linear::for_inference_int8_narrowed` says).
    fn new(precision: Precision, narrow: Option<usize>, w: ArrayView2<'_, f32>) -> Self {
        match precision {
            Precision::Int8 => Reduced::Int8 {
                weight: std::sync::Arc::new(PackedInt8::new(w, narrow, true)),
                outliers: 0,
            },
            Precision::Bf16 | Precision::F32 => {
                debug_assert_eq!(precision, Precision::Bf16, "f32 weights are not reduced");
                Reduced::Bf16(std::sync::Arc::new(PackedBf16::new(w, true)))
            }
        }
    }

    /// `w` packed as this is (its precision, and its narrowing and outliers in
    /// int8).
    fn repacked(&self, w: ArrayView2<'_, f32>) -> Self {
        match (Reduced::new(self.precision(), self.narrowing(), w), self) {
            (Reduced::Int8 { weight, .. }, Reduced::Int8 { outliers, .. }) => Reduced::Int8 {
                weight,
                outliers: *outliers,
            },
            (new, _) => new,
        }
    }

    /// An int8 weight's narrowing, as [`PackedInt8::new`] takes it.
    fn narrowing(&self) -> Option<usize> {
        match self {
            Reduced::Bf16(_) => None,
            Reduced::Int8 { weight, .. } => weight.narrowing(),
        }
    }

    fn precision(&self) -> Precision {
        match self {
            Reduced::Bf16(_) => Precision::Bf16,
            Reduced::Int8 { .. } => Precision::Int8,
        }
    }

    fn dim(&self) -> (usize, usize) {
        match self {
            Reduced::Bf16(p) => p.dim(),
            Reduced::Int8 { weight, .. } => weight.dim(),
        }
    }

    fn unpack(&self) -> Array2<f32> {
        match self {
            Reduced::Bf16(p) => p.unpack(),
            Reduced::Int8 { weight, .. } => weight.unpack(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Reduced::Bf16(p) => p.bytes(),
            Reduced::Int8 { weight, .. } => weight.bytes(),
        }
    }

    /// Whether this is still `w`'s packing. A bf16 packing checks a sample of
    /// entries; an int8 one cannot (a weight's scale depends on its whole row),
    /// so a weight assigned to an int8 layer is quantized again at every call.
    fn matches(&self, w: ArrayView2<'_, f32>) -> bool {
        match self {
            Reduced::Bf16(p) => p.matches(w),
            Reduced::Int8 { .. } => false,
        }
    }

    fn forward(
        &self,
        x: ArrayView2<'_, f32>,
        bias: Option<&[f32]>,
        epilogue: Epilogue<'_>,
    ) -> Array2<f32> {
        match self {
            Reduced::Bf16(p) => super::matmul::linear_bf16(x, p, bias, epilogue),
            Reduced::Int8 { weight, outliers } => {
                super::matmul::linear_int8(x, weight, *outliers, bias, epilogue)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array, Array3};

    fn naive(x: &Array2<f32>, l: &Linear) -> Array2<f32> {
        let mut y = Array2::zeros((x.nrows(), l.out_features()));
        for i in 0..x.nrows() {
            for j in 0..l.out_features() {
                let mut acc = l.bias.as_ref().map_or(0.0, |b| b[j] as f64);
                for kk in 0..l.in_features() {
                    acc += x[[i, kk]] as f64 * l.weight[[j, kk]] as f64;
                }
                y[[i, j]] = acc as f32;
            }
        }
        y
    }

    #[test]
    fn matches_naive_product_for_many_shapes() {
        for &(m, k, n, bias) in &[
            (1, 1, 1, false),
            (3, 5, 7, true),
            (17, 33, 65, true),
            (70, 384, 96, false),
            (129, 64, 1536, true),
        ] {
            let x =
                Array::from_shape_fn((m, k), |(i, j)| ((i * 31 + j * 7) % 13) as f32 / 7.0 - 0.9);
            let w =
                Array::from_shape_fn((n, k), |(i, j)| ((i * 17 + j * 5) % 11) as f32 / 5.0 - 1.1);
            let b = bias.then(|| Array::from_shape_fn(n, |i| i as f32 / 10.0));
            let l = Linear::new(w, b).unwrap();
            let y = l.forward(x.view()).unwrap();
            let want = naive(&x, &l);
            let err = (&y - &want).mapv(f32::abs).fold(0.0f32, |a, &b| a.max(b));
            assert!(err < 1e-4 * (k as f32).sqrt(), "{m}x{k}x{n}: {err}");
        }
    }

    #[test]
    fn strided_and_batched_inputs() {
        let x = Array3::from_shape_fn((2, 3, 4), |(a, b, c)| (a * 12 + b * 4 + c) as f32 / 10.0);
        let w = Array::from_shape_fn((5, 4), |(i, j)| (i as f32 - j as f32) / 3.0);
        let l = Linear::new(w, Some(Array::from_elem(5, 0.5))).unwrap();
        let y = l.forward(x.view()).unwrap();
        assert_eq!(y.shape(), &[2, 3, 5]);
        // A permuted (non-standard) view gives the same rows.
        let xt = x.clone().permuted_axes([1, 0, 2]);
        let yt = l.forward(xt.view()).unwrap();
        assert_eq!(yt.permuted_axes([1, 0, 2]), y);
        let flat = x.into_shape_with_order((6, 4)).unwrap();
        let want = naive(&flat, &l).into_shape_with_order((2, 3, 5)).unwrap();
        let err = (&y - &want).mapv(f32::abs).fold(0.0f32, |a, &b| a.max(b));
        assert!(err < 1e-5, "{err}");
    }

    #[test]
    fn column_major_weights_give_the_same_layer() {
        let w = Array::from_shape_fn((7, 5), |(i, j)| (i * 5 + j) as f32 / 9.0 - 1.0);
        let l = Linear::new(w, Some(Array::from_elem(7, 0.25))).unwrap();
        let c = l.clone().column_major();
        assert_eq!(c, l);
        assert_eq!(c.weight.strides(), &[1, 7]);
        let x = Array::from_shape_fn((3, 5), |(i, j)| (i + j) as f32);
        // The product may sum in another order, so equal up to rounding.
        let (yc, yl) = (c.forward(x.view()).unwrap(), l.forward(x.view()).unwrap());
        let err = (&yc - &yl).mapv(f32::abs).fold(0.0f32, |a, &b| a.max(b));
        assert!(err < 1e-5, "{err}");
        assert_eq!(c.clone().column_major(), c);
    }

    #[test]
    fn same_bits_whatever_the_thread_count() {
        let x = Array::from_shape_fn((200, 384), |(i, j)| {
            ((i * 31 + j * 7) % 97) as f32 / 50.0 - 1.0
        });
        let w = Array::from_shape_fn((384, 384), |(i, j)| {
            ((i * 13 + j * 5) % 89) as f32 / 40.0 - 1.1
        });
        let l = Linear::new(w, Some(Array::from_elem(384, 0.1)))
            .unwrap()
            .column_major();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| l.forward(x.view()).unwrap())
        };
        let one = run(1);
        assert_eq!(run(2), one);
        assert_eq!(run(3), one);
    }

    #[test]
    fn an_f32_inference_layer_keeps_its_weight_once_and_uses_an_assigned_one() {
        let w = Array::from_shape_fn((40, 30), |(i, j)| ((i * 7 + j * 3) % 17) as f32 / 8.0 - 1.0);
        let x = Array::from_shape_fn((9, 30), |(i, j)| ((i + 2 * j) % 5) as f32 - 2.0);
        let l = Linear::new(w, Some(Array::from_elem(40, 0.5))).unwrap();
        let mut fast = l.clone().for_inference();
        // The same layer, its weight given back to the bit.
        assert_eq!(fast, l);
        assert_eq!((fast.in_features(), fast.out_features()), (30, 40));
        if super::super::matmul::available() {
            // Only the packing: four bytes per weight (the panels padded to 16
            // outputs) and the f32 bias.
            assert!(fast.weight.is_empty());
            assert_eq!(fast.bytes(), 48 * 30 * 4 + 40 * 4);
        }
        let err = |a: &Array2<f32>, b: &Array2<f32>| {
            (a - b).mapv(f32::abs).fold(0.0f32, |m, &v| m.max(v))
        };
        let (y, want) = (fast.forward(x.view()).unwrap(), naive(&x, &l));
        assert!(err(&y, &want) < 1e-4, "{}", err(&y, &want));
        // Made again for inference, it is the same layer.
        assert_eq!(fast.clone().for_inference(), l);
        // An optimiser step after packing: the result must be the new weight's.
        fast.weight = l.weight.mapv(|v| v * 0.5);
        let changed = Linear::new(fast.weight.clone(), fast.bias.clone()).unwrap();
        let (y, want) = (fast.forward(x.view()).unwrap(), naive(&x, &changed));
        assert!(err(&y, &want) < 1e-4, "{}", err(&y, &want));
    }

    #[test]
    fn a_bf16_layer_keeps_its_weight_in_bf16_and_multiplies_in_bf16() {
        let (m, k, n) = (9, 67, 40);
        let w = Array::from_shape_fn((n, k), |(i, j)| ((i * 7 + j * 3) % 17) as f32 / 8.3 - 1.0);
        let x = Array::from_shape_fn((m, k), |(i, j)| ((i + 2 * j) % 11) as f32 / 3.7 - 1.4);
        let l = Linear::new(w, Some(Array::from_elem(n, 0.5))).unwrap();
        let b = l.clone().for_inference_with(Precision::Bf16);
        assert_eq!(b.precision(), Precision::Bf16);
        assert_eq!((b.in_features(), b.out_features()), (k, n));
        assert!(b.weight.is_empty());
        let rounded = crate::element::round_to_bf16(l.weight.view());
        assert_eq!(*b.weight_f32(), rounded);
        // Two bytes per weight (panels padded to 16 outputs, pairs to even k),
        // and the f32 bias.
        assert_eq!(
            b.bytes(),
            n.next_multiple_of(16) * k.next_multiple_of(2) * 2 + n * 4
        );
        // The product of the rounded operands, summed in f32: within a sum's
        // rounding of the f64 product, |error| ≤ k·ε·Σ|terms| (each term ≤ 1.4).
        let xr = crate::element::round_to_bf16(x.view());
        let want = naive(&xr, &Linear::new(rounded, l.bias.clone()).unwrap());
        let y = b.forward(x.view()).unwrap();
        let err = (&y - &want).mapv(f32::abs).fold(0.0f32, |a, &v| a.max(v));
        assert!(
            err <= k as f32 * f32::EPSILON * (k as f32 * 1.4 + 0.5),
            "{err}"
        );
        // Far from f32's own product: the inputs were rounded.
        let f32_err = (&l.forward(x.view()).unwrap() - &y).mapv(f32::abs);
        assert!(f32_err.fold(0.0f32, |a, &v| a.max(v)) > 1e-3);
        // Made again for inference (in either precision), it is the same layer.
        assert_eq!(b.clone().for_inference_with(Precision::Bf16), b);
        assert_eq!(*b.clone().for_inference().weight_f32(), *b.weight_f32());
        // A weight assigned afterwards is the one used, rounded to bf16.
        let mut changed = b.clone();
        changed.weight = l.weight.mapv(|v| v * 0.5);
        let want = Linear::new(changed.weight.clone(), l.bias.clone())
            .unwrap()
            .for_inference_with(Precision::Bf16);
        assert_eq!(
            changed.forward(x.view()).unwrap(),
            want.forward(x.view()).unwrap()
        );
    }

    #[test]
    fn stacked_layers_give_each_layers_bits_side_by_side() {
        let k = 70;
        let layer = |n: usize, seed: usize| {
            let w = Array::from_shape_fn((n, k), |(i, j)| {
                ((i * 7 + j * 3 + seed) % 17) as f32 / 8.3 - 1.0
            });
            Linear::new(w, Some(Array::from_shape_fn(n, |i| i as f32 / 9.0))).unwrap()
        };
        let parts = [layer(40, 0), layer(16, 1), layer(33, 2)];
        let refs: Vec<&Linear> = parts.iter().collect();
        for precision in [Precision::F32, Precision::Bf16] {
            let one = Linear::stacked(&refs)
                .unwrap()
                .for_inference_with(precision);
            assert_eq!((one.in_features(), one.out_features()), (k, 89));
            for m in [1, 7, 50] {
                let x =
                    Array::from_shape_fn((m, k), |(i, j)| ((i + 2 * j) % 11) as f32 / 3.7 - 1.4);
                let y = one.forward(x.view()).unwrap();
                let mut start = 0;
                for part in &parts {
                    let alone = part.clone().for_inference_with(precision);
                    let n = part.out_features();
                    let want = alone.forward(x.view()).unwrap();
                    assert_eq!(
                        y.slice(ndarray::s![.., start..start + n]),
                        want,
                        "{precision:?} {m}"
                    );
                    start += n;
                }
            }
        }
        let narrow = Linear::new(Array2::zeros((4, k - 1)), None).unwrap();
        assert!(Linear::stacked(&[&parts[0], &narrow]).is_err());
        let unbiased = Linear::new(Array2::zeros((4, k)), None).unwrap();
        assert!(Linear::stacked(&[&parts[0], &unbiased]).is_err());
        assert!(Linear::stacked(&[]).is_err());
    }

    #[test]
    fn the_fused_residual_and_layer_norm_equal_the_separate_ones() {
        let (k, n) = (96, 80);
        let w = Array::from_shape_fn((n, k), |(i, j)| ((i * 7 + j * 3) % 17) as f32 / 8.3 - 1.0);
        let l = Linear::new(w, Some(Array::from_shape_fn(n, |i| i as f32 / 9.0))).unwrap();
        let norm = LayerNorm::new(
            Array::from_shape_fn(n, |i| 1.0 + i as f32 / 40.0),
            Array::from_shape_fn(n, |i| i as f32 / 50.0 - 0.5),
            1e-12,
        )
        .unwrap();
        for precision in [Precision::F32, Precision::Bf16] {
            let l = l.clone().for_inference_with(precision);
            // Few rows (split by panels, then normalised) and many (normalised in
            // each block of whole rows), on one thread and two.
            for m in [3, 13, 100] {
                let x =
                    Array::from_shape_fn((m, k), |(i, j)| ((i + 2 * j) % 11) as f32 / 3.7 - 1.4);
                let res = Array::from_shape_fn((m, n), |(i, j)| ((i * 5 + j) % 7) as f32 - 3.0);
                let mut want = l.forward(x.view()).unwrap();
                norm.forward_inplace(want.view_mut(), Some(res.view()))
                    .unwrap();
                for threads in [1, 2] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let got = pool
                        .install(|| l.forward_residual_norm(x.view(), res.view(), &norm))
                        .unwrap();
                    assert_eq!(got, want, "{precision:?}, {m} rows, {threads} threads");
                }
            }
        }
        let x = Array2::zeros((4, k));
        let short = Array2::zeros((3, n));
        assert!(l
            .forward_residual_norm(x.view(), short.view(), &norm)
            .is_err());
        let narrow = LayerNorm::new(Array::ones(n - 1), Array::zeros(n - 1), 1e-5).unwrap();
        let res = Array2::zeros((4, n));
        assert!(l
            .forward_residual_norm(x.view(), res.view(), &narrow)
            .is_err());
    }

    #[test]
    fn wrong_width_is_an_error() {
        let l = Linear::new(Array2::zeros((2, 3)), None).unwrap();
        assert!(l.forward(Array2::<f32>::zeros((4, 5)).view()).is_err());
    }
}
