//! The heap-profile section of a session's report when the session has no sidecar: symbolized
//! (with the `symbolize` feature) in a forked child, never in the job's own address space; or the
//! profiles and how to read their sites.
//!
//! Symbolizing maps the loaded objects' symbol tables and debug information — for a PyTorch job,
//! libtorch's hundreds of MiB — and touching them counts in the process's resident set: done in
//! the job, it raised a 550 MiB job's max RSS by 180 MiB in its last 0.2 s (issue 41). A forked
//! child shares the job's pages copy-on-write, symbolizes in its own resident set (file pages that
//! the kernel can drop, and the symbolizer's own few tens of MiB), and sends the section back as
//! JSON through a pipe. A child that fails, or runs past [`DEADLINE`], leaves the report
//! unsymbolized, with a note that says how to list its sites; the readers (`memsight summary`,
//! `view`, `heap top`) symbolize such a report's profiles when they open it.

use super::{sample_bytes, DumpKind, DumpRecord, HeapProfile};
use std::path::Path;

/// How long the child may take before the session gives up on it (and kills it).
#[cfg(feature = "symbolize")]
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// The report's heap-profile section for `dumps` (its profiles; `report_dir`: where the report
/// goes): symbolized apart from the job with the `symbolize` feature, else unsymbolized.
pub(crate) fn section(dumps: Vec<DumpRecord>, report_dir: &Path) -> Option<HeapProfile> {
    #[cfg(feature = "symbolize")]
    {
        match in_child(&dumps, report_dir) {
            Ok(section) => section,
            Err(e) => Some(unsymbolized(dumps, Some(e))),
        }
    }
    #[cfg(not(feature = "symbolize"))]
    {
        let _ = report_dir;
        Some(unsymbolized(dumps, None))
    }
}

/// The section without sites: the profiles, and how to list the sites at the peak (`why`: what
/// kept the job from symbolizing them).
fn unsymbolized(dumps: Vec<DumpRecord>, why: Option<String>) -> HeapProfile {
    let peak = dumps
        .iter()
        .find(|d| d.kind == DumpKind::Peak)
        .or(dumps.last())
        .map(|d| d.path.clone())
        .unwrap_or_default();
    let how = format!("`memsight heap top {peak}` lists its sites");
    let note = match why {
        Some(e) => format!("not symbolized by the job ({e}): {how}"),
        None => format!(
            "not symbolized by the job: {how} (`memsight run` puts them in the report, as does \
             memsight's `symbolize` feature)"
        ),
    };
    HeapProfile {
        sample_bytes: sample_bytes().unwrap_or_default(),
        at_peak: None,
        growth: None,
        dumps,
        notes: vec![note],
    }
}

/// Runs the symbolizer in a forked child and reads its section back.
#[cfg(feature = "symbolize")]
fn in_child(dumps: &[DumpRecord], report_dir: &Path) -> Result<Option<HeapProfile>, String> {
    use std::io::Read;
    use std::os::fd::FromRawFd;

    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!(
            "no pipe to a symbolizing child: {}",
            std::io::Error::last_os_error()
        ));
    }
    let [read_fd, write_fd] = fds;
    // SAFETY: the child runs only the symbolizer (in the calling thread's copy of the process:
    // jemalloc's and the sampler's fork handlers leave the allocator usable there), writes to the
    // pipe and leaves with `_exit`, running no exit handler of the job's.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child's copy of the read end.
        unsafe { libc::close(read_fd) };
        let section =
            std::panic::catch_unwind(|| memsight_analysis::heapprof::summarize(dumps, report_dir));
        let code = match section.ok().and_then(|s| serde_json::to_vec(&s).ok()) {
            Some(json) => i32::from(!write_all(write_fd, &json)),
            None => 1,
        };
        // SAFETY: ends the child without running the job's exit handlers or destructors.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: the parent's write end (the child has its own).
    unsafe { libc::close(write_fd) };
    if pid < 0 {
        // SAFETY: the read end, unused.
        unsafe { libc::close(read_fd) };
        return Err(format!(
            "no symbolizing child: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the read end is the parent's own; the `File` owns it from here.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(read_fd) };
    let started = std::time::Instant::now();
    let mut json = Vec::new();
    let mut buf = [0u8; 64 << 10];
    let finished = loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        if left.is_zero() {
            break false;
        }
        let mut pfd = libc::pollfd {
            fd: read_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32) };
        if ready < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break false;
        }
        if ready <= 0 {
            continue;
        }
        match pipe.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => json.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
    };
    if !finished {
        // SAFETY: our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: reaps our own child.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    {}
    if !finished {
        return Err(format!(
            "the symbolizing child took longer than {} s",
            DEADLINE.as_secs()
        ));
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err("the symbolizing child failed".into());
    }
    serde_json::from_slice(&json).map_err(|e| format!("the symbolizing child's answer: {e}"))
}

/// Writes all of `data` to `fd`; `false` when the pipe refused it.
#[cfg(feature = "symbolize")]
fn write_all(fd: i32, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        // SAFETY: `data` is valid for its length.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        data = &data[n as usize..];
    }
    true
}
