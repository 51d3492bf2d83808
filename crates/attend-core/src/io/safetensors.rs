//! Reading and writing [safetensors] files of `f32` tensors. `F16` and `BF16`
//! tensors (how many checkpoints are shipped) are read too, widened exactly to `f32`.
//!
//! The format is an 8-byte little-endian header length `N`, `N` bytes of JSON
//! (`{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//! "__metadata__": {"key": "value"}}`), then the raw little-endian data, offsets
//! counted from the end of the header. Every way a file can be wrong (too short,
//! header longer than the file, bad JSON, a tensor whose bytes run past the end or do
//! not match its shape) is reported as one line naming the file and the tensor.
//!
//! A module's tensors are read through a [`Scope`] (the file under a prefix,
//! [`SafeTensors::scope`]) and gathered for writing through a [`ScopeMut`] of a
//! [`StateDict`], so a module's reader or writer names only its own tensors.
//!
//! ```
//! use attend_core::io::safetensors::{self, SafeTensors};
//! use ndarray::array;
//!
//! let w = array![[1.0f32, 2.0], [3.0, 4.0]].into_dyn();
//! let bytes = safetensors::serialize(&[("w", w.view())], None)?;
//! let file = SafeTensors::from_bytes(bytes, "memory")?;
//! assert_eq!(file.tensor("w")?, w);
//! # Ok::<(), attend_core::Error>(())
//! ```
//!
//! [safetensors]: https://huggingface.co/docs/safetensors

use std::collections::BTreeMap;
use std::path::Path;

use ndarray::{Array1, Array2, ArrayD, ArrayViewD, IxDyn};

use crate::{Error, Result};

mod scope;
pub use scope::{Scope, ScopeMut, StateDict};

/// Where one tensor sits in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The dtype as the header spells it (`"F32"`, `"I64"`, `"BF16"`, …).
    pub dtype: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// Byte range within the data section.
    pub data_offsets: (usize, usize),
}

/// A safetensors file held in memory, with its header parsed and checked.
#[derive(Clone, Debug)]
pub struct SafeTensors {
    origin: String,
    bytes: Bytes,
    data_start: usize,
    tensors: BTreeMap<String, TensorInfo>,
    metadata: BTreeMap<String, String>,
}

/// A file's bytes: given in memory, or the file mapped read-only (loading a
/// model then reads its weights from the page cache once, into the arrays,
/// instead of copying the whole file into a buffer first).
#[derive(Clone, Debug)]
enum Bytes {
    Owned(Vec<u8>),
    Mapped(std::sync::Arc<memmap2::Mmap>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Owned(v) => v,
            Bytes::Mapped(m) => m,
        }
    }
}

/// Bytes per element of the dtypes the format defines.
fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

