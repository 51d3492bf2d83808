//! Reading and writing arrays in files: safetensors and `.npy`.

pub mod npy;
pub mod safetensors;
