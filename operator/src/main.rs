//! `program-operator`: runs the ProgramScheduling controller, optionally behind Lease-based leader
//! election, with `/healthz`, `/readyz` and `/metrics` on its probe listener.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use program_operator::controller::{self, Context, Scope};
use program_operator::telemetry::{self, Metrics};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Kubernetes operator for program-router.
#[derive(Debug, Parser)]
#[command(name = "program-operator", version, args_override_self = true)]
struct Cli {
    /// Watch only these namespaces, comma-separated (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE", value_delimiter = ',')]
    namespace: Vec<String>,
    /// Address of the `/healthz`, `/readyz` and `/metrics` listener.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Run the controller only while holding the leader Lease.
    #[arg(long, env = "LEADER_ELECT", default_value_t = false)]
    leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, default_value = "program-operator")]
    lease_name: String,
    /// Namespace of the leader Lease (defaults to the pod's own namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Seconds a lease stays valid after its last renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration_secs: u64,
    /// This replica's identity in the Lease and in Events.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Router images a ProgramScheduling may name, as image-reference prefixes (comma-separated,
    /// e.g. `registry.example/program-router@sha256:`); a resource naming another one is not
    /// rendered (Ready=False, InvalidSpec). Empty: any image (CR authors trusted as much as the
    /// operator).
    #[arg(long, env = "ALLOWED_ROUTER_IMAGES", value_delimiter = ',')]
    allowed_router_images: Vec<String>,
    /// The router image of a ProgramScheduling that names none (the chart sets the
    /// program-router image of its appVersion). Default: this operator's version.
    #[arg(long, env = "ROUTER_IMAGE", default_value = program_operator::controller::DEFAULT_ROUTER_IMAGE)]
    router_image: String,
    /// The OTLP/gRPC collector the routers of a ProgramScheduling without `router.tracing`
    /// export traces to (an http:// URL); unset: no traces unless a resource asks.
    #[arg(long, env = "ROUTER_OTLP_TRACES_ENDPOINT")]
    router_otlp_traces_endpoint: Option<String>,
    /// Share of the traces starting at those routers that are exported, 0 to 1.
    #[arg(long, env = "ROUTER_OTEL_SAMPLING_RATIO", default_value_t = 1.0)]
    router_otel_sampling_ratio: f64,
    #[arg(long, value_enum, default_value = "json")]
    log_format: LogFormat,
    /// Log filter: `level` or `target=level`, comma-separated (`warn,program_operator=debug`).
    #[arg(long, env = "RUST_LOG", default_value = "info", value_parser = log_level)]
    log_level: String,
}

/// A log filter the router's parser takes; a bad one stops the operator at start, named.
fn log_level(s: &str) -> Result<String, String> {
    program_router::observe::log_filter::parse(s).map(|_| s.to_string())
}

/// The router's subscriber: routers and operator write one JSON log shape.
fn init_logs(cli: &Cli) {
    // No traces: the operator serves no requests.
    let _ = program_router::observe::log::install(
        &cli.log_level,
        matches!(cli.log_format, LogFormat::Json),
        None,
    );
}

fn identity(cli: &Cli) -> String {
    cli.identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("program-operator-{}", std::process::id()))
}

