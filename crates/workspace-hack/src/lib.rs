//! No code. Depending on this crate turns on, in every build of the workspace,
//! the features that `cargo test --workspace` turns on for the crates listed in its
//! `Cargo.toml`, so that building one package (`cargo build -p attend-cli`,
//! `maturin develop`, the bench scripts) reuses the artifacts the tests compiled
//! instead of compiling attend-core and everything above it again.
