//! Python frames in sampled stacks: the calling thread's Python call stack (file, line, function),
//! read from CPython's own structures without running the interpreter, taking its locks or
//! allocating, and interleaved with the native frames where each C-level evaluation of Python
//! code ran (`_PyEval_EvalFrameDefault`) — so a sampled allocation reads
//! `train.py:112 forward ← model.py:87 CausalSelfAttention.forward ← aten::bmm …`.
//!
//! Of the two known ways, this is py-spy's (read the interpreter's frame chain where it keeps it)
//! rather than memray's (keep a shadow stack from a profile hook on every Python call and return):
//! a shadow stack costs on every call whether or not an allocation is sampled (memray: 1.07–1.54×
//! on this project's jobs), while reading the chain costs only when a sample is taken (one per
//! 512 KiB allocated). py-spy reads from another process; here the thread reads its own chain, which
//! no other thread changes while it is inside `malloc`.
//!
//! The thread state comes from `PyGILState_GetThisThreadState` (a thread-specific-data read, valid
//! whether or not the thread holds the GIL: PyTorch's ops release it). Offsets are per minor
//! version ([`layout`]); line numbers are decoded from the code object's line table
//! ([`linetable`]); functions are interned once ([`names`]). [`enable`] is called from Python (the
//! `memsight` package, at start-up) with the name of the function calling it, and reads its own
//! stack once to check: a version whose layout is wrong never gets a frame read.
//!
//! A Python frame in a stack is a tagged word: bit 63 set (never a user-space return address),
//! the function's entry above bit 24, its line below.

mod layout;
pub mod linetable;
mod names;

use layout::{Chain, Layout};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};

/// The bit that marks a Python frame in a stack.
pub const TAG: u64 = 1 << 63;
const LINE_BITS: u32 = 24;
/// Python frames read per stack at most.
pub const MAX_PYTHON_FRAMES: usize = 64;

/// What the reader found of the interpreter in this process.
struct Python {
    layout: Layout,
    /// `PyGILState_GetThisThreadState`.
    this_thread: unsafe extern "C" fn() -> *mut c_void,
    /// `&PyCode_Type`: every code object's type.
    code_type: usize,
    /// `_PyEval_EvalFrameDefault`'s code: `[start, end)` (0, 0 when its size is unknown).
    eval: (usize, usize),
}

static PYTHON: AtomicPtr<Python> = AtomicPtr::new(std::ptr::null_mut());

/// One Python frame as read: its code object, line (0: unknown) and whether it is the outermost
/// frame of one C-level evaluation.
#[derive(Clone, Copy, Default, Debug)]
pub struct RawFrame {
    code: usize,
    line: u32,
    last_of_run: bool,
}

/// A Python frame of a recorded stack, as a reader shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyFrame {
    /// `co_filename`.
    pub file: &'static str,
    /// `co_qualname` (3.11+) or `co_name`.
    pub function: &'static str,
    /// The line running (0: unknown).
    pub line: u32,
}

/// Whether a stack word is a Python frame.
pub fn is_python(word: u64) -> bool {
    word & TAG != 0
}

/// The Python frame a stack word names, if it is one and its function was kept.
pub fn describe(word: u64) -> Option<PyFrame> {
    if !is_python(word) {
        return None;
    }
    let entry = ((word & !TAG) >> LINE_BITS) as u32;
    let (file, function) = names::get(entry)?;
    Some(PyFrame {
        file,
        function,
        line: (word & ((1 << LINE_BITS) - 1)) as u32,
    })
}

fn frame_word(entry: u32, line: u32) -> u64 {
    TAG | (u64::from(entry) << LINE_BITS) | u64::from(line.min((1 << LINE_BITS) - 1))
}

