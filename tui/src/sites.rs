//! The allocation sites of a running job: the profile the report will show (its profiled peak
//! so far), read and symbolized on a thread of its own (symbolizing takes a while; the viewer keeps drawing) into
//! the view the report keeps of a profile (its top sites), without writing anything beside it.

use memsight_analysis::heapprof::symbolize::Symbolizer;
use memsight_analysis::heapprof::{sites_view, Profile};
use memsight_format::heap_profile::{DumpRecord, ProfileView};
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, Sender};

/// The sites of profile `d` (its file must still be on disk).
pub fn of(d: &DumpRecord, sym: &mut Symbolizer) -> Result<ProfileView, String> {
    let p = Profile::load(Path::new(&d.path), sym)?;
    Ok(sites_view(d, &p, d.path.clone()))
}

/// A thread that reads the profiles sent to it, newest first (older ones waiting are skipped),
/// and answers with their sites; it ends when the sender is dropped.
pub fn reader() -> (Sender<DumpRecord>, Receiver<Result<ProfileView, String>>) {
    let (tx, rx) = channel::<DumpRecord>();
    let (done_tx, done) = channel();
    let spawned = std::thread::Builder::new()
        .name("memsight-sites".into())
        .spawn(move || {
            let mut sym = Symbolizer::new();
            while let Ok(mut d) = rx.recv() {
                while let Ok(newer) = rx.try_recv() {
                    d = newer;
                }
                if done_tx.send(of(&d, &mut sym)).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("memsight: no live allocation sites: {e}");
    }
    (tx, done)
}
