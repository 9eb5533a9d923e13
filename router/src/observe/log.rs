//! The process's log subscriber, for the router and the operator alike. One JSON shape: an object
//! per line with `timestamp`, `level`, `target` (the module) and `fields` (`message` and the
//! event's own, which may include a `target` of their own), on stderr through a writer thread
//! (`log_writer`). Installed once by a
//! binary, with a filter that a reloaded configuration's `log_level` replaces in place (no
//! restart to turn on `debug` while a problem is happening). Library users that never install it
//! (tests, embedders) reload as a no-op.

use std::sync::OnceLock;

use tracing_subscriber::{EnvFilter, Layer, Registry, layer::SubscriberExt, reload};

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Installs the global subscriber: the log (stderr, JSON lines when `json`, else text; shapes in
/// `log_format`) filtered
/// by `level`, and with `trace` the OpenTelemetry exporter, whose handle the caller shuts down at
/// exit. An invalid filter falls back to `info` (the configuration was validated before, so only
/// a defect gets there).
pub fn install(
    level: &str,
    json: bool,
    trace: Option<&super::trace::Settings>,
) -> Result<Option<super::trace::Exporter>, String> {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let format = if json {
        super::log_format::LineFormat::json()
    } else {
        super::log_format::LineFormat::text(super::log_format::stderr_is_a_terminal())
    };
    let log = tracing_subscriber::fmt::layer()
        .event_format(format)
        .fmt_fields(format.fields())
        .with_writer(super::log_writer::Buffered);
    let registry = tracing_subscriber::registry().with(log.with_filter(filter));
    let (otel, exporter) = match trace {
        Some(settings) => {
            let (layer, exporter) = super::trace::layer(settings)?;
            (Some(layer), Some(exporter))
        }
        None => (None, None),
    };
    if tracing::subscriber::set_global_default(registry.with(otel)).is_ok() {
        let _ = FILTER.set(handle);
    }
    Ok(exporter)
}

/// Replaces the installed filter with `level` (a `tracing` filter the config validation
/// accepted); nothing to do when no subscriber was installed by [`install`].
pub fn set_level(level: &str) -> Result<(), String> {
    let Some(handle) = FILTER.get() else {
        return Ok(());
    };
    let filter = EnvFilter::try_new(level).map_err(|e| e.to_string())?;
    handle.reload(filter).map_err(|e| e.to_string())
}