impl SafeTensors {
    /// Maps and checks the file at `path`. The file must not change while the
    /// returned value lives (as with any memory-mapped model file).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only and private to this value; what it shows
        // is the file's bytes, which this crate only reads, and the file is not
        // expected to change while a model loads from it (the documented
        // condition above).
        let map = unsafe { memmap2::MmapOptions::new().populate().map(&file) };
        let bytes = match map {
            Ok(map) => Bytes::Mapped(std::sync::Arc::new(map)),
            // Not every file can be mapped (an empty one, a pipe): read it instead.
            Err(_) => Bytes::Owned(std::fs::read(path).map_err(|e| Error::io(path, e))?),
        };
        Self::parse(bytes, &path.display().to_string())
    }

    /// Parses `bytes`; `origin` names them in error messages (usually the path).
    pub fn from_bytes(bytes: Vec<u8>, origin: &str) -> Result<Self> {
        Self::parse(Bytes::Owned(bytes), origin)
    }

    fn parse(bytes: Bytes, origin: &str) -> Result<Self> {
        let bad =
            |msg: String| Error::format(format!("{origin}: not a valid safetensors file: {msg}"));
        if bytes.len() < 8 {
            return Err(bad(format!(
                "it holds {} bytes, fewer than the 8 of the header length",
                bytes.len()
            )));
        }
        let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        let available = (bytes.len() - 8) as u64;
        if header_len > available {
            return Err(bad(format!(
                "the header claims {header_len} bytes but only {available} follow (truncated?)"
            )));
        }
        let data_start = 8 + header_len as usize;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&bytes[8..data_start])
                .map_err(|e| bad(format!("its header is not a JSON object: {e}")))?;
        let data_len = bytes.len() - data_start;
        let mut tensors = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for (name, entry) in header {
            if name == "__metadata__" {
                let map = entry
                    .as_object()
                    .ok_or_else(|| bad("__metadata__ is not an object".into()))?;
                for (k, v) in map {
                    let v = v
                        .as_str()
                        .ok_or_else(|| bad(format!("__metadata__ value {k:?} is not a string")))?;
                    metadata.insert(k.clone(), v.to_string());
                }
                continue;
            }
            let info = parse_info(&name, &entry).map_err(bad)?;
            let (begin, end) = info.data_offsets;
            if end > data_len {
                return Err(bad(format!(
                    "tensor {name:?} needs data bytes {begin}..{end} but the file holds only {data_len} (truncated?)"
                )));
            }
            tensors.insert(name, info);
        }
        check_layout(&tensors, data_len).map_err(bad)?;
        Ok(SafeTensors {
            origin: origin.to_string(),
            bytes,
            data_start,
            tensors,
            metadata,
        })
    }

    /// Where the tensors came from (the path given to [`open`](Self::open)).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Names of all tensors, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Whether a tensor called `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Dtype, shape and offsets of `name`, if it exists.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// The `__metadata__` string map (empty if the file has none).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The tensor `name` as `f32`, in its stored shape: `F32` as stored, `F16` and
    /// `BF16` widened (exactly: every value of both is an `f32`).
    pub fn tensor(&self, name: &str) -> Result<ArrayD<f32>> {
        let info = self.tensors.get(name).ok_or_else(|| {
            Error::format(format!("{}: has no tensor named {name:?}", self.origin))
        })?;
        let (begin, end) = info.data_offsets;
        let raw = &self.bytes[self.data_start + begin..self.data_start + end];
        let half = |c: &[u8]| u16::from_le_bytes(c.try_into().expect("2 bytes"));
        let values: Vec<f32> = match info.dtype.as_str() {
            "F32" => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
            "F16" => raw
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(half(c)).to_f32())
                .collect(),
            "BF16" => raw
                .chunks_exact(2)
                .map(|c| f32::from_bits((half(c) as u32) << 16))
                .collect(),
            other => {
                return Err(Error::format(format!(
                    "{}: tensor {name:?} has dtype {other}; only F32, F16 and BF16 are supported",
                    self.origin
                )))
            }
        };
        Ok(ArrayD::from_shape_vec(IxDyn(&info.shape), values).expect("size checked on open"))
    }

    /// Refuses a floating-point tensor `name` that holds a NaN or an infinity,
    /// naming the file, the tensor and the first such element. Reads the stored
    /// bits, without converting or allocating.
    pub fn check_finite(&self, name: &str) -> Result<()> {
        let Some(info) = self.tensors.get(name) else {
            return Ok(());
        };
        let (begin, end) = info.data_offsets;
        let raw = &self.bytes[self.data_start + begin..self.data_start + end];
        // An IEEE value is non-finite exactly when its exponent bits are all ones.
        let bad = match info.dtype.as_str() {
            "F64" => first_non_finite(raw, u64::from_le_bytes, 0x7ff0_0000_0000_0000),
            "F32" => first_non_finite(raw, u32::from_le_bytes, 0x7f80_0000),
            "F16" => first_non_finite(raw, u16::from_le_bytes, 0x7c00),
            "BF16" => first_non_finite(raw, u16::from_le_bytes, 0x7f80),
            _ => return Ok(()),
        };
        match bad {
            None => Ok(()),
            Some(i) => Err(Error::value(format!(
                "{}: tensor {name:?} holds a NaN or infinite value (flat element {i})",
                self.origin
            ))),
        }
    }

    /// The `f32` tensor `name`, which must have exactly `shape`.
    pub fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<ArrayD<f32>> {
        let t = self.tensor(name)?;
        if t.shape() != shape {
            return Err(Error::shape(format!(
                "{}: tensor {name:?} has shape {:?}, expected {shape:?}",
                self.origin,
                t.shape()
            )));
        }
        Ok(t)
    }

    /// The one-dimensional `f32` tensor `name`.
    pub fn tensor1(&self, name: &str) -> Result<Array1<f32>> {
        let t = self.tensor(name)?;
        let shape = t.shape().to_vec();
        t.into_dimensionality().map_err(|_| {
            Error::shape(format!(
                "{}: tensor {name:?} has shape {shape:?}, expected one axis",
                self.origin
            ))
        })
    }

    /// The two-dimensional `f32` tensor `name`.
    pub fn tensor2(&self, name: &str) -> Result<Array2<f32>> {
        let t = self.tensor(name)?;
        let shape = t.shape().to_vec();
        t.into_dimensionality().map_err(|_| {
            Error::shape(format!(
                "{}: tensor {name:?} has shape {shape:?}, expected two axes",
                self.origin
            ))
        })
    }
}

