//! A training-shaped job for the sidecar tests: steps with train/forward phases, each keeping
//! another 4 MiB. `stepping_job kill` SIGKILLs itself at step 10; `abort` aborts 8 s into step 3,
//! before its phases; `oom` caps its address space and
//! allocates until an allocation fails; `grow` keeps 8 MiB a step until something stops it; `exit
//! CODE [STEPS]` finishes its session and exits with CODE. With `JOB_PID_FILE` set it writes its pid
//! there first; with `JOB_CGROUP` set it moves itself into that cgroup directory; `JOB_PHASE_NAME`
//! renames the inner phase; with `JOB_WAIT_FILE` set it waits at step 3 until that file exists
//! (for a watcher to attach first; 180 s at most).

use std::time::Duration;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

fn touch(v: &mut [u8]) {
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
}

fn cap_address_space(extra: u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let vm_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let cap = vm_kb * 1024 + extra;
    let lim = libc::rlimit {
        rlim_cur: cap,
        rlim_max: cap,
    };
    // SAFETY: plain setrlimit on this process.
    unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
}

fn main() {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("exit");
    if let Some(f) = std::env::var_os("JOB_PID_FILE") {
        std::fs::write(f, std::process::id().to_string()).expect("pid file");
    }
    if let Some(cg) = std::env::var_os("JOB_CGROUP") {
        let procs = std::path::Path::new(&cg).join("cgroup.procs");
        std::fs::write(procs, std::process::id().to_string()).expect("join cgroup");
    }
    let session = memsight::Session::builder()
        .interval(Duration::from_millis(100))
        .quiet()
        .start()
        .expect("session");
    let steps: u64 = match mode {
        "exit" => args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5),
        _ => 1000,
    };
    if mode == "oom" {
        cap_address_space(256 << 20);
    }
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let forward = std::env::var("JOB_PHASE_NAME").unwrap_or_else(|_| "forward".into());
    for step in 0..steps {
        if step == 3 {
            if let Some(f) = std::env::var_os("JOB_WAIT_FILE") {
                let deadline = std::time::Instant::now() + Duration::from_secs(180);
                while !std::path::Path::new(&f).exists() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        memsight::step(step);
        if mode == "abort" && step == 3 {
            // Before the next regular sample (the test sets a 10 s interval): only the sample the
            // step's start asked for (at most one per half interval: 5 s after the first) places
            // the abort. Three seconds more let the sampler run on a busy machine.
            std::thread::sleep(Duration::from_secs(8));
            std::process::abort();
        }
        let _train = memsight::phase("train");
        {
            let _fwd = memsight::phase(&forward);
            let size = match mode {
                "oom" => 16 << 20,
                "grow" => 8 << 20,
                _ => 4 << 20,
            };
            let mut v = vec![0u8; size];
            touch(&mut v);
            kept.push(std::hint::black_box(v));
        }
        if mode == "kill" && step == 10 {
            // SAFETY: signalling ourselves.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    drop(kept);
    session.finish().expect("report");
    let code: i32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    std::process::exit(code);
}
