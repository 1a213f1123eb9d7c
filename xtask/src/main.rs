//! `cargo xtask`: setup, kernel, vm, install, bind, unbind, test.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod kernel;
mod toolchain;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ugds build, VM and test automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the Rust-enabled test kernel (cached outside the repository).
    Kernel {
        /// Build the debug flavour (KASAN, lockdep, atomic-sleep checks).
        #[arg(long)]
        debug: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Kernel { debug } => {
            let flavour = if debug {
                kernel::Flavour::Debug
            } else {
                kernel::Flavour::Normal
            };
            let k = kernel::ensure(flavour)?;
            println!("{}", k.bzimage().display());
        }
    }
    Ok(())
}