/// Looks a symbol up among the loaded objects (null when absent).
fn symbol(name: &CStr) -> *mut c_void {
    // SAFETY: a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// The interpreter's `(major, minor)`: `Py_Version` (3.11+), else `Py_GetVersion()`'s text.
fn version() -> Option<(u8, u8)> {
    let v = symbol(c"Py_Version");
    if !v.is_null() {
        // SAFETY: `Py_Version` is a `const unsigned long` (PY_VERSION_HEX): 64 bits on LP64 Linux.
        let hex = unsafe { (v as *const u64).read() };
        return Some(((hex >> 24) as u8, (hex >> 16) as u8));
    }
    let f = symbol(c"Py_GetVersion");
    if f.is_null() {
        return None;
    }
    // SAFETY: `const char *Py_GetVersion(void)`, a static string.
    let text = unsafe {
        let f: unsafe extern "C" fn() -> *const c_char = std::mem::transmute(f);
        CStr::from_ptr(f())
    };
    let text = text.to_str().ok()?;
    let mut parts = text.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// `[start, end)` of the function at `f` (its symbol's size), or `(0, 0)`.
fn extent(f: *mut c_void) -> (usize, usize) {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 fills `info` and `sym` (RTLD_DL_SYMENT = 1: a pointer to the ELF symbol).
    let found = unsafe { libc::dladdr1(f, info.as_mut_ptr(), &mut sym, 1) };
    // SAFETY: null or the object's symbol table entry.
    match (found, unsafe { (sym as *const libc::Elf64_Sym).as_ref() }) {
        (0, _) | (_, None) => (0, 0),
        (_, Some(s)) if s.st_size == 0 => (0, 0),
        (_, Some(s)) => (f as usize, f as usize + s.st_size as usize),
    }
}

/// Turns Python frames on for this process: finds the interpreter, and reads the calling thread's
/// stack once — its innermost Python function must be `caller` (the function that called this,
/// through the `memsight` package). Idempotent. Outside any allocation path (it allocates).
pub fn enable(caller: &str) -> Result<(), String> {
    if !PYTHON.load(Ordering::Acquire).is_null() {
        return Ok(());
    }
    let (major, minor) = version().ok_or("no Python interpreter in this process")?;
    let layout = layout::of(major, minor).ok_or_else(|| {
        format!("Python {major}.{minor}: its frames are not read (3.10 to 3.13 are)")
    })?;
    let this_thread = symbol(c"PyGILState_GetThisThreadState");
    let code_type = symbol(c"PyCode_Type");
    if this_thread.is_null() || code_type.is_null() {
        return Err(format!(
            "Python {major}.{minor} without PyGILState_GetThisThreadState or PyCode_Type"
        ));
    }
    let eval = symbol(c"_PyEval_EvalFrameDefault");
    let eval = if eval.is_null() { (0, 0) } else { extent(eval) };
    if !names::map() {
        return Err("the table of Python functions could not be mapped".into());
    }
    let py = Python {
        layout,
        // SAFETY: `PyThreadState *PyGILState_GetThisThreadState(void)`.
        this_thread: unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> *mut c_void>(this_thread)
        },
        code_type: code_type as usize,
        eval,
    };
    let mut raw = [RawFrame::default(); 8];
    // SAFETY: this thread is running Python code (the caller's), so its chain is live.
    let n = unsafe { read(&py, &mut raw) };
    let seen = raw[..n].first().and_then(|f| {
        // SAFETY: a live code object of this thread's chain.
        unsafe { function_name(&py.layout, f.code) }
    });
    match seen {
        Some(name) if name == caller || name.rsplit('.').next() == Some(caller) => {
            PYTHON.store(Box::into_raw(Box::new(py)), Ordering::Release);
            Ok(())
        }
        other => Err(format!(
            "Python {major}.{minor}: the frame check read {other:?} where {caller:?} runs; \
             Python frames are off"
        )),
    }
}

/// Turns Python frames off (the interpreter is about to finalize: its thread states go away).
/// Stacks recorded since keep their Python frames.
pub fn disable() {
    // The reader stays allocated: a sample being taken on another thread may still hold it.
    PYTHON.store(std::ptr::null_mut(), Ordering::Release);
}

/// Whether Python frames are read in this process.
pub fn enabled() -> bool {
    !PYTHON.load(Ordering::Acquire).is_null()
}

/// Reads a pointer-sized word.
///
/// # Safety
/// `addr` is readable.
unsafe fn word(addr: usize) -> usize {
    (addr as *const usize).read()
}

/// Reads the calling thread's Python frames, innermost first, into `out`; their count.
///
/// # Safety
/// The interpreter `py` describes is this process's, and the calling thread's frame chain is live.
unsafe fn read(py: &Python, out: &mut [RawFrame]) -> usize {
    let l = &py.layout;
    let ts = (py.this_thread)() as usize;
    if ts == 0 {
        return 0;
    }
    let mut f = match l.chain {
        Chain::FrameObjects | Chain::CurrentFrame => word(ts + l.tstate_frame),
        Chain::EntryFlag | Chain::CStackShim => match word(ts + l.tstate_frame) {
            0 => 0,
            cframe => word(cframe + l.cframe_current),
        },
    };
    let mut n = 0;
    let mut hops = 0;
    while f != 0 && n < out.len() && hops < 4 * MAX_PYTHON_FRAMES {
        hops += 1;
        if matches!(l.chain, Chain::CStackShim | Chain::CurrentFrame)
            && *((f + l.frame_owner) as *const u8) == layout::OWNED_BY_CSTACK
        {
            // The shim a C-level evaluation starts with: the frame read before it ends a run.
            if n > 0 {
                out[n - 1].last_of_run = true;
            }
            f = word(f + l.frame_previous);
            continue;
        }
        let code = word(f + l.frame_code);
        if code != 0 && word(code + layout::OB_TYPE) == py.code_type {
            let (line, last_of_run) = match l.chain {
                Chain::FrameObjects => {
                    let lasti = *((f + l.frame_instr) as *const c_int);
                    (line_of_offset(l, code, lasti.max(0) as u32 * 2), true)
                }
                _ => {
                    let instr = word(f + l.frame_instr);
                    let start = code + l.code_adaptive;
                    let line = if instr >= start {
                        line_of_offset(l, code, ((instr - start) / 2) as u32)
                    } else {
                        0 // A frame not started yet.
                    };
                    let entry =
                        l.chain == Chain::EntryFlag && *((f + l.frame_is_entry) as *const u8) != 0;
                    (line, entry)
                }
            };
            out[n] = RawFrame {
                code,
                line,
                last_of_run,
            };
            n += 1;
        }
        f = word(f + l.frame_previous);
    }
    n
}

/// The line of instruction `at` (3.10: a byte offset; later: a code-unit index) of `code` (0:
/// unknown).
///
/// # Safety
/// `code` is a live code object of the version `l` describes.
unsafe fn line_of_offset(l: &Layout, code: usize, at: u32) -> u32 {
    let table = word(code + l.code_linetable);
    let first = *((code + l.code_firstlineno) as *const c_int);
    let Some(bytes) = bytes_of(table) else {
        return 0;
    };
    let line = match l.chain {
        Chain::FrameObjects => linetable::line_310(bytes, first, at),
        _ => linetable::line_311(bytes, first, at),
    };
    line.unwrap_or(0)
}

/// A bytes object's contents.
///
/// # Safety
/// `obj` is null or a live bytes object.
unsafe fn bytes_of(obj: usize) -> Option<&'static [u8]> {
    if obj == 0 {
        return None;
    }
    let len = word(obj + layout::OB_SIZE) as isize;
    (0..=1 << 24)
        .contains(&len)
        .then(|| std::slice::from_raw_parts((obj + layout::BYTES_DATA) as *const u8, len as usize))
}

