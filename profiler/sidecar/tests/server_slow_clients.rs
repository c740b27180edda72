//! Viewers that connect and never read cannot pin the sidecar's memory: each is disconnected once a
//! write has waited the server's write timeout (and counted), and clients past the limit are
//! refused with a line that says why.

use memsight_format::wire::Record;
use memsight_format::Snapshot;
use memsight_sidecar::server::{Limits, Server};
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[test]
fn clients_that_never_read_are_dropped_and_counted() {
    let dir = std::env::temp_dir().join(format!("memsight-slow-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sidecar-1.sock");
    let limits = Limits {
        write_timeout: Duration::from_secs(1),
        max_clients: 3,
    };
    let server = Server::start_with(&path, 1, vec!["job".into()], limits).unwrap();
    // A state of a few MiB: far more than a socket buffer holds.
    let mut s = Snapshot {
        phase: Some("x".repeat(2000)),
        ..Snapshot::default()
    };
    for t in 0..2000 {
        s.t_ms = t;
        server.publish(&Record::Snapshot(Box::new(s.clone())));
    }
    let idle: Vec<UnixStream> = (0..3)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    // The fourth is refused at once, with the reason.
    let extra = UnixStream::connect(&path).unwrap();
    let mut first = String::new();
    BufReader::new(extra).read_line(&mut first).unwrap();
    assert!(first.contains("refused: too many viewers"), "{first}");
    // The idle three are let go; nobody is served any more.
    let mut waited = 0;
    while (server.clients() > 0 || server.slow_clients() < 3) && waited < 600 {
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
    }
    assert_eq!(server.slow_clients(), 3);
    assert_eq!(server.clients(), 0);
    // A viewer that reads is served again.
    let mut r = BufReader::new(UnixStream::connect(&path).unwrap());
    let mut hello = String::new();
    r.read_line(&mut hello).unwrap();
    assert!(hello.contains("sidecar_hello"), "{hello}");
    drop(idle);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
