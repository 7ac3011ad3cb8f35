//! `spechost models`: fetch, list and locate the default models, and requantize a model.

use std::path::Path;

use crate::config::{ModelsCommand, QuantizeArgs};
use crate::models::{DefaultModel, Quantized, quantize};

/// Runs a `spechost models` subcommand; paths go to stdout.
pub fn run(command: ModelsCommand, cache: &Path) -> anyhow::Result<()> {
    match command {
        ModelsCommand::Fetch { models } => {
            let models = if models.is_empty() {
                DefaultModel::ALL.to_vec()
            } else {
                models
            };
            for model in models {
                eprintln!("fetching {} ...", model.alias());
                let path = model.fetch(cache)?;
                println!("{}\t{}", model.alias(), path.display());
            }
            Ok(())
        }
        ModelsCommand::List => {
            for model in DefaultModel::ALL {
                let path = model.path(cache);
                let state = if path.exists() {
                    "cached"
                } else {
                    "not fetched"
                };
                println!("{}\t{}\t{state}", model.alias(), path.display());
            }
            Ok(())
        }
        ModelsCommand::Path { model } => {
            println!("{}", model.path(cache).display());
            Ok(())
        }
        ModelsCommand::Quantize(args) => quantize_model(args, cache),
    }
}

/// `spechost models quantize`: prints the output path on stdout.
fn quantize_model(args: QuantizeArgs, cache: &Path) -> anyhow::Result<()> {
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
