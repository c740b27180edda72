//! The `/metrics` endpoint: plain HTTP on a thread of its own, a bounded number of connections at
//! once, each with a deadline; and the address it binds.

use super::Metrics;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// Connections answered at once; more are told 503 and closed.
const MAX_CONNECTIONS: usize = 16;
/// Longest a client has to send its request and take the answer.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// Longest the accept loop spends telling a client over the limit that it is busy.
const REFUSAL_DEADLINE: Duration = Duration::from_millis(200);

/// Answers 503 to a client over the limit. Its request is read first (within
/// [`REFUSAL_DEADLINE`]): closing a socket with unread bytes resets the connection, and the client
/// may then lose the answer (seen on a loaded 2-core machine).
fn refuse(mut conn: TcpStream) {
    let deadline = std::time::Instant::now() + REFUSAL_DEADLINE;
    let _ = conn.set_read_timeout(Some(REFUSAL_DEADLINE));
    let _ = conn.set_write_timeout(Some(REFUSAL_DEADLINE));
    let mut buf = [0u8; 4096];
    let mut tail = [0u8; 4];
    while std::time::Instant::now() < deadline {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                for &b in &buf[..n] {
                    tail = [tail[1], tail[2], tail[3], b];
                }
                if &tail == b"\r\n\r\n" {
                    break;
                }
            }
        }
    }
    let _ = conn.write_all(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

/// Serves `/metrics` at `addr` on a thread of its own; returns the address bound (port 0 picks
/// one). Each connection is answered on its own thread, at most [`MAX_CONNECTIONS`] at once, and
/// gets [`REQUEST_DEADLINE`] in all: a slow or idle client cannot hold the others up.
pub fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let busy = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("memsight-metrics".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                    busy.fetch_sub(1, Ordering::AcqRel);
                    refuse(conn);
                    continue;
                }
                let (m, b) = (Arc::clone(&metrics), Arc::clone(&busy));
                let spawned = std::thread::Builder::new()
                    .name("memsight-metrics-conn".into())
                    .spawn(move || {
                        let _ = answer(conn, &m);
                        b.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    busy.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
    Ok(bound)
}

fn answer(mut conn: TcpStream, metrics: &Metrics) -> io::Result<()> {
    let deadline = std::time::Instant::now() + REQUEST_DEADLINE;
    let left = || {
        deadline
            .checked_duration_since(std::time::Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "request too slow"))
    };
    conn.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
        conn.set_read_timeout(Some(left()?))?;
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let first = req.split(|&b| b == b'\n').next().unwrap_or_default();
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
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
