//! The C++ allocation operators (`operator new`, `new[]`, `delete`, `delete[]` in all their
//! standard forms) of the job this library is preloaded into, served by the counted C family of
//! [`crate::malloc`], as the C++ runtime serves them by default (libstdc++'s `operator new` calls
//! `malloc`).
//!
//! Without them, an allocator the user preloads (`LD_PRELOAD=libtcmalloc.so.4` or
//! `libjemalloc.so.2`, common in training recipes) answered the program's `operator new` and
//! `delete` itself, past memsight's counting: a PyTorch job's heap read 26–29% low (its C++
//! objects, the autograd graph's among them). Here every form lands in `malloc`, `free` or
//! `posix_memalign` — the next allocator's, counted — whichever allocator that is.
//!
//! An allocator's own code may call `operator new` from inside its `malloc` (tcmalloc builds its
//! `MallocExtension` so, the first time `malloc_usable_size` runs): a `new` nested in one of this
//! module's on the same thread goes to the next definition of the operator, the allocator's own,
//! uncounted (served through `malloc` again, it recursed until the stack overflowed).
//!
//! A throwing `new` that the counted allocation cannot serve is handed to the next definition of
//! the same operator (the C++ runtime's, or the preloaded allocator's), which runs the program's
//! `new_handler` and throws `std::bad_alloc` as the standard requires; the exception unwinds
//! through this frame (`C-unwind`). A block that a `new_handler` then makes room for is served by
//! that definition: under glibc through `malloc` again, counted; under an allocator with operators
//! of its own, uncounted (the rare case of a handler that frees memory). A `nothrow` form returns
//! null at once, without calling the `new_handler`.

use crate::malloc::{free, malloc, posix_memalign};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::AtomicUsize;

/// `operator new(size_t)` and its kin, as the next library defines them.
type NewFn = unsafe extern "C-unwind" fn(usize) -> *mut c_void;
/// The aligned forms: `operator new(size_t, std::align_val_t)`.
type NewAlignedFn = unsafe extern "C-unwind" fn(usize, usize) -> *mut c_void;
/// The `nothrow` forms.
type NothrowFn = unsafe extern "C" fn(usize, *const c_void) -> *mut c_void;
/// The aligned `nothrow` forms.
type NothrowAlignedFn = unsafe extern "C" fn(usize, usize, *const c_void) -> *mut c_void;

thread_local! {
    /// True while this thread is inside one of this module's `new` forms.
    static IN_NEW: Cell<bool> = const { Cell::new(false) };
}

/// A counted block of `size` bytes (at least one: `new` of 0 bytes is a unique pointer), aligned
/// to `align` when that is above what `malloc` gives; null when the allocator refuses it.
///
/// # Safety
/// As `malloc`.
#[inline(always)]
unsafe fn counted(size: usize, align: usize) -> *mut c_void {
    IN_NEW.with(|g| g.set(true));
    let p = counted_block(size.max(1), align);
    IN_NEW.with(|g| g.set(false));
    p
}

/// True when this `new` is nested in another of this thread's (the allocator's own code).
#[inline(always)]
fn nested() -> bool {
    IN_NEW.with(Cell::get)
}

#[inline(always)]
unsafe fn counted_block(size: usize, align: usize) -> *mut c_void {
    if align <= 16 {
        return malloc(size);
    }
    let mut p = std::ptr::null_mut();
    let align = align.max(std::mem::size_of::<usize>());
    if posix_memalign(&mut p, align, size) == 0 {
        p
    } else {
        std::ptr::null_mut()
    }
}

/// The next library's definition of the operator named `name` (cached in `slot`); ends the process
/// with a line on stderr where there is none (a C++ program's runtime always has one).
#[cold]
#[inline(never)]
unsafe fn next_operator(slot: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let f = crate::next_definition(slot, name);
    if f == 0 {
        const MSG: &[u8] = b"memsight: no C++ allocation operator after the preloaded library \
to hand this one to\n";
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
        libc::abort();
    }
    f
}

/// Defines a throwing `new` form: the counted block, else the next definition's answer.
macro_rules! throwing_new {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// The C++ contract of the operator.
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name(size: usize) -> *mut c_void {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let p = if nested() {
                std::ptr::null_mut()
            } else {
                counted(size, 0)
            };
            if !p.is_null() {
                return p;
            }
            let f = next_operator(&NEXT, &cstr(concat!(stringify!($name), "\0")));
            std::mem::transmute::<usize, NewFn>(f)(size)
        }
    };
    ($name:ident, aligned, $doc:literal) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// The C++ contract of the operator.
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name(size: usize, align: usize) -> *mut c_void {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let p = if nested() {
                std::ptr::null_mut()
            } else {
                counted(size, align)
            };
            if !p.is_null() {
                return p;
            }
            let f = next_operator(&NEXT, &cstr(concat!(stringify!($name), "\0")));
            std::mem::transmute::<usize, NewAlignedFn>(f)(size, align)
        }
    };
}

