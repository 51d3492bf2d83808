//! AdamW, as `torch.optim.AdamW` computes it.

use std::collections::HashMap;

use ndarray::{ArrayD, Zip};

use super::{check_lr, check_pair, check_range, key, Optimizer, Parameters};
use crate::Result;

/// `torch.optim.AdamW` (defaults `betas = (0.9, 0.999)`, `eps = 1e-8`,
/// `weight_decay = 0.01`), per parameter with its own step count `t`:
///
/// ```text
/// p ← p · (1 − lr λ)
/// m ← m + (1 − β₁)(g − m)          v ← β₂ v + (1 − β₂) g²
/// p ← p − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)
/// ```
#[derive(Clone, Debug)]
pub struct AdamW {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    state: HashMap<(usize, usize), Moments>,
}

#[derive(Clone, Debug)]
struct Moments {
    step: i32,
    m: ArrayD<f32>,
    v: ArrayD<f32>,
}

impl AdamW {
    /// AdamW with learning rate `lr` (positive, finite) and PyTorch's defaults.
    pub fn new(lr: f64) -> Result<Self> {
        check_lr(lr)?;
        Ok(AdamW {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            state: HashMap::new(),
        })
    }

    /// With `betas = (β₁, β₂)`, each in `[0, 1)`.
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Result<Self> {
        check_range("beta1", beta1, 0.0, 1.0)?;
        check_range("beta2", beta2, 0.0, 1.0)?;
        self.betas = (beta1, beta2);
        Ok(self)
    }

    /// With `eps ≥ 0`.
    pub fn eps(mut self, eps: f64) -> Result<Self> {
        check_range("eps", eps, 0.0, f64::INFINITY)?;
        self.eps = eps;
        Ok(self)
    }

    /// With decoupled weight decay `λ ≥ 0`.
    pub fn weight_decay(mut self, weight_decay: f64) -> Result<Self> {
        check_range("weight_decay", weight_decay, 0.0, f64::INFINITY)?;
        self.weight_decay = weight_decay;
        Ok(self)
    }

    /// Changes the learning rate (for schedules).
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_lr(lr)?;
        self.lr = lr;
        Ok(())
    }
}

impl Optimizer for AdamW {
    fn step<P: Parameters>(&mut self, params: &mut P, grads: &P::Grads) -> Result<()> {
        let AdamW {
            lr,
            betas: (beta1, beta2),
            eps,
            weight_decay,
            ..
        } = *self;
        let state = &mut self.state;
        params.visit(grads, &mut |name, mut p, g| {
            check_pair(name, &p, &g)?;
            let s = state.entry(key(&p)).or_insert_with(|| Moments {
                step: 0,
                m: ArrayD::zeros(p.raw_dim()),
                v: ArrayD::zeros(p.raw_dim()),
            });
            s.step += 1;
            // Scalars in f64 as Python computes them, applied in f32 as the kernels do.
            let decay = (1.0 - lr * weight_decay) as f32;
            let bc1 = 1.0 - beta1.powi(s.step);
            let bc2_sqrt = (1.0 - beta2.powi(s.step)).sqrt() as f32;
            let step_size = (lr / bc1) as f32;
            let (w1, b2, w2, eps) = (
                (1.0 - beta1) as f32,
                beta2 as f32,
                (1.0 - beta2) as f32,
                eps as f32,
            );
            Zip::from(&mut p)
                .and(&g)
                .and(&mut s.m)
                .and(&mut s.v)
                .for_each(|p, &g, m, v| {
                    *p *= decay;
                    *m = lerp(*m, g, w1);
                    *v = *v * b2 + w2 * g * g;
                    let denom = v.sqrt() / bc2_sqrt + eps;
                    *p += -step_size * (*m / denom);
                });
            Ok(())
        })
    }
}

/// `torch.lerp(start, end, weight)` as PyTorch computes it.
#[inline]
fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    if weight.abs() < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}
