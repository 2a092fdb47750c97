//! `gpuvisor`: plan, enforce and supervise GPU memory budgets for multi-process jobs.
//!
//! This binary is a thin layer: argument parsing lives in [`cli`], each command in
//! [`commands`], and the logic in the library crates.

mod cli;
mod commands;
mod failure;
mod inventory;
mod sha256;
mod shim;
mod table;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match commands::run(cli) {
        Ok(code) => code,
        Err(failure) => failure.report(),
    }
}
