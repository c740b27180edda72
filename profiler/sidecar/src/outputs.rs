//! Where the sidecar sends what it sees while the job runs: viewers' socket and Prometheus.

use crate::delivery::SidecarError;
use crate::{metrics, server};
use memsight_format::report::Report;
use memsight_format::wire::Record;
use std::ffi::OsString;
use std::sync::Arc;

/// Where the sidecar sends what it sees while the job runs: viewers' socket, Prometheus.
pub(crate) struct Outputs {
    pub(crate) server: Option<server::Server>,
    pub(crate) metrics: Option<Arc<metrics::Metrics>>,
}

impl Outputs {
    /// Binds the metrics address (an explicit request: failing is an error). The rank labels come
    /// from the environment of `attached` (a process watched from outside), else this process's.
    pub(crate) fn new(
        addr: Option<std::net::SocketAddr>,
        command: &[OsString],
        attached: Option<u32>,
    ) -> Result<Self, SidecarError> {
        let metrics = match addr {
            None => None,
            Some(a) => {
                let program = command
                    .first()
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let m = Arc::new(metrics::Metrics::new(metrics::job_labels(
                    &program, attached,
                )));
                let bound =
                    metrics::serve(a, Arc::clone(&m)).map_err(|e| SidecarError::Metrics(a, e))?;
                if !bound.ip().is_loopback() {
                    eprintln!(
                        "memsight: metrics on {bound} are readable by anyone who can reach it"
                    );
                }
                eprintln!("memsight · Prometheus metrics at http://{bound}/metrics");
                Some(m)
            }
        };
        Ok(Outputs {
            server: None,
            metrics,
        })
    }

    /// Opens the viewers' socket for `pid`; without one the sidecar still writes its report.
    pub(crate) fn listen(&mut self, pid: u32, command: &[OsString]) {
        let command = command
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        let started = server::socket_path(pid)
            .map_err(|(p, e)| format!("{}: {e}", p.display()))
            .and_then(|p| {
                server::Server::start(&p, pid, command).map_err(|e| format!("{}: {e}", p.display()))
            });
        match started {
            Ok(s) => self.server = Some(s),
            Err(e) => eprintln!("memsight: no live socket for viewers: {e}"),
        }
    }

    /// Sends a record to viewers and updates the metrics.
    pub(crate) fn emit(&self, r: &Record) {
        if let Some(s) = &self.server {
            s.publish(r);
        }
        match (&self.metrics, r) {
            (Some(m), Record::Snapshot(s)) => m.update(s),
            (Some(m), Record::DeviceOom(_)) => m.device_oom(),
            _ => {}
        }
    }

    /// Each measured process's live heap and role now (pid → heap, role), for metrics.
    pub(crate) fn processes(&self, notes: &std::collections::HashMap<u32, (Option<u64>, String)>) {
        if let Some(m) = &self.metrics {
            let heaps: Vec<(u32, u64, String)> = notes
                .iter()
                .filter_map(|(pid, (heap, role))| heap.map(|h| (*pid, h, role.clone())))
                .collect();
            m.process_heaps(&heaps);
        }
    }

    /// Heap allocations of the job that failed so far (the flight recorder's count), for metrics.
    pub(crate) fn alloc_failures(&self, n: u64) {
        if let Some(m) = &self.metrics {
            m.alloc_failures(n);
        }
    }

    /// Tells viewers how the job ended, then closes the socket; the metrics take the final
    /// report's OOM counts.
    pub(crate) fn end(self, report: &Report) {
        if let Some(m) = &self.metrics {
            m.finish(report);
        }
        if let Some(pm) = &report.post_mortem {
            self.emit(&Record::Ended {
                description: pm.description.clone(),
                post_mortem: Some(Box::new(pm.clone())),
            });
        }
    }
}
