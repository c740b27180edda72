//! `memsight top [PID|SOCKET]` and `memsight view REPORT.json`: the terminal viewer. One main loop
//! owns the state; a reader thread turns the sidecar's stream into records (reconnecting with
//! backoff); keys become intents; frames are drawn at 10 Hz. SIGTERM, SIGHUP and SIGINT end the
//! loop like `q`, so the terminal is always restored.

use memsight_format::wire::stream::StreamReader;
use memsight_format::wire::Record;
use memsight_format::Report;
use memsight_tui::state::backoff::Backoff;
use memsight_tui::state::connection::{self, Down};
use memsight_tui::state::ViewerState;
use memsight_tui::view::{intent, render, Ui};
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Attaches to a sidecar.
#[derive(clap::Args)]
pub struct TopArgs {
    /// The job's pid (its sidecar's socket in the runtime directory) or a socket path; without
    /// it, the one running sidecar.
    target: Option<String>,
}

/// Replays a report.
#[derive(clap::Args)]
pub struct ViewArgs {
    /// The report.
    report: PathBuf,
}

/// Messages from the reader thread.
enum Feed {
    Up,
    Record(Record),
    Down(Down),
}

/// The jobs with a live sidecar socket in the runtime directory: (pid, command line).
fn running_sidecars() -> Vec<(u32, String)> {
    let Ok(dir) = memsight_format::wire::runtime_dir() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = memsight_format::wire::pid_of_file_name(&name, "sidecar-", ".sock") else {
            continue;
        };
        let cmd = memsight::collect::command_line(pid);
        if !cmd.is_empty() {
            let words: Vec<_> = cmd.iter().map(|c| c.to_string_lossy()).collect();
            found.push((pid, words.join(" ")));
        }
    }
    found.sort();
    found
}

/// The socket of a pid's sidecar: its own; else that of a job it started (the pid of `memsight
/// run` itself, what `$!` gives a shell that ran it in the background: the sidecar is named by
/// the job's first process, its child); else the first of its ancestors' (a rank, a worker or a
/// helper of a job under `memsight run`).
fn socket_of(target: &str) -> Result<PathBuf, String> {
    let Ok(pid) = target.parse::<u32>() else {
        return Ok(PathBuf::from(target));
    };
    let own = memsight_sidecar::server::socket_path(pid)
        .map_err(|(p, e)| format!("{}: {e}", p.display()))?;
    if own.exists() {
        return Ok(own);
    }
    for (job, _) in running_sidecars() {
        if parent_of(job) == Some(pid) {
            if let Ok(s) = memsight_sidecar::server::socket_path(job) {
                if s.exists() {
                    return Ok(s);
                }
            }
        }
    }
    let mut p = pid;
    for _ in 0..64 {
        match parent_of(p) {
            Some(q) if q > 1 => {
                if let Ok(s) = memsight_sidecar::server::socket_path(q) {
                    if s.exists() {
                        return Ok(s);
                    }
                }
                p = q;
            }
            _ => break,
        }
    }
    Ok(own)
}

/// A process's parent, from `/proc/PID/stat`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn reader(socket: PathBuf) -> Receiver<Feed> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut backoff = Backoff::default();
        loop {
            let down = match UnixStream::connect(&socket) {
                Ok(s) => {
                    backoff.reset();
                    if tx.send(Feed::Up).is_err() {
                        return;
                    }
                    let mut r = StreamReader::new(BufReader::new(s));
                    loop {
                        match r.next_record() {
                            Ok(Some(rec)) => {
                                let ended = matches!(rec, Record::Ended { .. });
                                if tx.send(Feed::Record(rec)).is_err() {
                                    return;
                                }
                                if ended {
                                    return;
                                }
                            }
                            Ok(None) => {
                                break Down {
                                    why: "the sidecar closed the connection".into(),
                                    retry: true,
                                }
                            }
                            Err(e) => break connection::stream_failed(&e),
                        }
                    }
                }
                Err(e) => connection::connect_failed(&socket, &e),
            };
            let retry = down.retry;
            if tx.send(Feed::Down(down)).is_err() || !retry {
                return;
            }
            std::thread::sleep(backoff.next_delay());
        }
    });
    rx
}

/// Signals that end the viewer: it leaves the loop and restores the terminal instead of dying
/// with the terminal raw and on the alternate screen.
const STOP_SIGNALS: [i32; 3] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGINT,
];

/// The last stop signal received (0: none), set by the handlers `signal-hook` installs.
/// Waits up to `timeout` for input on the terminal (standard input): `Ok(true)` when some is
/// there, `Ok(false)` on timeout, `Err` when the terminal hung up or is unusable. When standard
/// input is not a terminal (crossterm then reads /dev/tty), crossterm's own poll waits.
fn terminal_input(timeout: Duration) -> Result<bool, String> {
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        return event::poll(timeout).map_err(|e| e.to_string());
    }
    let mut p = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut p, 1, ms) };
    if ready < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(format!("cannot wait on the terminal: {e}"))
        };
    }
    if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return Err("the terminal hung up".into());
    }
    Ok(ready == 1)
}

