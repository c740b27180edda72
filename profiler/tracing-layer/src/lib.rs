//! A [`tracing`](https://docs.rs/tracing) layer that turns chosen spans into memsight phases: while
//! a chosen span is entered on a thread, that thread is in a phase of the span's name (nested as
//! the spans are), so the job's report, viewer and timeline show each span's time, peak and net
//! memory. A job links this crate only if it wants it.
//!
//! ```
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! let layer = memsight_tracing::MemsightLayer::new()
//!     .with_target("my_trainer") // every span of this crate (and its modules)
//!     .with_name("data_loading"); // and spans of this name, whatever their target
//! let subscriber = tracing_subscriber::registry().with(layer);
//! tracing::subscriber::with_default(subscriber, || {
//!     // Chosen by its `memsight.phase` field (the field's value names the phase).
//!     let span = tracing::info_span!("step", memsight.phase = "train");
//!     let _in = span.enter();
//!     assert_eq!(memsight::current_phase().as_deref(), Some("train"));
//! });
//! ```
//!
//! Which spans: those carrying a field `memsight.phase` (named by its value), those whose target
//! starts with a prefix given to [`MemsightLayer::with_target`], and those whose name was given to
//! [`MemsightLayer::with_name`] (named by the span's name); [`MemsightLayer::all_spans`] takes
//! every span.
//!
//! Phases follow their thread: each *entry* of a span is a phase on the thread that entered it,
//! closed when that thread exits the span. An async task's span (`Instrument`) is entered at each
//! poll, so the task's phase is open while it runs, on whichever thread polls it, and its
//! statistics count each poll as one entry; the time between polls is not in the phase.

use memsight::PhaseGuard;
use std::thread::ThreadId;
use tracing_core::field::{Field, Visit};
use tracing_core::span::{Attributes, Id};
use tracing_core::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The field that chooses a span and names its phase.
pub const PHASE_FIELD: &str = "memsight.phase";

/// The layer: add it to a `tracing_subscriber` registry.
#[derive(Clone, Debug, Default)]
pub struct MemsightLayer {
    targets: Vec<String>,
    names: Vec<String>,
    all: bool,
}

impl MemsightLayer {
    /// A layer that chooses only spans carrying the field `memsight.phase`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also chooses every span whose target starts with `prefix` (a crate or module path).
    pub fn with_target(mut self, prefix: impl Into<String>) -> Self {
        self.targets.push(prefix.into());
        self
    }

    /// Also chooses every span named `name`.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.names.push(name.into());
        self
    }

    /// Chooses every span.
    pub fn all_spans(mut self) -> Self {
        self.all = true;
        self
    }

    fn chooses(&self, meta: &Metadata<'_>) -> bool {
        self.all
            || self.names.iter().any(|n| n == meta.name())
            || self.targets.iter().any(|t| {
                meta.target()
                    .strip_prefix(t.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
            })
    }
}

/// A chosen span's phase name (in the span's extensions).
struct PhaseName(String);

/// The phases a span has open, one per entry, with the thread that entered it.
#[derive(Default)]
struct Open(Vec<(ThreadId, PhaseGuard)>);

/// Finds the `memsight.phase` field's value.
#[derive(Default)]
struct NameField(Option<String>);

impl Visit for NameField {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == PHASE_FIELD {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == PHASE_FIELD && self.0.is_none() {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S> Layer<S> for MemsightLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut field = NameField::default();
        attrs.record(&mut field);
        let meta = attrs.metadata();
        let name = field
            .0
            .or_else(|| self.chooses(meta).then(|| meta.name().to_string()));
        if let (Some(name), Some(span)) = (name, ctx.span(id)) {
            span.extensions_mut().insert(PhaseName(name));
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut ext = span.extensions_mut();
        let Some(name) = ext.get_mut::<PhaseName>().map(|n| n.0.clone()) else {
            return;
        };
        let guard = memsight::phase(&name);
        let me = std::thread::current().id();
        match ext.get_mut::<Open>() {
            Some(open) => open.0.push((me, guard)),
            None => ext.insert(Open(vec![(me, guard)])),
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let me = std::thread::current().id();
        let guard = {
            let mut ext = span.extensions_mut();
            let Some(open) = ext.get_mut::<Open>() else {
                return;
            };
            match open.0.iter().rposition(|(t, _)| *t == me) {
                Some(i) => Some(open.0.remove(i).1),
                None => None,
            }
        };
        // Closed outside the span's extensions lock.
        drop(guard);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        // Entries never exited (a span dropped while entered) close with the span.
        let open = ctx
            .span(&id)
            .and_then(|span| span.extensions_mut().remove::<Open>());
        drop(open);
    }
}
