//! The `program-router` command line: the flags ([`crate::config::flags`]), the `calibrate` and
//! `config` subcommands, `--help` with every default, and hints for vllm-router's flags.
//!
//! Sits above everything it starts; nothing below imports it.

pub mod migrate;

use clap::{Parser, Subcommand};

use crate::config::RouterConfig;
use crate::config::flags::Flags;

/// program-router: OpenAI-compatible router over vLLM data-parallel ranks.
#[derive(Debug, Parser)]
#[command(
    name = "program-router",
    version,
    about,
    args_conflicts_with_subcommands = false
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub flags: Flags,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure a backend and print calibrated Program scheduling coefficients (JSON, or YAML
    /// for a ProgramScheduling resource with --format crd).
    Calibrate(crate::calibrate::CalibrateArgs),
    /// Inspect the configuration without starting the router.
    Config {
        #[command(subcommand)]
        what: ConfigCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration (file + flags + defaults) as JSON.
    Print,
    /// Print the JSON Schema of the configuration file.
    Schema,
}

/// The command line, with each flag's default added to its help: a help text that names its
/// field as `[config: path]` gets `; default: value` from `RouterConfig::default()`, so `--help`
/// cannot drift from the defaults the router really uses.
pub fn command() -> clap::Command {
    let defaults = serde_json::to_value(RouterConfig::default()).unwrap_or_default();
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let ids: Vec<clap::Id> = cmd.get_arguments().map(|a| a.get_id().clone()).collect();
    for id in ids {
        cmd = cmd.mut_arg(id, |a| match a.get_help().map(|h| h.to_string()) {
            Some(help) => {
                let help = with_default(&help, &defaults);
                a.help(help)
            }
            None => a,
        });
    }
    cmd
}

/// `help` with `[config: path]` turned into `[config: path; default: value]` (unchanged when the
/// tag is missing or the default is null or empty).
fn with_default(help: &str, defaults: &serde_json::Value) -> String {
    let Some((head, tail)) = help.split_once("[config: ") else {
        return help.to_string();
    };
    let Some((path, rest)) = tail.split_once(']') else {
        return help.to_string();
    };
    let value = path
        .split('.')
        .try_fold(defaults, |v, k| v.get(k))
        .and_then(|v| match v {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(a) if a.is_empty() => None,
            // 1800.0 reads as 1800 (a whole number of seconds).
            serde_json::Value::Number(n) => Some(match n.as_f64() {
                Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => {
                    format!("{}", f as i64)
                }
                _ => n.to_string(),
            }),
            v => Some(v.to_string()),
        });
    match value {
        Some(v) => format!("{head}[config: {path}; default: {v}]{rest}"),
        None => help.to_string(),
    }
}
