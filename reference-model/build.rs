//! Puts libtorch on the binary's rpath and keeps libtorch_cuda linked (`--no-as-needed`), so the
//! binaries run without LD_LIBRARY_PATH and see CUDA (tch-rs issues #980, #907, #329).
fn main() {
    if let Ok(lib) = std::env::var("DEP_MEMSIGHT_TORCH_SHIM_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath={lib}");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
    }
}