fn watch_stop_signals() -> Arc<AtomicUsize> {
    let got = Arc::new(AtomicUsize::new(0));
    for sig in STOP_SIGNALS {
        if let Err(e) = signal_hook::flag::register_usize(sig, Arc::clone(&got), sig as usize) {
            eprintln!("memsight: cannot watch signal {sig}: {e}");
        }
    }
    got
}

/// Runs the viewer until `q` or a stop signal; `feed` drives a live state.
fn run_ui(mut state: ViewerState, feed: Option<Receiver<Feed>>) -> ExitCode {
    let signalled = watch_stop_signals();
    let mut term = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("memsight: cannot open the terminal: {e}");
            return ExitCode::from(2);
        }
    };
    let mut ui = Ui::default();
    let mut last_error = None;
    let mut hung_up = false;
    let frame = Duration::from_millis(100);
    // A running job's sites come from its profiled peak so far, read on a thread.
    let (want_sites, sites) = memsight_tui::sites::reader();
    let result = loop {
        let t0 = Instant::now();
        if let Some(rx) = &feed {
            loop {
                match rx.try_recv() {
                    Ok(Feed::Up) => state.set_connected(true),
                    Ok(Feed::Record(r @ Record::HeapProfile(_))) => {
                        let before = state.peak_heap_dump.clone();
                        state.apply(r);
                        if let Some(d) = state
                            .peak_heap_dump
                            .as_ref()
                            .filter(|d| Some(*d) != before.as_ref())
                        {
                            let _ = want_sites.send(d.clone());
                        }
                    }
                    Ok(Feed::Record(r)) => state.apply(r),
                    Ok(Feed::Down(down)) => {
                        last_error = Some(down.why.clone());
                        state.set_down(down);
                    }
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            while let Ok(v) = sites.try_recv() {
                state.live_sites = Some(v);
            }
        }
        if let Err(e) = term.draw(|f| render(f, &state, &ui)) {
            break Err(e);
        }
        let mut quit = false;
        loop {
            // Waits on the terminal itself first: once it hangs up (its pty's other end closed,
            // e.g. the tmux server killed), crossterm reads end-of-file forever inside its poll.
            match terminal_input(frame.saturating_sub(t0.elapsed())) {
                Ok(true) => {}
                Ok(false) => break,
                Err(why) => {
                    last_error = Some(why);
                    hung_up = true;
                    quit = true;
                    break;
                }
            }
            while let Ok(true) = event::poll(Duration::ZERO) {
                match event::read() {
                    Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                        if let Some(i) = intent(k) {
                            quit |= !ui.apply(i, state.timeline.len());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        last_error = Some(e.to_string());
                        quit = true;
                    }
                }
            }
            if quit {
                break;
            }
        }
        if quit || signalled.load(Ordering::Relaxed) != 0 {
            break Ok(());
        }
    };
    // Not `ratatui::restore`: it reports a failure with `eprintln!`, which panics when the
    // terminal is gone, and `memsight run --live` must go on to write the job's report.
    if hung_up {
        // Its drop would report (with `eprintln!`, which panics) that it cannot show the cursor.
        std::mem::forget(term);
    }
    let _ = ratatui::try_restore();
    let sig = signalled.load(Ordering::Relaxed);
    match result {
        // The shell's code for death by that signal, now that the terminal is back.
        Ok(()) if sig != 0 => ExitCode::from((128 + sig).min(255) as u8),
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "memsight: {e}{}",
                last_error.map_or(String::new(), |w| format!(" ({w})"))
            );
            ExitCode::from(2)
        }
    }
}

/// `memsight top`.
pub fn top(a: TopArgs) -> ExitCode {
    let target = match a.target {
        Some(t) => t,
        None => match running_sidecars().as_slice() {
            [(pid, _)] => pid.to_string(),
            [] => {
                eprintln!("memsight top: no running sidecar (start the job with `memsight run` or `memsight attach PID`)");
                return ExitCode::from(2);
            }
            many => {
                eprintln!("memsight top: several jobs are watched; name one:");
                for (pid, cmd) in many {
                    eprintln!("  memsight top {pid}    # {cmd}");
                }
                return ExitCode::from(2);
            }
        },
    };
    let socket = match socket_of(&target) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("memsight top: {e}");
            return ExitCode::from(2);
        }
    };
    if !socket.exists() {
        eprintln!(
            "memsight top: no sidecar at {} (start the job with `memsight run` or `memsight attach PID`)",
            socket.display()
        );
        return ExitCode::from(2);
    }
    let state = ViewerState::live(&socket.display().to_string());
    run_ui(state, Some(reader(socket)))
}

/// The viewer on a sidecar socket (`memsight run --live`).
pub fn live(socket: &std::path::Path) -> ExitCode {
    let state = ViewerState::live(&socket.display().to_string());
    run_ui(state, Some(reader(socket.to_path_buf())))
}

/// `memsight view`.
pub fn view(a: ViewArgs) -> ExitCode {
    match Report::load(&a.report) {
        Ok(mut r) => run_ui(
            {
                memsight_analysis::heapprof::complete(&mut r, &a.report);
                ViewerState::from_report(&a.report.display().to_string(), r)
            },
            None,
        ),
        Err(e) => {
            eprintln!("memsight view: {e}");
            ExitCode::from(2)
        }
    }
}
