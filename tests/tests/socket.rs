//! The sidecar's socket as a viewer uses it: hello with the format version, the full state, then
//! snapshots and the job's end; a client that writes garbage or never reads does not disturb the
//! sidecar or other clients.

use memsight::wire::stream::StreamReader;
use memsight::wire::{Record, MAJOR};
use memsight_e2e::{memsight_bin, scratch};
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn wait_for(p: &std::path::Path) {
    let t = Instant::now();
    while !p.exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(p.exists(), "{} never appeared", p.display());
}

/// `memsight run` of a stepping job of `steps` steps: the sidecar, the job's pid, its socket (up).
fn watched_job(name: &str, interval: &str, steps: &str) -> (Child, u32, PathBuf) {
    let dir = scratch(name);
    let pid_file = dir.join("job.pid");
    let sidecar = Command::new(memsight_bin())
        .args(["run", "--interval", interval, "--report"])
        .arg(dir.join("r.json"))
        .args(["--", env!("CARGO_BIN_EXE_stepping_job"), "exit", "0", steps])
        .env("JOB_PID_FILE", &pid_file)
        .spawn()
        .unwrap();
    wait_for(&pid_file);
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let sock = memsight_sidecar::server::socket_path(pid).unwrap();
    wait_for(&sock);
    (sidecar, pid, sock)
}

#[test]
fn a_client_gets_hello_state_snapshots_and_the_end() {
    let (mut sidecar, pid, sock) = watched_job("socket", "20ms", "30");

    // A rude client: writes garbage and never reads.
    let mut rude = UnixStream::connect(&sock).unwrap();
    rude.write_all(b"GET / HTTP/1.1\r\n\r\n\xff\xfe garbage")
        .unwrap();

    let mut r = StreamReader::new(BufReader::new(UnixStream::connect(&sock).unwrap()));
    match r.next_record().unwrap() {
        Some(Record::SidecarHello {
            major,
            job_pid,
            command,
            ..
        }) => {
            assert_eq!(major, MAJOR);
            assert_eq!(job_pid, pid);
            assert!(
                command.iter().any(|c| c.contains("stepping_job")),
                "{command:?}"
            );
        }
        other => panic!("expected the hello, got {other:?}"),
    }
    assert!(matches!(
        r.next_record().unwrap(),
        Some(Record::State { .. })
    ));
    let (mut snapshots, mut ended, mut last_step) = (0, None, 0);
    while let Some(rec) = r.next_record().unwrap() {
        match rec {
            Record::Snapshot(s) => {
                snapshots += 1;
                assert!(s.step >= last_step, "steps went backwards");
                last_step = s.step;
            }
            Record::Ended {
                description,
                post_mortem,
            } => {
                assert_eq!(post_mortem.map(|p| p.cause), Some("exited".to_string()));
                ended = Some(description);
            }
            Record::Phases { phases, .. } => assert!(!phases.is_empty()),
            _ => {}
        }
    }
    assert!(snapshots >= 5, "{snapshots} snapshots");
    assert!(ended.unwrap().contains("exited with code 0"));
    assert!(last_step >= 25);
    assert!(sidecar.wait().unwrap().success());
    assert!(!sock.exists(), "the socket was not removed");
    drop(rude);
}

#[test]
fn another_user_cannot_connect() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: a real second uid needs root; the uid check is unit-tested in the server");
        return;
    }
    let (mut sidecar, _, sock) = watched_job("socket-uid", "100ms", "40");
    // The same connect as root succeeds; as uid 65534 (nobody) it is refused.
    assert!(UnixStream::connect(&sock).is_ok());
    use std::os::unix::process::CommandExt;
    let probe = Command::new(env!("CARGO_BIN_EXE_connect_probe"))
        .arg(&sock)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&probe.stdout);
    assert!(said.starts_with("refused"), "uid 65534 got: {said}");
    sidecar.wait().unwrap();
}
