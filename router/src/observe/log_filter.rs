//! The log's filter: which spans and events the log records, by target and level, in
//! `tracing_subscriber`'s `Targets` syntax (`info`; `warn,program_router=debug`; `off`), and
//! replaced in place when a reload changes `log_level`.
//!
//! Only a callsite's first use and a reload ask it (the answer is cached in the callsite as
//! always or never). Entering and leaving a span ask it nothing: with tracing on, a request's
//! spans are entered on every poll, and `EnvFilter` behind `reload::Layer` took two shared read
//! locks each time (one for the reload, one for its table of spans matched by field), a write
//! to shared memory per poll of every request on every I/O thread. Filters by span or field value
//! (`target[span{field=value}]=level`), which only that table served, are refused.

use std::str::FromStr;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context, Filter, Layer};

/// Parses a `log_level`: what the router validates at start and on reload.
pub fn parse(level: &str) -> Result<Targets, String> {
    // `Targets` would read `target[span]` as a target of that name, which nothing matches.
    if level.contains(['[', ']', '{', '}']) {
        return Err(
            "filters by span or field value (`target[span{field=value}]=level`) are not taken: \
             a list of `level` or `target=level`, such as `warn,program_router=debug`"
                .into(),
        );
    }
    Targets::from_str(level).map_err(|e| {
        format!(
            "{e}: a list of `level` or `target=level` (trace, debug, info, warn, error, off), \
             such as `warn,program_router=debug`"
        )
    })
}

/// The installed filter; clones share it, so [`LogFilter::set`] on one applies to all.
#[derive(Clone, Debug)]
pub struct LogFilter(Arc<RwLock<Targets>>);

impl LogFilter {
    pub fn new(targets: Targets) -> Self {
        LogFilter(Arc::new(RwLock::new(targets)))
    }

    /// Applies `targets` from now on: every callsite's cached answer is asked again.
    pub fn set(&self, targets: Targets) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = targets;
        // After the write lock is gone: the rebuild asks `register_callsite`, which reads.
        tracing::callsite::rebuild_interest_cache();
    }

    fn current(&self) -> RwLockReadGuard<'_, Targets> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    fn interest(&self, meta: &Metadata<'_>) -> Interest {
        if self.enables(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enables(&self, meta: &Metadata<'_>) -> bool {
        self.current().would_enable(meta.target(), meta.level())
    }

    /// The most verbose level any directive enables (`Targets`' own answer).
    fn max_level(&self) -> Option<LevelFilter> {
        Filter::<()>::max_level_hint(&*self.current())
    }
}

/// As the subscriber's own filter (no exporter): a span or event it refuses is never built.
impl<S: Subscriber> Layer<S> for LogFilter {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        self.interest(meta)
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        self.enables(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.max_level()
    }
}

/// As the log layer's filter (beside the OpenTelemetry exporter, which takes spans at any level).
impl<S> Filter<S> for LogFilter {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.enables(meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        self.interest(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.max_level()
    }
}

#[cfg(test)]
mod tests;
