//! The process's log subscriber, for the router and the operator alike. One JSON shape: an object
//! per line with `timestamp`, `level`, `target` (the module) and `fields` (`message` and the
//! event's own, which may include a `target` of their own), on stderr through a writer thread
//! (`log_writer`). Installed once by a
//! binary, with a filter that a reloaded configuration's `log_level` replaces in place (no
//! restart to turn on `debug` while a problem is happening). Library users that never install it
//! (tests, embedders) reload as a no-op.

use std::sync::OnceLock;

use tracing_subscriber::{Layer, layer::SubscriberExt};

use super::log_filter::{self, LogFilter};
use super::log_format::LineFormat;
use super::log_writer::Buffered;

static FILTER: OnceLock<LogFilter> = OnceLock::new();

/// Installs the global subscriber: the log (stderr, JSON lines when `json`, else text; shapes in
/// `log_format`) filtered by `level`, and with `trace` the OpenTelemetry exporter, whose handle
/// the caller shuts down at exit. An invalid `level` is an error (the router's configuration and
/// the operator's flag were checked with the same parser before, so only a defect gets there).
///
/// Without `trace` the filter is the subscriber's own: a span or event it turns away is never
/// built, and entering a span asks no per-layer filter. With `trace` it filters the
/// log alone, as the exporter takes spans at any log level, and the log never sees the exporter's
/// spans (target `trace::TARGET`).
pub fn install(
    level: &str,
    json: bool,
    trace: Option<&super::trace::Settings>,
) -> Result<Option<super::trace::Exporter>, String> {
    let filter = LogFilter::new(log_filter::parse(level).map_err(|e| format!("log_level: {e}"))?);
    let handle = filter.clone();
    let format = if json {
        LineFormat::json()
    } else {
        LineFormat::text(super::log_format::stderr_is_a_terminal())
    };
    let (installed, exporter) = match trace {
        Some(settings) => {
            let (otel, exporter) = super::trace::layer(settings)?;
            // The exporter's spans are not the log's: its lines never list them.
            let not_traces =
                tracing_subscriber::filter::filter_fn(|m| m.target() != super::trace::TARGET);
            let subscriber = tracing_subscriber::registry()
                .with(log(format).with_filter(not_traces).with_filter(filter))
                .with(otel);
            (
                tracing::subscriber::set_global_default(subscriber),
                Some(exporter),
            )
        }
        None => {
            let subscriber = tracing_subscriber::registry()
                .with(filter)
                .with(log(format));
            (tracing::subscriber::set_global_default(subscriber), None)
        }
    };
    if installed.is_ok() {
        let _ = FILTER.set(handle);
    }
    Ok(exporter)
}

/// The log's layer: lines in `format`, to the buffered writer.
fn log<S>(
    format: LineFormat,
) -> tracing_subscriber::fmt::Layer<S, super::log_format::SpanFields, LineFormat, Buffered>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .event_format(format)
        .fmt_fields(format.fields())
        .with_writer(Buffered)
}

/// Replaces the installed filter with `level` (a `tracing` filter the config validation
/// accepted); nothing to do when no subscriber was installed by [`install`].
pub fn set_level(level: &str) -> Result<(), String> {
    let Some(handle) = FILTER.get() else {
        return Ok(());
    };
    handle.set(log_filter::parse(level)?);
    Ok(())
}
