//! The `spechost` binary: parse the command line, call the library, print the error chain.

use std::process::ExitCode;

use clap::Parser;
use spechost::config::Cli;

fn main() -> ExitCode {
    spechost::telemetry::init();
    let cli = Cli::parse();
    match spechost::commands::dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
