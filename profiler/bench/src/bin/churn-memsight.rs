//! Workloads under memsight's tracking allocator over jemalloc.
#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();
#[path = "../workload.rs"]
mod workload;
fn main() {
    workload::main_with_args()
}
