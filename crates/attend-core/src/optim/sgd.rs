//! Stochastic gradient descent, as `torch.optim.SGD` computes it.

use std::collections::HashMap;

use ndarray::{ArrayD, Zip};

use super::{check_lr, check_pair, check_range, key, Optimizer, Parameters};
use crate::Result;

/// `torch.optim.SGD`:
///
/// ```text
/// g ← g + λ p                                   (weight_decay λ)
/// b ← g on the first step, else μ b + (1 − τ) g (momentum μ, dampening τ)
/// g ← g + μ b if nesterov, else b
/// p ← p − lr g
/// ```
#[derive(Clone, Debug)]
pub struct Sgd {
    lr: f32,
    momentum: f32,
    dampening: f32,
    weight_decay: f32,
    nesterov: bool,
    buffers: HashMap<(usize, usize), ArrayD<f32>>,
}

impl Sgd {
    /// Plain SGD with learning rate `lr` (positive, finite).
    pub fn new(lr: f64) -> Result<Self> {
        check_lr(lr)?;
        Ok(Sgd {
            lr: lr as f32,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            buffers: HashMap::new(),
        })
    }

    /// With momentum `μ ∈ [0, 1)`.
    pub fn momentum(mut self, momentum: f64) -> Result<Self> {
        check_range("momentum", momentum, 0.0, 1.0)?;
        self.momentum = momentum as f32;
        Ok(self)
    }

    /// With dampening `τ ∈ [0, 1]` of the momentum.
    pub fn dampening(mut self, dampening: f64) -> Result<Self> {
        check_range("dampening", dampening, 0.0, 1.0 + f64::EPSILON)?;
        self.dampening = dampening as f32;
        Ok(self)
    }

    /// With L2 weight decay `λ ≥ 0`.
    pub fn weight_decay(mut self, weight_decay: f64) -> Result<Self> {
        check_range("weight_decay", weight_decay, 0.0, f64::INFINITY)?;
        self.weight_decay = weight_decay as f32;
        Ok(self)
    }

    /// With Nesterov momentum.
    pub fn nesterov(mut self, nesterov: bool) -> Self {
        self.nesterov = nesterov;
        self
    }
}

impl Optimizer for Sgd {
    fn step<P: Parameters>(&mut self, params: &mut P, grads: &P::Grads) -> Result<()> {
        let Sgd {
            lr,
            momentum,
            dampening,
            weight_decay,
            nesterov,
            ..
        } = *self;
        let buffers = &mut self.buffers;
        params.visit(grads, &mut |name, mut p, g| {
            check_pair(name, &p, &g)?;
            let mut d = g.to_owned();
            if weight_decay != 0.0 {
                Zip::from(&mut d)
                    .and(&p)
                    .for_each(|d, &p| *d += weight_decay * p);
            }
            if momentum != 0.0 {
                let buf = match buffers.entry(key(&p)) {
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(d.clone()),
                    std::collections::hash_map::Entry::Occupied(e) => {
                        let b = e.into_mut();
                        Zip::from(&mut *b)
                            .and(&d)
                            .for_each(|b, &d| *b = *b * momentum + (1.0 - dampening) * d);
                        b
                    }
                };
                if nesterov {
                    Zip::from(&mut d)
                        .and(&*buf)
                        .for_each(|d, &b| *d += momentum * b);
                } else {
                    d.assign(buf);
                }
            }
            Zip::from(&mut p).and(&d).for_each(|p, &d| *p += -lr * d);
            Ok(())
        })
    }
}
