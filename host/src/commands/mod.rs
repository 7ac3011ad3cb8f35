//! The subcommands, each a thin step from its validated config to the library: `main` parses
//! the command line and calls [`dispatch`]; every command's work lives in its own module
//! (`run`, `models` and `plugin` here; `server`, `bench`, `warm`, `info` for the others).

mod models;
mod plugin;
mod run;

use std::path::Path;

use crate::config::{Command, SuffixCommand, cache_dir};

/// Validates `command`'s flags and runs it.
pub fn dispatch(command: Command) -> anyhow::Result<()> {
    let cache = cache_dir();
    match command {
        Command::Run(args) => run::run(&args.into_config(&cache)?, &cache),
        Command::Bench(args) => crate::bench::run(&args.into_config(&cache)?, &cache),
        Command::Serve(args) => crate::server::serve(&args.into_config(&cache)?, &cache),
        Command::Suffix(SuffixCommand::Warm(args)) => warm(&args.into_config(&cache)?, &cache),
        Command::Info(args) => crate::info::run(args.into_config(&cache)?),
        Command::Trace(args) => crate::bench::trace::run(&args.into_config(&cache)?),
        Command::Simulate(args) => crate::bench::simulate::run(&args.into_config()?, &cache),
        Command::Prompts(args) => crate::bench::prompts::run(&args.into_config(&cache)?),
        Command::CheckOutputs(args) => crate::bench::check_outputs::run(&args.into_config(&cache)?),
        Command::Models(command) => models::run(command, &cache),
        Command::Plugin(command) => plugin::run(command, &cache),
    }
}

/// `spechost suffix warm`: fills the cache file and says how much went in.
fn warm(config: &crate::config::WarmConfig, cache: &Path) -> anyhow::Result<()> {
    let report = crate::warm::warm(config, cache)?;
    eprintln!(
        "warmed {} from {} texts ({} tokens): {} bytes",
        config.out.display(),
        report.texts,
        report.tokens,
        report.bytes
    );
    Ok(())
}
