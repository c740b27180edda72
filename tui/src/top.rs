//! `memsight top [PID|SOCKET]` and `memsight view REPORT.json`: the terminal viewer. One main loop
//! owns the state; a reader thread turns the sidecar's stream into records (reconnecting with
//! backoff); keys become intents; frames are drawn at 10 Hz.

use memsight::wire::stream::StreamReader;
use memsight::wire::Record;
use memsight::Report;
use memsight_tui::state::backoff::Backoff;
use memsight_tui::state::ViewerState;
use memsight_tui::view::{intent, render, Ui};
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::{channel, Receiver, TryRecvError};
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
    Down(String),
}

/// The jobs with a live sidecar socket in the runtime directory: (pid, command line).
fn running_sidecars() -> Vec<(u32, String)> {
    let Ok(dir) = memsight::wire::runtime_dir() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("sidecar-")
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
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

fn socket_of(target: &str) -> Result<PathBuf, String> {
    match target.parse::<u32>() {
        Ok(pid) => memsight::sidecar::server::socket_path(pid)
            .map_err(|(p, e)| format!("{}: {e}", p.display())),
        Err(_) => Ok(PathBuf::from(target)),
    }
}

fn reader(socket: PathBuf) -> Receiver<Feed> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut backoff = Backoff::default();
        loop {
            match UnixStream::connect(&socket) {
                Ok(s) => {
                    backoff.reset();
                    if tx.send(Feed::Up).is_err() {
                        return;
                    }
                    let mut r = StreamReader::new(BufReader::new(s));
                    let why = loop {
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
                            Ok(None) => break "the sidecar closed the connection".to_string(),
                            Err(e) => break e.to_string(),
                        }
                    };
                    if tx.send(Feed::Down(why)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    if tx
                        .send(Feed::Down(format!("{}: {e}", socket.display())))
                        .is_err()
                    {
                        return;
                    }
                }
            }
            std::thread::sleep(backoff.next_delay());
        }
    });
    rx
}

/// Runs the viewer until `q`; `feed` drives a live state.
fn run_ui(mut state: ViewerState, feed: Option<Receiver<Feed>>) -> ExitCode {
    let mut term = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("memsight: cannot open the terminal: {e}");
            return ExitCode::from(2);
        }
    };
    let mut ui = Ui::default();
    let mut last_error = None;
    let frame = Duration::from_millis(100);
    let result = loop {
        let t0 = Instant::now();
        if let Some(rx) = &feed {
            loop {
                match rx.try_recv() {
                    Ok(Feed::Up) => state.set_connected(true),
                    Ok(Feed::Record(r)) => state.apply(r),
                    Ok(Feed::Down(why)) => {
                        state.set_connected(false);
                        last_error = Some(why);
                    }
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
        }
        if let Err(e) = term.draw(|f| render(f, &state, &ui)) {
            break Err(e);
        }
        let mut quit = false;
        while let Ok(true) = event::poll(frame.saturating_sub(t0.elapsed())) {
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
            if quit {
                break;
            }
        }
        if quit {
            break Ok(());
        }
    };
    ratatui::restore();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
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
        Ok(r) => run_ui(
            ViewerState::from_report(&a.report.display().to_string(), r),
            None,
        ),
        Err(e) => {
            eprintln!("memsight view: {e}");
            ExitCode::from(2)
        }
    }
}
