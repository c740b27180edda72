//! The tracing layer: chosen spans become phases nested as the spans are, unchosen spans do not,
//! spans on another thread are that thread's phases, an async task's span follows the thread that
//! polls it, and a session's report measures a span's memory.

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

fn layer() -> memsight_tracing::MemsightLayer {
    memsight_tracing::MemsightLayer::new()
        .with_target("layer::model")
        .with_name("backward")
}

fn with_layer<R>(f: impl FnOnce() -> R) -> R {
    let subscriber = tracing_subscriber::registry().with(layer());
    tracing::subscriber::with_default(subscriber, f)
}

#[test]
fn chosen_spans_are_phases_nested_as_the_spans_are() {
    with_layer(|| {
        let train = tracing::info_span!("loop", memsight.phase = "train");
        let _t = train.enter();
        assert_eq!(memsight::current_phase().as_deref(), Some("train"));
        {
            let fwd = tracing::info_span!(target: "layer::model::mlp", "forward");
            let _f = fwd.enter();
            assert_eq!(memsight::current_phase().as_deref(), Some("train/forward"));
            // Not chosen: no phase of its own.
            let log = tracing::info_span!(target: "other_crate", "flush");
            let _l = log.enter();
            assert_eq!(memsight::current_phase().as_deref(), Some("train/forward"));
        }
        // A target that only shares a prefix of letters is not chosen.
        let near = tracing::info_span!(target: "layer::modeling", "near");
        let _n = near.enter();
        assert_eq!(memsight::current_phase().as_deref(), Some("train"));
        drop(_n);
        let bwd = tracing::info_span!(target: "anything", "backward");
        bwd.in_scope(|| {
            assert_eq!(memsight::current_phase().as_deref(), Some("train/backward"));
        });
        assert_eq!(memsight::current_phase().as_deref(), Some("train"));
    });
    assert_eq!(memsight::current_phase(), None);
}

#[test]
fn a_span_entered_on_another_thread_is_that_threads_phase() {
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer()));
    tracing::dispatcher::with_default(&dispatch, || {
        let outer = tracing::info_span!("outer", memsight.phase = "main-loop");
        let _o = outer.enter();
        let d = dispatch.clone();
        let seen = std::thread::spawn(move || {
            tracing::dispatcher::with_default(&d, || {
                let load = tracing::info_span!("load", memsight.phase = "load");
                load.in_scope(memsight::current_phase)
            })
        })
        .join()
        .unwrap();
        assert_eq!(seen.as_deref(), Some("load"));
        assert_eq!(memsight::current_phase().as_deref(), Some("main-loop"));
    });
}

/// A future that is pending once, then ready; says its thread's phase at each poll.
struct TwoPolls(Vec<Option<String>>);

impl Future for TwoPolls {
    type Output = Vec<Option<String>>;
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.push(memsight::current_phase());
        if self.0.len() == 1 {
            Poll::Pending
        } else {
            Poll::Ready(std::mem::take(&mut self.0))
        }
    }
}

#[test]
fn an_async_tasks_span_follows_the_thread_that_polls_it() {
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer()));
    let mut task = tracing::dispatcher::with_default(&dispatch, || {
        Box::pin(TwoPolls(Vec::new()).instrument(tracing::info_span!("t", memsight.phase = "task")))
    });
    let mut cx = Context::from_waker(Waker::noop());
    tracing::dispatcher::with_default(&dispatch, || {
        let busy = tracing::info_span!("busy", memsight.phase = "busy");
        let _b = busy.enter();
        assert!(task.as_mut().poll(&mut cx).is_pending());
    });
    // Between polls the task is in no phase of this thread.
    assert_eq!(memsight::current_phase(), None);
    let d = dispatch.clone();
    let seen = std::thread::spawn(move || {
        tracing::dispatcher::with_default(&d, || {
            let mut cx = Context::from_waker(Waker::noop());
            match task.as_mut().poll(&mut cx) {
                Poll::Ready(v) => v,
                Poll::Pending => panic!("pending twice"),
            }
        })
    })
    .join()
    .unwrap();
    assert_eq!(
        seen,
        [Some("busy/task".to_string()), Some("task".to_string())]
    );
}

#[test]
fn a_sessions_report_measures_a_spans_memory() {
    let dir = std::env::temp_dir().join(format!("memsight-tracing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let session = memsight::Session::builder()
        .report_path(dir.join("r.json"))
        .quiet()
        .start()
        .unwrap();
    with_layer(|| {
        for n in 0..3 {
            session.step(n);
            let span = tracing::info_span!(target: "layer::model", "forward");
            let _s = span.enter();
            let acts = black_box(vec![1u8; 16 << 20]);
            drop(acts);
        }
    });
    let report = session.finish().unwrap();
    let fwd = report
        .phases
        .iter()
        .find(|p| p.path == "forward")
        .expect("no phase `forward`");
    assert_eq!(fwd.count, 3);
    // Within the counters' documented bound (64 KiB per allocating thread): a workspace-wide build
    // unifies memsight's features and counts through jemalloc's per-thread counters.
    assert!(fwd.max_rise_bytes >= (16 << 20) - (64 << 10), "{fwd:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
