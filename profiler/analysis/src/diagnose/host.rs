//! Host memory: Rust's allocation-failure abort and the Linux OOM killer (global and memory cgroup,
//! v1 and v2 wordings, old and new kernels).

use super::facts::{Fact, Facts};
use super::scan::{compile, each, int_at, line_end, str_at, whole_at, Piece, KERNEL_CLOSES};
use super::Kind;
use regex::Regex;
use std::sync::LazyLock;

/// Rust's allocation-failure abort, also quoted with its size elided (`memory allocation of …
/// failed`) or masked by a placeholder word (`memory allocation of xxx bytes failed`).
static RUST: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"memory allocation of (?:([0-9]+) bytes|(?:…|\.\.\.)(?: bytes)?|[^\s0-9]\S{0,15} bytes) failed",
    )
});
static KILLED: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"(?:(Memory cgroup out of memory|Out of memory)(?: \([a-z_]+\))?:\s*)?Killed process ([0-9]+)(?:, UID ([0-9]+),)? \(",
    )
});
/// The fields after a killed process's name, in any of the kernel's spellings
/// (`total-vm:123kB`, `UID:0`, RHEL's `UID 0,`).
static KILLED_FIELD: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(total-vm|anon-rss|file-rss|shmem-rss|pgtables):\s*([0-9]+)\s*kB|\b(UID)[:\s]\s*([0-9]+)|(oom_score_adj):\s*(-?[0-9]+)").ok()
});
/// The first line of a kernel OOM report; what follows belongs to this event.
static INVOKED: LazyLock<Option<Regex>> = LazyLock::new(|| compile(r"\S+ invoked oom-killer: "));
static KILL_OLD: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(
        r"(Memory cgroup out of memory|Out of memory): Kill process ([0-9]+) \(([^\n]*)\) score ([0-9]+) or sacrifice child",
    )
});
static OOM_KILL: LazyLock<Option<Regex>> = LazyLock::new(|| compile(r"oom-kill:(\S+)"));
static TASK_IN: LazyLock<Option<Regex>> =
    LazyLock::new(|| compile(r"Task in (\S+) killed as a result of limit of (\S+)"));
static USAGE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(r"(?m)(?:^|[^+\w])memory: usage ([0-9]+)kB, limit ([0-9]+)kB, failcnt ([0-9]+)")
});

pub(crate) fn find(text: &str, out: &mut Vec<Piece>) {
    rust(text, out);
    killed(text, out);
    kill_old(text, out);
    oom_kill(text, out);
    cgroup_v1(text, out);
}

fn rust(text: &str, out: &mut Vec<Piece>) {
    each(&RUST, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("requested_bytes", int_at(c, 1));
        out.push(Piece::message(s, e, Kind::RustAllocFailure, f));
    });
}

fn scope(prefix: Option<&str>) -> Option<&'static str> {
    match prefix? {
        p if p.starts_with("Memory cgroup") => Some("memcg"),
        _ => Some("global"),
    }
}

/// The name between the outer parentheses that start at `open` (just after `(`): nested
/// parentheses are part of the name. Returns the name and the byte after the closing `)`.
fn paren_name(line: &str) -> Option<(&str, usize)> {
    let mut depth = 1usize;
    for (i, ch) in line.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&line[..i], i + 1));
                }
            }
            _ => {}
        }
    }
    None
}

