//! The pool's shared-page paths: a store that finds (or makes) a shared
//! object, and the release of a reference to one (`dedup.rs` keeps the
//! table; this is what the engine does with it).

use std::sync::atomic::Ordering::Relaxed;

use super::{Engine, LOAD_TRIES};
use crate::dedup::{DedupTable, Loc, Released};
use crate::entry::{Entry, ObjInfo};
use crate::error::Result;
use crate::objects::with_page_buf;
use crate::tier::OBJ;

impl Engine {
    /// Find an equal page already stored and share it, or (with `create`)
    /// store this one as a new shared object. A hash match only names a
    /// candidate: it is compared byte for byte (read from the backing file,
    /// with no lock held, if it was written back). Returns the entry and,
    /// for a page shared, the compressed bytes it saved; None when there
    /// is no twin and `create` is off (the caller stores the page plainly).
    pub(super) fn store_dedup(&self, d: &DedupTable, hash: u64, page: &[u8], create: bool) -> Result<Option<(Entry, Option<u64>)>> {
        let shard = d.shard(hash);
        // A tiered pool may wait for room: never with the dedup lock held.
        let mut admitted = false;
        let mut tries = 0;
        loop {
            tries += 1;
            let mut ds = shard.lock();
            let Some(rec) = ds.get(hash) else {
                if !create {
                    return Ok(None);
                }
                let waits = self.tier.writes_back();
                if waits && !admitted {
                    drop(ds);
                    self.admit()?;
                    admitted = true;
                    continue;
                }
                if !waits {
                    self.admit()?;
                }
                let b = self.budget();
                let place = self.tier.reserve_shared(d.shard_index(hash), b).map_err(|e| self.alloc_failed(e))?;
                let (handle, info) = match self.encode_new(page) {
                    Ok(made) => made,
                    Err(e) => {
                        self.tier.cancel(place);
                        return Err(e);
                    }
                };
                let gen = match ds.insert(hash, handle, info, self.now(), b) {
                    Ok(gen) => gen,
                    Err(e) => {
                        drop(ds);
                        self.tier.cancel(place);
                        self.release(Entry::obj(handle, info));
                        return Err(self.alloc_failed(e));
                    }
                };
                let live = ds.records();
                drop(ds);
                self.tier.queue(self, place, hash, gen, live);
                return Ok(Some((Entry::dedup(hash, info), None)));
            };
            let equal = match rec.loc {
                Loc::Dropped => false,
                Loc::Ram(h) => self.objects.equals(h, rec.info, page),
                Loc::Backed(id) => {
                    drop(ds);
                    let equal = self.record_equals(id, hash, rec.info, page);
                    ds = shard.lock();
                    let now = ds.get(hash).map(|r| (r.loc, r.gen));
                    if now != Some((rec.loc, rec.gen)) {
                        if tries < LOAD_TRIES {
                            // Promoted, freed or replaced while we read: look again.
                            continue;
                        }
                        false
                    } else {
                        equal
                    }
                }
            };
            if equal {
                ds.add_ref(hash, Some(self.now()));
                self.counters.dedup_hits.fetch_add(1, Relaxed);
                return Ok(Some((Entry::dedup(hash, rec.info), Some(rec.info.len as u64))));
            }
            // A true 64-bit collision (or an unreadable or dropped
            // candidate): store this page unshared.
            let dropped = rec.loc == Loc::Dropped;
            drop(ds);
            if !dropped {
                self.counters.dedup_collisions.fetch_add(1, Relaxed);
            }
            if !admitted {
                self.admit()?;
            }
            let (h, info) = self.encode_new(page)?;
            return Ok(Some((Entry::obj(h, info), None)));
        }
    }

    /// Whether the written-back shared object `id` decodes to `page`.
    fn record_equals(&self, id: u64, hash: u64, info: ObjInfo, page: &[u8]) -> bool {
        OBJ.with_borrow_mut(|obj| with_page_buf(|out| self.tier.read_record(&self.objects, hash, id, info, obj, out).is_ok() && out == page))
    }

    pub(super) fn release_shared(&self, hash: u64) -> std::result::Result<(), String> {
        let Some(d) = &self.dedup else {
            return Err("a shared-page entry in a pool without dedup".into());
        };
        let released = d.shard(hash).lock().release(hash)?;
        match released {
            Released::Nothing => Ok(()),
            Released::Object(h) => self.objects.free(h).map_err(|e| e.to_string()),
            Released::Record(id) => self.tier.free_record(id, self.budget()),
        }
    }
}
