//! `attend explain`.

/// Flags of `attend explain`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `attend explain`.
pub fn run(_args: Args) -> Result<(), attend::Error> {
    Ok(())
}
