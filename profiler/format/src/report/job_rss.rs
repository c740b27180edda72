//! The job's RSS peak, the figure `check --max-rss-peak` gates: the highest RSS a process of the
//! job reached — the report's own process's peak, or another process's of the job (a program a
//! launcher such as `runuser` or `su` started, which memsight's library could not enter; a worker)
//! where that is higher. RSS is a process's own figure: a budget of it holds for each. Ranks are
//! left to their own reports, which `check` gates each (in the same window).

use super::Report;

/// The RSS peak a report's budget takes, and whose it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RssPeak {
    /// The bytes.
    pub bytes: u64,
    /// Another process of the job reached it (pid, its role's words and command), not the
    /// report's own process.
    pub other: Option<(u32, String)>,
}

impl Report {
    /// The job's RSS peak: the report's own (`peaks.rss_peak_bytes`, within training where the
    /// budgets gate that window), or the highest whole-run RSS peak of another process of the job
    /// that is no rank (`processes`) where that is higher. `None` when neither was read.
    pub fn rss_peak(&self) -> Option<RssPeak> {
        let own = self
            .peaks
            .rss_peak_bytes
            .map(|bytes| RssPeak { bytes, other: None });
        let others = self
            .processes
            .iter()
            .filter(|p| p.pid != self.job.pid)
            .filter(|p| !matches!(p.role, Some(crate::process::Role::Rank { .. })))
            .filter_map(|p| Some((p.rss_peak_bytes?, p)))
            .max_by_key(|&(bytes, _)| bytes)
            .map(|(bytes, p)| RssPeak {
                bytes,
                other: Some((p.pid, describe(p))),
            });
        match (own, others) {
            (Some(o), Some(x)) if x.bytes <= o.bytes => Some(o),
            (o, None) => o,
            (_, x) => x,
        }
    }
}

/// `rank 1 (pid 42: python train.py)`, `process (pid 42: hold 64)`.
fn describe(p: &crate::process::JobProcess) -> String {
    let role = p.role_text();
    let command: Vec<&str> = p.command.iter().take(3).map(String::as_str).collect();
    match command.is_empty() {
        true => format!("{role} (pid {})", p.pid),
        false => format!("{role} (pid {}: {})", p.pid, command.join(" ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::JobProcess;

    fn process(pid: u32, rss: Option<u64>) -> JobProcess {
        JobProcess {
            pid,
            command: vec!["hold".into(), "64".into()],
            rss_peak_bytes: rss,
            ..Default::default()
        }
    }

    #[test]
    fn another_process_s_higher_rss_is_the_job_s_and_named() {
        let mut r = Report::default();
        r.job.pid = 1;
        r.peaks.rss_peak_bytes = Some(6 << 20);
        r.processes = vec![process(1, Some(7 << 20)), process(2, Some(65 << 20))];
        let p = r.rss_peak().expect("a peak");
        assert_eq!(p.bytes, 65 << 20);
        assert_eq!(p.other, Some((2, "process (pid 2: hold 64)".into())));
        // The report's own row is not another process; its own figure stands when higher.
        r.processes = vec![process(1, Some(90 << 20)), process(2, Some(5 << 20))];
        assert_eq!(
            r.rss_peak(),
            Some(RssPeak {
                bytes: 6 << 20,
                other: None
            })
        );
        r.peaks.rss_peak_bytes = None;
        assert_eq!(r.rss_peak().map(|p| p.bytes), Some(5 << 20));
        // A rank is gated on its own report, not here.
        r.processes[1].role = Some(crate::process::Role::Rank { rank: 1 });
        assert_eq!(r.rss_peak(), None);
        r.processes.clear();
        assert_eq!(r.rss_peak(), None);
    }
}
