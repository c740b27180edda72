//! A symbolized heap profile: stacks of source frames with their estimated live bytes, the sites
//! that hold the bytes (the first frame of the user's own code in each stack), and growth between
//! two profiles.

use super::dump::HeapDump;
use super::symbolize::{Frame, Frames, Symbolizer};
use memsight_format::heap_profile::{Site, SiteGrowth, SourceSite};
use std::collections::HashMap;
use std::path::Path;

/// One return address and the source frames there (innermost inlined function first).
#[derive(Clone, Debug)]
pub struct Location {
    /// The return address in the dumped process.
    pub addr: u64,
    /// Frames at this address (shared by every location at this address).
    pub frames: Frames,
}

/// A stack with the allocator's own frames removed, and what it holds.
#[derive(Clone, Debug)]
pub struct Stack {
    /// Innermost (the allocating call) first.
    pub locations: Vec<Location>,
    /// Estimated live bytes.
    pub bytes: f64,
    /// Estimated live objects.
    pub objects: f64,
}

impl Stack {
    /// Every frame, innermost first.
    pub fn frames(&self) -> impl DoubleEndedIterator<Item = &Frame> {
        self.locations.iter().flat_map(|l| l.frames.iter())
    }

    /// The allocation site: in a Python process, the innermost Python frame (the line whose code
    /// allocated, as memray names it: `torch/nn/modules/linear.py:125`); else the first frame in
    /// the user's own Rust code, else the innermost frame. A closure is named after the function
    /// around it (`app::load::{closure#0}`).
    pub fn site(&self) -> Option<Frame> {
        let frames: Vec<&Frame> = self.frames().collect();
        if let Some(py) = frames.iter().find(|f| f.python) {
            return Some((*py).clone());
        }
        let i = frames.iter().position(|f| is_user_code(f)).unwrap_or(0);
        let mut site = (*frames.get(i)?).clone();
        if site.function.starts_with("{closure") {
            if let Some(outer) = frames[i + 1..]
                .iter()
                .find(|f| is_user_code(f) && !f.function.starts_with("{closure"))
            {
                site.function = format!("{}::{}", outer.function, site.function);
            }
        }
        Some(site)
    }

    /// The library whose start-up made these allocations (its initialisers, run by the dynamic
    /// loader while it was loaded, before `main` or at `dlopen`): the module of the innermost
    /// frame, when a loader frame stands between the allocation and the user's code.
    pub fn start_up_module(&self) -> Option<&str> {
        let frames: Vec<&Frame> = self.frames().collect();
        let user = frames
            .iter()
            .position(|f| is_user_code(f))
            .unwrap_or(frames.len());
        let loader = frames[..user].iter().position(|f| is_loader(f))?;
        // The initialiser the loader called: the frame just inside the loader's (an initialiser's
        // own frame when it is named as one).
        let init = if is_initialiser(frames[loader]) {
            loader
        } else {
            frames[..loader]
                .iter()
                .rposition(|f| is_initialiser(f))
                .unwrap_or(loader.saturating_sub(1))
        };
        frames.get(init).map(|f| f.module.as_str())
    }

    /// The top-level Python module whose import made these allocations (`torch` for everything
    /// `import torch` allocated, its libraries' initialisers included): the first module body
    /// (`<module>`) run inside the outermost frame of the import machinery. `None` outside an
    /// import.
    pub fn import_module(&self) -> Option<String> {
        let python: Vec<&Frame> = self.frames().filter(|f| f.python).collect();
        let outermost = python.iter().rposition(|f| is_import_machinery(f))?;
        let body = python[..outermost]
            .iter()
            .rev()
            .find(|f| f.function == "<module>")?;
        Some(top_level_module(body.file.as_deref().unwrap_or("?")))
    }

    /// Whether memsight's own bookkeeping made these allocations (its sampler's timeline, its
    /// recorders): memsight frames and none of the user's.
    ///
    /// Without user code, the frame that decides is the innermost one that is neither the
    /// allocator, the standard library nor the C library: memsight's, or the program's (a C
    /// program's `main` under the preloaded library, whose start-up wrapper is memsight's frame
    /// outside all of the program's).
    pub fn is_memsight_own(&self) -> bool {
        !self.frames().any(|f| is_user_code(f) || f.python)
            && self
                .frames()
                .find(|f| !is_allocator(f) && !is_runtime(f))
                .is_some_and(is_memsight)
    }
}

