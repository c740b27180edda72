//! `memsight run --metrics`: the exposition has the job's gauges with its labels (the report's
//! peaks and its OOM count among them), `promtool check metrics` accepts it, and a real Prometheus
//! server scrapes it and returns the live values through its query API. promtool and prometheus come from the Debian package `prometheus` (the set-up
//! installs it where it can); without them those checks skip with a printed reason.

use memsight_e2e::{memsight_bin, scratch};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

fn until<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn prometheus_scrapes_the_sidecar() {
    let dir = scratch("metrics");
    let port = free_port();
    let pid_file = dir.join("job.pid");
    let mut sidecar = Command::new(memsight_bin())
        .args([
            "run",
            "--interval",
            "50ms",
            "--metrics",
            &format!("127.0.0.1:{port}"),
            "--report",
        ])
        .arg(dir.join("r.json"))
        .args([
            "--",
            env!("CARGO_BIN_EXE_stepping_job"),
            "exit",
            "0",
            "1000",
        ])
        .env("JOB_PID_FILE", &pid_file)
        .env("RANK", "3")
        .spawn()
        .unwrap();
    let body = until(20, || {
        get(port, "/metrics").filter(|b| b.contains("memsight_heap_live_bytes{"))
    })
    .expect("no metrics");
    assert!(
        body.contains("job=\"stepping_job\"") && body.contains("rank=\"3\""),
        "{body}"
    );
    assert!(
        body.contains("memsight_rss_bytes{") && body.contains("memsight_step{"),
        "{body}"
    );
    // The report's headline numbers at their peaks, and the OOM count (none in this job).
    let body = until(20, || {
        get(port, "/metrics").filter(|b| b.contains("memsight_oom_events_total{"))
    })
    .expect("no OOM count");
    for name in [
        "memsight_rss_peak_bytes{",
        "memsight_jemalloc_resident_peak_bytes{",
        "memsight_heap_peak_bytes{",
    ] {
        assert!(body.contains(name), "{name} missing in\n{body}");
    }
    let no_failures =
        "memsight_oom_events_total{job=\"stepping_job\",rank=\"3\",kind=\"allocation_failure\"} 0";
    assert!(body.contains(no_failures), "{body}");
    assert!(get(port, "/other").is_none());

    if have("promtool") {
        let mut p = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = p.wait_with_output().unwrap();
        // promtool lints the older Prometheus text format: an OpenMetrics counter's HELP is on its
        // family's name (`memsight_oom_events`), its samples end in `_total`, which promtool calls
        // "no help text". Every other problem it finds fails the test.
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let problems: Vec<&str> = said
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter(|l| {
                let counter_sample = l
                    .strip_suffix(" no help text")
                    .and_then(|n| n.strip_suffix("_total"))
                    .is_some_and(|family| body.contains(&format!("# TYPE {family} counter\n")));
                !counter_sample
            })
            .collect();
        assert!(
            problems.is_empty() && (out.status.success() || !said.is_empty()),
            "promtool: {said}"
        );
    } else {
        println!("SKIP promtool check: promtool not installed (Debian package `prometheus`)");
    }

    if have("prometheus") {
        let web = free_port();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: memsight\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"),
        )
        .unwrap();
        let _prom = Killed(
            Command::new("prometheus")
                .arg(format!("--config.file={}", cfg.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{web}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let answer = until(40, || {
            get(web, "/api/v1/query?query=memsight_heap_live_bytes")
                .filter(|a| a.contains("\"value\""))
        })
        .expect("Prometheus never returned memsight_heap_live_bytes");
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        let r = &v["data"]["result"][0];
        let live: f64 = r["value"][1].as_str().unwrap().parse().unwrap();
        assert!(live > 1e6, "{answer}");
        assert_eq!(r["metric"]["rank"], "3", "{answer}");
        let answer = until(40, || {
            // memsight_oom_events_total{kind="allocation_failure"}
            let q = "memsight_oom_events_total%7Bkind%3D%22allocation_failure%22%7D";
            get(web, &format!("/api/v1/query?query={q}")).filter(|a| a.contains("\"value\""))
        })
        .expect("Prometheus never returned memsight_oom_events_total");
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        let r = &v["data"]["result"][0];
        assert_eq!(r["metric"]["rank"], "3", "{answer}");
        assert_eq!(r["value"][1], "0", "{answer}");
    } else {
        println!("SKIP Prometheus scrape: prometheus not installed (Debian package `prometheus`)");
    }

    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: ending the test's own job.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(sidecar.wait().unwrap().code(), Some(137));
}
