//! The `spechost` binary: parse the command line, call the library, print the error chain.

use std::process::ExitCode;

use clap::Parser;
use spechost::config::{Cli, Command, ModelsCommand, QuantizeArgs, SuffixCommand, cache_dir};
use spechost::models::{DefaultModel, Quantized, quantize};

fn main() -> ExitCode {
    spechost::telemetry::init();
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    let cache = cache_dir();
    match command {
        Command::Run(args) => {
            let config = args.into_config(&cache)?;
            spechost::run::run(&config, &cache)
        }
        Command::Bench(args) => {
            let config = args.into_config(&cache)?;
            spechost::bench::run(&config, &cache)
        }
        Command::Suffix(SuffixCommand::Warm(args)) => {
            let config = args.into_config(&cache)?;
            let report = spechost::warm::warm(&config, &cache)?;
            eprintln!(
                "warmed {} from {} texts ({} tokens): {} bytes",
                config.out.display(),
                report.texts,
                report.tokens,
                report.bytes
            );
            Ok(())
        }
        Command::Info(args) => spechost::info::run(args.into_config()?),
        Command::Serve(args) => {
            let config = args.into_config(&cache)?;
            spechost::server::serve(&config, &cache)
        }
        Command::Trace(args) => {
            let config = args.into_config(&cache)?;
            spechost::bench::trace::run(&config)
        }
        Command::Simulate(args) => {
            let config = args.into_config()?;
            spechost::bench::simulate::run(&config, &cache)
        }
        Command::Prompts(args) => {
            let config = args.into_config(&cache)?;
            spechost::bench::prompts::run(&config)
        }
        Command::Models(ModelsCommand::Fetch { models }) => {
            let models = if models.is_empty() {
                DefaultModel::ALL.to_vec()
            } else {
                models
            };
            for model in models {
                eprintln!("fetching {} ...", model.alias());
                let path = model.fetch(&cache)?;
                println!("{}\t{}", model.alias(), path.display());
            }
            Ok(())
        }
        Command::Models(ModelsCommand::List) => {
            for model in DefaultModel::ALL {
                let path = model.path(&cache);
                let state = if path.exists() {
                    "cached"
                } else {
                    "not fetched"
                };
                println!("{}\t{}\t{state}", model.alias(), path.display());
            }
            Ok(())
        }
        Command::Models(ModelsCommand::Path { model }) => {
            println!("{}", model.path(&cache).display());
            Ok(())
        }
        Command::Models(ModelsCommand::Quantize(args)) => quantize_model(args, &cache),
    }
}

/// `spechost models quantize`: prints the output path on stdout.
fn quantize_model(args: QuantizeArgs, cache: &std::path::Path) -> anyhow::Result<()> {
    let request = args.into_request(cache)?;
    if quantize(&request)? == Quantized::AlreadyThere {
        eprintln!(
            "{} was already made as {}; kept",
            request.output.display(),
            request.recipe()
        );
    }
    println!("{}", request.output.display());
    Ok(())
}
