//! Reading and writing arrays in files.

pub mod npy;
