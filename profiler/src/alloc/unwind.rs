//! The heap sampler's stack walker: framehop over the loaded objects' DWARF call-frame information
//! (`.eh_frame`, read where the dynamic loader mapped it), with a cache of unwind rules by address,
//! so a walk through code it has seen costs a lookup per frame. framehop's cache is direct-mapped
//! (509 slots by address): two hot return addresses that share a slot evict each other, and every
//! walk through both reads DWARF again (measured: +3.4 ns per operation of `alloc-ab`'s c-mixed
//! in a build where two did). So the walker keeps [`CACHES`] of them and picks one per frame by a
//! hash of the address that is independent of its slot: a pair that shares a slot shares a cache
//! only one time in [`CACHES`]. libgcc's `_Unwind_Backtrace` (the
//! fallback) finds and interprets the tables again at every frame, which made a sample cost ≈ 4 µs.
//!
//! The object list is built outside the allocation path — when sampling is enabled and when the
//! session's sampler notices that an object was loaded since (`dl_iterate_phdr`'s load count) —
//! and swapped in under the walker's lock. A walk takes the lock (a spin lock; samples are rare)
//! and neither allocates (framehop's `MustNotAllocateDuringUnwind` cache) nor reads memory outside
//! the calling thread's stack. A walk that ends early (code without unwind tables, an object loaded
//! since the last refresh) falls back to libgcc's walker.

use super::spin::SpinLock;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, MustNotAllocateDuringUnwind, Unwinder,
};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Bytes of a loaded object, where the loader mapped them (never unmapped while the object is
/// loaded; an object unloaded later is dropped at the next refresh).
#[derive(Default)]
pub(crate) struct Mapped(&'static [u8]);

impl std::ops::Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0
    }
}

type Walker = UnwinderX86_64<Mapped, MustNotAllocateDuringUnwind>;
type RuleCache = CacheX86_64<MustNotAllocateDuringUnwind>;

/// framehop rule caches per walker; a frame's cache is picked by [`cache_of`].
const CACHES: usize = 8;

/// The cache for the frame at `address`: the top bits of a multiplicative hash, independent of
/// the slot framehop picks inside the cache (`address % 509`).
fn cache_of(address: u64) -> usize {
    (address.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CACHES.trailing_zeros())) as usize
}

struct State {
    walker: Walker,
    caches: [RuleCache; CACHES],
    /// The modules' code ranges, sorted: a return address outside all of them ends the walk
    /// (framehop would go on by frame pointers, which such code may not keep).
    code: Vec<(u64, u64)>,
}

/// The walker and its cache (null until [`refresh`] built them).
static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());
/// Guards the walker and its cache.
// The sampler's locks sit together: a process that forks writes their page once after each fork.
#[link_section = ".data.memsight_fork_locks"]
pub(crate) static LOCK: SpinLock = SpinLock::new();
/// Set when an object is being unloaded (`dlclose`): its tables may go away, so walks are left to
/// libgcc's unwinder until the next refresh.
static STALE: AtomicBool = AtomicBool::new(false);
/// `dl_iterate_phdr`'s count of loads when the walker was built.
static LOADS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Rebuilds the walker when an object was loaded or unloaded since it was built (or never was).
/// Allocates: never call it on an allocation path.
pub(crate) fn refresh() {
    let now = load_count();
    if LOADS.load(Ordering::Relaxed) == now && !STALE.load(Ordering::Acquire) {
        return;
    }
    let mut walker = Walker::new();
    let mut code = Vec::new();
    for (m, range) in modules() {
        walker.add_module(m);
        code.push(range);
    }
    code.sort_unstable();
    let new = Box::into_raw(Box::new(State {
        walker,
        caches: std::array::from_fn(|_| RuleCache::new_in()),
        code,
    }));
    let old = {
        let _g = LOCK.lock();
        STATE.swap(new, Ordering::AcqRel)
    };
    LOADS.store(now, Ordering::Relaxed);
    STALE.store(false, Ordering::Release);
    if !old.is_null() {
        // SAFETY: `old` came from `Box::into_raw` and no walk holds it (the swap was under the lock).
        drop(unsafe { Box::from_raw(old) });
    }
}

