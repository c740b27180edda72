//! The session of the job this library is loaded into: started as the library loads when
//! `memsight run` (or the user) asked for one through the environment, finished as the process
//! exits. Only the process that loaded the library owns it: a forked child (a DataLoader worker)
//! neither marks steps in it nor finishes it, and programs the job starts do not inherit it. A
//! launcher (a shell running a script, `env`, `timeout`…) is not the job: it passes the session on.
//! A program that links memsight (its own `malloc` family) is left to its own session.

use memsight::Session;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

static SESSION: Mutex<Option<Session>> = Mutex::new(None);
/// The process that started the session (0: none).
static OWNER: AtomicI32 = AtomicI32::new(0);

/// The variables that ask for a session; removed once read, so the programs the job starts run
/// without one (a session is the started process's, as with a job that links memsight).
const SESSION_VARS: [&str; 4] = [
    "MEMSIGHT_RING",
    "MEMSIGHT_REPORT",
    "MEMSIGHT_INTERVAL_MS",
    PARENT_VAR,
];

/// True in the process that owns the session.
pub(crate) fn owned_here() -> bool {
    let owner = OWNER.load(Ordering::Relaxed);
    // SAFETY: getpid has no preconditions.
    owner != 0 && owner == unsafe { libc::getpid() }
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

/// Programs that start the job rather than being it (a shell running a script, `env`, `nohup`,
/// `timeout`, `taskset`…): they pass the session on, to the job they start or exec, untouched.
const LAUNCHERS: [&str; 16] = [
    "sh", "bash", "dash", "zsh", "ksh", "fish", "env", "nohup", "time", "timeout", "nice",
    "ionice", "taskset", "numactl", "stdbuf", "setsid",
];

/// Whether the program is a launcher, by the name it was started as (`argv[0]`: multicall
/// binaries such as busybox or uutils resolve to one file for every name).
fn is_launcher(argv0: Option<&std::ffi::CStr>) -> bool {
    argv0
        .and_then(|a| a.to_str().ok())
        .and_then(|a| a.rsplit('/').next())
        .is_some_and(|name| LAUNCHERS.contains(&name))
}

/// The sidecar (or the launcher that passed the session on) that the session's process is a
/// direct child of; without the variable (preloaded by hand) any process may start it.
const PARENT_VAR: &str = "MEMSIGHT_SESSION_PARENT";

/// True when this process is the one the session was meant for: a direct child of
/// [`PARENT_VAR`]'s process, or that process itself once a launcher (`env`, `nice`, a shell's
/// last command) exec'd the job in its place. A program the job (or a Rust job that links
/// memsight) starts is not.
fn meant_for_this_process() -> bool {
    match std::env::var(PARENT_VAR)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    {
        // SAFETY: getppid has no preconditions.
        Some(parent) => parent == unsafe { libc::getppid() } || parent == unsafe { libc::getpid() },
        None => true,
    }
}

extern "C" fn on_load(argc: c_int, argv: *const *const c_char, _envp: *const *const c_char) {
    if !serving_malloc() {
        return;
    }
    memsight::alloc::foreign::install();
    if !meant_for_this_process() {
        return;
    }
    // SAFETY: the loader passes the program's argc and argv to ELF constructors.
    let argv0 = (argc > 0 && !argv.is_null())
        .then(|| unsafe { *argv })
        .filter(|a| !a.is_null())
        .map(|a| unsafe { std::ffi::CStr::from_ptr(a) });
    if is_launcher(argv0) {
        // The launcher's own children are the candidates now.
        // SAFETY: getpid has no preconditions.
        std::env::set_var(PARENT_VAR, unsafe { libc::getpid() }.to_string());
        return;
    }
    let wanted = SESSION_VARS[..2]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|p| !p.is_empty()));
    if !wanted {
        return;
    }
    let started = Session::builder().start();
    forget_for_children();
    match started {
        Ok(s) => {
            // SAFETY: getpid has no preconditions.
            OWNER.store(unsafe { libc::getpid() }, Ordering::Relaxed);
            if let Ok(mut slot) = SESSION.lock() {
                *slot = Some(s);
            }
        }
        Err(e) => eprintln!("memsight: the session did not start: {e}"),
    }
}

/// Removes the session's variables and this library from `LD_PRELOAD`, for the programs the job
/// starts (other preloaded libraries stay).
fn forget_for_children() {
    for v in SESSION_VARS {
        std::env::remove_var(v);
    }
    let Some(list) = std::env::var_os("LD_PRELOAD") else {
        return;
    };
    let list = list.to_string_lossy().into_owned();
    let kept: Vec<&str> = preloaded(&list).filter(|e| !is_this_library(e)).collect();
    if kept.is_empty() {
        std::env::remove_var("LD_PRELOAD");
    } else {
        std::env::set_var("LD_PRELOAD", kept.join(":"));
    }
}

/// Whether a path names this library.
fn is_this_library(path: &str) -> bool {
    path.ends_with("libmemsight_preload.so")
}

extern "C" fn on_exit() {
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

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn(c_int, *const *const c_char, *const *const c_char) = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_EXIT: extern "C" fn() = on_exit;
