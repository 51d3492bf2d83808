//! NumPy `.npy` files: f32 and boolean arrays, as `numpy.save` writes them.
//!
//! Reads format versions 1–3, little-endian `<f4` and `|b1`, C or Fortran order;
//! writes version 1.0, `<f4`, C order, whole ([`write_f32`]) or row by row
//! ([`RowWriter`]). Anything else is an [`Error::Format`] naming
//! the file.

use std::io::Write;
use std::path::Path;

use ndarray::{ArrayD, ArrayViewD, IxDyn, ShapeBuilder};

use crate::{Error, Result};

mod header;
mod rows;
use header::Header;
pub use rows::RowWriter;

const MAGIC: &[u8] = b"\x93NUMPY";

/// An array read from a `.npy` file.
#[derive(Clone, Debug, PartialEq)]
pub enum NpyArray {
    /// `<f4`.
    F32(ArrayD<f32>),
    /// `|b1`.
    Bool(ArrayD<bool>),
}

impl NpyArray {
    /// The array's shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            NpyArray::F32(a) => a.shape(),
            NpyArray::Bool(a) => a.shape(),
        }
    }

    /// The NumPy dtype name (`float32` or `bool`).
    pub fn dtype(&self) -> &'static str {
        match self {
            NpyArray::F32(_) => "float32",
            NpyArray::Bool(_) => "bool",
        }
    }
}

/// Reads an f32 or boolean `.npy` file.
pub fn read(path: impl AsRef<Path>) -> Result<NpyArray> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    from_bytes(&bytes, &path.display().to_string())
}

/// Parses the bytes of a `.npy` file; `origin` names them in error messages.
pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<NpyArray> {
    parse(bytes).map_err(|msg| Error::format(format!("{origin}: {msg}")))
}

/// Reads a `.npy` file that must hold f32 values.
pub fn read_f32(path: impl AsRef<Path>) -> Result<ArrayD<f32>> {
    let path = path.as_ref();
    match read(path)? {
        NpyArray::F32(a) => Ok(a),
        other => Err(Error::format(format!(
            "{}: expected dtype float32, got {}",
            path.display(),
            other.dtype()
        ))),
    }
}

/// Writes an f32 array as a version 1.0 `.npy` file in C order.
pub fn write_f32(path: impl AsRef<Path>, a: ArrayViewD<'_, f32>) -> Result<()> {
    let path = path.as_ref();
    let shape = match a.shape() {
        [n] => format!("({n},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad with spaces so that the data starts on a 64-byte boundary; end with '\n'.
    let unpadded = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut buf = Vec::with_capacity(10 + header.len() + 4 * a.len());
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&[1, 0]);
    buf.extend_from_slice(&(header.len() as u16).to_le_bytes());
    buf.extend_from_slice(header.as_bytes());
    for &x in a.iter() {
        buf.extend_from_slice(&x.to_le_bytes());
    }
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(&buf).map_err(|e| Error::io(path, e))
}

fn parse(bytes: &[u8]) -> std::result::Result<NpyArray, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (bad magic)".into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = bytes
        .get(start..start + header_len)
        .ok_or("truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "header is not text")?;
    let Header {
        descr,
        fortran,
        shape,
    } = header::parse(header)?;
    let n = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize / 4)
        .ok_or_else(|| format!("shape {shape:?} has more elements than any memory holds"))?;
    let data = &bytes[start + header_len..];
    let shape = IxDyn(&shape);
    let shape = if fortran {
        shape.f()
    } else {
        shape.into_shape_with_order()
    };
    let short = |need: usize| format!("data holds {} bytes, the shape needs {need}", data.len());
    match descr.as_str() {
        "<f4" => {
            if data.len() < 4 * n {
                return Err(short(4 * n));
            }
            let v = data[..4 * n]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            ArrayD::from_shape_vec(shape, v)
                .map(NpyArray::F32)
                .map_err(|e| e.to_string())
        }
        "|b1" => {
            if data.len() < n {
                return Err(short(n));
            }
            let v = data[..n].iter().map(|&b| b != 0).collect();
            ArrayD::from_shape_vec(shape, v)
                .map(NpyArray::Bool)
                .map_err(|e| e.to_string())
        }
        other => Err(format!(
            "unsupported dtype {other:?}: expected float32 ('<f4') or bool ('|b1')"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_fortran_order() {
        let dir = std::env::temp_dir().join(format!("attend-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = ArrayD::from_shape_fn(IxDyn(&[2, 3, 4]), |i| (i[0] * 12 + i[1] * 4 + i[2]) as f32);
        let p = dir.join("a.npy");
        write_f32(&p, a.view()).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!((bytes.len() - 4 * 24) % 64, 0);
        assert_eq!(read_f32(&p).unwrap(), a);
        // A Fortran-order boolean file, written by hand.
        let header = "{'descr': '|b1', 'fortran_order': True, 'shape': (2, 3), }";
        let mut f = MAGIC.to_vec();
        f.extend_from_slice(&[1, 0]);
        f.extend_from_slice(&(header.len() as u16).to_le_bytes());
        f.extend_from_slice(header.as_bytes());
        f.extend_from_slice(&[1, 0, 0, 1, 1, 0]); // column-major
        match parse(&f).unwrap() {
            NpyArray::Bool(b) => {
                assert_eq!(b.shape(), &[2, 3]);
                assert!(b[[0, 0]] && !b[[1, 0]] && !b[[0, 1]] && b[[1, 1]] && b[[0, 2]]);
            }
            other => panic!("{other:?}"),
        }
        let scalar = write_f32(dir.join("s.npy"), ArrayD::from_elem(IxDyn(&[]), 1.5).view());
        assert!(scalar.is_ok());
        assert_eq!(
            read_f32(dir.join("s.npy")).unwrap().shape(),
            &[] as &[usize]
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
