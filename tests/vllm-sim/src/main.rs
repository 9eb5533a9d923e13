//! `vllm-sim` binary: parse flags, start the server, stop cleanly on SIGTERM or Ctrl-C.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vllm_sim::config::SimArgs;

#[tokio::main]
async fn main() -> ExitCode {
    let args = SimArgs::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cfg = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vllm-sim: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let (listener, addr) = match vllm_sim::server::bind(&cfg).await {
        Ok(x) => x,
        Err(e) => {
            eprintln!("vllm-sim: cannot listen on {}:{}: {e}", cfg.host, cfg.port);
            return ExitCode::from(1);
        }
    };
    tracing::info!(
        %addr,
        model = %cfg.model,
        ranks = ?(cfg.dp_start..cfg.dp_start + cfg.dp_size),
        kv_tokens_per_rank = cfg.engine.token_capacity(),
        time_scale = cfg.time_scale,
        "vllm-sim listening"
    );
    // A machine-readable line for harnesses that start the simulator on port 0.
    println!("listening on http://{addr}");
    match vllm_sim::server::serve(cfg, listener, shutdown_signal(), Duration::from_secs(30)).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vllm-sim: server error: {e}");
            ExitCode::from(1)
        }
    }
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
}
