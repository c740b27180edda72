//! Workloads under dhat-rs's heap profiler.
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;
#[path = "../../../bench/src/workload.rs"]
mod workload;
fn main() {
    let _profiler = dhat::Profiler::builder()
        .file_name(std::env::temp_dir().join("memsight-bench-dhat.json"))
        .build();
    workload::main_with_args()
}
