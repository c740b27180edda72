//! The sidecar's Unix-socket server: `sidecar-<job pid>.sock` in the runtime directory (0700),
//! socket mode 0600, peer uid checked with SO_PEERCRED. Each client gets the greeting and the full
//! state, then every new record through its own bounded queue: a client that reads slowly gets
//! `dropped` notices instead of slowing the sidecar down. A client that stops reading altogether is
//! disconnected once a write has waited [`Limits::write_timeout`] (counted: [`Server::slow_clients`]),
//! so it cannot pin its copy of the state; at most [`Limits::max_clients`] are served at once.

use crate::lock;
use memsight_format::snapshot::Snapshot;
use memsight_format::timeline::{Timeline, DEFAULT_CAPACITY};
use memsight_format::wire::{Record, MAJOR, MINOR};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Records queued per client before it starts missing some.
const CLIENT_QUEUE: usize = 1024;

/// How much the server gives each client.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest a write to a client may wait before the client is dropped as not reading.
    pub write_timeout: std::time::Duration,
    /// Clients served at once; more are refused with an error line.
    pub max_clients: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            write_timeout: std::time::Duration::from_secs(10),
            max_clients: 32,
        }
    }
}

struct Client {
    tx: SyncSender<Arc<str>>,
    dropped: Arc<AtomicU64>,
}

struct Inner {
    hello: Arc<str>,
    timeline: Timeline,
    clients: Vec<Client>,
}

/// A running socket server; stops (and removes its socket) when dropped, after giving clients up
/// to [`DRAIN`] to receive what was queued for them (the `ended` record, typically).
pub struct Server {
    path: PathBuf,
    inner: Arc<Mutex<Inner>>,
    stop: Arc<AtomicBool>,
    /// One clone per live client thread.
    writers: Arc<()>,
    /// Clients disconnected because they stopped reading.
    slow: Arc<AtomicU64>,
}

/// Longest wait for client threads to send their last records when the server stops.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

fn line(r: &Record) -> Arc<str> {
    let mut s = serde_json::to_string(r).unwrap_or_else(|_| "{\"type\":\"unknown\"}".into());
    s.push('\n');
    s.into()
}

/// The socket path of the sidecar watching `job_pid`.
pub fn socket_path(job_pid: u32) -> Result<PathBuf, (PathBuf, io::Error)> {
    Ok(
        memsight_format::wire::runtime_dir()?.join(memsight_format::wire::pid_file_name(
            "sidecar-", job_pid, ".sock",
        )),
    )
}

/// Whether a peer with `peer_uid` may connect to a server run by `own_uid`.
pub fn peer_allowed(peer_uid: u32, own_uid: u32) -> bool {
    peer_uid == own_uid
}

