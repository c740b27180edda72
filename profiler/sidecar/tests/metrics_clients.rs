//! The metrics endpoint serves every client: one sending its request a byte at a time does not hold
//! up the others, neither do idle connections (32 of them, or more than the server keeps open), and
//! `localhost:9464` is an address.

use memsight_sidecar::metrics::{parse_addr, serve, Metrics};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The status line of a GET /metrics, or None when no answer came within the read timeout.
fn status(addr: std::net::SocketAddr) -> Option<String> {
    status_within(addr, Duration::from_secs(4))
}

/// The status line of a GET /metrics, or None when no answer came within `limit`.
fn status_within(addr: std::net::SocketAddr, limit: Duration) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(limit)).ok()?;
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

    // Idle connections, more than the server keeps open at once: a scrape is still answered.
    for n in [32, 300] {
        let idle: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect();
        assert_eq!(
            status_within(addr, Duration::from_secs(60)).as_deref(),
            Some("HTTP/1.1 200 OK"),
            "with {n} idle connections open"
        );
        drop(idle);
    }
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