/// A symbolized profile.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Mean bytes between samples.
    pub sample_bytes: u64,
    /// Every stack with live sampled bytes.
    pub stacks: Vec<Stack>,
}

impl Profile {
    /// Reads, parses and symbolizes a heap dump with `sym` (share one across the profiles of a
    /// run: modules and addresses are resolved once).
    pub fn load(path: &Path, sym: &mut Symbolizer) -> Result<Profile, String> {
        Ok(Profile::symbolize(&HeapDump::read(path)?, sym))
    }

    /// Symbolizes a parsed dump (`sym.missing` then names the files it could not read).
    pub fn symbolize(dump: &HeapDump, sym: &mut Symbolizer) -> Profile {
        let stacks = dump
            .stacks
            .iter()
            .map(|s| {
                let mut locations: Vec<Location> = s
                    .addrs
                    .iter()
                    .map(|&addr| Location {
                        addr,
                        frames: sym.frames(dump, addr),
                    })
                    .collect();
                strip_allocator(&mut locations);
                Stack {
                    locations,
                    bytes: s.bytes,
                    objects: s.objects,
                }
            })
            .collect();
        Profile {
            sample_bytes: dump.sample_bytes,
            stacks,
        }
    }

    /// Estimated live bytes over all stacks.
    pub fn total_bytes(&self) -> f64 {
        self.stacks.iter().map(|s| s.bytes).sum()
    }

    /// Estimated live bytes of memsight's own bookkeeping (left out of sites and growth).
    pub fn own_bytes(&self) -> f64 {
        self.stacks
            .iter()
            .filter(|s| s.is_memsight_own())
            .map(|s| s.bytes)
            .sum()
    }

    /// The stacks of the program's allocations: all but memsight's own, the libraries' start-up
    /// and Python's imports.
    fn program_stacks(&self) -> impl Iterator<Item = &Stack> {
        self.stacks.iter().filter(|s| {
            !s.is_memsight_own() && s.start_up_module().is_none() && s.import_module().is_none()
        })
    }

    /// Estimated live bytes of CPU tensor storage: the stacks that pass through PyTorch's CPU
    /// allocator (`c10::alloc_cpu`, libtorch's one way to a tensor's host memory), whoever asked.
    pub fn tensor_storage_bytes(&self) -> f64 {
        self.stacks
            .iter()
            .filter(|s| s.frames().any(|f| f.function.starts_with("c10::alloc_cpu")))
            .map(|s| s.bytes)
            .sum()
    }

    /// Estimated live bytes Python's imports allocated, per top-level module, largest first (left
    /// out of sites and growth, as libraries' start-up is).
    pub fn import_bytes(&self) -> Vec<(String, f64)> {
        let mut by: HashMap<String, f64> = HashMap::new();
        for s in &self.stacks {
            if let Some(m) = s.import_module() {
                *by.entry(m).or_default() += s.bytes;
            }
        }
        let mut out: Vec<(String, f64)> = by.into_iter().collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    /// Estimated live bytes the libraries' start-up allocated, per library, largest first (left
    /// out of sites and growth: no line of the user's made them).
    pub fn start_up_bytes(&self) -> Vec<(String, f64)> {
        let mut by: HashMap<&str, f64> = HashMap::new();
        for s in &self.stacks {
            if let Some(m) = s.start_up_module().filter(|_| s.import_module().is_none()) {
                *by.entry(m).or_default() += s.bytes;
            }
        }
        let mut out: Vec<(String, f64)> = by.into_iter().map(|(m, b)| (m.to_string(), b)).collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    fn bytes_by_site(&self) -> HashMap<SourceSite, f64> {
        let mut by: HashMap<SourceSite, f64> = HashMap::new();
        for s in self.program_stacks() {
            if let Some(f) = s.site() {
                let at = SourceSite {
                    function: f.function,
                    file: f.file,
                    line: f.line,
                };
                *by.entry(at).or_default() += s.bytes;
            }
        }
        by
    }

    /// The `n` sites holding the most bytes, largest first; shares are of all profiled bytes.
    pub fn top_sites(&self, n: usize) -> Vec<Site> {
        let total = self.total_bytes().max(1.0);
        let mut sites: Vec<Site> = self
            .bytes_by_site()
            .into_iter()
            .map(|(at, bytes)| Site {
                at,
                bytes: bytes.round() as u64,
                share: bytes / total,
            })
            .collect();
        sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.at.cmp(&b.at)));
        sites.truncate(n);
        sites
    }