/// A `str` object's text as UTF-8 into `buf` (non-ASCII without cached UTF-8: transcoded; cut at
/// `buf`'s size); `None` for a string this reader does not know (not compact).
///
/// # Safety
/// `obj` is null or a live `str` of the version `l` describes.
unsafe fn text_of<'b>(l: &Layout, obj: usize, buf: &'b mut [u8]) -> Option<&'b [u8]> {
    if obj == 0 {
        return None;
    }
    let state = *((obj + layout::STR_STATE) as *const u32);
    let (kind, compact, ascii) = ((state >> 2) & 7, state >> 5 & 1 == 1, state >> 6 & 1 == 1);
    if !compact {
        return None;
    }
    let chars = word(obj + layout::STR_LENGTH).min(names::MAX_TEXT);
    if ascii {
        let n = chars.min(buf.len());
        std::ptr::copy_nonoverlapping((obj + l.ascii_size) as *const u8, buf.as_mut_ptr(), n);
        return Some(&buf[..n]);
    }
    let utf8 = word(obj + l.compact_utf8);
    let data = obj + l.compact_size;
    let mut n = 0;
    for i in 0..chars {
        let c = match (utf8, kind) {
            (0, 1) => u32::from(*((data + i) as *const u8)),
            (0, 2) => u32::from(*((data + 2 * i) as *const u16)),
            (0, 4) => *((data + 4 * i) as *const u32),
            (0, _) => return None,
            // Cached UTF-8 (its length in bytes is at least `chars`; read until its NUL).
            (p, _) => {
                let b = *((p + i) as *const u8);
                if b == 0 || n == buf.len() {
                    break;
                }
                buf[n] = b;
                n += 1;
                continue;
            }
        };
        let c = char::from_u32(c).unwrap_or('?');
        if n + c.len_utf8() > buf.len() {
            break;
        }
        n += c.encode_utf8(&mut buf[n..]).len();
    }
    if utf8 != 0 {
        // Cut at a character boundary.
        while n > 0 && std::str::from_utf8(&buf[..n]).is_err() {
            n -= 1;
        }
    }
    Some(&buf[..n])
}

