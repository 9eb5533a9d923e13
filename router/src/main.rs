//! `program-router` binary: CLI → config → serve, with `config print|schema` helpers.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::FromArgMatches;
use program_router::cli::{Cli, Command, ConfigCommand};
use program_router::config::RouterConfig;

/// mimalloc: the proxy allocates and frees small buffers on every request; glibc malloc cost
/// a visible share of the router's CPU under load, mimalloc's thread-local free lists far less.
/// The `system-alloc` feature keeps the system allocator, for heap profilers (valgrind massif,
/// heaptrack) that see only `malloc`.
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exits with clap's error; an unknown vllm-router flag also gets what to use instead.
fn exit_with_hint(e: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() == ErrorKind::UnknownArgument
        && let Some(ContextValue::String(flag)) = e.get(ContextKind::InvalidArg)
        && let Some(hint) = program_router::cli::migrate::vllm_router_hint(flag)
    {
        let _ = e.print();
        eprintln!("\nhint: {flag} is a vllm-router flag; {hint}.");
        std::process::exit(2);
    }
    if e.kind() == ErrorKind::InvalidValue
        && let Some(ContextValue::String(value)) = e.get(ContextKind::InvalidValue)
        && let Some(hint) = program_router::cli::migrate::policy_hint(value)
    {
        let _ = e.print();
        eprintln!("\nhint: {value} is a vllm-router policy; {hint}.");
        std::process::exit(2);
    }
    e.exit()
}

#[tokio::main]
async fn main() -> ExitCode {
    let matches = program_router::cli::command()
        .try_get_matches()
        .unwrap_or_else(|e| exit_with_hint(e));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(Command::Calibrate(args)) = &cli.command {
        if let Some(file) = &cli.flags.config {
            eprintln!(
                "program-router calibrate: reads no --config ({}); it measures the one server \
                 given by --worker-url (with --dp-rank and --api-key)",
                file.display()
            );
            return ExitCode::from(2);
        }
        return calibrate(args).await;
    }
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
        for k in shown.client_api_keys.iter_mut().flatten() {
            *k = "<redacted>".into();
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&shown).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    let trace = config
        .enable_trace
        .then(|| program_router::observe::trace::Settings {
            endpoint: config
                .otlp_traces_endpoint
                .clone()
                .unwrap_or_else(|| program_router::config::DEFAULT_OTLP_TRACES_ENDPOINT.into()),
            sampling_ratio: config.otel_sampling_ratio,
        });
    let _flush = program_router::observe::log_writer::FlushOnExit;
    let exporter = match program_router::observe::log::install(
        &config.log_level,
        config.log_format == program_router::config::LogFormat::Json,
        trace.as_ref(),
    ) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("program-router: tracing: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(ps) = &config.program_scheduling {
        warn_reference_calibration(ps, &cli.flags);
    }
    if config.api_key.is_some()
        && config.client_api_keys.as_ref().is_some_and(Vec::is_empty)
        && config.client_api_keys_dir.is_none()
    {
        tracing::warn!(
            "client_api_keys is [] with an api_key set: every client reaches the workers with the \
             router's key; only run this way behind a gateway that authenticates"
        );
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
        metrics = bound.metrics.as_ref().map(|m| m.1.to_string()),
        peer = bound.peer.as_ref().map(|m| m.1.to_string()),
        targets = bound.state.applied.load().targets.targets.len(),
        policy = config.policy.kind.as_str(),
        hash = %bound.state.applied.load().hash,
        "program-router listening"
    );
    // One write, the API's line first: a reader that stops after that line (and closes the pipe)
    // cannot make a later line fail; `--port 0` users learn every chosen port here.
    let mut lines = format!("listening on http://{}\n", bound.api_addr);
    if let Some((_, addr)) = &bound.metrics {
        lines.push_str(&format!("metrics on http://{addr}\n"));
    }
    if let Some((_, addr)) = &bound.peer {
        lines.push_str(&format!("peers on http://{addr}\n"));
    }
    print!("{lines}");
    let served = bound.serve(program_router::run::shutdown_signal()).await;
    // Spans still queued go to the collector before the process ends.
    if let Some(e) = exporter {
        e.shutdown();
    }
    if let Err(e) = served {
        eprintln!("program-router: stopped after an internal error: {e}");
        // EX_SOFTWARE: the orchestrator restarts it with fresh state.
        return ExitCode::from(70);
    }
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// The spec's startup warning: which calibration coefficients the configuration leaves at their
/// reference values.
fn warn_reference_calibration(
    ps: &program_router::config::ProgramSchedulingConfig,
    flags: &program_router::config::flags::Flags,
) {
    use program_router::program::cost::{decode_throughput, prefill_seconds};
    if ps.binding_only {
        return;
    }
    let defaulted = flags.omitted_coefficients();
    if defaulted.is_empty() {
        return;
    }
    let (p, d) = (&ps.prefill_cost_model, &ps.decode_throughput_model);
    tracing::warn!(
        event = "program_scheduling_reference_calibration",
        defaulted_fields = %defaulted.join(","),
        effective_prefill_seconds_50k_tokens = prefill_seconds(p, 50_000),
        effective_decode_tokens_per_second_batch4_ctx200k = decode_throughput(d, 4, 200_000),
        "Program scheduling uses reference calibration coefficients; calibrate them for this deployment (docs/program-scheduling.md)"
    );
}

async fn calibrate(args: &program_router::calibrate::CalibrateArgs) -> ExitCode {
    match program_router::calibrate::run(args).await {
        Ok(c) => {
            let json = serde_json::to_string_pretty(&c).unwrap_or_default();
            if let Some(why) = c.poor_fit(args.min_r2) {
                eprintln!(
                    "program-router calibrate: {why}; not printing coefficients. Samples:\n{json}"
                );
                return ExitCode::from(3);
            }
            match args.format {
                program_router::calibrate::Format::Json => println!("{json}"),
                program_router::calibrate::Format::Crd => match c.crd_yaml() {
                    Ok(yaml) => print!("{yaml}"),
                    Err(e) => {
                        eprintln!("program-router calibrate: {e}");
                        return ExitCode::from(1);
                    }
                },
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("program-router calibrate: {e}");
            ExitCode::from(1)
        }
    }
}
