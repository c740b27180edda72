//! Keeps a ring file cut short under its writer from killing the writer's process. Its blocks are
//! reserved before it is mapped, but the file's owner (or root) can still truncate it while the job
//! runs; a write to the mapping past the new end raises SIGBUS. A SIGBUS handler, installed with
//! the first writable ring, checks whether the faulting address lies in a ring this process writes:
//! if so, it maps anonymous memory over that ring (the write then lands there, unseen by readers,
//! and the ring is lost, as the file's owner chose) and the program runs on; any other SIGBUS goes
//! to the handler that was there before, or ends the process as it would have.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Most writable rings one process maps at once (a session has one).
const SLOTS: usize = 8;

/// Start and length of each writable ring mapping (0: free).
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LENS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// Set once a ring was replaced by anonymous memory.
static LOST: AtomicBool = AtomicBool::new(false);

/// The SIGBUS disposition before ours (set once, before ours is installed).
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALL: Once = Once::new();

/// Registers a writable ring mapping; installs the handler the first time.
pub(super) fn watch(start: *mut u8, len: usize) {
    INSTALL.call_once(install);
    for (s, l) in STARTS.iter().zip(&LENS) {
        if s.compare_exchange(0, start as usize, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            l.store(len, Ordering::Release);
            return;
        }
    }
}

/// Forgets a ring mapping about to be unmapped.
pub(super) fn unwatch(start: *mut u8) {
    for (s, l) in STARTS.iter().zip(&LENS) {
        if s.load(Ordering::Acquire) == start as usize {
            l.store(0, Ordering::Release);
            s.store(0, Ordering::Release);
        }
    }
}

/// Whether a ring of this process was cut short and replaced (its records since are lost).
pub fn ring_lost() -> bool {
    LOST.load(Ordering::Relaxed)
}

fn install() {
    // SAFETY: sigaction queries, then sets, this process's SIGBUS disposition; ours is set only
    // once the previous one is kept, for the handler to read.
    unsafe {
        let mut prev: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev) != 0 {
            return;
        }
        let _ = PREVIOUS.set(prev);
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigbus as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
    }
}

/// The ring mapping holding `addr`: (start, length).
fn ring_at(addr: usize) -> Option<(usize, usize)> {
    STARTS.iter().zip(&LENS).find_map(|(s, l)| {
        let (start, len) = (s.load(Ordering::Acquire), l.load(Ordering::Acquire));
        (start != 0 && addr >= start && addr < start + len).then_some((start, len))
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some((start, len)) = ring_at(addr) {
        // SAFETY: replaces this process's own ring mapping, page for page, with private anonymous
        // memory (async-signal-safe: one system call); the faulting write is retried on it.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            LOST.store(true, Ordering::Relaxed);
            return;
        }
    }
    // Not a ring of ours: what would have happened without memsight.
    let (handler, flags) = PREVIOUS
        .get()
        .map_or((libc::SIG_DFL, 0), |p| (p.sa_sigaction, p.sa_flags));
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: restores the default action; the faulting instruction runs again and the
        // kernel delivers SIGBUS with it (a fault cannot be ignored).
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        }
    } else if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous SA_SIGINFO handler, called as the kernel would have.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the previous plain handler, called as the kernel would have.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}
