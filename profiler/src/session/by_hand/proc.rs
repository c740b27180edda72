//! Reading `/proc/<pid>/environ` and `/proc/<pid>/stat` without allocating (a job started by hand
//! places each process as the preloaded library loads).

use crate::session::place::number;

/// One `KEY=VALUE` entry looked for in an environment block, matched byte by byte as it is read.
#[derive(Clone, Copy)]
pub(super) struct Entry<'a> {
    pub(super) key: &'a [u8],
    value: &'a [u8],
    /// Bytes of the current entry matched so far; `usize::MAX` once it differs.
    at: usize,
    found: bool,
}

impl<'a> Entry<'a> {
    pub(super) const EMPTY: Entry<'static> = Entry {
        key: b"",
        value: b"",
        at: 0,
        found: false,
    };

    pub(super) fn new(key: &'a [u8], value: &'a [u8]) -> Entry<'a> {
        Entry {
            key,
            value,
            at: 0,
            found: false,
        }
    }

    /// The byte expected at `i` of `KEY=VALUE`.
    fn expected(&self, i: usize) -> Option<u8> {
        let k = self.key.len();
        match i {
            _ if i < k => Some(self.key[i]),
            _ if i == k => Some(b'='),
            _ => self.value.get(i - k - 1).copied(),
        }
    }

    /// Takes the environment's next byte (a NUL ends an entry).
    fn feed(&mut self, b: u8) {
        if b == 0 {
            if self.at == self.key.len() + 1 + self.value.len() {
                self.found = true;
            }
            self.at = 0;
        } else if self.at != usize::MAX {
            self.at = match self.expected(self.at) {
                Some(e) if e == b => self.at + 1,
                _ => usize::MAX,
            };
        }
    }
}

/// Whether `/proc/<pid>/environ` (the environment `pid` was exec'd with) holds every entry.
pub(super) fn environ_holds(pid: libc::pid_t, wanted: &mut [Entry]) -> bool {
    let Some(fd) = open_proc(pid, b"/environ") else {
        return false;
    };
    let mut buf = [0u8; 4096];
    let mut any = false;
    loop {
        // SAFETY: reads at most `buf.len()` bytes into `buf`.
        let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if got <= 0 {
            break;
        }
        any = true;
        for &b in &buf[..got as usize] {
            wanted.iter_mut().for_each(|e| e.feed(b));
        }
    }
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    // The last entry ends at the end of the block even without its NUL.
    wanted.iter_mut().for_each(|e| e.feed(0));
    any && wanted.iter().all(|e| e.found)
}

/// `n`'s decimal digits, written into `buf`.
fn itoa(n: libc::pid_t, buf: &mut [u8; 12]) -> &[u8] {
    let mut n = n.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// What `/proc/<pid>/stat` tells of a process.
pub(super) struct Stat {
    /// The parent.
    pub(super) ppid: libc::pid_t,
    /// The process group.
    pub(super) group: libc::pid_t,
    /// The session.
    pub(super) session: libc::pid_t,
    /// Start, in clock ticks after boot.
    pub(super) start: u64,
}

/// Process `pid`'s parent, groups and start time, from `/proc/<pid>/stat`. Allocation-free.
pub(super) fn stat_fields(pid: libc::pid_t) -> Option<Stat> {
    let mut buf = [0u8; 1024];
    let text = read_proc(pid, b"/stat", &mut buf)?;
    // The command name in parentheses may hold anything; the fields after its last `)` do not.
    let after = text.iter().rposition(|&b| b == b')')? + 1;
    let mut fields = text[after..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let mut pid_field = |skip| libc::pid_t::try_from(number(fields.nth(skip)?)?).ok();
    let ppid = pid_field(1)?;
    let group = pid_field(0)?;
    let session = pid_field(0)?;
    let start = number(fields.nth(15)?)?;
    Some(Stat {
        ppid,
        group,
        session,
        start,
    })
}

/// Opens `/proc/<pid><file>` (read-only, no controlling terminal); the descriptor, or `None`.
fn open_proc(pid: libc::pid_t, file: &[u8]) -> Option<libc::c_int> {
    let mut path = [0u8; 40];
    let mut len = 0;
    for part in [&b"/proc/"[..], itoa(pid, &mut [0u8; 12]), file] {
        path.get_mut(len..len + part.len())?.copy_from_slice(part);
        len += part.len();
    }
    // A NUL after the name: `path` is zeroed past `len`.
    path.get(len).filter(|&&b| b == 0)?;
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    (fd >= 0).then_some(fd)
}

/// Reads `/proc/<pid><file>` into `buf` (what fits); the bytes read.
fn read_proc<'b>(pid: libc::pid_t, file: &[u8], buf: &'b mut [u8]) -> Option<&'b [u8]> {
    let fd = open_proc(pid, file)?;
    // SAFETY: reads at most `buf.len()` bytes into `buf`.
    let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    buf.get(..usize::try_from(got).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holds(block: &[u8], key: &[u8], value: &[u8]) -> bool {
        let mut e = [Entry::new(key, value)];
        block.iter().for_each(|&b| e[0].feed(b));
        e[0].feed(0);
        e[0].found
    }

    #[test]
    fn an_entry_is_found_only_whole() {
        let block = b"A=1\0LD_PRELOAD=/lib/x.so\0MEMSIGHT_REPORT=r.json\0";
        assert!(holds(block, b"LD_PRELOAD", b"/lib/x.so"));
        assert!(holds(block, b"MEMSIGHT_REPORT", b"r.json"));
        assert!(!holds(block, b"MEMSIGHT_REPORT", b"r.jso"));
        assert!(!holds(block, b"MEMSIGHT_REPORT", b"r.json2"));
        assert!(!holds(block, b"REPORT", b"r.json"));
        assert!(!holds(
            b"XMEMSIGHT_REPORT=r.json\0",
            b"MEMSIGHT_REPORT",
            b"r.json"
        ));
        assert!(holds(
            b"MEMSIGHT_REPORT=r.json",
            b"MEMSIGHT_REPORT",
            b"r.json"
        ));
        assert!(holds(b"K=\0", b"K", b""));
    }

    #[test]
    fn this_process_environment_is_read_back() {
        let mut e = [Entry::new(b"PATH", b"no such value")];
        // SAFETY: getpid has no preconditions.
        assert!(!environ_holds(unsafe { libc::getpid() }, &mut e));
        let path = std::env::var("PATH").unwrap();
        let mut e = [Entry::new(b"PATH", path.as_bytes())];
        // SAFETY: as above.
        assert!(environ_holds(unsafe { libc::getpid() }, &mut e));
    }

    #[test]
    fn this_process_parent_and_start_are_read() {
        // SAFETY: getpid and getppid have no preconditions.
        let (me, parent) = unsafe { (libc::getpid(), libc::getppid()) };
        let st = stat_fields(me).unwrap();
        assert_eq!(st.ppid, parent);
        // SAFETY: getpgid and getsid have no preconditions.
        assert_eq!(st.group, unsafe { libc::getpgid(0) });
        assert_eq!(st.session, unsafe { libc::getsid(0) });
        assert!(st.start > 0);
        assert_eq!(number(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(number(b"18446744073709551616"), None);
        assert_eq!(number(b"12a"), None);
    }

    #[test]
    fn pids_are_written_in_decimal() {
        assert_eq!(itoa(0, &mut [0; 12]), b"0");
        assert_eq!(itoa(4_194_304, &mut [0; 12]), b"4194304");
        assert_eq!(itoa(i32::MAX, &mut [0; 12]), b"2147483647");
    }
}
