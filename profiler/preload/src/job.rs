//! The session of the process this library is loaded into. Under `memsight run` every process of
//! the job carries the library (it stays in `LD_PRELOAD` and the job's variables stay set), and
//! every one is measured: each starts a session of its own — its own ring and report, which the
//! sidecar assembles into the job — once it has lived [`START_AFTER`]; one that ends sooner (a
//! `date` in a shell loop) leaves nothing behind and costs no thread: the start is armed at load
//! (and at each fork) and taken up by the counters' slow path ([`on_slow_alloc`]), so a process
//! that never allocates much never spawns the starter. A forked child (a DataLoader worker) forgets its
//! parent's session and starts its own, counting from what it inherited — settled when the child
//! first needs it ([`settle_fork`]), not in the fork handler, so a shell's fork that execs at once
//! touches one page of this library's. `exit` and `_exit` say
//! the exit code in the ring, so the sidecar tells an exit from a kill. No program is chosen or
//! passed over by its name. A program that links memsight (its own `malloc` family) is left to
//! its own session.

use memsight::Session;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

static SESSION: Mutex<Option<Session>> = Mutex::new(None);
/// The process whose session runs (0: none).
static OWNER: AtomicI32 = AtomicI32::new(0);
/// The process that is measured: its session runs or starts soon (0: none).
static MEASURED: AtomicI32 = AtomicI32::new(0);
/// Set once the process marked a step or phase: it is worth a report, however short it ran.
static MARKED: AtomicBool = AtomicBool::new(false);
/// Set once the process started exiting: no session starts after it.
static EXITING: AtomicBool = AtomicBool::new(false);

/// How long a process lives before its session starts. Its heap is counted from its first
/// instant either way (the counters run from the library's load); what waits is the ring, the
/// sampler thread and the report, which a short-lived helper does without.
const START_AFTER: Duration = Duration::from_millis(100);

/// The variables by which `memsight run` (or a user, for one process) asks for a session.
const SESSION_VARS: [&CStr; 3] = [c"MEMSIGHT_JOB", c"MEMSIGHT_RING", c"MEMSIGHT_REPORT"];

/// Whether the environment variable `name` is set and not empty. The C library's `getenv`, not
/// the standard library's: every process of the job runs this as it loads, and each page of code
/// it runs is a page fault in every `date` a shell script starts.
#[link_section = ".text.hot.memsight"]
fn set(name: &CStr) -> bool {
    // SAFETY: a NUL-terminated name; getenv returns null or a NUL-terminated value, read before
    // anything can change the environment (the library's initialiser runs before `main`).
    unsafe {
        let value = libc::getenv(name.as_ptr());
        !value.is_null() && *value != 0
    }
}

/// The calling process's pid.
#[link_section = ".text.hot.memsight"]
fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// True in the process whose session runs.
#[link_section = ".text.hot.memsight"]
pub(crate) fn owned_here() -> bool {
    settle_fork();
    let owner = OWNER.load(Ordering::Relaxed);
    owner != 0 && owner == pid()
}

/// True in a process that is measured: its session runs, or starts once it has lived
/// [`START_AFTER`] (steps and phases marked meanwhile are kept).
#[link_section = ".text.hot.memsight"]
pub(crate) fn measured_here() -> bool {
    settle_fork();
    let m = MEASURED.load(Ordering::Relaxed);
    m != 0 && m == pid()
}

