//! Activation functions applied in place, vectorised for the CPU at hand.

use rayon::prelude::*;

use crate::isa::{erf, exp, multiversion};

/// The activations of BERT-family feed-forward layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Exact GELU, `x · Φ(x) = x/2 · (1 + erf(x/√2))` (`nn.GELU()`, config `"gelu"`).
    Gelu,
    /// The tanh approximation of GELU (`nn.GELU(approximate="tanh")`,
    /// config `"gelu_new"`, `"gelu_pytorch_tanh"`).
    GeluTanh,
    /// `max(x, 0)`.
    Relu,
    /// `x · σ(x)` (config `"silu"`, `"swish"`).
    Silu,
}

impl Activation {
    /// Parses a Hugging Face `hidden_act` name.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        Some(match name {
            "gelu" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            "silu" | "swish" => Activation::Silu,
            _ => return None,
        })
    }

    /// Applies the activation to every element of `xs` (in parallel when large).
    pub fn apply(self, xs: &mut [f32]) {
        const CHUNK: usize = 1 << 14;
        if xs.len() >= 4 * CHUNK {
            xs.par_chunks_mut(CHUNK).for_each(|c| self.apply_serial(c));
        } else {
            self.apply_serial(xs);
        }
    }

    /// [`apply`](Self::apply) on the calling thread (for callers that already split
    /// the work, such as a matrix product's blocks).
    pub(crate) fn apply_serial(self, xs: &mut [f32]) {
        match self {
            Activation::Gelu => gelu(xs),
            Activation::GeluTanh => gelu_tanh(xs),
            Activation::Relu => xs.iter_mut().for_each(|x| *x = x.max(0.0)),
            Activation::Silu => silu(xs),
        }
    }
}

multiversion! {
    fn gelu(xs: &mut [f32]) {
        const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
        for x in xs {
            *x = *x * 0.5 * (1.0 + erf(*x * FRAC_1_SQRT_2));
        }
    }
}

multiversion! {
    fn gelu_tanh(xs: &mut [f32]) {
        const K: f32 = 0.797_884_6; // √(2/π)
        for x in xs {
            let u = K * (*x + 0.044_715 * *x * *x * *x);
            // tanh(u) = 1 − 2/(e^{2u} + 1)
            let t = 1.0 - 2.0 / (exp(2.0 * u) + 1.0);
            *x = 0.5 * *x * (1.0 + t);
        }
    }
}

multiversion! {
    fn silu(xs: &mut [f32]) {
        for x in xs {
            *x /= 1.0 + exp(-*x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_values() {
        // torch.nn.functional.gelu(torch.tensor([-3., -1., -0.5, 0., 0.5, 1., 3.]))
        let mut xs = [-3.0f32, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0];
        Activation::Gelu.apply(&mut xs);
        let want = [
            -0.004_049_71f32,
            -0.158_655_25,
            -0.154_268_5,
            0.0,
            0.345_731_5,
            0.841_344_7,
            2.995_950_3,
        ];
        for (g, w) in xs.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    #[test]
    fn other_activations() {
        let mut xs = [-1.0f32, 0.0, 2.0];
        Activation::GeluTanh.apply(&mut xs);
        assert!(
            (xs[0] + 0.158_808).abs() < 1e-5 && (xs[2] - 1.954_597_7).abs() < 1e-5,
            "{xs:?}"
        );
        let mut xs = [-1.0f32, 0.0, 2.0];
        Activation::Silu.apply(&mut xs);
        assert!((xs[0] + 0.268_941_4).abs() < 1e-6 && (xs[2] - 1.761_594_2).abs() < 1e-6);
        let mut xs = [-1.0f32, 0.0, 2.0];
        Activation::Relu.apply(&mut xs);
        assert_eq!(xs, [0.0, 0.0, 2.0]);
        assert_eq!(Activation::from_hf_name("gelu"), Some(Activation::Gelu));
        assert_eq!(Activation::from_hf_name("mish"), None);
    }

    #[test]
    fn large_inputs_take_the_parallel_path() {
        let mut xs: Vec<f32> = (0..100_000)
            .map(|i| (i as f32 - 50_000.0) / 10_000.0)
            .collect();
        let copy = xs.clone();
        Activation::Gelu.apply(&mut xs);
        let mut one = copy[12_345..12_346].to_vec();
        Activation::Gelu.apply(&mut one);
        assert_eq!(xs[12_345], one[0]);
    }
}
