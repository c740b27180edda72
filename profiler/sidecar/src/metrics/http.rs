//! The `/metrics` endpoint: plain HTTP served by one thread that waits on every connection at once
//! (`poll`, non-blocking sockets), so no client — idle, slow or gone — holds up another; and the
//! address it binds.

use super::Metrics;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Parses a metrics address: `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT` (`localhost:9464`), the
/// first address the name resolves to.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    match s.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("`{s}` resolves to no address")),
        Err(e) => Err(format!(
            "`{s}` is not an address (HOST:PORT, e.g. 127.0.0.1:9464 or localhost:9464): {e}"
        )),
    }
}

/// Connections open at once; at the limit the oldest is closed to make room for a new one, so idle
/// clients can delay nobody: a scraper sends its request at once and is answered long before
/// [`MAX_CONNECTIONS`] newer connections could push it out.
const MAX_CONNECTIONS: usize = 256;
/// Longest a client has to send its request and take the answer.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Longest request read; anything after it is ignored.
const MAX_REQUEST: usize = 16 * 1024;

/// One client: its request so far, then the answer being written.
struct Conn {
    stream: TcpStream,
    deadline: Instant,
    request: Vec<u8>,
    /// The answer and how much of it is written, once the request is in.
    answer: Option<(Vec<u8>, usize)>,
}

/// Serves `/metrics` at `addr` on a thread of its own; returns the address bound (port 0 picks
/// one). The thread waits on all connections at once; each gets [`REQUEST_DEADLINE`] in all, and
/// at most [`MAX_CONNECTIONS`] are kept (the oldest goes first): a slow or idle client cannot hold
/// the others up.
pub fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("memsight-metrics".into())
        .spawn(move || {
            let mut conns: Vec<Conn> = Vec::new();
            loop {
                wait(&listener, &conns);
                accept(&listener, &mut conns);
                let now = Instant::now();
                conns.retain_mut(|c| now < c.deadline && step(c, &metrics));
            }
        })?;
    Ok(bound)
}

/// Waits until the listener or a connection is ready, or the nearest deadline passes.
fn wait(listener: &TcpListener, conns: &[Conn]) {
    let mut fds = Vec::with_capacity(conns.len() + 1);
    fds.push(libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    for c in conns {
        fds.push(libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: if c.answer.is_some() {
                libc::POLLOUT
            } else {
                libc::POLLIN
            },
            revents: 0,
        });
    }
    let now = Instant::now();
    let timeout = conns
        .iter()
        .map(|c| c.deadline.saturating_duration_since(now))
        .min()
        .map_or(-1, |d| d.as_millis().min(60_000) as libc::c_int + 1);
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures for the call's duration.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
}

/// Takes every pending connection, closing the oldest ones over [`MAX_CONNECTIONS`].
fn accept(listener: &TcpListener, conns: &mut Vec<Conn>) {
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Out of descriptors, say: the connection stays queued; try again shortly rather than
            // spin on a listener that stays readable.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(50));
                return;
            }
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        if conns.len() >= MAX_CONNECTIONS {
            conns.remove(0);
        }
        conns.push(Conn {
            stream,
            deadline: Instant::now() + REQUEST_DEADLINE,
            request: Vec::with_capacity(1024),
            answer: None,
        });
    }
}

/// Moves one connection on as far as it goes without waiting; false once it is finished.
fn step(c: &mut Conn, metrics: &Metrics) -> bool {
    if c.answer.is_none() {
        let mut buf = [0u8; 4096];
        loop {
            match c.stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    c.request.extend_from_slice(&buf[..n]);
                    if complete(&c.request) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
        c.answer = Some((respond(&c.request, metrics), 0));
    }
    let Some((answer, written)) = c.answer.as_mut() else {
        return false;
    };
    while *written < answer.len() {
        match c.stream.write(&answer[*written..]) {
            Ok(0) => return false,
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    let _ = c.stream.shutdown(std::net::Shutdown::Write);
    false
}

/// Whether the request's head is in (or it is as long as one is read).
fn complete(request: &[u8]) -> bool {
    request.len() >= MAX_REQUEST || request.windows(4).any(|w| w == b"\r\n\r\n")
}

/// The whole HTTP answer to `request`: the metrics for `GET /metrics`, 404 otherwise.
fn respond(request: &[u8], metrics: &Metrics) -> Vec<u8> {
    let first = request.split(|&b| b == b'\n').next().unwrap_or_default();
    let (status, ctype, body) =
        if first.starts_with(b"GET /metrics ") || first.starts_with(b"GET /metrics?") {
            (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                metrics.encode(),
            )
        } else {
            (
                "404 Not Found",
                "text/plain",
                "memsight serves /metrics only\n".to_string(),
            )
        };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
