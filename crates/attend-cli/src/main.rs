//! The `attend` command-line tool.

fn main() {}