/// Walks the calling thread's stack into `frames` (instruction pointer first, then return
/// addresses); the number written, 0 when the walker is not built yet.
#[inline(never)]
pub(crate) fn walk(frames: &mut [usize], stack_hi: usize) -> usize {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    if stack_hi.wrapping_sub(sp as usize) >= MAX_STACK {
        return 0;
    }
    let _g = LOCK.lock();
    if STALE.load(Ordering::Acquire) {
        return 0;
    }
    // SAFETY: published by `refresh`, freed only after a swap under this lock.
    let Some(state) = (unsafe { STATE.load(Ordering::Acquire).as_mut() }) else {
        return 0;
    };
    let code = &state.code;
    let known = |pc: u64| {
        let i = code.partition_point(|r| r.0 <= pc);
        i > 0 && pc < code[i - 1].1
    };
    let mut read = |addr: u64| -> Result<u64, ()> {
        if addr < sp || addr.saturating_add(8) > stack_hi as u64 || !addr.is_multiple_of(8) {
            return Err(());
        }
        // SAFETY: inside this thread's stack, between the walk's own frame and the stack's top.
        Ok(unsafe { *(addr as *const u64) })
    };
    let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
    let mut at = FrameAddress::from_instruction_pointer(ip);
    let mut n = 0;
    while let Some(slot) = frames.get_mut(n) {
        let address = at.address();
        // Code outside every known object (loaded since the last refresh, or generated at run
        // time): libgcc's unwinder takes the whole walk.
        if !known(address) {
            return 0;
        }
        *slot = address as usize;
        n += 1;
        if n == frames.len() {
            break;
        }
        let cache = &mut state.caches[cache_of(address)];
        match state.walker.unwind_frame(at, &mut regs, cache, &mut read) {
            Ok(Some(ret)) => match FrameAddress::from_return_address(ret) {
                Some(next) => at = next,
                None => break,
            },
            _ => break,
        }
    }
    n
}

extern "C" {
    /// The main thread's stack address when the program started (the dynamic loader's).
    static __libc_stack_end: *mut c_void;
}

/// An address at or below the top of the calling thread's stack, above every frame: the thread's
/// descriptor, which glibc places at the top of each thread's stack (its own or a user-supplied
/// one), or for the main thread the stack address the program started with. No lock and no
/// allocation (`pthread_getattr_np` takes the thread's lock, which a thread being created holds
/// while it allocates). 0 when that address is not above the stack pointer.
pub(crate) fn stack_top() -> usize {
    let here = 0u8;
    let sp = std::hint::black_box(&raw const here) as usize;
    // SAFETY: glibc calls without preconditions; `__libc_stack_end` is set before any user code.
    let top = unsafe {
        let me = libc::pthread_self() as usize;
        if me == MAIN_THREAD.load(Ordering::Relaxed) {
            __libc_stack_end as usize
        } else {
            me
        }
    };
    if top > sp && top - sp < MAX_STACK {
        top
    } else {
        0
    }
}

/// The deepest stack a walk reads (a walk from further below its thread's top, such as from a
/// signal's alternate stack, is left to libgcc's unwinder).
const MAX_STACK: usize = 256 << 20;

/// The main thread's `pthread_self()` (recorded at load: after a `fork` from another thread the
/// child's only thread has the process's id but not the main thread's stack).
static MAIN_THREAD: AtomicUsize = AtomicUsize::new(0);

/// Records the calling thread as the main thread (the executable's pre-initialiser calls it).
pub(crate) fn note_main_thread() {
    // SAFETY: no preconditions.
    MAIN_THREAD.store(unsafe { libc::pthread_self() } as usize, Ordering::Relaxed);
}

/// Loads plus unloads so far, as the dynamic loader counts them.
fn load_count() -> u64 {
    let mut adds = [0u64; 2];
    // SAFETY: the callback only reads the info it is handed and writes into `adds`.
    unsafe { libc::dl_iterate_phdr(Some(count_cb), (&raw mut adds).cast()) };
    adds[0].wrapping_add(adds[1])
}

unsafe extern "C" fn count_cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
    let out = &mut *data.cast::<[u64; 2]>();
    *out = [(*info).dlpi_adds, (*info).dlpi_subs];
    1
}

/// Every loaded object with unwind tables, as framehop modules, with their code ranges.
///
/// Nothing is allocated while the loader's lock is held (inside `dl_iterate_phdr`): an allocator
/// that takes that lock under a lock of its own — tcmalloc walks the stack as its heap grows, and
/// its stack walker iterates the loaded objects — waited for this thread while this thread, in its
/// `malloc`, waited for it: a PyTorch job preloaded with tcmalloc hung for good. So the objects are
/// counted first, room for them is made, and the callback only copies each one's numbers into it
/// (an object loaded between the two passes makes the copy start again).
fn modules() -> Vec<(Module<Mapped>, (u64, u64))> {
    let mut found: Vec<Found> = Vec::new();
    loop {
        let mut count = 0usize;
        // SAFETY: the callback only counts.
        unsafe { libc::dl_iterate_phdr(Some(object_count_cb), (&raw mut count).cast()) };
        found.clear();
        found.reserve_exact(count + 8);
        let mut sink = (&mut found, false);
        // SAFETY: the callback reads the loader's program headers of each object and pushes within
        // the vector's capacity (no allocation).
        unsafe { libc::dl_iterate_phdr(Some(found_cb), (&raw mut sink).cast()) };
        if !sink.1 {
            break;
        }
    }
    found
        .iter()
        // SAFETY: each object's name is the loader's, kept while the object is loaded.
        .map(|f| unsafe { module_from(f) })
        .collect()
}

