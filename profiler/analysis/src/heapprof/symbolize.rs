//! Addresses to source frames: the mapped file's DWARF (function, file, line, inlined callers), or
//! its symbol table when it has no DWARF (libtorch's shared objects). Works on another process's
//! addresses, using the memory map saved in its heap dump, as long as its files are on disk.

use super::dump::{HeapDump, Mapping};
use addr2line::gimli;
use object::read::elf::{FileHeader, ProgramHeader};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One source frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// Demangled function name (without Rust's hash suffix).
    pub function: String,
    /// Source file, when the module has line tables.
    pub file: Option<String>,
    /// Source line.
    pub line: Option<u32>,
    /// Whether the function is Rust code.
    pub rust: bool,
    /// The mapped file's name (`train`, `libtorch_cpu.so`); `python` for a Python frame.
    pub module: String,
    /// Whether this is a Python function's frame (its file and line are the script's).
    pub python: bool,
}

/// A mapped file opened for lookups.
struct Module {
    loader: Option<addr2line::Loader>,
    /// `(file offset, size, virtual address)` of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
    name: String,
}

/// The frames at one address, shared by every stack that holds it (a profile's stacks repeat
/// their addresses: one copy each, not one per stack).
pub type Frames = Arc<Vec<Frame>>;

/// Resolves addresses of dumped processes; caches opened modules and resolved (module, offset)
/// pairs, so one symbolizer serves every profile of a run (or of two runs, for a diff).
#[derive(Default)]
pub struct Symbolizer {
    /// Module numbers by path, then inode (a rebuilt file is another module).
    ids: HashMap<PathBuf, Vec<(u64, usize)>>,
    /// Each module, opened once (`None`: it could not be).
    modules: Vec<Option<Module>>,
    cache: HashMap<(usize, u64), Frames>,
    /// Addresses outside every mapping.
    unmapped: HashMap<u64, Frames>,
    /// Files that could not be opened (named once in the report).
    pub missing: Vec<String>,
}

impl Symbolizer {
    /// A fresh symbolizer.
    pub fn new() -> Self {
        Symbolizer::default()
    }

    /// The frames at return address `addr` in `dump`'s process, innermost (inlined) first.
    pub fn frames(&mut self, dump: &HeapDump, addr: u64) -> Frames {
        if addr & PYTHON_TAG != 0 {
            // Not cached: a word names a function of its own process only (dumps of several
            // processes share a symbolizer).
            return Arc::new(vec![python_frame(dump, addr)]);
        }
        let Some(m) = dump.mapping_of(addr) else {
            let frames = self
                .unmapped
                .entry(addr)
                .or_insert_with(|| Arc::new(vec![unknown(format!("0x{addr:x}"), String::new())]));
            return Arc::clone(frames);
        };
        // Wrapping: a corrupt mapping may claim any file offset; its lookups then just fail.
        let key = (
            self.module_id(m),
            (addr - m.start).wrapping_add(m.file_offset),
        );
        if let Some(frames) = self.cache.get(&key) {
            return Arc::clone(frames);
        }
        let frames = Arc::new(self.resolve(m, key.0, key.1));
        self.cache.insert(key, Arc::clone(&frames));
        frames
    }

    /// The number of `m`'s module, opening it the first time.
    fn module_id(&mut self, m: &Mapping) -> usize {
        if let Some(&(_, id)) = self
            .ids
            .get(m.path.as_path())
            .and_then(|v| v.iter().find(|(inode, _)| *inode == m.inode))
        {
            return id;
        }
        let id = self.modules.len();
        let module = Module::open(&m.path, m.inode)
            .map_err(|why| self.missing.push(format!("{} ({why})", m.path.display())))
            .ok();
        self.modules.push(module);
        self.ids
            .entry(m.path.clone())
            .or_default()
            .push((m.inode, id));
        id
    }

    fn resolve(&self, m: &Mapping, id: usize, offset: u64) -> Vec<Frame> {
        let module = self.modules.get(id).and_then(Option::as_ref);
        let name = file_name(&m.path);
        // A return address points after the call; look up the call itself.
        let frames = module
            .and_then(|module| {
                let probe = module.vaddr(offset)?.saturating_sub(1);
                Some(module.lookup(probe))
            })
            .unwrap_or_default();
        if frames.is_empty() {
            vec![unknown(format!("{name}+0x{offset:x}"), name)]
        } else {
            frames
        }
    }
}

fn unknown(function: String, module: String) -> Frame {
    Frame {
        function,
        file: None,
        line: None,
        rust: false,
        module,
        python: false,
    }
}

