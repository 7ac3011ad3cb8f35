//! `spechost plugin new|check|bench`: the tools of [`crate::authoring`], with their output.

use std::path::Path;

use crate::authoring::scaffold::{self, Lang};
use crate::authoring::{bench, check};
use crate::config::PluginCommand;
use crate::plugins::PluginKind;

/// Runs one `plugin` subcommand.
pub fn run(command: PluginCommand, cache: &Path) -> anyhow::Result<()> {
    match command {
        PluginCommand::New(args) => new(&args.into_config()?),
        PluginCommand::Check(args) => {
            let (options, json) = args.into_config(cache)?;
            let report = check::check(&options)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.text());
            }
            anyhow::ensure!(
                report.passed(),
                "{} does not conform: {} of {} checks failed (see above)",
                options.plugin.display(),
                report.failures(),
                report.checks.len()
            );
            Ok(())
        }
        PluginCommand::Bench(args) => bench::run(&args.into_config(cache)?, cache),
    }
}

/// Makes the project and says what to do next.
fn new(plugin: &scaffold::NewPlugin) -> anyhow::Result<()> {
    let root = scaffold::create(plugin)?;
    let flag = match plugin.kind {
        PluginKind::Drafter => "--cascade",
        PluginKind::Policy => "--policy",
    };
    let built = match plugin.lang {
        Lang::Rust => format!(
            "{}/target/wasm32-wasip2/release/{}.wasm",
            root.display(),
            plugin.name.replace('-', "_")
        ),
        Lang::Python => format!("{}/{}.wasm", root.display(), plugin.name),
    };
    println!(
        "created the {} {} plugin `{}` in {}\n\nnext:\n  {}/build.sh            # tests, builds {built} and checks it\n  spechost run --model smollm2 {flag} {built} --prompt \"...\"",
        plugin.lang.as_str(),
        plugin.kind.as_str(),
        plugin.name,
        root.display(),
        root.display(),
    );
    if plugin.kind == PluginKind::Drafter {
        println!("  spechost plugin bench {built}   # acceptance on a recorded trace, no model");
    }
    Ok(())
}