fn peer_uid(s: &UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

impl Server {
    /// Listens at `path` (an old socket file there is replaced) with the default [`Limits`].
    pub fn start(path: &Path, job_pid: u32, command: Vec<String>) -> io::Result<Server> {
        Self::start_with(path, job_pid, command, Limits::default())
    }

    /// Listens at `path` with `limits`.
    pub fn start_with(
        path: &Path,
        job_pid: u32,
        command: Vec<String>,
        limits: Limits,
    ) -> io::Result<Server> {
        // A stale socket of a sidecar of this pid namespace is replaced; anything else is not.
        if let Ok(m) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !m.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists and is not a socket: left alone",
                ));
            }
            let _ = std::fs::remove_file(path);
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let hello = line(&Record::SidecarHello {
            major: MAJOR,
            minor: MINOR,
            job_pid,
            command,
        });
        let inner = Arc::new(Mutex::new(Inner {
            hello,
            timeline: Timeline::with_capacity(DEFAULT_CAPACITY),
            clients: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let writers = Arc::new(());
        let slow = Arc::new(AtomicU64::new(0));
        let shared = Shared {
            inner: Arc::clone(&inner),
            stop: Arc::clone(&stop),
            writers: Arc::clone(&writers),
            slow: Arc::clone(&slow),
            limits,
        };
        std::thread::Builder::new()
            .name("memsight-server".into())
            .spawn(move || accept_loop(listener, shared))?;
        Ok(Server {
            path: path.to_path_buf(),
            inner,
            stop,
            writers,
            slow,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends a record to every client (snapshots also join the state new clients get).
    pub fn publish(&self, record: &Record) {
        let text = line(record);
        let mut inner = lock(&self.inner);
        if let Record::Snapshot(s) = record {
            inner.timeline.push(Snapshot::clone(s));
        }
        inner
            .clients
            .retain(|c| match c.tx.try_send(Arc::clone(&text)) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    c.dropped.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            });
    }

    /// Clients being served now.
    pub fn clients(&self) -> usize {
        Arc::strong_count(&self.writers).saturating_sub(2)
    }

    /// Clients disconnected so far because they stopped reading.
    pub fn slow_clients(&self) -> u64 {
        self.slow.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag, then close every client's queue.
        let _ = UnixStream::connect(&self.path);
        lock(&self.inner).clients.clear();
        let _ = std::fs::remove_file(&self.path);
        // The accept loop holds one clone until it returns; each client thread one more.
        let deadline = std::time::Instant::now() + DRAIN;
        while Arc::strong_count(&self.writers) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// What the accept loop shares with the server.
struct Shared {
    inner: Arc<Mutex<Inner>>,
    stop: Arc<AtomicBool>,
    writers: Arc<()>,
    slow: Arc<AtomicU64>,
    limits: Limits,
}

fn accept_loop(listener: UnixListener, sh: Shared) {
    // SAFETY: getuid cannot fail.
    let own = unsafe { libc::getuid() };
    for conn in listener.incoming() {
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = conn else { continue };
        if !peer_uid(&stream).is_some_and(|u| peer_allowed(u, own)) {
            let _ =
                stream.write_all(b"{\"type\":\"error\",\"message\":\"refused: another user\"}\n");
            continue;
        }
        // Writers: the server's, this loop's (`sh.writers`) and one per client.
        if Arc::strong_count(&sh.writers).saturating_sub(2) >= sh.limits.max_clients {
            let _ = stream.set_nonblocking(true);
            let _ = stream
                .write_all(b"{\"type\":\"error\",\"message\":\"refused: too many viewers\"}\n");
            continue;
        }
        if stream
            .set_write_timeout(Some(sh.limits.write_timeout))
            .is_err()
        {
            continue;
        }
        let (tx, rx) = sync_channel::<Arc<str>>(CLIENT_QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        {
            // Greeting and state are queued under the lock that orders published records, so the
            // client sees every record after its state exactly once.
            let mut g = lock(&sh.inner);
            let state = line(&Record::State {
                timeline: g.timeline.samples().to_vec(),
            });
            let hello = Arc::clone(&g.hello);
            let _ = tx.try_send(hello);
            let _ = tx.try_send(state);
            g.clients.push(Client {
                tx,
                dropped: Arc::clone(&dropped),
            });
        }
        let token = Arc::clone(&sh.writers);
        let slow = Arc::clone(&sh.slow);
        let spawned = std::thread::Builder::new()
            .name("memsight-client".into())
            .spawn(move || {
                let _token = token;
                // A write that timed out: the client stopped reading; let it go (its queue and
                // state with it) and count it.
                let send = |stream: &mut UnixStream, text: &[u8]| match stream.write_all(text) {
                    Ok(()) => true,
                    Err(e) => {
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) {
                            slow.fetch_add(1, Ordering::Relaxed);
                        }
                        false
                    }
                };
                for text in rx {
                    let missed = dropped.swap(0, Ordering::Relaxed);
                    if missed > 0 {
                        let notice = line(&Record::Dropped { count: missed });
                        if !send(&mut stream, notice.as_bytes()) {
                            return;
                        }
                    }
                    if !send(&mut stream, text.as_bytes()) {
                        return;
                    }
                }
            });
        if spawned.is_err() {
            continue;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_user_may_connect() {
        assert!(peer_allowed(1000, 1000));
        assert!(!peer_allowed(0, 1000));
        assert!(!peer_allowed(1001, 1000));
    }
}