/// True when the program's `malloc` is this library's: otherwise the program brings its own (a
/// Rust job that links memsight defines the malloc family itself and runs its own session).
/// Compared by the object that defines each: inside this library, even the address of its own
/// `malloc` resolves to the program's when the program interposes it.
///
/// A non-PIE executable that takes `malloc`'s address (Ubuntu's `/usr/bin/python3.12` does) makes
/// its PLT stub the function's address everywhere, so the lookup names the executable although
/// it only *calls* `malloc`: its symbol there is undefined. The stub jumps to the first definition
/// in the lookup order — the executable's own (none), then the preloaded libraries' in order — so
/// the program's `malloc` is this library's when it leads `LD_PRELOAD`, as `memsight run` puts it
/// (preloaded by hand after another allocator, or loaded by the CUDA driver as an injection
/// library in a child, it is not, and stays passive). (Before this
/// was known, Python jobs on Ubuntu 24.04 started no session at all: seen on the GPU machine.)
#[link_section = ".text.hot.memsight"]
fn serving_malloc() -> bool {
    // SAFETY: a NUL-terminated name.
    let found = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let here = on_load as extern "C" fn(c_int, *const *const c_char, *const *const c_char);
    match (
        symbol_at(found.cast_const()),
        symbol_at(here as *const libc::c_void),
    ) {
        (Some(theirs), _) if !theirs.defined => first_preloaded(),
        (Some(theirs), Some(ours)) => theirs.object == ours.object,
        _ => false,
    }
}

/// Whether this library is the first entry of `LD_PRELOAD`.
fn first_preloaded() -> bool {
    std::env::var("LD_PRELOAD")
        .is_ok_and(|list| preloaded(&list).next().is_some_and(is_this_library))
}

/// The entries of an `LD_PRELOAD` list (the loader separates them by colons or blanks).
fn preloaded(list: &str) -> impl Iterator<Item = &str> {
    list.split([':', ' ']).filter(|e| !e.is_empty())
}

/// Where an address lies: the loaded object (its base address), and whether that object defines
/// the symbol there (false for a canonical PLT stub of an undefined function).
struct Symbol {
    object: usize,
    defined: bool,
}

/// `dladdr1`'s request for the symbol table entry (glibc's `RTLD_DL_SYMENT`).
const RTLD_DL_SYMENT: c_int = 1;
/// The section index of an undefined symbol (ELF's `SHN_UNDEF`).
const SHN_UNDEF: u16 = 0;

