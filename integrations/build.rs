//! Builds the libtorch shim (feature `tch`) against the same libtorch torch-sys uses: re-runs
//! torch-sys's python probe for include dirs, library dir and C++ ABI, compiles csrc/torch_shim.cpp
//! always and csrc/cuda_shim.cpp only where the CUDA runtime and crt headers exist (cfg
//! `memsight_cuda`). Exports the library dir to dependents as `DEP_MEMSIGHT_TORCH_SHIM_LIBTORCH_LIB`
//! so their build scripts can set the rpath (link args do not propagate from a library).

#[cfg(feature = "tch")]
use std::path::PathBuf;
#[cfg(feature = "tch")]
use std::process::Command;

#[cfg(feature = "tch")]
const PROBE: &str = r#"
import importlib.util, os, torch
from torch.utils import cpp_extension
print("ABI:" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))
for p in cpp_extension.include_paths(): print("INC:" + p)
for p in cpp_extension.library_paths(): print("LIB:" + p)
spec = importlib.util.find_spec("nvidia")
if spec is not None:
    for root in spec.submodule_search_locations:
        for sub in ("cu13", "cuda_runtime", "cuda_nvcc"):
            d = os.path.join(root, sub, "include")
            if os.path.isdir(d): print("NVINC:" + d)
"#;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(memsight_cuda)");
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "tch")]
    build_shim();
}

#[cfg(feature = "tch")]
fn build_shim() {
    for f in ["csrc/torch_shim.cpp", "csrc/cuda_shim.cpp"] {
        println!("cargo:rerun-if-changed={f}");
    }
    for v in ["LIBTORCH_USE_PYTORCH", "VIRTUAL_ENV", "LIBTORCH", "PATH"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let python = match std::env::var_os("VIRTUAL_ENV") {
        Some(v) => PathBuf::from(v).join("bin/python"),
        None => PathBuf::from("python3"),
    };
    let out = Command::new(&python)
        .args(["-c", PROBE])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "memsight-integrations: cannot run {} to find libtorch ({e}); run scripts/setup.sh \
                 and use the environment it prints",
                python.display()
            )
        });
    if !out.status.success() {
        panic!(
            "memsight-integrations: the libtorch probe failed (is torch installed in {}?): {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut abi = "1".to_string();
    let (mut incs, mut libs, mut nvincs) = (Vec::new(), Vec::new(), Vec::new());
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("ABI:") {
            abi = v.to_string();
        } else if let Some(v) = line.strip_prefix("INC:") {
            incs.push(PathBuf::from(v));
        } else if let Some(v) = line.strip_prefix("LIB:") {
            libs.push(PathBuf::from(v));
        } else if let Some(v) = line.strip_prefix("NVINC:") {
            nvincs.push(PathBuf::from(v));
        }
    }
    let lib = libs.first().cloned().unwrap_or_else(|| {
        panic!("memsight-integrations: the probe found no libtorch library dir")
    });
    let cuda = lib.join("libc10_cuda.so").exists()
        && nvincs.iter().any(|d| d.join("crt/host_config.h").exists())
        && nvincs.iter().any(|d| d.join("cuda_runtime_api.h").exists());
    let mut b = cc::Build::new();
    b.cpp(true)
        .pic(true)
        .warnings(false)
        .flag("-std=c++20")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .includes(&incs)
        .file("csrc/torch_shim.cpp");
    if cuda {
        b.includes(&nvincs).file("csrc/cuda_shim.cpp");
        println!("cargo:rustc-cfg=memsight_cuda");
    } else {
        println!(
            "cargo:warning=memsight-integrations: CUDA runtime/crt headers or libc10_cuda.so not \
             found; the CUDA OOM observer and segment snapshot are compiled out (pip install \
             nvidia-cuda-crt nvidia-cuda-runtime to enable)"
        );
    }
    b.compile("memsight_torch_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    for l in ["torch_cpu", "c10"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    if cuda {
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    // This crate's own tests and examples: find libtorch at run time, keep libtorch_cuda linked.
    println!("cargo:rustc-link-arg=-Wl,-rpath={}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:libtorch_lib={}", lib.display());
}
