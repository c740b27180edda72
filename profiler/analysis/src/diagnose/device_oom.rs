//! A device OOM that memsight caught itself (the CUDA OOM observer), as the facts a PyTorch OOM
//! message states, under the same names: the post-mortem and `diagnose --report` judge it exactly
//! as `diagnose` judges the message the job printed.

use super::{Fact, Facts, Finding, GpuProcess, Kind};
use memsight_format::device::DeviceOom;

/// The finding for one caught device OOM.
pub fn finding(o: &DeviceOom) -> Finding {
    let mut f = Facts::default();
    f.text("backend", "CUDA");
    f.int("requested_bytes", o.requested_bytes);
    f.int("device_index", o.device);
    f.int("total_bytes", o.total_bytes);
    f.int("free_bytes", o.free_bytes);
    // NVML's figure for the job itself: PyTorch's "this process has X memory in use".
    if let Some(own) = o
        .processes
        .iter()
        .find(|p| p.is_job)
        .and_then(|p| p.used_bytes)
    {
        f.int("this_process_bytes", own);
    }
    if let Some(a) = o.allocated_bytes {
        f.int("allocated_by_torch_bytes", a);
        if let Some(r) = o.reserved_bytes {
            f.int("reserved_unallocated_bytes", r.saturating_sub(a));
        }
    }
    let others: Vec<GpuProcess> = o
        .processes
        .iter()
        .filter(|p| !p.is_job)
        .filter_map(|p| {
            Some(GpuProcess {
                pid: u64::from(p.host_pid),
                bytes: u128::from(p.used_bytes?),
            })
        })
        .collect();
    if !others.is_empty() {
        f.set("processes", Fact::Processes(others));
    }
    Finding {
        kind: Kind::TorchCudaOomNew,
        facts: f,
        line: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::{diagnose, judge, Context};
    use memsight_format::device::DeviceProcess;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// The message PyTorch printed for the OOM that the observer caught on an H100 (docs/gpu.md),
    /// and the observer's record of the same moment.
    #[test]
    fn a_caught_device_oom_gets_the_verdict_of_the_message_the_job_printed() {
        let message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 \
            has a total capacity of 79.18 GiB of which 3.47 GiB is free. Including non-PyTorch memory, \
            this process has 75.70 GiB memory in use. Of the allocated memory 69.00 GiB is allocated \
            by PyTorch, and 6.04 GiB is reserved by PyTorch but unallocated. If reserved but \
            unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
            to avoid fragmentation.";
        let caught = DeviceOom {
            device: 0,
            requested_bytes: 12 * GIB,
            total_bytes: 85_017_493_504,
            free_bytes: 3_726_000_000,
            allocated_bytes: Some(69 * GIB),
            reserved_bytes: Some(69 * GIB + 6_485_000_000),
            processes: vec![DeviceProcess {
                host_pid: 4242,
                pid: Some(4242),
                used_bytes: Some(75 * GIB + 717 * MIB),
                is_job: true,
            }],
            ..Default::default()
        };
        let ctx = Context::default();
        let from_message = diagnose(message, &ctx);
        assert_eq!(from_message.len(), 1);
        let from_record = judge(finding(&caught), &ctx);
        assert_eq!(from_record.verdict.verdict, from_message[0].verdict.verdict);
        assert_eq!(
            from_record.remedies.first().map(|r| &r.id),
            from_message[0].remedies.first().map(|r| &r.id)
        );
    }

    #[test]
    fn other_processes_on_the_device_are_the_message_s_process_list() {
        let caught = DeviceOom {
            device: 1,
            requested_bytes: 2 * GIB,
            total_bytes: 80 * GIB,
            free_bytes: GIB,
            allocated_bytes: Some(30 * GIB),
            reserved_bytes: Some(31 * GIB),
            processes: vec![
                DeviceProcess {
                    host_pid: 1,
                    pid: Some(1),
                    used_bytes: Some(32 * GIB),
                    is_job: true,
                },
                DeviceProcess {
                    host_pid: 2,
                    pid: None,
                    used_bytes: Some(47 * GIB),
                    is_job: false,
                },
            ],
            ..Default::default()
        };
        let f = finding(&caught);
        assert_eq!(f.facts.processes().len(), 1);
        assert_eq!(
            f.facts.bytes("this_process_bytes"),
            Some(u128::from(32 * GIB))
        );
        let d = judge(f, &Context::default());
        assert!(
            format!("{:?}", d.verdict.verdict)
                .to_lowercase()
                .contains("contention"),
            "{:?}",
            d.verdict
        );
    }
}