/// Defines a `nothrow` `new` form: the counted block, or null.
macro_rules! nothrow_new {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// The C++ contract of the operator.
        #[no_mangle]
        pub unsafe extern "C" fn $name(size: usize, nothrow: *const c_void) -> *mut c_void {
            if nested() {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                let f = next_operator(&NEXT, &cstr(concat!(stringify!($name), "\0")));
                return std::mem::transmute::<usize, NothrowFn>(f)(size, nothrow);
            }
            counted(size, 0)
        }
    };
    ($name:ident, aligned, $doc:literal) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// The C++ contract of the operator.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            size: usize,
            align: usize,
            nothrow: *const c_void,
        ) -> *mut c_void {
            if nested() {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                let f = next_operator(&NEXT, &cstr(concat!(stringify!($name), "\0")));
                return std::mem::transmute::<usize, NothrowAlignedFn>(f)(size, align, nothrow);
            }
            counted(size, align)
        }
    };
}

/// Defines a `delete` form (plain, sized, aligned or `nothrow`: each frees the block).
macro_rules! delete {
    ($name:ident, $doc:literal $(, $extra:ident)*) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// The C++ contract of the operator.
        #[no_mangle]
        pub unsafe extern "C" fn $name(p: *mut c_void $(, $extra: usize)*) {
            free(p)
        }
    };
}

/// A `CStr` of a literal that ends in its only NUL.
const fn cstr(s: &str) -> &std::ffi::CStr {
    match std::ffi::CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => c"",
    }
}

throwing_new!(_Znwm, "`operator new(size_t)`.");
throwing_new!(_Znam, "`operator new[](size_t)`.");
throwing_new!(
    _ZnwmSt11align_val_t,
    aligned,
    "`operator new(size_t, align_val_t)`."
);
throwing_new!(
    _ZnamSt11align_val_t,
    aligned,
    "`operator new[](size_t, align_val_t)`."
);
nothrow_new!(_ZnwmRKSt9nothrow_t, "`operator new(size_t, nothrow_t)`.");
nothrow_new!(_ZnamRKSt9nothrow_t, "`operator new[](size_t, nothrow_t)`.");
nothrow_new!(
    _ZnwmSt11align_val_tRKSt9nothrow_t,
    aligned,
    "`operator new(size_t, align_val_t, nothrow_t)`."
);
nothrow_new!(
    _ZnamSt11align_val_tRKSt9nothrow_t,
    aligned,
    "`operator new[](size_t, align_val_t, nothrow_t)`."
);
delete!(_ZdlPv, "`operator delete(void*)`.");
delete!(_ZdaPv, "`operator delete[](void*)`.");
delete!(_ZdlPvm, "`operator delete(void*, size_t)`.", _size);
delete!(_ZdaPvm, "`operator delete[](void*, size_t)`.", _size);
delete!(
    _ZdlPvRKSt9nothrow_t,
    "`operator delete(void*, nothrow_t)`.",
    _nothrow
);
delete!(
    _ZdaPvRKSt9nothrow_t,
    "`operator delete[](void*, nothrow_t)`.",
    _nothrow
);
delete!(
    _ZdlPvSt11align_val_t,
    "`operator delete(void*, align_val_t)`.",
    _align
);
delete!(
    _ZdaPvSt11align_val_t,
    "`operator delete[](void*, align_val_t)`.",
    _align
);
delete!(
    _ZdlPvmSt11align_val_t,
    "`operator delete(void*, size_t, align_val_t)`.",
    _size,
    _align
);
delete!(
    _ZdaPvmSt11align_val_t,
    "`operator delete[](void*, size_t, align_val_t)`.",
    _size,
    _align
);
delete!(
    _ZdlPvSt11align_val_tRKSt9nothrow_t,
    "`operator delete(void*, align_val_t, nothrow_t)`.",
    _align,
    _nothrow
);
delete!(
    _ZdaPvSt11align_val_tRKSt9nothrow_t,
    "`operator delete[](void*, align_val_t, nothrow_t)`.",
    _align,
    _nothrow
);
