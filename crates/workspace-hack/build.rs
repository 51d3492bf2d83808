//! Empty: cargo resolves a package's build-dependencies (here, the proc macros'
//! features this crate exists to unify) only when it has a build script.

fn main() {}
