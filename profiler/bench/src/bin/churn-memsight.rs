//! Workloads under memsight's tracking allocator over jemalloc, with its heap sampler started as a
//! session starts it (`MEMSIGHT_HEAP_SAMPLE`: a rate or `off`).
#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();
#[path = "../workload.rs"]
mod workload;
fn main() {
    if let Err(e) = memsight::heapprof::control::configure_from_env() {
        eprintln!("memsight heap sampler: {e}");
        std::process::exit(2);
    }
    workload::main_with_args()
}