/// The qualified name of a code object, copied (for [`enable`]'s check).
///
/// # Safety
/// `code` is a live code object of the version `l` describes.
unsafe fn function_name(l: &Layout, code: usize) -> Option<String> {
    let mut buf = [0u8; names::MAX_TEXT];
    let name = text_of(l, word(code + l.code_name), &mut buf)?;
    Some(String::from_utf8_lossy(name).into_owned())
}

/// The table entry of a code object (interning it on first sight).
///
/// # Safety
/// `code` is a live code object of the version `l` describes.
unsafe fn entry_of(l: &Layout, code: usize) -> Option<u32> {
    let name_obj = word(code + l.code_name);
    let file_obj = word(code + l.code_filename);
    let first = *((code + l.code_firstlineno) as *const c_int) as u32;
    let check =
        (name_obj as u64).rotate_left(17) ^ (file_obj as u64).rotate_left(41) ^ u64::from(first);
    let mut file_buf = [0u8; names::MAX_TEXT];
    let mut name_buf = [0u8; names::MAX_TEXT];
    // Copied only on first sight: `intern` reads them then. Reading them is cheap next to a sample.
    let file = text_of(l, file_obj, &mut file_buf).unwrap_or(b"?");
    let name = text_of(l, name_obj, &mut name_buf).unwrap_or(b"?");
    names::intern(code as u64, check, file, name)
}

/// Native frames [`splice`] reads at most.
const NATIVE: usize = 128;

/// Interleaves the calling thread's Python frames with its native stack `frames[..len]`
/// (innermost first): each native frame inside `_PyEval_EvalFrameDefault` is replaced by the
/// Python frames that evaluation ran; Python frames left over (the native walk stopped short, or
/// the interpreter's extent is unknown) go after the native ones. Returns the new length (at most
/// `frames.len()`: outermost frames are dropped when it is full). Does nothing while Python frames
/// are off. Allocates nothing and takes no lock shared with the interpreter.
pub fn splice(frames: &mut [usize], len: usize) -> usize {
    let py = PYTHON.load(Ordering::Acquire);
    if py.is_null() {
        return len;
    }
    // SAFETY: published once by `enable`, never freed.
    let py = unsafe { &*py };
    let mut raw = [RawFrame::default(); MAX_PYTHON_FRAMES];
    // SAFETY: the calling thread is inside an allocation; its own chain does not change meanwhile.
    let n = unsafe { read(py, &mut raw) };
    if n == 0 {
        return len;
    }
    let mut words = [0u64; MAX_PYTHON_FRAMES];
    for (w, f) in words.iter_mut().zip(&raw[..n]) {
        // SAFETY: a live code object of this thread's chain.
        *w = match unsafe { entry_of(&py.layout, f.code) } {
            Some(e) => frame_word(e, f.line),
            None => frame_word(u32::MAX >> 8, f.line),
        };
    }
    let native: [usize; NATIVE] = {
        let mut copy = [0usize; NATIVE];
        let m = len.min(copy.len());
        copy[..m].copy_from_slice(&frames[..m]);
        copy
    };
    let mut out = 0;
    let mut next_py = 0;
    let in_eval = |ip: usize| ip > py.eval.0 && ip <= py.eval.1;
    let mut push = |frames: &mut [usize], w: usize| {
        if out < frames.len() {
            frames[out] = w;
            out += 1;
        }
    };
    for &ip in &native[..len.min(NATIVE)] {
        if next_py < n && in_eval(ip) {
            // One C-level evaluation: its run of Python frames.
            while next_py < n {
                push(frames, words[next_py] as usize);
                next_py += 1;
                if raw[next_py - 1].last_of_run {
                    break;
                }
            }
        } else {
            push(frames, ip);
        }
    }
    while next_py < n {
        push(frames, words[next_py] as usize);
        next_py += 1;
    }
    out
}

/// The calling thread's stack as the sampler would record it, as text, one frame per line
/// (innermost first): `file:line function` for Python frames, the address for native ones. For
/// tests and the `memsight` package's check; allocates.
pub fn stack_text(native: &[usize]) -> String {
    let mut frames = [0usize; NATIVE];
    let m = native.len().min(frames.len());
    frames[..m].copy_from_slice(&native[..m]);
    let len = splice(&mut frames, m);
    let mut text = String::new();
    for &w in &frames[..len] {
        match describe(w as u64) {
            Some(f) => text.push_str(&format!("{}:{} {}\n", f.file, f.line, f.function)),
            None if is_python(w as u64) => text.push_str("?:0 ?\n"),
            None => text.push_str(&format!("{w:#x}\n")),
        }
    }
    text
}
