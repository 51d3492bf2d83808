//! Flags more than one command shares: the value parsers, a notebook experiment's
//! flags and a real model's.

pub mod experiment;
pub mod flags;
pub mod model;