    /// Folded stacks (`root;…;leaf BYTES`), the flamegraph's input; identical stacks merged.
    pub fn folded(&self) -> Vec<(String, u64)> {
        fold(self.stacks.iter().map(|s| (s, s.bytes)))
    }
}

/// The `n` sites that grew most from `a` to `b`, largest growth first (only sites that grew;
/// memsight's own bookkeeping left out).
pub fn growth(a: &Profile, b: &Profile, n: usize) -> Vec<SiteGrowth> {
    let before = a.bytes_by_site();
    let mut out: Vec<SiteGrowth> = b
        .bytes_by_site()
        .into_iter()
        .map(|(at, to)| {
            let from = before.get(&at).copied().unwrap_or(0.0);
            SiteGrowth {
                at,
                from_bytes: from.round() as u64,
                to_bytes: to.round() as u64,
                grew_bytes: (to - from).round() as i64,
            }
        })
        .filter(|g| g.grew_bytes > 0)
        .collect();
    out.sort_by(|x, y| y.grew_bytes.cmp(&x.grew_bytes).then(x.at.cmp(&y.at)));
    out.truncate(n);
    out
}

/// Folded stacks of what grew from `a` to `b` (stacks matched by their frames; memsight's own
/// bookkeeping left out).
pub fn growth_folded(a: &Profile, b: &Profile) -> Vec<(String, u64)> {
    let program = |p: &Profile| fold(p.program_stacks().map(|s| (s, s.bytes)));
    let before: HashMap<String, u64> = program(a).into_iter().collect();
    program(b)
        .into_iter()
        .filter_map(|(stack, to)| {
            let grew = to.saturating_sub(before.get(&stack).copied().unwrap_or(0));
            (grew > 0).then_some((stack, grew))
        })
        .collect()
}

fn fold<'a>(stacks: impl Iterator<Item = (&'a Stack, f64)>) -> Vec<(String, u64)> {
    let mut by: HashMap<String, f64> = HashMap::new();
    for (s, bytes) in stacks {
        let names: Vec<String> = s.frames().rev().map(folded_name).collect();
        if !names.is_empty() {
            *by.entry(names.join(";")).or_default() += bytes;
        }
    }
    let mut out: Vec<(String, u64)> = by
        .into_iter()
        .map(|(k, v)| (k, v.round() as u64))
        .filter(|(_, v)| *v > 0)
        .collect();
    out.sort();
    out
}

/// A frame's name in folded stacks: a Python frame with its file and line (one box per line, as
/// memray draws them), a native one by its function.
fn folded_name(f: &Frame) -> String {
    let name = if f.python {
        let file = f.file.as_deref().unwrap_or("?");
        let short = file.rsplit('/').next().unwrap_or(file);
        format!("{} ({short}:{})", f.function, f.line.unwrap_or(0))
    } else {
        f.function.clone()
    };
    name.replace(';', ":")
}

/// Removes the allocator's frames (jemalloc, `malloc`, Rust's allocation shims, memsight's
/// counting wrapper and sampler) from the inner end of a stack — frame by frame: where the
/// allocator's code is inlined into the caller's (`alloc::alloc::alloc` inside `app::load`), the
/// caller's frames at that address stay, so the function whose code allocated keeps its place.
fn strip_allocator(locations: &mut Vec<Location>) {
    let last = locations
        .iter()
        .take(48)
        .enumerate()
        .rev()
        .find_map(|(i, l)| l.frames.iter().rposition(is_allocator).map(|j| (i, j)));
    if let Some((i, j)) = last {
        std::sync::Arc::make_mut(&mut locations[i].frames).drain(..=j);
        let keep_from = if locations[i].frames.is_empty() {
            i + 1
        } else {
            i
        };
        locations.drain(..keep_from);
    }
}