fn parse_info(name: &str, entry: &serde_json::Value) -> std::result::Result<TensorInfo, String> {
    let obj = entry
        .as_object()
        .ok_or_else(|| format!("entry of tensor {name:?} is not an object"))?;
    let dtype = obj
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(|| format!("tensor {name:?} has no string \"dtype\""))?
        .to_string();
    let size =
        dtype_size(&dtype).ok_or_else(|| format!("tensor {name:?} has unknown dtype {dtype:?}"))?;
    let shape = obj
        .get("shape")
        .and_then(|s| s.as_array())
        .ok_or_else(|| format!("tensor {name:?} has no \"shape\" array"))?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| format!("tensor {name:?} has a shape that is not a list of sizes"))?;
    let offsets = obj
        .get("data_offsets")
        .and_then(|o| o.as_array())
        .filter(|o| o.len() == 2)
        .and_then(|o| Some((o[0].as_u64()? as usize, o[1].as_u64()? as usize)))
        .ok_or_else(|| format!("tensor {name:?} has no \"data_offsets\" pair"))?;
    // ndarray (like NumPy) bounds the product of the non-zero axes, so that a view
    // of an empty axis stays valid; a [0, 2^40, 2^40] tensor holds nothing but is
    // still not a shape any array can take.
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|_| {
            shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)))
                .is_some_and(|n| n <= isize::MAX as usize)
        })
        .ok_or_else(|| format!("tensor {name:?} has a shape {shape:?} too large to hold"))?;
    let (begin, end) = offsets;
    if begin > end || end - begin != numel.saturating_mul(size) {
        return Err(format!(
            "tensor {name:?} of dtype {dtype} and shape {shape:?} needs {} bytes but its data_offsets are {begin}..{end}",
            numel.saturating_mul(size)
        ));
    }
    Ok(TensorInfo {
        dtype,
        shape,
        data_offsets: offsets,
    })
}

/// The data section must be the tensors' bytes back to back, as the format's own
/// reader demands: a byte read by two tensors, or one no tensor owns (a gap or
/// trailing data), means the header does not describe the file.
fn check_layout(
    tensors: &BTreeMap<String, TensorInfo>,
    data_len: usize,
) -> std::result::Result<(), String> {
    let mut spans: Vec<(usize, usize, &str)> = tensors
        .iter()
        .map(|(name, t)| (t.data_offsets.0, t.data_offsets.1, name.as_str()))
        .collect();
    spans.sort_unstable();
    let mut at = 0;
    let mut previous = None;
    for (begin, end, name) in spans {
        if begin != at {
            return Err(match previous {
                Some(p) if begin < at => format!(
                    "tensors {p:?} and {name:?} overlap (data_offsets {begin}..{end} start before byte {at})"
                ),
                _ => format!("data bytes {at}..{begin} belong to no tensor (before {name:?})"),
            });
        }
        at = end;
        previous = Some(name);
    }
    if at != data_len {
        return Err(format!(
            "the data section holds {data_len} bytes but the tensors cover only {at} (trailing data)"
        ));
    }
    Ok(())
}