fn killed(text: &str, out: &mut Vec<Piece>) {
    each(&KILLED, text, |c, s, e| {
        let end = line_end(text, e);
        let Some((name, after)) = paren_name(&text[e..end]) else {
            return;
        };
        let mut f = Facts::default();
        f.opt_int("pid", int_at(c, 2));
        f.text("process_name", name);
        f.opt_int("uid", int_at(c, 3));
        if let Some(re) = KILLED_FIELD.as_ref() {
            for m in re.captures_iter(&text[e + after..end]) {
                if let Some(k) = str_at(&m, 1) {
                    let name = match k {
                        "total-vm" => "total_vm_bytes",
                        "anon-rss" => "anon_rss_bytes",
                        "file-rss" => "file_rss_bytes",
                        "shmem-rss" => "shmem_rss_bytes",
                        _ => "pgtables_bytes",
                    };
                    f.opt_int(name, int_at(&m, 2).and_then(|v| v.checked_mul(1024)));
                } else if str_at(&m, 3).is_some() {
                    f.opt_int("uid", int_at(&m, 4));
                } else {
                    f.opt_int("oom_score_adj", int_at(&m, 6));
                }
            }
        }
        f.opt_text("scope", scope(str_at(c, 1)));
        out.push(Piece::part(s, end, Kind::LinuxOomKiller, f, true).stage(KERNEL_CLOSES));
    });
    // The report's first line opens the event; alone (the rest not pasted) it is still the
    // kernel's OOM report.
    each(&INVOKED, text, |_, s, e| {
        let mut p = Piece::boundary(s, e, Kind::LinuxOomKiller);
        p.evidence = true;
        out.push(p);
    });
}

fn kill_old(text: &str, out: &mut Vec<Piece>) {
    each(&KILL_OLD, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("selected_pid", int_at(c, 2));
        f.opt_text("selected_process_name", str_at(c, 3));
        f.opt_int("oom_score", int_at(c, 4));
        f.opt_text("scope", scope(str_at(c, 1)));
        out.push(Piece::part(s, e, Kind::LinuxOomKiller, f, true).stage(3));
    });
}

fn oom_kill(text: &str, out: &mut Vec<Piece>) {
    let Some(re) = OOM_KILL.as_ref() else { return };
    for c in re.captures_iter(text) {
        let (Some(m), Some(list)) = (c.get(0), str_at(&c, 1)) else {
            continue;
        };
        // A list cut by a line break that may be a wrap loses its last, maybe partial, item.
        let list = if crate::diagnose::normalize::may_continue(text, m.end()) {
            list.rsplit_once(',').map_or("", |(head, _)| head)
        } else {
            list
        };
        // key=value pairs separated by commas; a token without `=` continues the previous value
        // (mems_allowed=0-1,3) unless it is the `global_oom` flag.
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut global = false;
        for tok in list.split(',') {
            match tok.split_once('=') {
                Some((k, v)) => pairs.push((k.to_string(), v.to_string())),
                None if tok == "global_oom" => global = true,
                None => {
                    if let Some(last) = pairs.last_mut() {
                        last.1.push(',');
                        last.1.push_str(tok);
                    }
                }
            }
        }
        let mut f = Facts::default();
        for (k, v) in pairs {
            let name = match k.as_str() {
                "constraint" => "constraint",
                "nodemask" => "nodemask",
                "cpuset" => "cpuset",
                "mems_allowed" => "mems_allowed",
                "oom_memcg" => "oom_memcg",
                "task_memcg" => "task_memcg",
                "task" => "process_name",
                "pid" | "uid" => {
                    if let Ok(n) = v.parse::<i128>() {
                        f.int(if k == "pid" { "pid" } else { "uid" }, n);
                    }
                    continue;
                }
                _ => continue,
            };
            f.text(name, v);
        }
        if global {
            f.set("global_oom", Fact::Bool(true));
        }
        out.push(Piece::part(m.start(), m.end(), Kind::LinuxOomKiller, f, true).stage(2));
    }
}

fn cgroup_v1(text: &str, out: &mut Vec<Piece>) {
    each(&TASK_IN, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("task_memcg", str_at(c, 1));
        f.opt_text("oom_memcg", whole_at(c, 2, text));
        out.push(Piece::part(s, e, Kind::LinuxOomKiller, f, true).stage(1));
    });
    each(&USAGE, text, |c, s, e| {
        let mut f = Facts::default();
        if let Some(v) = int_at(c, 1) {
            f.int("memory_usage_bytes", v * 1024);
        }
        if let Some(v) = int_at(c, 2) {
            f.int("memory_limit_bytes", v * 1024);
        }
        f.opt_int("failcnt", int_at(c, 3));
        out.push(Piece::part(s, e, Kind::LinuxOomKiller, f, false).stage(1));
    });
}
