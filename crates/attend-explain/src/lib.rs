//! `attend`'s explanations, the top layer: a notebook experiment end to end
//! ([`experiment`]), its steps and their page ([`walkthrough`]), pictures of
//! attention ([`viz`]), PyTorch-style printing ([`print`](mod@print)), the notebooks' toy
//! tokenisation ([`text`]) and the training example ([`train`]). Reach them through
//! the `attend` crate, which re-exports every module.
#![warn(missing_docs)]

pub mod experiment;
mod markup;
pub mod print;
pub mod text;
pub mod train;
pub mod viz;
pub mod walkthrough;