/// The object and symbol table entry that hold `addr`.
#[link_section = ".text.hot.memsight"]
fn symbol_at(addr: *const libc::c_void) -> Option<Symbol> {
    if addr.is_null() {
        return None;
    }
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let mut entry: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 only reads `addr` as an address and fills `info` and `entry` (a pointer into
    // the object's symbol table, or null).
    let found = unsafe { libc::dladdr1(addr, info.as_mut_ptr(), &mut entry, RTLD_DL_SYMENT) };
    if found == 0 {
        return None;
    }
    // SAFETY: filled by a successful dladdr1.
    let object = unsafe { info.assume_init() }.dli_fbase as usize;
    // SAFETY: null or the object's `ElfW(Sym)` for the symbol at `addr`, mapped while it is loaded.
    let defined = unsafe { (entry as *const libc::Elf64_Sym).as_ref() }
        .is_none_or(|sym| sym.st_shndx != SHN_UNDEF);
    Some(Symbol { object, defined })
}

#[link_section = ".text.hot.memsight"]
extern "C" fn on_load(_argc: c_int, _argv: *const *const c_char, _envp: *const *const c_char) {
    if !serving_malloc() {
        return;
    }
    memsight::alloc::foreign::install();
    memsight::alloc::foreign::sampled::note_main_thread();
    resolve_exit();
    let wanted = SESSION_VARS.iter().any(|v| set(v));
    if !wanted {
        return;
    }
    // SAFETY: registers handlers that only this library's code runs, once per load.
    unsafe { libc::pthread_atfork(Some(before_fork), None, Some(after_fork_in_child)) };
    MEASURED.store(pid(), Ordering::Relaxed);
    memsight::alloc::foreign::on_slow_alloc(on_slow_alloc);
    if memsight::process::writes_user_report() {
        // The job's first process: measured from its first instant, however short it runs.
        start_here();
    } else {
        start_soon();
    }
}

/// Notes that the process marked a step or phase (the Python package's calls).
pub(crate) fn marked() {
    MARKED.store(true, Ordering::Relaxed);
}

/// `kill`: a signal a measured process sends to another process is noted for its flight recorder
/// (`memsight::process::signals`), so the sidecar tells a process the job stopped itself (a
/// `multiprocessing.Pool` terminating its workers, a DataLoader's shutdown, a `subprocess`
/// timeout) from one that failed. A process that sent one is worth a report however short it ran
/// (the note reaches the sidecar through it). Then the system call, as the C library makes it.
#[no_mangle]
pub extern "C" fn kill(pid: libc::pid_t, signal: c_int) -> c_int {
    if measured_here() && pid > 0 && signal > 0 {
        memsight::process::signals::sent(pid, signal);
        MARKED.store(true, Ordering::Relaxed);
    }
    // SAFETY: the `kill` system call with the caller's arguments; on failure it returns -1 and
    // sets `errno`, as the C library's `kill` does.
    unsafe { libc::syscall(libc::SYS_kill, pid, signal) as c_int }
}

/// A process that ends before its session started, having held at least this much heap (or
/// marked a step or phase), starts and finishes one as it exits: its exact peak and steps are not
/// lost (a `date` leaves nothing).
const WORTH_A_REPORT: u64 = 1 << 20;

/// When this process's session is due, in `CLOCK_MONOTONIC` nanoseconds (0: no start pending).
static DUE_AT: AtomicU64 = AtomicU64::new(0);

/// `CLOCK_MONOTONIC` now, in nanoseconds (the vDSO: no system call).
#[link_section = ".text.hot.memsight"]
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes `ts` only.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Arms this process's session to start once it has lived [`START_AFTER`]. No thread yet: the
/// counters' slow path spawns the starter ([`on_slow_alloc`]) once the process is due or holds
/// [`WORTH_A_REPORT`] — so a `date` or a shell's fork that execs at once costs nothing more.
#[link_section = ".text.hot.memsight"]
fn start_soon() {
    let due = now_ns().saturating_add(START_AFTER.as_nanos() as u64);
    DUE_AT.store(due.max(1), Ordering::Relaxed);
}

/// The counters' slow path (inside `malloc`, once per tens of KiB a thread allocates): spawns the
/// starter once a pending start is due, or early (to sleep out the rest of [`START_AFTER`]) once
/// the process holds [`WORTH_A_REPORT`] — a program that allocates its data and then only
/// computes, or is killed, still gets its session. Not while exiting, and not in a `vfork` child
/// (which shares this memory but is not the measured process).
#[link_section = ".text.hot.memsight"]
fn on_slow_alloc() {
    settle_fork();
    let due = DUE_AT.load(Ordering::Relaxed);
    if due == 0 || EXITING.load(Ordering::Relaxed) {
        return;
    }
    let now = now_ns();
    if now < due && memsight::alloc::run_peak() < WORTH_A_REPORT {
        return;
    }
    if !measured_here()
        || DUE_AT
            .compare_exchange(due, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let wait = std::time::Duration::from_nanos(due.saturating_sub(now));
    // The stack size is given, so spawning reads no environment variable (a caller of `malloc`
    // may hold the environment's lock).
    // The job's signals are blocked in it (and in the sampler it starts): a program waiting for
    // its `SIGCHLD` with `signalfd` or `sigwait` gets it.
    let spawned = memsight::process::spawn_without_signals(
        std::thread::Builder::new()
            .name("memsight-start".into())
            .stack_size(256 << 10),
        move || {
            std::thread::sleep(wait);
            start_here();
        },
    );
    if let Err(e) = spawned {
        eprintln!("memsight: the session did not start: {e}");
    }
}

/// Starts the session, unless the process began exiting or is no longer the one measured (it
/// forked, and this thread is the parent's, gone in the child).
fn start_here() {
    if EXITING.load(Ordering::Relaxed) || !measured_here() {
        return;
    }
    start_session(Session::builder());
}

/// Runs `change` (a credential change the C library applies to every thread) with this process's
/// sampler thread paused, when its session runs ([`crate::credentials`]).
pub(crate) fn with_sampler_paused<R>(change: impl FnOnce() -> R) -> R {
    if !owned_here() {
        return change();
    }
    let Ok(mut slot) = SESSION.lock() else {
        return change();
    };
    let Some(session) = slot.as_mut() else {
        return change();
    };
    session.pause_sampler();
    let done = change();
    if let Err(e) = session.start_sampler() {
        eprintln!("memsight: the sampler thread did not start again: {e}");
    }
    done
}

/// Starts the session `builder` describes, unless one runs.
fn start_session(builder: memsight::SessionBuilder) {
    let Ok(mut slot) = SESSION.lock() else {
        return;
    };
    if slot.is_some() {
        return;
    }
    match builder.start() {
        Ok(s) => {
            OWNER.store(pid(), Ordering::Relaxed);
            *slot = Some(s);
        }
        Err(e) => eprintln!("memsight: the session did not start: {e}"),
    }
}

/// The process heap's live bytes when this process last forked, taken in the parent just before
/// ([`before_fork`]): what a forked child inherited.
static LIVE_AT_FORK: AtomicU64 = AtomicU64::new(0);
/// The forked child of a measured process that has not settled yet (0: none): set by the fork
/// handler (its one write), so that a `vfork` child of that child, which shares its memory, does
/// not settle in its place.
static FORK_PENDING: AtomicI32 = AtomicI32::new(0);

/// Before a `fork` of a measured process (in the parent, whose pages are still its own): notes
/// the live bytes the child will inherit.
#[link_section = ".text.hot.memsight"]
extern "C" fn before_fork() {
    if MEASURED.load(Ordering::Relaxed) != 0 {
        LIVE_AT_FORK.store(memsight::alloc::heap_live(), Ordering::Relaxed);
    }
}

/// In the child of a `fork` (not of a `vfork` or `posix_spawn`, which run no handlers): marks the
/// fork to be settled when the child first needs it. One store: each page a handler touches is a
/// copy-on-write fault in every child, and a shell's child that execs at once needs nothing.
#[link_section = ".text.hot.memsight"]
extern "C" fn after_fork_in_child() {
    if MEASURED.load(Ordering::Relaxed) != 0 {
        FORK_PENDING.store(pid(), Ordering::Relaxed);
    }
}

/// In a forked child of a measured process, the first time it needs its state (its counters'
/// slow path, its exit, a call of the Python package, CUDA's start): the parent's session is the
/// parent's (its sampler thread did not survive the fork); the child is measured on its own, from
/// the heap it inherited. Waits for no lock a thread of the parent may have held at the fork.
/// Until then nothing of the child's is written into the parent's ring: its session state is the
/// parent's, whose process id (`OWNER`, the ring's owner) is not the child's.
#[link_section = ".text.hot.memsight"]
fn settle_fork() {
    let pending = FORK_PENDING.load(Ordering::Relaxed);
    if pending == 0 || pending != pid() {
        return;
    }
    FORK_PENDING.store(0, Ordering::Relaxed);
    OWNER.store(0, Ordering::Relaxed);
    if let Ok(mut slot) = SESSION.try_lock() {
        // Not dropped: finishing it is the parent's.
        std::mem::forget(slot.take());
    }
    memsight::process::forget_inherited();
    let inherited = LIVE_AT_FORK.load(Ordering::Relaxed);
    memsight::alloc::restart_peaks_after_fork(inherited);
    memsight::process::forked(inherited);
    MEASURED.store(pid(), Ordering::Relaxed);
    start_soon();
}

/// Whether a path names this library.
fn is_this_library(path: &str) -> bool {
    path.ends_with("libmemsight_preload.so")
}

#[link_section = ".text.hot.memsight"]
extern "C" fn on_exit() {
    settle_fork();
    let worth = MARKED.load(Ordering::Relaxed) || memsight::alloc::run_peak() >= WORTH_A_REPORT;
    if measured_here() && !owned_here() && worth {
        start_session(Session::builder());
    }
    EXITING.store(true, Ordering::Relaxed);
    if !owned_here() {
        return;
    }
    let session = SESSION.lock().ok().and_then(|mut s| s.take());
    if let Some(s) = session {
        if let Err(e) = s.finish() {
            eprintln!("memsight: the report was not written: {e}");
        }
    }
}

/// The C library's `exit`, found once the library loads (0: not found).
static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);

#[link_section = ".text.hot.memsight"]
fn resolve_exit() {
    // SAFETY: a NUL-terminated name; RTLD_NEXT finds the definition after this library's.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"exit".as_ptr()) };
    REAL_EXIT.store(f as usize, Ordering::Relaxed);
}

/// Ends the process at once with `code` (what `_exit` does).
#[link_section = ".text.hot.memsight"]
fn exit_group(code: c_int) -> ! {
    // SAFETY: exit_group ends every thread of the process; it does not return.
    unsafe { libc::syscall(libc::SYS_exit_group, code) };
    #[allow(clippy::empty_loop)]
    loop {}
}

/// `exit`: says the code in the ring, then exits as the C library does (its `atexit` handlers and
/// this library's finish run).
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub extern "C" fn exit(code: c_int) -> ! {
    EXITING.store(true, Ordering::Relaxed);
    memsight::process::exiting(code);
    match REAL_EXIT.load(Ordering::Relaxed) {
        0 => exit_group(code),
        f => {
            // SAFETY: the C library's `exit`, which does not return.
            let real: extern "C" fn(c_int) -> ! = unsafe { std::mem::transmute(f) };
            real(code)
        }
    }
}

/// `_exit` (Python's `os._exit`, which ends every multiprocessing child and DataLoader worker):
/// says the code in the ring and ends the process. Async-signal-safe.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub extern "C" fn _exit(code: c_int) -> ! {
    memsight::process::exiting(code);
    exit_group(code)
}

