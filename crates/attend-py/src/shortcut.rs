//! The common case of the forward operator's autograd kernel, recognised in Rust.
//!
//! PyTorch's dispatcher calls the autograd kernel of
//! `torch.ops.attend.scaled_dot_product_attention` on every call, and most calls need
//! nothing from it but the CPU kernel: plain CPU tensors (nothing else in the
//! dispatch keyset), no gradient to record, no forward-mode AD or `torch.func`
//! transform, no mask or a boolean or float32 one. Recognising them in Python took
//! about a microsecond a call (two frames and their checks), as much again as the
//! rest of what the operator adds to the kernel; here it is a few C calls. Every
//! other call goes to the Python kernel (`attend.ops._forward_autograd`), which
//! handles all calls, these included.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::dlpack::{Element, Tensor};
use crate::sdpa::sdpa_forward_tensors;

/// The forward operator's autograd kernel: the common case here, the rest in
/// `kernel`. The other fields are what the common case is recognised by, handed
/// over by `attend.ops`.
#[pyclass(frozen, module = "attend._attend")]
pub struct ForwardShortcut {
    /// The Python autograd kernel, for every call not taken here.
    kernel: Py<PyAny>,
    /// `DispatchKeySet(CPU, AutogradCPU).raw_repr()`: plain CPU tensors, nothing else.
    cpu_keys: u64,
    /// `torch.autograd.forward_ad`, whose `_current_level` is ≥ 0 while forward-mode
    /// AD runs.
    forward_ad: Py<PyAny>,
    /// `torch.is_grad_enabled`.
    grad_enabled: Py<PyAny>,
    /// `torch._C._are_functorch_transforms_active`.
    transforms_active: Py<PyAny>,
    /// `attend.get_num_threads`.
    threads: Py<PyAny>,
}

#[pymethods]
impl ForwardShortcut {
    #[new]
    #[pyo3(signature = (*, kernel, cpu_keys, forward_ad, grad_enabled, transforms_active, threads))]
    fn new(
        kernel: Py<PyAny>,
        cpu_keys: u64,
        forward_ad: Py<PyAny>,
        grad_enabled: Py<PyAny>,
        transforms_active: Py<PyAny>,
        threads: Py<PyAny>,
    ) -> Self {
        ForwardShortcut {
            kernel,
            cpu_keys,
            forward_ad,
            grad_enabled,
            transforms_active,
            threads,
        }
    }

    /// `(keyset, query, key, value, attn_mask, dropout_p, is_causal, scale,
    /// enable_gqa, seed)`, as the dispatcher calls an autograd kernel registered
    /// with its keyset: `(out, lse, lse_residual)`.
    #[pyo3(signature = (*args))]
    fn __call__<'py>(&self, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        match self.common_case(args)? {
            Some(result) => Ok(result),
            None => self.kernel.bind(args.py()).call1(args),
        }
    }
}

impl ForwardShortcut {
    /// The call's result if it is the common case, else `None` (nothing done).
    fn common_case<'py>(&self, args: &Bound<'py, PyTuple>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = args.py();
        if args.len() != 10 {
            return Ok(None);
        }
        let raw = args.get_item(0)?.call_method0(intern!(py, "raw_repr"))?;
        if raw.extract::<u64>()? != self.cpu_keys
            || self
                .forward_ad
                .bind(py)
                .getattr(intern!(py, "_current_level"))?
                .extract::<i64>()?
                >= 0
            || self.transforms_active.bind(py).call0()?.is_truthy()?
        {
            return Ok(None);
        }
        let (query, key, value) = (args.get_item(1)?, args.get_item(2)?, args.get_item(3)?);
        let mask = Some(args.get_item(4)?).filter(|m| !m.is_none());
        if self.grad_enabled.bind(py).call0()?.is_truthy()? {
            for t in [&query, &key, &value].into_iter().chain(mask.as_ref()) {
                if t.getattr(intern!(py, "requires_grad"))?.is_truthy()? {
                    return Ok(None);
                }
            }
        }
        if let Some(m) = &mask {
            // Other mask dtypes are converted by the Python kernel.
            let dtype = Tensor::new(m, "attn_mask")?.dtype();
            if dtype != bool::DTYPE && dtype != f32::DTYPE {
                return Ok(None);
            }
        }
        let seed = Some(args.get_item(9)?).filter(|s| !s.is_none());
        let (out, lse, residual) = sdpa_forward_tensors(
            py,
            &query,
            &key,
            &value,
            mask.as_ref(),
            args.get_item(5)?.extract()?,
            args.get_item(6)?.extract()?,
            args.get_item(7)?.extract()?,
            args.get_item(8)?.extract()?,
            seed.as_ref(),
            self.threads.bind(py).call0()?.extract()?,
        )?;
        Ok(Some(PyTuple::new(py, [out, lse, residual])?.into_any()))
    }
}
