//! W3C trace context across processes. A job carries the `traceparent` of
//! the span that submitted it (a column of its row, a field of the worker's
//! `Assign`); the spans that follow it elsewhere take it as their parent, so
//! one trace runs from the HTTP request to the settlement. The propagator is
//! the process-wide one of `opentelemetry::global`, installed by the binary
//! when it exports traces; without it these are no-ops.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::Extractor;
use tracing_opentelemetry::OpenTelemetrySpanExt;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Marks this process as exporting traces (see [`enabled`]); called once the
/// OpenTelemetry layer and the propagator are installed.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether this process exports traces. The spans that exist only for
/// traces (one per job in each role) are made only then, so a process
/// without an OTLP endpoint pays nothing for them.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The `traceparent` header of `span`'s context, if it is part of a trace
/// (never without [`enabled`]).
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    if !enabled() {
        return None;
    }
    let cx = span.context();
    let mut carrier: HashMap<String, String> = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.inject_context(&cx, &mut carrier));
    carrier.remove("traceparent").filter(|value| !value.is_empty())
}

/// The trace id (32 hex digits) `span` belongs to: its OpenTelemetry
/// context's when traces are exported, else the one of `traceparent` (a
/// caller's header), so that logs name the caller's trace either way.
pub fn trace_id_of(span: &tracing::Span, traceparent: Option<&str>) -> Option<String> {
    if enabled() {
        use opentelemetry::trace::TraceContextExt;
        let cx = span.context();
        let context = cx.span().span_context().clone();
        if context.is_valid() {
            return Some(context.trace_id().to_string());
        }
    }
    // version "-" trace id "-" parent id "-" flags
    let mut parts = traceparent?.trim().split('-');
    let (_, trace_id) = (parts.next()?, parts.next()?);
    (trace_id.len() == 32
        && trace_id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        && trace_id.bytes().any(|b| b != b'0'))
    .then(|| trace_id.to_owned())
}

/// The `traceparent` of the current span.
pub fn current_traceparent() -> Option<String> {
    traceparent_of(&tracing::Span::current())
}

/// Makes the remote span of `traceparent` the parent of `span` (which must
/// not have been entered yet). Nothing happens without a valid value.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent.filter(|value| !value.is_empty()) else {
        return;
    };
    set_parent_from(span, &One(traceparent));
}

/// Makes the remote span of the carrier's `traceparent` (HTTP headers) the
/// parent of `span`.
pub fn set_parent_from(span: &tracing::Span, carrier: &dyn Extractor) {
    let cx = opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(carrier));
    use opentelemetry::trace::TraceContextExt;
    if cx.span().span_context().is_valid() {
        // Fails only where the span is disabled or has no OTel layer.
        let _ = span.set_parent(cx);
    }
}

/// Adds a link from `span` (not entered yet) to the span of `traceparent`,
/// as a batch links the jobs it handles. Nothing happens without a valid value.
pub fn add_link(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent.filter(|value| !value.is_empty()) else {
        return;
    };
    let cx = opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&One(traceparent)));
    use opentelemetry::trace::TraceContextExt;
    let context = cx.span().span_context().clone();
    if context.is_valid() {
        span.add_link(context);
    }
}

/// A carrier holding only a `traceparent`.
struct One<'a>(&'a str);

impl Extractor for One<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        key.eq_ignore_ascii_case("traceparent").then_some(self.0)
    }
    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}
