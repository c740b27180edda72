//! Workloads under bare jemalloc (same build and features as memsight's).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
#[path = "../workload.rs"]
mod workload;
fn main() {
    workload::main_with_args()
}
