//! The C library's credential changes (`setuid`, `setresgid`, `setgroups`, …), with the session's
//! sampler thread paused around each. The C library applies such a change to every thread of the
//! process and aborts the process when one thread's change fails. A program that kept a capability
//! on its own thread only — `setpriv --reuid … --regid …` sets `PR_SET_KEEPCAPS`, changes the uid,
//! restores its capabilities with `capset` (per thread), then changes the gid — would have
//! memsight's thread, without `CAP_SETGID`, refuse the second change, and be aborted before it ran
//! its program. Paused, the thread is not there; started again, it has the new credentials.

use std::ffi::c_int;
use std::sync::atomic::AtomicUsize;

/// Defines `$name` over the C library's, with the sampler paused around the call.
macro_rules! paused {
    ($name:ident, $c_name:literal, ($($arg:ident: $ty:ty),*)) => {
        /// The C library's function of this name, with memsight's sampler thread paused around
        /// the change (see the module's documentation).
        ///
        /// # Safety
        /// As the C library's.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            static REAL: AtomicUsize = AtomicUsize::new(0);
            let f = crate::next_definition(&REAL, $c_name);
            if f == 0 {
                // SAFETY: errno is this thread's.
                unsafe { *libc::__errno_location() = libc::ENOSYS };
                return -1;
            }
            // SAFETY: the C library's function of this name, with this signature.
            let real: unsafe extern "C" fn($($ty),*) -> c_int = unsafe { std::mem::transmute(f) };
            crate::job::with_sampler_paused(|| unsafe { real($($arg),*) })
        }
    };
}

paused!(setuid, c"setuid", (uid: libc::uid_t));
paused!(setgid, c"setgid", (gid: libc::gid_t));
paused!(seteuid, c"seteuid", (uid: libc::uid_t));
paused!(setegid, c"setegid", (gid: libc::gid_t));
paused!(setreuid, c"setreuid", (ruid: libc::uid_t, euid: libc::uid_t));
paused!(setregid, c"setregid", (rgid: libc::gid_t, egid: libc::gid_t));
paused!(setresuid, c"setresuid", (ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t));
paused!(setresgid, c"setresgid", (rgid: libc::gid_t, egid: libc::gid_t, sgid: libc::gid_t));
paused!(setgroups, c"setgroups", (size: libc::size_t, list: *const libc::gid_t));