unsafe extern "C" fn object_count_cb(
    _: *mut libc::dl_phdr_info,
    _: usize,
    data: *mut c_void,
) -> c_int {
    *data.cast::<usize>() += 1;
    0
}

unsafe extern "C" fn found_cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
    let (out, full) = &mut *data.cast::<(&mut Vec<Found>, bool)>();
    let Some(f) = found_of(&*info) else {
        return 0;
    };
    if out.len() == out.capacity() {
        *full = true;
        return 1;
    }
    out.push(f);
    0
}

/// One object's executable segment and `.eh_frame` (found through `PT_GNU_EH_FRAME`, the
/// `.eh_frame_hdr` the loader maps), as numbers: what the loader's callback copies.
struct Found {
    name: *const std::ffi::c_char,
    bias: u64,
    /// The executable segment's address and size, before the bias.
    text: (u64, u64),
    /// `.eh_frame_hdr`'s.
    hdr: (u64, u64),
    /// `.eh_frame`'s.
    eh_frame: (u64, u64),
}

/// The numbers of one object, read from its program headers; allocates nothing.
unsafe fn found_of(info: &libc::dl_phdr_info) -> Option<Found> {
    let bias = info.dlpi_addr;
    let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
    let text = phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_X != 0)?;
    let hdr = phdrs.iter().find(|p| p.p_type == libc::PT_GNU_EH_FRAME)?;
    let hdr_bytes =
        std::slice::from_raw_parts((bias + hdr.p_vaddr) as *const u8, hdr.p_memsz as usize);
    let eh_frame = eh_frame_of(hdr_bytes, bias + hdr.p_vaddr)? - bias;
    // `.eh_frame`'s length is not in the header: up to the end of the segment that holds it.
    let holder = phdrs.iter().find(|p| {
        p.p_type == libc::PT_LOAD && p.p_vaddr <= eh_frame && eh_frame < p.p_vaddr + p.p_memsz
    })?;
    Some(Found {
        name: info.dlpi_name,
        bias,
        text: (text.p_vaddr, text.p_memsz),
        hdr: (hdr.p_vaddr, hdr.p_memsz),
        eh_frame: (eh_frame, holder.p_vaddr + holder.p_memsz - eh_frame),
    })
}

/// One object's module, with its code range.
///
/// # Safety
/// `f` describes an object still loaded.
unsafe fn module_from(f: &Found) -> (Module<Mapped>, (u64, u64)) {
    let bias = f.bias;
    let seg = |(vaddr, len): (u64, u64)| {
        Mapped(std::slice::from_raw_parts(
            (bias + vaddr) as *const u8,
            len as usize,
        ))
    };
    let name = if f.name.is_null() {
        String::new()
    } else {
        CStr::from_ptr(f.name).to_string_lossy().into_owned()
    };
    let text_svma = f.text.0..f.text.0 + f.text.1;
    let range = (bias + text_svma.start, bias + text_svma.end);
    let module = Module::new(
        name,
        bias + text_svma.start..bias + text_svma.end,
        bias,
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: Some(text_svma.clone()),
            text: Some(seg(f.text)),
            eh_frame_svma: Some(f.eh_frame.0..f.eh_frame.0 + f.eh_frame.1),
            eh_frame: Some(seg(f.eh_frame)),
            eh_frame_hdr_svma: Some(f.hdr.0..f.hdr.0 + f.hdr.1),
            eh_frame_hdr: Some(seg(f.hdr)),
            ..Default::default()
        },
    );
    (module, range)
}

/// An object is being unloaded: until the next refresh, walks are libgcc's (its tables may be
/// unmapped under the walker).
pub(crate) fn invalidate() {
    let _g = LOCK.lock();
    STALE.store(true, Ordering::Release);
}

/// The address of `.eh_frame` that an `.eh_frame_hdr` at `at` points to (its `eh_frame_ptr`,
/// encoded as the header says: pc-relative or absolute, 4 or 8 bytes).
fn eh_frame_of(hdr: &[u8], at: u64) -> Option<u64> {
    const PCREL: u8 = 0x10;
    if hdr.len() < 4 || hdr[0] != 1 {
        return None;
    }
    let enc = hdr[1];
    let field = &hdr[4..];
    let value = match enc & 0x0f {
        0x0b => i32::from_le_bytes(field.get(..4)?.try_into().ok()?) as i64 as u64,
        0x03 => u32::from_le_bytes(field.get(..4)?.try_into().ok()?) as u64,
        0x04 | 0x0c => u64::from_le_bytes(field.get(..8)?.try_into().ok()?),
        _ => return None,
    };
    match enc & 0x70 {
        0 => Some(value),
        PCREL => Some((at + 4).wrapping_add(value)),
        _ => None,
    }
}