/// The frame a Python word of a stack stands for (its `PYTHON_FRAMES:` entry).
fn python_frame(dump: &HeapDump, word: u64) -> Frame {
    match dump.python.get(&word) {
        Some(f) => Frame {
            function: f.function.clone(),
            file: Some(f.file.clone()),
            line: (f.line > 0).then_some(f.line),
            rust: false,
            module: PYTHON_MODULE.to_string(),
            python: true,
        },
        None => Frame {
            function: "<python>".to_string(),
            file: None,
            line: None,
            rust: false,
            module: PYTHON_MODULE.to_string(),
            python: true,
        },
    }
}

/// The module name of Python frames.
pub const PYTHON_MODULE: &str = "python";

/// The tag of a Python frame's word in a stack (memsight::pyframes::TAG): never a user-space
/// return address.
const PYTHON_TAG: u64 = 1 << 63;

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl Module {
    fn open(path: &Path, inode: u64) -> Result<Module, &'static str> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|_| "no longer on disk")?;
        // A profile's mapping names any path; opening a FIFO or device there would block or read
        // forever.
        if !meta.is_file() {
            return Err("not a regular file");
        }
        if inode != 0 && meta.ino() != inode {
            return Err("replaced since the profile was written");
        }
        let segments = load_segments(path).ok_or("not a readable ELF file")?;
        Ok(Module {
            loader: addr2line::Loader::new(path).ok(),
            segments,
            name: file_name(path),
        })
    }

    fn vaddr(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(off, size, _)| *off <= offset && offset < off.saturating_add(*size))
            .map(|(off, _, vaddr)| (offset - off).wrapping_add(*vaddr))
    }

    fn lookup(&self, probe: u64) -> Vec<Frame> {
        let Some(loader) = &self.loader else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Ok(mut frames) = loader.find_frames(probe) {
            while let Ok(Some(f)) = frames.next() {
                let Some(func) = f.function.as_ref() else {
                    continue;
                };
                let Ok(name) = func.demangle() else { continue };
                out.push(Frame {
                    function: strip_hash(&name).to_string(),
                    file: f.location.as_ref().and_then(|l| l.file).map(str::to_string),
                    line: f.location.as_ref().and_then(|l| l.line),
                    rust: func.language == Some(gimli::DW_LANG_Rust),
                    module: self.name.clone(),
                    python: false,
                });
            }
        }
        // Line-tables-only DWARF names functions without their path (`forward`); the symbol table
        // has the physical (outermost) function's full name (`app::model::Block::forward`).
        if let (Some(last), Some(sym)) = (out.last_mut(), loader.find_symbol(probe)) {
            let full = addr2line::demangle_auto(sym.into(), None);
            if let Some(q) = qualify(&last.function, strip_hash(&full)) {
                last.function = q;
            }
        }
        if out.is_empty() {
            if let Some(sym) = loader.find_symbol(probe) {
                let rust = is_rust_symbol(sym);
                let name = addr2line::demangle_auto(sym.into(), None);
                out.push(Frame {
                    function: strip_hash(&name).to_string(),
                    file: None,
                    line: None,
                    rust,
                    module: self.name.clone(),
                    python: false,
                });
            }
        }
        out
    }
}

/// The loadable segments of an ELF file, from its program headers alone (a shared object can be
/// hundreds of MiB; only its first pages are read).
fn load_segments(path: &Path) -> Option<Vec<(u64, u64, u64)>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut head = Vec::new();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    file.take(64 * 1024).read_to_end(&mut head).ok()?;
    let data = head.as_slice();
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let phdrs = header.program_headers(endian, data).ok()?;
    Some(
        phdrs
            .iter()
            .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
            .map(|p| (p.p_offset(endian), p.p_filesz(endian), p.p_vaddr(endian)))
            .collect(),
    )
}

/// Rust's legacy mangling ends in `17h` + 16 hex digits + `E`; v0 starts with `_R`.
fn is_rust_symbol(sym: &str) -> bool {
    if sym.starts_with("_R") {
        return true;
    }
    let core = sym.split('.').next().unwrap_or(sym);
    core.starts_with("_ZN")
        && core.len() > 20
        && core.ends_with('E')
        && core[core.len() - 20..].starts_with("17h")
        && core[core.len() - 17..core.len() - 1]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

/// The path-qualified name of a line-table function name (`forward`, `held_by<Vec<u8>>`) from the
/// symbol table's name of the same function (`app::model::forward`, or with v0 mangling
/// `app::model::held_by::<Vec<u8>>`), keeping the line table's type arguments; `None` when the
/// name already has a path or the symbol is another function.
fn qualify(short: &str, symbol: &str) -> Option<String> {
    let (base, args) = split_type_args(short);
    if base.is_empty() || base.contains("::") {
        return None;
    }
    let (sym_base, _) = split_type_args(symbol);
    let sym_base = sym_base.strip_suffix("::").unwrap_or(sym_base);
    let path = sym_base.strip_suffix(base)?;
    if !(path.is_empty() || path.ends_with("::")) {
        return None;
    }
    Some(format!("{sym_base}{args}"))
}

/// Splits a trailing `<…>` (balanced) off a name: `f<Vec<u8>>` → (`f`, `<Vec<u8>>`).
fn split_type_args(name: &str) -> (&str, &str) {
    if !name.ends_with('>') {
        return (name, "");
    }
    let mut depth = 0usize;
    for (i, c) in name.char_indices().rev() {
        match c {
            '>' => depth += 1,
            '<' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return name.split_at(i);
                }
            }
            _ => {}
        }
    }
    (name, "")
}

