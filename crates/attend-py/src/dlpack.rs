//! Torch tensors in and out without NumPy, through DLPack's C exchange API
//! (`torch.Tensor.__dlpack_c_exchange_api__`, DLPack 1.3).
//!
//! The operators' CPU kernels run on every call of `torch.ops.attend.*`, so what
//! crossing the boundary costs is paid per call: a NumPy view of a tensor costs about
//! a microsecond in Python, and a NumPy result another half one to become a tensor.
//! Here a tensor's pointer, shape and strides come from one C call of PyTorch's
//! (tens of nanoseconds), and a result's memory is handed to PyTorch as it is, with a
//! deleter, without a copy.

use std::ffi::{c_int, c_void, CStr};
use std::marker::PhantomData;
use std::ptr::NonNull;

use attend::element::bf16;
use ndarray::{ArrayD, ArrayViewD, IxDyn, ShapeBuilder};
use pyo3::exceptions::{PyImportError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyType};
use pyo3::{ffi, intern};

use crate::errors::{type_error, value_error};

#[repr(C)]
#[derive(Clone, Copy)]
struct Version {
    major: u32,
    minor: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Device {
    device_type: i32,
    device_id: i32,
}

const CPU: i32 = 1;

/// An element type: DLPack's `(code, bits, lanes)`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

impl DataType {
    const fn new(code: u8, bits: u8) -> Self {
        DataType {
            code,
            bits,
            lanes: 1,
        }
    }

    /// PyTorch's name of the type, for messages.
    pub fn name(self) -> String {
        match (self.code, self.bits, self.lanes) {
            (6, 8, 1) => "torch.bool".into(),
            (2, b, 1) => format!("torch.float{b}"),
            (4, 16, 1) => "torch.bfloat16".into(),
            (0, b, 1) => format!("torch.int{b}"),
            (1, b, 1) => format!("torch.uint{b}"),
            (c, b, l) => format!("DLPack type (code {c}, {b} bits, {l} lanes)"),
        }
    }
}

/// DLPack's `DLTensor`: a strided view of memory on a device.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlTensor {
    data: *mut c_void,
    device: Device,
    ndim: i32,
    dtype: DataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// DLPack's `DLManagedTensorVersioned`: a `DlTensor` with its owner and deleter.
#[repr(C)]
struct Managed {
    version: Version,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut Managed)>,
    flags: u64,
    tensor: DlTensor,
}

/// DLPack's `DLPackExchangeAPI`, as far as attend calls it.
#[repr(C)]
struct ExchangeApi {
    version: Version,
    prev_api: *const c_void,
    managed_tensor_allocator: *const c_void,
    managed_tensor_from_py_object_no_sync: *const c_void,
    managed_tensor_to_py_object_no_sync:
        Option<unsafe extern "C" fn(*mut Managed, *mut *mut c_void) -> c_int>,
    dltensor_from_py_object_no_sync:
        Option<unsafe extern "C" fn(*mut c_void, *mut DlTensor) -> c_int>,
    current_work_stream: *const c_void,
}

/// PyTorch's tensor type and exchange functions, found once.
struct Torch {
    tensor_type: Py<PyType>,
    to_py: unsafe extern "C" fn(*mut Managed, *mut *mut c_void) -> c_int,
    from_py: unsafe extern "C" fn(*mut c_void, *mut DlTensor) -> c_int,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

fn torch(py: Python<'_>) -> PyResult<&Torch> {
    TORCH.get_or_try_init(py, || {
        let tensor_type = py
            .import("torch")?
            .getattr("Tensor")?
            .cast_into::<PyType>()?;
        let missing = || {
            PyImportError::new_err(
                "attend's operators need torch.Tensor.__dlpack_c_exchange_api__ (DLPack 1.x): upgrade torch",
            )
        };
        let capsule = tensor_type
            .getattr(intern!(py, "__dlpack_c_exchange_api__"))
            .map_err(|_| missing())?
            .cast_into::<PyCapsule>()?;
        let name: &CStr = c"dlpack_exchange_api";
        let api = capsule.pointer_checked(Some(name))?.cast::<ExchangeApi>();
        // SAFETY: the capsule of that name holds a `DLPackExchangeAPI` that its
        // producer keeps for the life of the process (DLPack's contract); its
        // version is read before anything past the header.
        let api = unsafe { api.as_ref() };
        if api.version.major != 1 {
            return Err(missing());
        }
        match (
            api.managed_tensor_to_py_object_no_sync,
            api.dltensor_from_py_object_no_sync,
        ) {
            (Some(to_py), Some(from_py)) => Ok(Torch {
                tensor_type: tensor_type.unbind(),
                to_py,
                from_py,
            }),
            _ => Err(missing()),
        }
    })
}

/// The element types that cross: how DLPack names them.
pub trait Element: Copy + 'static {
    const DTYPE: DataType;
}

