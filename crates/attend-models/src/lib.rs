//! `attend`'s real encoders, above its core: BERT-family checkpoints with their
//! tokenizers and pooling ([`models`]) and corpus embedding ([`corpus`]). Reach them
//! through the `attend` crate, which re-exports both modules.
#![warn(missing_docs)]

pub mod corpus;
pub mod models;
