//! A `.npy` file of f32 rows written as they come, its row count patched in at the end.
//!
//! The row count of a streamed corpus is known only when the last row is written,
//! and counting first would mean reading the input twice (impossible for standard
//! input). So the header is written with room for the largest row count a `u64`
//! holds and rewritten in place, at the same length, by [`RowWriter::finish`]; the
//! output only has to be seekable, which the temporary file it goes to always is.

use std::io::{Seek, SeekFrom, Write};

use ndarray::ArrayView2;

use super::MAGIC;
use crate::{Error, Result};

/// Writes an `<f4` array `[rows, width]` in C order, one block of rows at a time.
///
/// ```
/// use attend_core::io::npy::RowWriter;
/// use ndarray::array;
///
/// let mut w = RowWriter::new(std::io::Cursor::new(Vec::new()), 2, "mem.npy")?;
/// w.append(array![[1.0f32, 2.0]].view())?;
/// w.append(array![[3.0f32, 4.0], [5.0, 6.0]].view())?;
/// let bytes = w.finish()?.into_inner();
/// let a = attend_core::io::npy::from_bytes(&bytes, "mem.npy")?;
/// assert_eq!(a.shape(), &[3, 2]);
/// # Ok::<(), attend_core::Error>(())
/// ```
pub struct RowWriter<W: Write + Seek> {
    out: W,
    width: usize,
    rows: u64,
    header_len: usize,
    origin: String,
}

impl<W: Write + Seek> RowWriter<W> {
    /// Starts the file at `out`'s current position (its start) with a header for
    /// rows of `width` values; `origin` names the file in error messages.
    pub fn new(mut out: W, width: usize, origin: impl Into<String>) -> Result<Self> {
        let origin = origin.into();
        let header_len = header(u64::MAX, width, 0).len();
        let first = header(0, width, header_len);
        out.write_all(&first).map_err(|e| Error::io(&origin, e))?;
        Ok(RowWriter {
            out,
            width,
            rows: 0,
            header_len,
            origin,
        })
    }

    /// Appends rows; each must be `width` wide.
    pub fn append(&mut self, rows: ArrayView2<'_, f32>) -> Result<()> {
        if rows.ncols() != self.width {
            return Err(Error::shape(format!(
                "{}: rows of {} values cannot join a .npy file of rows of {}",
                self.origin,
                rows.ncols(),
                self.width
            )));
        }
        let mut buf = Vec::with_capacity(4 * rows.len());
        for &x in rows.iter() {
            buf.extend_from_slice(&x.to_le_bytes());
        }
        self.out
            .write_all(&buf)
            .map_err(|e| Error::io(&self.origin, e))?;
        self.rows += rows.nrows() as u64;
        Ok(())
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Writes the final row count into the header, flushes, and hands back the output.
    pub fn finish(mut self) -> Result<W> {
        let io = |e: std::io::Error| Error::io(&self.origin, e);
        let end = self.out.stream_position().map_err(io)?;
        self.out.seek(SeekFrom::Start(0)).map_err(io)?;
        self.out
            .write_all(&header(self.rows, self.width, self.header_len))
            .map_err(io)?;
        self.out.seek(SeekFrom::Start(end)).map_err(io)?;
        self.out.flush().map_err(io)?;
        Ok(self.out)
    }
}

/// Magic, version 1.0, header length and the header for `[rows, width]`, padded
/// with spaces to `total` bytes (or, when `total` is 0, to the next multiple of 64,
/// which keeps the data aligned as NumPy aligns it).
fn header(rows: u64, width: usize, total: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {width}), }}");
    let unpadded = MAGIC.len() + 2 + 2 + dict.len() + 1;
    let total = if total == 0 {
        unpadded.div_ceil(64) * 64
    } else {
        total
    };
    let mut text = dict;
    text.push_str(&" ".repeat(total - unpadded));
    text.push('\n');
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&[1, 0]);
    bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::npy::{from_bytes, NpyArray};
    use ndarray::{Array2, ArrayD, IxDyn};
    use std::io::Cursor;

    #[test]
    fn rows_in_blocks_read_back_as_one_array() {
        let a = Array2::from_shape_fn((7, 3), |(i, j)| (i * 3 + j) as f32 - 0.5);
        let mut w = RowWriter::new(Cursor::new(Vec::new()), 3, "t.npy").unwrap();
        w.append(a.slice(ndarray::s![..0, ..])).unwrap();
        w.append(a.slice(ndarray::s![..4, ..])).unwrap();
        w.append(a.slice(ndarray::s![4.., ..])).unwrap();
        assert_eq!(w.rows(), 7);
        let bytes = w.finish().unwrap().into_inner();
        assert_eq!((bytes.len() - 4 * 21) % 64, 0, "data starts 64-aligned");
        let want = ArrayD::from_shape_vec(IxDyn(&[7, 3]), a.iter().copied().collect()).unwrap();
        assert_eq!(from_bytes(&bytes, "t.npy").unwrap(), NpyArray::F32(want));
    }

    #[test]
    fn an_empty_file_has_zero_rows_and_wrong_widths_are_refused() {
        let mut w = RowWriter::new(Cursor::new(Vec::new()), 384, "e.npy").unwrap();
        let err = w.append(Array2::<f32>::zeros((1, 3)).view()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "e.npy: rows of 3 values cannot join a .npy file of rows of 384"
        );
        let bytes = w.finish().unwrap().into_inner();
        assert_eq!(from_bytes(&bytes, "e.npy").unwrap().shape(), &[0, 384]);
    }
}
