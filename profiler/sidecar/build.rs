//! Builds the `memsight` Python package (integrations/python/memsight/*.py) into the sidecar, which
//! writes it out for `import memsight` in the jobs it runs (src/inject.rs).

use std::path::Path;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let pkg = Path::new(&manifest).join("../../integrations/python/memsight");
    println!("cargo:rerun-if-changed={}", pkg.display());
    let mut files: Vec<_> = std::fs::read_dir(&pkg)
        .unwrap_or_else(|e| panic!("{}: {e}", pkg.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a UTF-8 file name");
        let path = std::fs::canonicalize(f).expect("a readable file");
        out += &format!(
            "    ({name:?}, include_str!({:?})),\n",
            path.display().to_string()
        );
    }
    out += "]\n";
    let dest =
        Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("python_package.rs");
    std::fs::write(dest, out).expect("writable OUT_DIR");
}