/// Drops a `::h0123456789abcdef` suffix.
fn strip_hash(name: &str) -> &str {
    match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            head
        }
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_rust_symbols_from_cpp() {
        assert!(is_rust_symbol(
            "_ZN4core3ptr13drop_in_place17h0123456789abcdefE"
        ));
        assert!(is_rust_symbol("_RNvCs1234_5crate4main"));
        assert!(!is_rust_symbol("_ZN2at9empty_cpuEN3c108ArrayRefIlEE"));
        assert!(!is_rust_symbol("malloc"));
        assert_eq!(strip_hash("a::b::h0123456789abcdef"), "a::b");
        assert_eq!(strip_hash("a::hello"), "a::hello");
    }

    #[test]
    fn qualifies_line_table_names_from_symbols() {
        assert_eq!(
            qualify("forward", "app::Block::forward").as_deref(),
            Some("app::Block::forward")
        );
        assert_eq!(
            qualify("held_by<alloc::vec::Vec<u8>>", "app::held_by").as_deref(),
            Some("app::held_by<alloc::vec::Vec<u8>>")
        );
        assert_eq!(
            qualify("held_by<u8>", "app::held_by::<u8>").as_deref(),
            Some("app::held_by<u8>")
        );
        assert_eq!(qualify("forward", "app::Block::preforward"), None);
        assert_eq!(qualify("forward", "forward").as_deref(), Some("forward"));
        assert_eq!(qualify("app::forward", "app::forward"), None);
        assert_eq!(
            qualify("drop", "<app::Foo as core::ops::drop::Drop>::drop").as_deref(),
            Some("<app::Foo as core::ops::drop::Drop>::drop")
        );
        assert_eq!(split_type_args("a<b<c>>"), ("a", "<b<c>>"));
        assert_eq!(split_type_args("<a as b>"), ("", "<a as b>"));
    }

    /// Symbolizes an address of this very test binary through its own memory map.
    #[test]
    #[inline(never)]
    fn resolves_an_address_of_this_binary() {
        let here = resolves_an_address_of_this_binary as *const () as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let dump = HeapDump::parse(&format!("heap_v2/524288\nMAPPED_LIBRARIES:\n{maps}")).unwrap();
        let mut s = Symbolizer::new();
        let frames = s.frames(&dump, here + 1);
        assert!(
            frames
                .iter()
                .any(|f| f.function.ends_with("resolves_an_address_of_this_binary") && f.rust),
            "{frames:?}"
        );
    }

    /// A generic function's line-table name (`held_by<alloc::vec::Vec<u8>>`) gets its path from
    /// the symbol table, keeping its type arguments.
    #[inline(never)]
    fn held_by<T: Default>() -> u64 {
        std::hint::black_box(T::default());
        held_by::<T> as *const () as u64
    }

    /// A mapping that names a FIFO (a crafted or stale profile) is skipped, not opened and waited on.
    #[test]
    fn a_mapping_naming_a_fifo_does_not_hang() {
        let fifo = std::env::temp_dir().join(format!("memsight-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let text = format!(
            "heap_v2/524288\nMAPPED_LIBRARIES:\n400000-401000 r-xp 00000000 00:00 0 {}\n",
            fifo.display()
        );
        let dump = HeapDump::parse(&text).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = Symbolizer::new();
            let frames = s.frames(&dump, 0x400010);
            let _ = tx.send((frames, s.missing));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(30));
        let _ = std::fs::remove_file(&fifo);
        let (frames, missing) = got.expect("symbolizing hung on a FIFO");
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert!(frames[0].file.is_none(), "{frames:?}");
        assert!(missing[0].ends_with("(not a regular file)"), "{missing:?}");
    }

    #[test]
    fn a_generic_function_gets_its_path() {
        let here = held_by::<Vec<u8>>();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let dump = HeapDump::parse(&format!("heap_v2/524288\nMAPPED_LIBRARIES:\n{maps}")).unwrap();
        let frames = Symbolizer::new().frames(&dump, here + 1);
        let last = frames.last().expect("a frame");
        assert!(
            last.function.contains("symbolize::tests::held_by"),
            "{frames:?}"
        );
        assert!(last.function.contains("Vec<u8"), "{frames:?}");
    }
}