/// The program's `main`, as the C library's start-up was given it (0: not yet).
static REAL_MAIN: AtomicUsize = AtomicUsize::new(0);

type Main = unsafe extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
type StartMain = unsafe extern "C" fn(
    Main,
    c_int,
    *mut *mut c_char,
    *const c_void,
    *const c_void,
    *const c_void,
    *mut c_void,
) -> c_int;

/// The program's `main`, whose return value is its exit code: said in the ring, as `exit` says
/// it (the C library calls its own `exit` with it, which no library can interpose).
#[link_section = ".text.hot.memsight"]
unsafe extern "C" fn main_then_say(
    argc: c_int,
    argv: *mut *mut c_char,
    envp: *mut *mut c_char,
) -> c_int {
    // SAFETY: stored from the program's `main` before this runs.
    let main: Main = std::mem::transmute(REAL_MAIN.load(Ordering::Relaxed));
    let code = main(argc, argv, envp);
    EXITING.store(true, Ordering::Relaxed);
    memsight::process::exiting(code);
    code
}

/// The C library's start-up, through which a dynamically linked program's `_start` calls `main`:
/// run with `main` wrapped so that its return value is said (see [`main_then_say`]).
///
/// # Safety
/// Called by the program's `_start` with the C library's arguments.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub unsafe extern "C" fn __libc_start_main(
    main: Main,
    argc: c_int,
    argv: *mut *mut c_char,
    init: *const c_void,
    fini: *const c_void,
    rtld_fini: *const c_void,
    stack_end: *mut c_void,
) -> c_int {
    let real = libc::dlsym(libc::RTLD_NEXT, c"__libc_start_main".as_ptr());
    if real.is_null() {
        // Cannot happen with glibc; without it the program cannot start either way.
        exit_group(127);
    }
    let real: StartMain = std::mem::transmute(real);
    REAL_MAIN.store(main as usize, Ordering::Relaxed);
    real(main_then_say, argc, argv, init, fini, rtld_fini, stack_end)
}

/// `_Exit`: as `_exit`.
#[no_mangle]
#[link_section = ".text.hot.memsight"]
pub extern "C" fn _Exit(code: c_int) -> ! {
    _exit(code)
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn(c_int, *const *const c_char, *const *const c_char) = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_EXIT: extern "C" fn() = on_exit;
