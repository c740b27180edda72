//! Where CPython keeps what the frame reader needs, per minor version: the thread state's current
//! frame, a frame's code object, caller and instruction, a code object's names and line table, and
//! a string's characters. Offsets measured with `offsetof` against each version's own headers
//! (internal ones included, `Py_BUILD_CORE`) for x86-64 and aarch64 Linux (LP64: the same
//! offsets); a version not listed has no Python frames (said once, never guessed).

/// How a version chains its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chain {
    /// 3.10: `PyThreadState.frame` → `PyFrameObject.f_back`; one C-level evaluation per frame;
    /// `f_lasti` counts code units.
    FrameObjects,
    /// 3.11: `PyThreadState.cframe->current_frame` → `_PyInterpreterFrame.previous`; the frame
    /// that entered a C-level evaluation has `is_entry` set; `prev_instr` points at the
    /// instruction running.
    EntryFlag,
    /// 3.12: as 3.11, but a C-level evaluation starts with a shim frame owned by the C stack.
    CStackShim,
    /// 3.13: `PyThreadState.current_frame`; `f_executable` may be something other than code;
    /// `instr_ptr` points at the instruction running; shim frames as 3.12.
    CurrentFrame,
}

/// One version's offsets (bytes from the start of each object).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// How frames chain.
    pub chain: Chain,
    /// In the thread state: the current frame (3.10, 3.13) or the `_PyCFrame` pointer (3.11, 3.12).
    pub tstate_frame: usize,
    /// In `_PyCFrame`: the current frame (3.11, 3.12).
    pub cframe_current: usize,
    /// In a frame: its code object.
    pub frame_code: usize,
    /// In a frame: its caller.
    pub frame_previous: usize,
    /// In a frame: the instruction (3.10: `f_lasti`, an `int` in code units; later: a pointer).
    pub frame_instr: usize,
    /// In a frame: `is_entry` (3.11).
    pub frame_is_entry: usize,
    /// In a frame: `owner` (3.12, 3.13; a frame owned by the C stack is a shim).
    pub frame_owner: usize,
    /// In a code object: `co_filename`.
    pub code_filename: usize,
    /// In a code object: `co_qualname` (3.11+) or `co_name` (3.10).
    pub code_name: usize,
    /// In a code object: `co_linetable`.
    pub code_linetable: usize,
    /// In a code object: `co_firstlineno` (an `int`).
    pub code_firstlineno: usize,
    /// In a code object: `co_code_adaptive`, its instructions (3.11+).
    pub code_adaptive: usize,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's characters start.
    pub ascii_size: usize,
    /// `sizeof(PyCompactUnicodeObject)`: where a compact non-ASCII string's characters start.
    pub compact_size: usize,
    /// In a compact non-ASCII string: its cached UTF-8 (or null).
    pub compact_utf8: usize,
}

/// In every version: `PyObject.ob_type`.
pub const OB_TYPE: usize = 8;
/// In every version: `PyVarObject.ob_size` (a bytes object's length).
pub const OB_SIZE: usize = 16;
/// In every version: `PyBytesObject.ob_sval`.
pub const BYTES_DATA: usize = 32;
/// In every version: `PyASCIIObject.length` (characters).
pub const STR_LENGTH: usize = 16;
/// In every version: `PyASCIIObject.state` (interned:2, kind:3, compact:1, ascii:1, …).
pub const STR_STATE: usize = 32;
/// 3.12+'s `FRAME_OWNED_BY_CSTACK`.
pub const OWNED_BY_CSTACK: u8 = 3;

/// The layout of CPython `major.minor`, when this reader knows it.
pub fn of(major: u8, minor: u8) -> Option<Layout> {
    let l = match (major, minor) {
        (3, 10) => Layout {
            chain: Chain::FrameObjects,
            tstate_frame: 24,
            cframe_current: 0,
            frame_code: 32,
            frame_previous: 24,
            frame_instr: 96,
            frame_is_entry: 0,
            frame_owner: 0,
            code_filename: 104,
            code_name: 112,
            code_linetable: 120,
            code_firstlineno: 40,
            code_adaptive: 0,
            ascii_size: 48,
            compact_size: 72,
            compact_utf8: 56,
        },
        (3, 11) => Layout {
            chain: Chain::EntryFlag,
            tstate_frame: 56,
            cframe_current: 8,
            frame_code: 32,
            frame_previous: 48,
            frame_instr: 56,
            frame_is_entry: 68,
            frame_owner: 69,
            code_filename: 112,
            code_name: 128,
            code_linetable: 136,
            code_firstlineno: 72,
            code_adaptive: 184,
            ascii_size: 48,
            compact_size: 72,
            compact_utf8: 56,
        },
        (3, 12) => Layout {
            chain: Chain::CStackShim,
            tstate_frame: 56,
            cframe_current: 0,
            frame_code: 0,
            frame_previous: 8,
            frame_instr: 56,
            frame_is_entry: 0,
            frame_owner: 70,
            code_filename: 112,
            code_name: 128,
            code_linetable: 136,
            code_firstlineno: 68,
            code_adaptive: 192,
            ascii_size: 40,
            compact_size: 56,
            compact_utf8: 48,
        },
        (3, 13) => Layout {
            chain: Chain::CurrentFrame,
            tstate_frame: 72,
            cframe_current: 0,
            frame_code: 0,
            frame_previous: 8,
            frame_instr: 56,
            frame_is_entry: 0,
            frame_owner: 70,
            code_filename: 112,
            code_name: 128,
            code_linetable: 136,
            code_firstlineno: 68,
            code_adaptive: 200,
            ascii_size: 40,
            compact_size: 56,
            compact_utf8: 48,
        },
        _ => return None,
    };
    Some(l)
}
