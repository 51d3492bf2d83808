//! NumPy `.npy` files: f32 and boolean arrays, as `numpy.save` writes them.
//!
//! Reads format versions 1–3, little-endian `<f4` and `|b1`, C or Fortran order;
//! writes version 1.0, `<f4`, C order, whole ([`write_f32`]) or row by row
//! ([`RowWriter`]). Anything else is an [`Error::Format`] naming
//! the file.
//!
//! A file is read as a stream and checked as it goes: the magic bytes and the
//! header before anything else, the body's size against the memory the process can
//! get before the body is read, and then only the bytes the shape needs. A path
//! that is not a `.npy` file (`/dev/urandom`, a FIFO that never ends) fails after
//! ten bytes.

use std::io::{Read, Write};
use std::path::Path;

use ndarray::{ArrayD, ArrayViewD, IxDyn, ShapeBuilder};

use crate::{Error, Result};

mod header;
mod rows;
use header::Header;
pub use rows::RowWriter;

const MAGIC: &[u8] = b"\x93NUMPY";

/// The longest header read. NumPy itself refuses headers past 10 000 bytes unless
/// told otherwise; the header of any array attend reads (a dict of three keys) is
/// far shorter.
const MAX_HEADER_BYTES: usize = 1 << 16;

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
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    read_from(std::io::BufReader::new(file), &path.display().to_string())
}

/// Parses the bytes of a `.npy` file; `origin` names them in error messages.
pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<NpyArray> {
    read_from(bytes, origin)
}

/// Reads a `.npy` array from `input`, header first; `origin` names it in error
/// messages.
fn read_from(mut input: impl Read, origin: &str) -> Result<NpyArray> {
    let bad = |msg: String| Error::format(format!("{origin}: {msg}"));
    let io = |e: std::io::Error| Error::io(origin, e);
    let mut lead = [0u8; 10];
    if read_up_to(&mut input, &mut lead).map_err(io)? < lead.len() || &lead[..6] != MAGIC {
        return Err(bad("not a .npy file (bad magic)".into()));
    }
    let header_len = match lead[6] {
        1 => u16::from_le_bytes([lead[8], lead[9]]) as usize,
        2 | 3 => {
            let mut high = [0u8; 2];
            if read_up_to(&mut input, &mut high).map_err(io)? < high.len() {
                return Err(bad("truncated header".into()));
            }
            u32::from_le_bytes([lead[8], lead[9], high[0], high[1]]) as usize
        }
        v => return Err(bad(format!("unsupported .npy version {v}"))),
    };
    if header_len > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "header of {header_len} bytes: a .npy header is at most {MAX_HEADER_BYTES}"
        )));
    }
    let mut header = vec![0u8; header_len];
    if read_up_to(&mut input, &mut header).map_err(io)? < header_len {
        return Err(bad("truncated header".into()));
    }
    let header = std::str::from_utf8(&header).map_err(|_| bad("header is not text".into()))?;
    let header = header::parse(header).map_err(bad)?;
    let elem_bytes = match header.descr.as_str() {
        "<f4" => 4,
        "|b1" => 1,
        other => {
            return Err(bad(format!(
                "unsupported dtype {other:?}: expected float32 ('<f4') or bool ('|b1')"
            )))
        }
    };
    let n = header
        .shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize / 4)
        .ok_or_else(|| {
            bad(format!(
                "shape {:?} has more elements than any memory holds",
                header.shape
            ))
        })?;
    let need = n * elem_bytes;
    crate::limits::check_memory(origin, need as u128)?;
    let mut data = Vec::with_capacity(need);
    input.take(need as u64).read_to_end(&mut data).map_err(io)?;
    if data.len() < need {
        return Err(bad(format!(
            "data holds {} bytes, the shape needs {need}",
            data.len()
        )));
    }
    parse_body(header, &data).map_err(bad)
}

/// Fills `buf` as far as `input` goes; returns the bytes read.
fn read_up_to(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(k) => filled += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
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

/// The array of a body `data` holding exactly the bytes `header` says.
fn parse_body(header: Header, data: &[u8]) -> std::result::Result<NpyArray, String> {
    let Header {
        descr,
        fortran,
        shape,
    } = header;
    let shape = IxDyn(&shape);
    let shape = if fortran {
        shape.f()
    } else {
        shape.into_shape_with_order()
    };
    if descr == "|b1" {
        let v = data.iter().map(|&b| b != 0).collect();
        return ArrayD::from_shape_vec(shape, v)
            .map(NpyArray::Bool)
            .map_err(|e| e.to_string());
    }
    let v = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    ArrayD::from_shape_vec(shape, v)
        .map(NpyArray::F32)
        .map_err(|e| e.to_string())
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
        match from_bytes(&f, "f").unwrap() {
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

    /// Bytes that are not a `.npy` file are refused after the first ten, and a
    /// header is checked before its body is read: neither an endless stream nor a
    /// header promising more than memory holds is read on.
    #[test]
    fn an_endless_stream_is_refused_at_its_start() {
        let err = read_from(std::io::repeat(0x42), "noise").unwrap_err();
        assert_eq!(err.to_string(), "noise: not a .npy file (bad magic)");
        let header =
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000, 1000), }";
        let mut lead = MAGIC.to_vec();
        lead.extend_from_slice(&[1, 0]);
        lead.extend_from_slice(&(header.len() as u16).to_le_bytes());
        lead.extend_from_slice(header.as_bytes());
        let err = read_from((&lead[..]).chain(std::io::repeat(0)), "huge").unwrap_err();
        assert!(err.to_string().starts_with("huge would need"), "{err}");
        let mut long = MAGIC.to_vec();
        long.extend_from_slice(&[2, 0, 0, 0, 0, 1]);
        let err = read_from((&long[..]).chain(std::io::repeat(b' ')), "long").unwrap_err();
        assert_eq!(
            err.to_string(),
            "long: header of 16777216 bytes: a .npy header is at most 65536"
        );
    }
}
