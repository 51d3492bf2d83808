//! Files: safetensors and `.npy`.

pub mod safetensors;
