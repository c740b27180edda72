//! Host memory: Rust's allocation-failure abort and the Linux OOM killer (global and memory cgroup,
//! v1 and v2 wordings, old and new kernels).

use super::facts::{Fact, Facts};
use super::scan::{compile, each, int_at, line_end, str_at, Piece};
use super::Kind;
use regex::Regex;
use std::sync::LazyLock;

static RUST: LazyLock<Option<Regex>> =
    LazyLock::new(|| compile(r"memory allocation of ([0-9]+) bytes failed"));
static KILLED: LazyLock<Option<Regex>> = LazyLock::new(|| {
    compile(r"(?:(Memory cgroup out of memory|Out of memory):\s*)?Killed process ([0-9]+) \(")
});
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

/// kB value of a `key:NNNkB` token.
fn kb(v: &str) -> Option<i128> {
    v.strip_suffix("kB")?.parse::<i128>().ok().map(|k| k * 1024)
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
        for tok in text[e + after..end].split([',', ' ', '\t']) {
            let Some((k, v)) = tok.split_once(':') else {
                continue;
            };
            let (name, value) = match k {
                "total-vm" => ("total_vm_bytes", kb(v)),
                "anon-rss" => ("anon_rss_bytes", kb(v)),
                "file-rss" => ("file_rss_bytes", kb(v)),
                "shmem-rss" => ("shmem_rss_bytes", kb(v)),
                "pgtables" => ("pgtables_bytes", kb(v)),
                "UID" => ("uid", v.parse().ok()),
                "oom_score_adj" => ("oom_score_adj", v.parse().ok()),
                _ => continue,
            };
            f.opt_int(name, value);
        }
        f.opt_text("scope", scope(str_at(c, 1)));
        out.push(Piece::part(s, end, Kind::LinuxOomKiller, f, true));
    });
}

fn kill_old(text: &str, out: &mut Vec<Piece>) {
    each(&KILL_OLD, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_int("selected_pid", int_at(c, 2));
        f.opt_text("selected_process_name", str_at(c, 3));
        f.opt_int("oom_score", int_at(c, 4));
        f.opt_text("scope", scope(str_at(c, 1)));
        out.push(Piece::part(s, e, Kind::LinuxOomKiller, f, true));
    });
}

fn oom_kill(text: &str, out: &mut Vec<Piece>) {
    let Some(re) = OOM_KILL.as_ref() else { return };
    for c in re.captures_iter(text) {
        let (Some(m), Some(list)) = (c.get(0), str_at(&c, 1)) else {
            continue;
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
        out.push(Piece::part(
            m.start(),
            m.end(),
            Kind::LinuxOomKiller,
            f,
            true,
        ));
    }
}

fn cgroup_v1(text: &str, out: &mut Vec<Piece>) {
    each(&TASK_IN, text, |c, s, e| {
        let mut f = Facts::default();
        f.opt_text("task_memcg", str_at(c, 1));
        f.opt_text("oom_memcg", str_at(c, 2));
        out.push(Piece::part(s, e, Kind::LinuxOomKiller, f, true));
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
        out.push(Piece::part(s, e, Kind::LinuxOomKiller, f, false));
    });
}
