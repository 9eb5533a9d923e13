use std::sync::{Arc, Mutex};

use tracing_subscriber::layer::SubscriberExt;

use super::*;

/// Records the messages of the events that reach it.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl<S: Subscriber> Layer<S> for Seen {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    *self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = String::new();
        event.record(&mut Message(&mut m));
        self.0.lock().expect("seen").push(m);
    }
}

fn emit() {
    tracing::debug!(target: "program_router::x", "router debug");
    tracing::info!(target: "program_router::x", "router info");
    tracing::debug!(target: "hyper::proto", "hyper debug");
    tracing::warn!(target: "hyper::proto", "hyper warn");
}

fn filter(level: &str) -> LogFilter {
    LogFilter::new(parse(level).expect("a valid filter"))
}

#[test]
fn levels_and_targets_filter_and_a_new_filter_applies_at_once() {
    for per_layer in [false, true] {
        let seen = Seen::default();
        let f = filter("info");
        let dispatch: tracing::Dispatch = if per_layer {
            tracing_subscriber::registry()
                .with(seen.clone().with_filter(f.clone()))
                .into()
        } else {
            tracing_subscriber::registry()
                .with(f.clone())
                .with(seen.clone())
                .into()
        };
        tracing::dispatcher::with_default(&dispatch, || {
            emit();
            f.set(parse("warn,program_router=debug").expect("valid"));
            emit();
            f.set(parse("off").expect("valid"));
            emit();
        });
        let seen = seen.0.lock().expect("seen").clone();
        assert_eq!(
            seen,
            [
                "router info",
                "hyper warn",
                "router debug",
                "router info",
                "hyper warn"
            ],
            "per layer: {per_layer}"
        );
    }
}

#[test]
fn the_most_verbose_level_is_the_hint() {
    assert_eq!(filter("info").max_level(), Some(LevelFilter::INFO));
    assert_eq!(
        filter("warn,program_router=debug").max_level(),
        Some(LevelFilter::DEBUG)
    );
    assert_eq!(
        filter("program_router=trace").max_level(),
        Some(LevelFilter::TRACE)
    );
    assert_eq!(filter("off").max_level(), Some(LevelFilter::OFF));
}

#[test]
fn a_filter_by_span_or_field_is_refused_with_the_syntax_taken() {
    for bad in [
        "program_router[request{id=1}]=debug",
        "program_router[request]=debug",
        "[{id=1}]",
        "info,x=loud",
    ] {
        let e = parse(bad).expect_err(bad);
        assert!(e.contains("target=level"), "{e}");
    }
    for good in [
        "info",
        "warn,program_router=debug",
        "off",
        "trace",
        "program_router",
    ] {
        assert!(parse(good).is_ok(), "{good}");
    }
}
