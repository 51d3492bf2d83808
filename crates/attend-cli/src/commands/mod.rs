//! One module per command: its flags (`Args`) and its `run`.

pub mod attention;
pub mod bench;
pub mod embed;
pub mod explain;
pub mod sdpa;
pub mod serve;
pub mod train;
pub mod view;
