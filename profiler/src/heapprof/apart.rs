//! The heap-profile section of a session's report when the session has no sidecar: symbolized
//! (with the `symbolize` feature) in a process of its own, never in the job's address space; or
//! the profiles and how to read their sites.
//!
//! Symbolizing maps the loaded objects' symbol tables and debug information — for a PyTorch job,
//! libtorch's hundreds of MiB — and touching them counts in the process's resident set: done in
//! the job, it raised a 490 MiB job's max RSS by 230 MiB in its last 0.2 s (issue 41). Nor is it
//! done in a fork of the job: a fork of a multi-threaded process copies one thread (a lock another
//! thread held stays held in the child) and runs every library's fork handlers. The session starts
//! the job's own executable again (`posix_spawn`, through `std::process::Command`), and memsight's
//! pre-initialiser in it, seeing `MEMSIGHT_SYMBOLIZE_CHILD`, serves the request before any
//! library's initialiser runs and exits (`alloc::interpose`): the profiles and the report's
//! directory on its standard input, the report's section on its standard output, as JSON. A child
//! that fails, or runs past [`DEADLINE`], leaves the report unsymbolized, with a note that says how
//! to list its sites; the readers (`memsight summary`, `view`, `heap top`) symbolize such a
//! report's profiles when they open it.

use super::{sample_bytes, DumpKind, DumpRecord, HeapProfile};
#[cfg(feature = "symbolize")]
use crate::alloc::process_heap::{SymbolizeRequest, SYMBOLIZING_CHILD_ENV};
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

/// Runs the symbolizer in a child process (the job's executable, served by memsight's
/// pre-initialiser in `alloc::interpose`) and reads its section back.
#[cfg(feature = "symbolize")]
fn in_child(dumps: &[DumpRecord], report_dir: &Path) -> Result<Option<HeapProfile>, String> {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    if !crate::alloc::process_heap::preinit_ran() {
        // Started again, this program would not serve the request (memsight is in a library it
        // loaded, not in its executable).
        return Err("memsight is not linked into the program's executable".into());
    }
    let request: SymbolizeRequest = (dumps.to_vec(), report_dir.to_path_buf());
    let request = serde_json::to_vec(&request)
        .map_err(|e| format!("the symbolizing child's request: {e}"))?;
    // std's `Command` starts the program with `posix_spawn` when it can (no pre-exec hook, as
    // here): the job's fork handlers do not run.
    let mut child = Command::new("/proc/self/exe")
        .arg0("memsight-symbolize")
        .env(SYMBOLIZING_CHILD_ENV, "1")
        .env("MEMSIGHT_HEAP_SAMPLE", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("no symbolizing child: {e}"))?;
    let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("no pipes to the symbolizing child".into());
    };
    // The request is small (a few records): written whole before the answer is read.
    let sent = stdin.write_all(&request);
    drop(stdin);
    let started = std::time::Instant::now();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stdout);
    let mut json = Vec::new();
    let mut buf = [0u8; 64 << 10];
    let finished = sent.is_ok()
        && loop {
            let left = DEADLINE.saturating_sub(started.elapsed());
            if left.is_zero() {
                break false;
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, valid for the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32) };
            if ready < 0
                && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
            {
                break false;
            }
            if ready <= 0 {
                continue;
            }
            match stdout.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => json.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break false,
            }
        };
    if !finished {
        let _ = child.kill();
    }
    let status = child.wait();
    if !finished {
        return Err(format!(
            "the symbolizing child did not answer within {} s",
            DEADLINE.as_secs()
        ));
    }
    match status {
        Ok(s) if s.success() => {}
        _ => return Err("the symbolizing child failed".into()),
    }
    serde_json::from_slice(&json).map_err(|e| format!("the symbolizing child's answer: {e}"))
}