impl Element for f32 {
    const DTYPE: DataType = DataType::new(2, 32);
}

impl Element for f64 {
    const DTYPE: DataType = DataType::new(2, 64);
}

impl Element for bf16 {
    const DTYPE: DataType = DataType::new(4, 16);
}

impl Element for bool {
    const DTYPE: DataType = DataType::new(6, 8);
}

/// DLPack's float16, which the kernels do not read: PyTorch widens it for them.
pub const F16: DataType = DataType::new(2, 16);

/// A CPU tensor's memory, as PyTorch describes it, borrowed for as long as the
/// tensor object is.
pub struct Tensor<'a> {
    data: *const u8,
    dtype: DataType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    name: &'static str,
    tensor: PhantomData<&'a ()>,
}

impl<'a> Tensor<'a> {
    /// `t`, which the messages call `name`: a torch tensor on the CPU whose memory
    /// can be read as it is (no negative bit, a data pointer behind its elements).
    pub fn new(t: &'a Bound<'_, PyAny>, name: &'static str) -> PyResult<Self> {
        let py = t.py();
        let torch = torch(py)?;
        if !t.is_instance(torch.tensor_type.bind(py))? {
            return Err(type_error(format!(
                "{name} must be a torch.Tensor, got {}",
                t.get_type().name()?
            )));
        }
        // PyTorch's export below ignores the negative bit of `torch._neg_view`:
        // reading such memory as it is would flip the signs.
        if t.call_method0(intern!(py, "is_neg"))?.is_truthy()? {
            return Err(value_error(format!(
                "{name} is a negative view: pass {name}.resolve_neg()"
            )));
        }
        let mut dl = DlTensor {
            data: std::ptr::null_mut(),
            device: Device {
                device_type: 0,
                device_id: 0,
            },
            ndim: 0,
            dtype: DataType::new(0, 0),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        // SAFETY: `t` is a torch.Tensor (checked above) and the GIL is held, as
        // the function requires; it fills `dl` or sets a Python error.
        if unsafe { (torch.from_py)(t.as_ptr().cast(), &mut dl) } != 0 {
            return Err(PyErr::take(py)
                .unwrap_or_else(|| PyRuntimeError::new_err(format!("{name}: no DLPack view"))));
        }
        if dl.device.device_type != CPU {
            return Err(value_error(format!(
                "attend runs on CPU tensors: {name} is not on the CPU (move it with .cpu())"
            )));
        }
        let ndim = usize::try_from(dl.ndim).unwrap_or(0);
        let (shape, strides): (&[i64], &[i64]) =
            if ndim == 0 || dl.shape.is_null() || dl.strides.is_null() {
                // A scalar's pointers may be null, which a slice may not be.
                (&[], &[])
            } else {
                // SAFETY: PyTorch points `shape` and `strides` at `ndim` sizes of the
                // tensor, alive while the tensor is and the GIL held; they are copied here.
                unsafe {
                    (
                        std::slice::from_raw_parts(dl.shape, ndim),
                        std::slice::from_raw_parts(dl.strides, ndim),
                    )
                }
            };
        if shape.len() != ndim {
            return Err(PyRuntimeError::new_err(format!(
                "{name}: DLPack gave no shape"
            )));
        }
        let shape = shape
            .iter()
            .map(|&n| usize::try_from(n))
            .collect::<Result<Vec<_>, _>>();
        let strides = strides
            .iter()
            .map(|&s| usize::try_from(s))
            .collect::<Result<Vec<_>, _>>();
        let (Ok(shape), Ok(strides)) = (shape, strides) else {
            return Err(value_error(format!("{name} has a negative size or stride")));
        };
        let data = dl.data.cast::<u8>().cast_const();
        if data.is_null() && shape.iter().product::<usize>() != 0 {
            return Err(value_error(format!(
                "{name} has no data (a fake or meta tensor reached attend's CPU kernel)"
            )));
        }
        Ok(Tensor {
            data: data.wrapping_add(dl.byte_offset as usize),
            dtype: dl.dtype,
            shape,
            strides,
            name,
            tensor: PhantomData,
        })
    }

    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// A `TypeError` naming the tensor unless it holds `dtype`.
    pub fn expect(&self, dtype: DataType) -> PyResult<()> {
        if self.dtype != dtype {
            return Err(type_error(format!(
                "{} must be {}, got {}",
                self.name,
                dtype.name(),
                self.dtype.name()
            )));
        }
        Ok(())
    }

    /// The tensor's memory as an array of `T`, in place, or a `TypeError` if it
    /// holds another type.
    pub fn view<T: Element>(&self) -> PyResult<ArrayViewD<'a, T>> {
        self.expect(T::DTYPE)?;
        let empty = self.shape.contains(&0);
        let data = if empty {
            NonNull::<T>::dangling().as_ptr().cast_const()
        } else {
            self.data.cast::<T>()
        };
        if !data.is_aligned() {
            return Err(value_error(format!(
                "{}'s data is not aligned for {}: pass {}.clone()",
                self.name,
                T::DTYPE.name(),
                self.name
            )));
        }
        let shape = IxDyn(&self.shape).strides(IxDyn(&self.strides));
        // SAFETY: PyTorch's shape and strides (non-negative, checked) describe
        // elements of `T` (the dtype, checked) inside the tensor's storage, at an
        // aligned, non-null address (checked; dangling only when empty); the
        // tensor object outlives `'a`, and attend only reads through the view.
        Ok(unsafe { ArrayViewD::from_shape_ptr(shape, data) })
    }
}

