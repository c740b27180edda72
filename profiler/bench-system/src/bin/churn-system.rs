//! Workloads under the system allocator (glibc malloc); heaptrack runs this binary.
#[path = "../../../bench/src/workload.rs"]
mod workload;
fn main() {
    workload::main_with_args()
}
