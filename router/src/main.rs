//! `program-router` binary: CLI → config → serve, with `config print|schema` helpers.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use program_router::config::cli::{Cli, Command, ConfigCommand};
use program_router::config::{LogFormat, RouterConfig};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Config {
        what: ConfigCommand::Schema,
    }) = &cli.command
    {
        println!(
            "{}",
            serde_json::to_string_pretty(&RouterConfig::schema()).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    let config = match cli.flags.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("program-router: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Config {
        what: ConfigCommand::Print,
    }) = &cli.command
    {
        let mut shown = config.clone();
        if shown.api_key.is_some() {
            shown.api_key = Some("<redacted>".into());
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&shown).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let sub = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Json => sub.json().init(),
        LogFormat::Text => sub.init(),
    }
    if config.workers.is_empty() {
        tracing::warn!(
            "no workers configured: every generation request will get 503 until a reload adds some"
        );
    }
    let bound = match program_router::run::bind(config.clone(), cli.flags).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("program-router: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    tracing::info!(
        addr = %bound.api_addr,
        metrics = ?bound.metrics.as_ref().map(|m| m.1),
        targets = bound.state.applied.load().targets.targets.len(),
        policy = config.policy.kind.as_str(),
        hash = %bound.state.applied.load().hash,
        "program-router listening"
    );
    println!("listening on http://{}", bound.api_addr);
    bound.serve(shutdown_signal()).await;
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutdown signal received");
}
