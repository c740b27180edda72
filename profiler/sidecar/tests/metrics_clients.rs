//! The metrics endpoint serves every client: one sending its request a byte at a time does not hold
//! up the others, idle connections past the limit are told 503 at once instead of filling the
//! backlog, and `localhost:9464` is an address.

use memsight_sidecar::metrics::{parse_addr, serve, Metrics};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The status line of a GET /metrics, or None when no answer came within the read timeout.
fn status(addr: std::net::SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(4))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines().next().map(str::to_string)
}

#[test]
fn slow_and_idle_clients_do_not_block_the_others() {
    let m = Arc::new(Metrics::new(vec![("job".into(), "t".into())]));
    let addr = serve("127.0.0.1:0".parse().unwrap(), m).unwrap();

    // A client that sends its request one byte a second, for as long as the test runs.
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            while !stop.load(Ordering::Relaxed) {
                if s.write_all(b"G").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(status(addr).as_deref(), Some("HTTP/1.1 200 OK"));

    // Idle connections up to the limit: the next client is told so at once.
    let idle: Vec<TcpStream> = (0..16).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        status(addr).as_deref(),
        Some("HTTP/1.1 503 Service Unavailable")
    );
    // Idle clients run out of time and make room.
    let mut got = None;
    for _ in 0..40 {
        got = status(addr);
        if got.as_deref() == Some("HTTP/1.1 200 OK") {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(got.as_deref(), Some("HTTP/1.1 200 OK"));
    drop(idle);
    stop.store(true, Ordering::Relaxed);
    trickle.join().unwrap();
}

#[test]
fn host_names_are_addresses() {
    assert!(parse_addr("localhost:9464").unwrap().ip().is_loopback());
    assert_eq!(parse_addr("127.0.0.1:0").unwrap().port(), 0);
    let e = parse_addr("9464").unwrap_err();
    assert!(e.contains("HOST:PORT"), "{e}");
}