/// An array handed to PyTorch: the DLPack description PyTorch reads, then what
/// it describes. `managed` is the first field, so the deleter that PyTorch calls
/// with a pointer to it can free the whole.
#[repr(C)]
struct Export<T> {
    managed: Managed,
    array: ArrayD<T>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

unsafe extern "C" fn delete<T>(managed: *mut Managed) {
    // SAFETY: PyTorch calls the deleter once, with the pointer `into_tensor`
    // gave it, which came from `Box::into_raw` of an `Export<T>`.
    drop(unsafe { Box::from_raw(managed.cast::<Export<T>>()) });
}

/// `a` as a torch tensor of its shape and C-contiguous strides, owning its memory
/// (no copy when `a` is already in standard layout, which results are).
pub fn into_tensor<'py, T: Element>(py: Python<'py>, a: ArrayD<T>) -> PyResult<Bound<'py, PyAny>> {
    let torch = torch(py)?;
    let array = if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    };
    let shape: Vec<i64> = array.shape().iter().map(|&n| n as i64).collect();
    // PyTorch's contiguous strides, which count an empty axis as 1: what the
    // operators' fake implementation predicts.
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    let mut export = Box::new(Export {
        managed: Managed {
            version: Version { major: 1, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete::<T>),
            flags: 0,
            tensor: DlTensor {
                data: array.as_ptr().cast_mut().cast(),
                device: Device {
                    device_type: CPU,
                    device_id: 0,
                },
                ndim: shape.len() as i32,
                dtype: T::DTYPE,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        array,
        shape,
        strides,
    });
    // The vectors' heap buffers stay where they are when the box moves.
    export.managed.tensor.shape = export.shape.as_mut_ptr();
    export.managed.tensor.strides = export.strides.as_mut_ptr();
    let managed = Box::into_raw(export).cast::<Managed>();
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `managed` is a valid DLManagedTensorVersioned whose deleter frees
    // it; PyTorch takes it over (on failure it is leaked, never freed twice). The
    // GIL is held, and a new reference comes back on success.
    unsafe {
        if (torch.to_py)(managed, &mut out) != 0 || out.is_null() {
            return Err(PyErr::take(py).unwrap_or_else(|| {
                PyRuntimeError::new_err("attend: a result could not become a tensor")
            }));
        }
        Ok(Bound::from_owned_ptr(py, out.cast::<ffi::PyObject>()))
    }
}