/// The bytes of a safetensors file holding `tensors` (as `F32`) and `metadata`.
///
/// Names must be unique and must not be `__metadata__`.
pub fn serialize(
    tensors: &[(&str, ArrayViewD<'_, f32>)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<Vec<u8>> {
    let mut header = serde_json::Map::new();
    if let Some(meta) = metadata {
        let map = meta
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), serde_json::Value::Object(map));
    }
    let mut offset = 0usize;
    for (name, t) in tensors {
        if *name == "__metadata__" {
            return Err(Error::value("a tensor may not be called \"__metadata__\""));
        }
        let end = offset + t.len() * 4;
        let entry = serde_json::json!({
            "dtype": "F32",
            "shape": t.shape(),
            "data_offsets": [offset, end],
        });
        if header.insert(name.to_string(), entry).is_some() {
            return Err(Error::value(format!("tensor name {name:?} appears twice")));
        }
        offset = end;
    }
    let mut json = serde_json::to_vec(&header).expect("a JSON map serialises");
    // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len() + offset);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    for (_, t) in tensors {
        // `iter` walks in logical (row-major) order whatever the strides.
        for &x in t.iter() {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    Ok(out)
}

/// Writes `tensors` (as `F32`) and `metadata` to a safetensors file at `path`.
pub fn write(
    path: impl AsRef<Path>,
    tensors: &[(&str, ArrayViewD<'_, f32>)],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<()> {
    let bytes = serialize(tensors, metadata)?;
    std::fs::write(path.as_ref(), bytes).map_err(|e| Error::io(path, e))
}

/// Index of the first element of `raw` (little-endian numbers of `N` bytes, read
/// by `bits`) whose `exponent` bits are all ones: a NaN or an infinity. Blocks of
/// 64 elements are first tested with a branch-free fold that the compiler
/// vectorises (checking a model's weights at load is then a small part of
/// loading it); only a block that fails is searched element by element.
fn first_non_finite<const N: usize, T>(
    raw: &[u8],
    bits: fn([u8; N]) -> T,
    exponent: T,
) -> Option<usize>
where
    T: Copy + PartialEq + std::ops::BitAnd<Output = T>,
{
    let is_bad = |c: &[u8]| bits(c.try_into().expect("chunks of N bytes")) & exponent == exponent;
    const BLOCK: usize = 64;
    raw.chunks(BLOCK * N).enumerate().find_map(|(b, block)| {
        let any = block.chunks_exact(N).fold(false, |any, c| any | is_bad(c));
        any.then(|| {
            b * BLOCK
                + block
                    .chunks_exact(N)
                    .position(is_bad)
                    .expect("a bad element")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array3};

    fn sample() -> Vec<u8> {
        let a = array![[1.0f32, -2.0, 3.5], [4.0, 5.0, 6.0]].into_dyn();
        let b =
            Array3::from_shape_fn((2, 3, 4), |(i, j, k)| (i * 12 + j * 4 + k) as f32).into_dyn();
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        serialize(&[("a", a.view()), ("b.weight", b.view())], Some(&meta)).unwrap()
    }

    #[test]
    fn round_trip_with_metadata() {
        let st = SafeTensors::from_bytes(sample(), "sample").unwrap();
        assert_eq!(st.names().collect::<Vec<_>>(), ["a", "b.weight"]);
        assert_eq!(st.metadata()["format"], "pt");
        assert_eq!(
            st.tensor2("a").unwrap(),
            array![[1.0f32, -2.0, 3.5], [4.0, 5.0, 6.0]]
        );
        let b = st.tensor("b.weight").unwrap();
        assert_eq!(b.shape(), &[2, 3, 4]);
        assert_eq!(b[[1, 2, 3]], 23.0);
        let header_len = u64::from_le_bytes(sample()[..8].try_into().unwrap());
        assert_eq!(header_len % 8, 0);
    }

    #[test]
    fn transposed_views_are_written_in_logical_order() {
        let a = array![[1.0f32, 2.0], [3.0, 4.0]];
        let bytes = serialize(&[("t", a.t().into_dyn())], None).unwrap();
        let st = SafeTensors::from_bytes(bytes, "t").unwrap();
        assert_eq!(st.tensor2("t").unwrap(), a.t());
    }

    #[test]
    fn missing_tensor_is_named() {
        let st = SafeTensors::from_bytes(sample(), "sample").unwrap();
        let err = st.tensor("c").unwrap_err().to_string();
        assert!(err.contains("no tensor named \"c\""), "{err}");
        let err = st.tensor1("a").unwrap_err().to_string();
        assert!(err.contains("[2, 3]"), "{err}");
    }

    #[test]
    fn truncated_files_are_reported() {
        let bytes = sample();
        for cut in [0, 5, 8, 20, bytes.len() - 1] {
            let err = SafeTensors::from_bytes(bytes[..cut].to_vec(), "cut")
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("cut: not a valid safetensors file"),
                "{err}"
            );
            assert!(!err.contains('\n'));
        }
        let err = SafeTensors::from_bytes(bytes[..bytes.len() - 1].to_vec(), "cut")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("b.weight") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn malformed_headers_are_reported() {
        let with_header = |json: &str| {
            let mut b = (json.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(json.as_bytes());
            b.extend_from_slice(&[0u8; 16]);
            SafeTensors::from_bytes(b, "x").unwrap_err().to_string()
        };
        assert!(with_header("[1, 2]").contains("not a JSON object"));
        assert!(with_header("{\"a\": 3}").contains("not an object"));
        assert!(
            with_header(r#"{"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}"#)
                .contains("unknown dtype")
        );
        assert!(
            with_header(r#"{"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 4]}}"#)
                .contains("needs 12 bytes")
        );
        assert!(with_header(r#"{"a": {"dtype": "F32", "shape": [1]}}"#).contains("data_offsets"));
        let ok = {
            let json = r#"{"a": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}"#;
            let mut b = (json.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(json.as_bytes());
            b.extend_from_slice(&[0u8; 16]);
            SafeTensors::from_bytes(b, "x").unwrap()
        };
        assert!(ok
            .tensor("a")
            .unwrap_err()
            .to_string()
            .contains("has dtype I64; only F32, F16 and BF16 are supported"));
    }

    /// A file of one tensor `a` of `dtype` with the given little-endian halves.
    fn halves(dtype: &str, values: &[u16]) -> SafeTensors {
        let json = format!(
            r#"{{"a": {{"dtype": "{dtype}", "shape": [{}], "data_offsets": [0, {}]}}}}"#,
            values.len(),
            2 * values.len()
        );
        let mut b = (json.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(json.as_bytes());
        for v in values {
            b.extend_from_slice(&v.to_le_bytes());
        }
        SafeTensors::from_bytes(b, "x").unwrap()
    }

    #[test]
    fn every_f16_value_widens_exactly() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let got = halves("F16", &all).tensor("a").unwrap();
        for (&h, &x) in all.iter().zip(got.iter()) {
            // The definition: (−1)^s · 2^(e − 15) · (1 + m/1024), subnormals
            // 2^−14 · m/1024, e = 31 infinities and NaNs; in f64, then compared.
            let (s, e, m) = (h >> 15, (h >> 10) & 0x1f, h & 0x3ff);
            let sign = if s == 1 { -1.0 } else { 1.0 };
            let want = match e {
                0 => sign * 2f64.powi(-14) * (m as f64 / 1024.0),
                31 if m == 0 => sign * f64::INFINITY,
                31 => f64::NAN,
                _ => sign * 2f64.powi(e as i32 - 15) * (1.0 + m as f64 / 1024.0),
            };
            if want.is_nan() {
                assert!(x.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(x as f64, want, "{h:#06x}");
                assert_eq!(x.is_sign_negative(), s == 1, "{h:#06x} sign");
            }
        }
    }

    #[test]
    fn bf16_values_widen_exactly() {
        let got = halves("BF16", &[0x3f80, 0xc020, 0x4049, 0x0001, 0xff80])
            .tensor("a")
            .unwrap();
        let want = [
            1.0,
            -2.5,
            3.140625,
            f32::from_bits(0x0001_0000),
            f32::NEG_INFINITY,
        ];
        assert_eq!(got.as_slice().unwrap(), &want);
    }

    #[test]
    fn duplicate_names_are_refused() {
        let a = array![1.0f32].into_dyn();
        assert!(serialize(&[("a", a.view()), ("a", a.view())], None).is_err());
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = SafeTensors::open("/nonexistent/model.safetensors")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/nonexistent/model.safetensors: "), "{err}");
    }
}