async fn run(cli: Cli) -> Result<(), String> {
    if cli.router_image.trim().is_empty() || cli.router_image.ends_with(":latest") {
        return Err(format!(
            "--router-image: {:?} must name a version (a tag other than latest, or a digest)",
            cli.router_image
        ));
    }
    if let Some(e) = &cli.router_otlp_traces_endpoint
        && !e.trim().is_empty()
        && !e.starts_with("http://")
    {
        return Err(format!(
            "--router-otlp-traces-endpoint: {e:?} must be an http:// URL of an OTLP/gRPC collector"
        ));
    }
    if !(0.0..=1.0).contains(&cli.router_otel_sampling_ratio) {
        return Err(format!(
            "--router-otel-sampling-ratio: {} must be within 0 and 1",
            cli.router_otel_sampling_ratio
        ));
    }
    let metrics = Metrics::new().map_err(|e| format!("metrics: {e}"))?;
    let listener = telemetry::bind(cli.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", cli.listen))?;
    tokio::spawn(telemetry::serve(listener, metrics.clone()));

    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("Kubernetes client: {e}"))?;
    let scopes: Vec<Scope> = if cli.namespace.is_empty() {
        vec![Scope::All]
    } else {
        cli.namespace
            .iter()
            .map(|ns| ns.trim())
            .filter(|ns| !ns.is_empty())
            .map(|ns| Scope::Namespace(ns.to_string()))
            .collect()
    };
    let me = identity(&cli);
    let mut ctx = Context::new(client.clone(), metrics.clone(), me.clone());
    ctx.router_image = cli.router_image.clone();
    ctx.router_tracing = cli
        .router_otlp_traces_endpoint
        .clone()
        .filter(|e| !e.trim().is_empty())
        .map(|endpoint| program_operator::crd::TracingSpec {
            enabled: true,
            otlp_traces_endpoint: Some(endpoint),
            sampling_ratio: Some(cli.router_otel_sampling_ratio),
        });
    ctx.allowed_images = cli
        .allowed_router_images
        .iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    let ctx = Arc::new(ctx);

    if !cli.leader_elect {
        metrics.leader.set(1);
        tracing::info!(scopes = ?scopes, "controller starting (no leader election)");
        controller::run_all(ctx, scopes, program_router::run::shutdown_signal()).await;
        return Ok(());
    }

    let lease_ns = cli
        .lease_namespace
        .clone()
        .ok_or("--leader-elect needs --lease-namespace (or POD_NAMESPACE)")?;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), &lease_ns);
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client, &cli.lease_name)
        .with_namespace(&lease_ns)
        .with_identity(&me)
        .with_duration(cli.lease_duration_secs.max(5))
        // Renewed at half its life, so a renewal has time to land before the fence (which
        // stops the leader 3 s before expiry) gives up on it.
        .with_grace((cli.lease_duration_secs / 2).max(2))
        .build()
        .await
        .map_err(|e| format!("leader election: {e}"))?;
    let (mut leading, task) = manager.watch().await;
    // A standby replica is healthy and ready: it is waiting for the lease, not broken.
    metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(lease = %cli.lease_name, namespace = %lease_ns, identity = %me, "waiting for the leader lease");
    let shutdown = program_router::run::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            r = leading.changed() => if r.is_err() { return Err("leader election stopped".into()) },
            _ = &mut shutdown => return Ok(()),
        }
    }
    metrics.leader.set(1);
    tracing::info!(identity = %me, scopes = ?scopes, "leading; controller starting");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(controller::run_all(ctx, scopes, async move {
        let _ = stop_rx.await;
    }));
    // The lease manager never says the lease is lost while the API server is unreachable:
    // the fence stops this replica before a standby can take over.
    let fence = program_operator::fence::lost(leases, cli.lease_name.clone(), me.clone());
    tokio::pin!(fence);
    let lost = loop {
        tokio::select! {
            r = leading.changed() => match r {
                Ok(()) if *leading.borrow_and_update() => continue,
                _ => break true,
            },
            _ = &mut fence => break true,
            _ = &mut shutdown => break false,
        }
    };
    metrics.leader.set(0);
    if lost {
        // No reconcile in flight may finish a write now: another replica may act soon.
        ctl.abort();
    } else {
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), ctl).await;
    }
    drop(leading);
    if let Ok(Ok(Ok(m))) = tokio::time::timeout(Duration::from_secs(5), task).await {
        let _ = m.release().await;
    }
    if lost {
        // Another replica may already act; stop so the pod restarts as a standby.
        return Err("lost the leader lease".into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let _flush = program_router::observe::log_writer::FlushOnExit;
    init_logs(&cli);
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "program-operator stopped");
            eprintln!("program-operator: {e}");
            ExitCode::FAILURE
        }
    }
}
