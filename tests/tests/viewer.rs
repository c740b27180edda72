//! `memsight top` as a person uses it: a real job runs under `memsight run`, the viewer runs in
//! tmux, keys switch screens (send-keys) and the screen text (capture-pane) must agree with the
//! report the sidecar wrote (its peaks, and the allocation sites of the job's heap profiles). The set-up installs tmux; without it the test says why it skips.

use memsight_e2e::{memsight_bin, scratch, wait_until};
use serde_json::Value;
use std::process::Command;

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Kills its tmux session when dropped: a failing assertion does not leave the viewer running.
struct KillOnDrop(String);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

fn screen(session: &str) -> String {
    tmux(&["capture-pane", "-p", "-t", session])
}

fn number_after(text: &str, word: &str) -> Option<u64> {
    let at = text.find(word)? + word.len();
    text[at..].split_whitespace().next()?.parse().ok()
}

#[test]
fn the_viewer_in_tmux_shows_what_the_report_says() {
    if Command::new("tmux").arg("-V").output().is_err() {
        println!("SKIP: tmux is not installed (the set-up installs it with apt-get where it can)");
        return;
    }
    let dir = scratch("viewer");
    let report = dir.join("r.json");
    let pid_file = dir.join("job.pid");
    let mut sidecar = Command::new(memsight_bin())
        .args(["run", "--interval", "50ms", "--report"])
        .arg(&report)
        .args(["--", env!("CARGO_BIN_EXE_stepping_job"), "exit", "0", "60"])
        .env("JOB_PID_FILE", &pid_file)
        .spawn()
        .unwrap();
    assert!(wait_until(20, || pid_file.exists()));
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    let socket = memsight_sidecar::server::socket_path(pid.parse().unwrap()).unwrap();
    assert!(wait_until(20, || socket.exists()));

    let session = format!("memsight-e2e-{}", std::process::id());
    let _kill = KillOnDrop(session.clone());
    let top = format!("{} top {pid}", memsight_bin().display());
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "120",
        "-y",
        "35",
        &top,
    ]);
    let live = wait_until(10, || screen(&session).contains(&format!("pid {pid}")));
    assert!(live, "viewer never showed the job:\n{}", screen(&session));

    assert!(sidecar.wait().unwrap().success());
    let ended = wait_until(10, || screen(&session).contains("job exited:"));
    let overview = screen(&session);
    assert!(ended, "{overview}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let pm = &v["post_mortem"];
    assert!(
        overview.contains(&format!("job exited: {}", pm["description"].as_str().unwrap())[..40]),
        "{overview}"
    );
    assert_eq!(
        number_after(&overview, "step "),
        pm["last_sample"]["step"].as_u64(),
        "{overview}"
    );
    assert_eq!(
        number_after(&overview, "samples "),
        Some(v["timeline"].as_array().unwrap().len() as u64),
        "{overview}"
    );
    // The live Overview states the report's heap peak and where it was first reached.
    let p = &v["peaks"];
    let want = format!(
        "{}  at step {}",
        memsight_format::units::fmt_bytes(p["heap_peak_bytes"].as_u64().unwrap()),
        p["heap_peak_step"].as_u64().unwrap()
    );
    assert!(
        overview.contains("peak process heap") && overview.contains(&want),
        "{want:?} not in\n{overview}"
    );

    // Live, the sites at the profiled peak so far: at the end, the report's top site.
    tmux(&["send-keys", "-t", &session, "3"]);
    assert!(
        wait_until(20, || {
            let s = screen(&session);
            s.contains("allocation sites at the profiled peak so far")
                && s.contains("stepping_job::main")
        }),
        "{}",
        screen(&session)
    );

    tmux(&["send-keys", "-t", &session, "2"]);
    assert!(
        wait_until(5, || screen(&session).contains("peak per step")),
        "{}",
        screen(&session)
    );
    tmux(&["send-keys", "-t", &session, "5"]);
    assert!(
        wait_until(5, || screen(&session).contains("tips & diagnosis")),
        "{}",
        screen(&session)
    );
    tmux(&["send-keys", "-t", &session, "?"]);
    assert!(wait_until(5, || screen(&session)
        .contains("time window: 1m, 10m, 1h, all")));
    tmux(&["send-keys", "-t", &session, "q"]);
    let gone = wait_until(5, || !tmux(&["ls"]).contains(&session));
    if !gone {
        tmux(&["kill-session", "-t", &session]);
    }
    assert!(gone, "the viewer did not quit on q");
}

#[test]
fn top_without_a_sidecar_and_view_of_a_bad_report_are_clear_errors() {
    let r = memsight_e2e::run_memsight(&["top", "4000000"], None);
    assert_eq!(r.code, 2);
    assert!(
        r.err.contains("no sidecar at") && r.err.contains("memsight run"),
        "{}",
        r.err
    );
    let dir = scratch("viewer-bad");
    let bad = dir.join("r.json");
    std::fs::write(&bad, "{\"schema_version\": 1").unwrap();
    let r = memsight_e2e::run_memsight(&["view", bad.to_str().unwrap()], None);
    assert_eq!(r.code, 2);
    assert!(r.err.starts_with("memsight view: "), "{}", r.err);
}
