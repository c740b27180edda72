//! Whether the job panicked: a panic hook, installed before the one already in place (which still
//! runs: its message is printed as before), notes the first panic's thread, place and message, so
//! that a session finishing while its thread unwinds reports the end state `panicked` and why.

use crate::sys::lock;
use std::sync::{Mutex, Once};

static HOOK: Once = Once::new();
/// The first panic of the process, in words.
static FIRST: Mutex<Option<String>> = Mutex::new(None);

/// Installs the hook (once per process), chaining the hook in place.
pub(super) fn install() {
    // `take_hook` and `set_hook` panic on a panicking thread.
    if std::thread::panicking() {
        return;
    }
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            note(info);
            previous(info);
        }));
    });
}

fn note(info: &std::panic::PanicHookInfo<'_>) {
    // Never wait in a panic hook: another panicking thread may hold the lock.
    let Ok(mut first) = FIRST.try_lock() else {
        return;
    };
    if first.is_some() {
        return;
    }
    let payload = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into());
    let thread = std::thread::current();
    let place = info
        .location()
        .map(|l| format!(" at {}:{}", l.file(), l.line()))
        .unwrap_or_default();
    *first = Some(format!(
        "thread '{}' panicked{place}: {payload}",
        thread.name().unwrap_or("<unnamed>")
    ));
}

/// Why the job ended, when the session finishes on a thread that unwinds a panic: the first
/// panic of the process (the one that started it, when a worker's panic reached this thread).
pub(super) fn unwinding() -> Option<String> {
    std::thread::panicking().then(|| {
        lock(&FIRST)
            .clone()
            .unwrap_or_else(|| "a panic unwound the thread that finished the session".into())
    })
}