fn is_allocator(f: &Frame) -> bool {
    const EXACT: &[&str] = &[
        "malloc",
        "calloc",
        "realloc",
        "free",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "mallocx",
        "rallocx",
    ];
    const PREFIX: &[&str] = &[
        "_rjem_",
        "je_",
        "__rust_alloc",
        "__rust_realloc",
        "__rdl_",
        "__rg_",
        "alloc::alloc::",
        "memsight::alloc::",
        "tikv_jemallocator::",
        "std::alloc::",
        "operator new",
        "prof_backtrace",
    ];
    let name = unwrap_impl(&f.function);
    EXACT.contains(&f.function.as_str()) || PREFIX.iter().any(|p| name.starts_with(p))
}

/// Whether a Python frame is the import machinery's (`<frozen importlib._bootstrap>`, its
/// `_external` half, or `importlib` itself).
fn is_import_machinery(f: &Frame) -> bool {
    f.python
        && f.file.as_deref().is_some_and(|file| {
            file.starts_with("<frozen importlib._bootstrap")
                || file.contains("/importlib/_bootstrap")
                || file.ends_with("/importlib/__init__.py")
        })
}

/// The top-level module a Python file belongs to: the first name under `site-packages` (or
/// `dist-packages`, or the standard library's `lib/pythonX.Y`), else the file's own name.
fn top_level_module(file: &str) -> String {
    // A frozen module of the standard library (`<frozen site>`).
    if let Some(name) = file
        .strip_prefix("<frozen ")
        .and_then(|f| f.strip_suffix('>'))
    {
        return name.split('.').next().unwrap_or(name).to_string();
    }
    let under = ["/site-packages/", "/dist-packages/"]
        .iter()
        .find_map(|d| file.split_once(d).map(|(_, rest)| rest))
        .or_else(|| {
            let (_, rest) = file.split_once("/lib/python3")?;
            rest.split_once('/').map(|(_, rest)| rest)
        });
    let name = match under {
        Some(rest) => rest.split('/').next().unwrap_or(rest),
        None => file.rsplit('/').next().unwrap_or(file),
    };
    name.strip_suffix(".py").unwrap_or(name).to_string()
}

/// Whether a frame is the language runtime's rather than anyone's program: Rust's standard
/// library, or the C library and dynamic loader.
fn is_runtime(f: &Frame) -> bool {
    const STD: &[&str] = &[
        "std::",
        "core::",
        "alloc::",
        "hashbrown::",
        "<std::",
        "<core::",
        "<alloc::",
    ];
    const C: &[&str] = &["libc.so", "ld-linux", "libpthread.so", "libgcc_s.so"];
    STD.iter().any(|p| f.function.starts_with(p))
        || f.file
            .as_deref()
            .is_some_and(|file| file.starts_with("/rustc/"))
        || C.iter().any(|m| f.module.starts_with(m))
}

/// Whether a frame is the dynamic loader running a library's initialisers (at `dlopen` or before
/// `main`). Only the loader's initialiser-running functions: its other work (thread-local storage
/// for a new thread, `dlsym`) is made for the caller.
fn is_loader(f: &Frame) -> bool {
    const LOADER: &[&str] = &["_dl_init", "call_init", "dl_open_worker", "_dl_start_user"];
    LOADER.iter().any(|p| f.function.starts_with(p)) || is_initialiser(f)
}

/// Whether a frame is a C++ static initialiser (GCC's and Clang's names for them).
fn is_initialiser(f: &Frame) -> bool {
    f.function.starts_with("_GLOBAL__sub_I") || f.function.starts_with("__static_initialization")
}

/// memsight's crates: a frame named in one is memsight's.
const OWN_CRATES: &[&str] = &[
    "memsight::",
    "memsight_preload::",
    "memsight_format::",
    "memsight_analysis::",
    "memsight_sidecar::",
    "memsight_integrations::",
];

/// Whether `file` is one of memsight's own sources (the crates under `profiler/`): a frame there is
/// memsight's whatever its (possibly short, inlined) name.
fn is_own_source(file: &str) -> bool {
    let here = env!("CARGO_MANIFEST_DIR");
    let profiler = here.strip_suffix("/analysis").unwrap_or(here);
    file.strip_prefix(profiler).is_some_and(|rest| {
        [
            "/src/",
            "/format/src/",
            "/analysis/src/",
            "/sidecar/src/",
            "/preload/src/",
        ]
        .iter()
        .any(|dir| rest.starts_with(dir))
    })
}

/// Whether a frame is memsight's own code (the library, not the program it profiles).
fn is_memsight(f: &Frame) -> bool {
    let name = unwrap_impl(&f.function);
    OWN_CRATES.iter().any(|c| name.starts_with(c)) || f.file.as_deref().is_some_and(is_own_source)
}

/// Whether a frame is in the user's own code: Rust, and not in the standard library, memsight
/// ([`is_memsight`]), or the libraries between a training loop and its allocations.
fn is_user_code(f: &Frame) -> bool {
    const LIBRARY: &[&str] = &[
        "std::",
        "core::",
        "alloc::",
        "hashbrown::",
        "tch::",
        "torch_sys::",
        "tikv_jemalloc",
        "serde",
        "test::",
        "[",
        "(",
        "_",
    ];
    // Inlined frames carry short names (`allocate_in`): their source file tells the standard
    // library (`/rustc/…`) and dependencies (`~/.cargo/registry/…`) from the user's code.
    let library_file = f.file.as_deref().is_some_and(|file| {
        file.starts_with("/rustc/")
            || file.contains("/.cargo/registry/")
            || file.contains("/.cargo/git/")
    });
    f.rust && !library_file && !is_memsight(f) && {
        let name = unwrap_impl(&f.function);
        !LIBRARY.iter().any(|p| name.starts_with(p))
    }
}

/// `<a::B as c::D>::f` → `a::B as c::D>::f`; `<&mut a::B …` → `a::B …`: the implementing type first.
fn unwrap_impl(name: &str) -> &str {
    let mut s = name.trim_start_matches('<');
    for prefix in ["&mut ", "&", "*const ", "*mut ", "dyn "] {
        s = s.strip_prefix(prefix).unwrap_or(s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn frame(function: &str, rust: bool, line: u32) -> Frame {
        Frame {
            function: function.into(),
            file: Some("/src/app/src/main.rs".into()),
            line: Some(line),
            rust,
            module: "app".into(),
            python: false,
        }
    }

    fn stack(names: &[(&str, bool)], bytes: f64) -> Stack {
        Stack {
            locations: names
                .iter()
                .enumerate()
                .map(|(i, (n, r))| Location {
                    addr: i as u64,
                    frames: vec![frame(n, *r, 10 + i as u32)].into(),
                })
                .collect(),
            bytes,
            objects: 1.0,
        }
    }

    fn py(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            function: function.into(),
            file: Some(file.into()),
            line: Some(line),
            rust: false,
            module: "python".into(),
            python: true,
        }
    }

    fn frames_stack(frames: Vec<Frame>, bytes: f64) -> Stack {
        Stack {
            locations: frames
                .into_iter()
                .enumerate()
                .map(|(i, f)| Location {
                    addr: i as u64,
                    frames: vec![f].into(),
                })
                .collect(),
            bytes,
            objects: 1.0,
        }
    }

    #[test]
    fn a_python_stack_is_sited_at_its_innermost_python_line_and_imports_are_apart() {
        let native = |n: &str| Frame {
            module: "libtorch_cpu.so".into(),
            ..frame(n, false, 1)
        };
        let boot = "<frozen importlib._bootstrap>";
        // A tensor made in training: native frames, then the user's lines.
        let train = frames_stack(
            vec![
                native("c10::alloc_cpu"),
                py(
                    "Linear.forward",
                    "/v/lib/python3.11/site-packages/torch/nn/modules/linear.py",
                    125,
                ),
                py("Model.forward", "/job/model.py", 87),
                py("<module>", "/job/train.py", 112),
            ],
            100.0,
        );
        assert_eq!(train.site().unwrap().function, "Linear.forward");
        assert_eq!(train.import_module(), None);
        assert!(!train.is_memsight_own());
        // What `import torch` allocated, through a meta-path hook (memsight's own start-up) and a
        // nested import of numpy: torch's.
        let import = frames_stack(
            vec![
                native("_GLOBAL__sub_I_registry"),
                py(
                    "<module>",
                    "/v/lib/python3.11/site-packages/numpy/core/__init__.py",
                    3,
                ),
                py("_find_and_load", boot, 1176),
                py(
                    "<module>",
                    "/v/lib/python3.11/site-packages/torch/__init__.py",
                    20,
                ),
                py("_call_with_frames_removed", boot, 241),
                py("_Loader.exec_module", "/mem/memsight/_startup.py", 70),
                py("_load_unlocked", boot, 690),
                py("_find_and_load", boot, 1176),
                py("<module>", "/job/train.py", 3),
            ],
            40.0,
        );
        assert_eq!(import.import_module().as_deref(), Some("torch"));
        let p = Profile {
            sample_bytes: 1,
            stacks: vec![train, import],
        };
        assert_eq!(p.import_bytes(), vec![("torch".to_string(), 40.0)]);
        assert_eq!(p.tensor_storage_bytes(), 100.0);
        let top = p.top_sites(5);
        assert_eq!(top.len(), 1, "imports are not among the sites");
        assert_eq!(top[0].at.line, Some(125));
        // Folded stacks draw a Python frame with its file and line.
        assert!(p
            .folded()
            .iter()
            .any(|(s, _)| s.contains("Model.forward (model.py:87)")));
        assert_eq!(
            top_level_module("/usr/lib/python3.11/json/decoder.py"),
            "json"
        );
        assert_eq!(top_level_module("/home/u/proj/data.py"), "data");
        assert_eq!(top_level_module("<frozen site>"), "site");
    }

    #[test]
    fn a_c_program_under_the_preloaded_library_is_not_memsights_own() {
        let preload = |n: &str| Frame {
            module: "libmemsight_preload.so".into(),
            ..frame(n, true, 1)
        };
        let s = frames_stack(
            vec![
                Frame {
                    module: "t".into(),
                    ..frame("main", false, 5)
                },
                preload("memsight_preload::job::main_then_say"),
                Frame {
                    module: "libc.so.6".into(),
                    ..frame("__libc_start_call_main", false, 0)
                },
            ],
            8.0,
        );
        assert!(!s.is_memsight_own());
        assert_eq!(s.site().unwrap().function, "main");
        let own = frames_stack(
            vec![
                frame("alloc::vec::Vec<T>::push", true, 1),
                preload("memsight::session::sampler::run"),
                preload("std::thread::spawn::{closure#0}"),
            ],
            8.0,
        );
        assert!(own.is_memsight_own());
    }

    #[test]
    fn strips_the_allocator_and_finds_the_users_frame() {
        let mut locs = stack(
            &[
                ("_rjem_je_prof_backtrace", false),
                ("imalloc_body", false),
                ("malloc", false),
                (
                    "<memsight::alloc::Allocator as core::alloc::global::GlobalAlloc>::alloc",
                    true,
                ),
                ("alloc::raw_vec::RawVec<T,A>::allocate_in", true),
                ("<alloc::vec::Vec<T> as core::clone::Clone>::clone", true),
                ("app::model::forward", true),
                ("main", false),
            ],
            1.0,
        )
        .locations;
        strip_allocator(&mut locs);
        assert_eq!(
            locs[0].frames[0].function,
            "alloc::raw_vec::RawVec<T,A>::allocate_in"
        );
        let s = Stack {
            locations: locs,
            bytes: 1.0,
            objects: 1.0,
        };
        assert_eq!(s.site().unwrap().function, "app::model::forward");
    }

    #[test]
    fn a_user_frame_inlined_with_the_allocator_keeps_its_place() {
        // `vec![…]` inlined into `app::load`: one return address carries the allocation shims and
        // the user's function.
        let mut locs = stack(
            &[
                ("memsight::alloc::sampling::alloc", true),
                ("__rust_alloc", true),
                ("std::rt::lang_start::{{closure}}", true),
            ],
            1.0,
        )
        .locations;
        Arc::make_mut(&mut locs[1].frames).push(frame("alloc::alloc::alloc", true, 1));
        Arc::make_mut(&mut locs[1].frames).push(frame("alloc::vec::from_elem", true, 2));
        Arc::make_mut(&mut locs[1].frames).push(frame("app::load", true, 3));
        strip_allocator(&mut locs);
        assert_eq!(locs[0].frames[0].function, "alloc::vec::from_elem");
        let s = Stack {
            locations: locs,
            bytes: 1.0,
            objects: 1.0,
        };
        assert_eq!(s.site().unwrap().function, "app::load");
    }

    #[test]
    fn a_librarys_start_up_is_kept_apart_from_the_sites() {
        let mut s = stack(
            &[
                ("c10::Dispatcher::registerImpl", false),
                ("_GLOBAL__sub_I_RegisterCPU.cpp", false),
                ("call_init", false),
                ("dlopen", false),
                ("tch::load_library", true),
                ("app::main", true),
            ],
            1.0,
        );
        for l in &mut s.locations {
            Arc::make_mut(&mut l.frames)[0].module = "libtorch_cpu.so".into();
        }
        assert_eq!(s.start_up_module(), Some("libtorch_cpu.so"));
        // An allocation of the library's own, later, is the user's call.
        let later = stack(&[("c10::alloc_cpu", false), ("app::train", true)], 1.0);
        assert_eq!(later.start_up_module(), None);
        assert_eq!(later.site().unwrap().function, "app::train");
        let p = Profile {
            sample_bytes: 1,
            stacks: vec![s, later],
        };
        let top = p.top_sites(5);
        assert_eq!(top.len(), 1, "{top:?}");
        assert_eq!(top[0].at.function, "app::train");
        assert_eq!(
            p.start_up_bytes(),
            vec![("libtorch_cpu.so".to_string(), 1.0)]
        );
    }

    #[test]
    fn a_tensor_allocation_is_charged_to_the_rust_caller() {
        let s = stack(
            &[
                ("c10::alloc_cpu(unsigned long)", false),
                ("at::empty_cpu(...)", false),
                ("atg_matmul", false),
                ("tch::wrappers::tensor_generated::Tensor::matmul", true),
                ("<app::Block as tch::nn::Module>::forward", true),
            ],
            1.0,
        );
        assert_eq!(
            s.site().unwrap().function,
            "<app::Block as tch::nn::Module>::forward"
        );
    }

    #[test]
    fn sites_and_growth_rank_by_bytes() {
        let a = Profile {
            sample_bytes: 1,
            stacks: vec![
                stack(&[("app::hold", true)], 100.0),
                stack(&[("app::leak", true)], 10.0),
            ],
        };
        let b = Profile {
            sample_bytes: 1,
            stacks: vec![
                stack(&[("app::hold", true)], 100.0),
                stack(&[("app::leak", true)], 60.0),
                stack(&[("app::new", true)], 5.0),
            ],
        };
        let top = b.top_sites(2);
        assert_eq!(top[0].at.function, "app::hold");
        assert!((top[0].share - 100.0 / 165.0).abs() < 1e-9);
        assert_eq!(top[0].at.label(), "app::hold (src/main.rs:10)");
        let g = growth(&a, &b, 5);
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].at.function.as_str(), g[0].grew_bytes),
            ("app::leak", 50)
        );
        assert_eq!(g[1].at.function, "app::new");
        assert_eq!(
            growth_folded(&a, &b),
            vec![("app::leak".to_string(), 50), ("app::new".to_string(), 5)]
        );
    }

    #[test]
    fn memsights_own_bookkeeping_is_left_out_of_sites_and_growth() {
        // The sampler's timeline: an inlined frame with a short name in memsight's sources, then
        // memsight's thread entry; no frame of the program.
        let own = |bytes| {
            let mut s = stack(
                &[
                    ("alloc::raw_vec::finish_grow", true),
                    ("run", true),
                    ("memsight::session::Session::start::{closure#0}", true),
                    ("start_thread", false),
                ],
                bytes,
            );
            let profiler = env!("CARGO_MANIFEST_DIR").trim_end_matches("/analysis");
            Arc::make_mut(&mut s.locations[1].frames)[0].file =
                Some(format!("{profiler}/src/session.rs"));
            s
        };
        let a = Profile {
            sample_bytes: 1,
            stacks: vec![own(10.0), stack(&[("app::leak", true)], 10.0)],
        };
        let b = Profile {
            sample_bytes: 1,
            stacks: vec![own(500.0), stack(&[("app::leak", true)], 20.0)],
        };
        assert!(b.stacks[0].is_memsight_own());
        assert!(!b.stacks[1].is_memsight_own());
        assert_eq!(b.own_bytes(), 500.0);
        let top = b.top_sites(5);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].at.function, "app::leak");
        let g = growth(&a, &b, 5);
        assert_eq!((g.len(), g[0].at.function.as_str()), (1, "app::leak"));
        assert_eq!(growth_folded(&a, &b), vec![("app::leak".to_string(), 10)]);
        // A program's call into memsight (a phase guard's name) stays the program's.
        let call = stack(&[("memsight::phase", true), ("app::train", true)], 1.0);
        assert!(!call.is_memsight_own());
        assert_eq!(call.site().unwrap().function, "app::train");
    }
}
