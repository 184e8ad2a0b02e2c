//! Opening a pool again: the engine rebuilt from the arena another process
//! left, its objects and its ledger (`ledger.rs`).
//!
//! The allocator finds its live objects again (`zmem_alloc::ZsPool::open`);
//! a pool with a backing file has a new store on the same file take over
//! the records the ledger names (`ColdStore::adopt`); each key the ledger
//! records goes back into the index, in its shard, stamped and counted as
//! a store would (an object in RAM on the tier's LRU, a written-back key
//! in its cold block); the objects no key names (the dead process had
//! allocated them and not yet published them, or written them back and
//! not yet freed them) are freed.
//! Access times start again at the opening (every page is as young as
//! the others), and so do the counters of events; the counts of what the
//! pool holds are rebuilt.
//!
//! A key whose entry cannot be proven right (a damaged word, an object the
//! arena does not hold, a kind this pool cannot have) is not guessed at:
//! it is marked lost (`Shard::mark_lost`), its reads fail (EIO at a
//! device) until it is written or dropped, and the ledger keeps the mark,
//! so the next opening does not read zeros there either.

use std::collections::HashSet;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zmem_alloc::{Budget, Handle, ZsPool};

use super::{Engine, Pool, PoolConfig};
use crate::cold::{ColdStore, RecordId};
use crate::entry::{ObjInfo, Slot};
use crate::error::{Result, ZmemError};
use crate::ledger::Recorded;

/// What [`Pool::open`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reopened {
    /// Keys holding a page.
    pub pages: u64,
    /// Objects no key named, freed: allocated by the process that left the
    /// arena, which died before it published them.
    pub strays_freed: u64,
    /// Keys whose page could not be proven right, now marked lost (and
    /// those lost at an earlier opening and not written since).
    pub lost: u64,
    /// How long opening took.
    pub took: Duration,
}

impl Pool {
    /// The file that holds this pool's objects and ledger, for a process
    /// that keeps it while this one is replaced ([`Pool::open`]); `None`
    /// for a pool without a ledger ([`PoolConfig::ledger_keys`]), which
    /// cannot be opened again.
    pub fn arena(&self) -> Option<BorrowedFd<'_>> {
        self.e.cfg.ledger_keys.and(self.e.objects.arena_fd())
    }

    /// This process leaves the pool to the next one (a planned restart):
    /// its cold store keeps its records when dropped
    /// ([`ColdStore::leave`]), for the next process to take over.
    pub fn leave(&self) {
        self.e.tier.leave();
    }

    /// Open the pool another process left in `arena` (the file of
    /// [`Pool::arena`]), with the configuration it was made with (its
    /// `ledger_keys` at least; the rest may change). Every page it held is
    /// here; the objects it had not yet published are freed.
    ///
    /// Refused, with the reason, when the arena is held by a live process,
    /// is not a pool's, of another version or damaged: nothing is changed
    /// then, and the arena may be opened again by a zmem that can read it.
    /// A key whose entry cannot be proven right is marked lost instead
    /// ([`Reopened::lost`]): its reads fail, the other pages are served.
    pub fn open(arena: OwnedFd, cfg: PoolConfig) -> Result<(Pool, Reopened)> {
        Self::open_on(arena, cfg, None)
    }

    /// [`Pool::open`] of a pool that wrote pages back: `store` is a cold
    /// store made on what the last one left (a backing file's store on the
    /// same file, `zmem_backing::OsFile::kept`), which takes over the
    /// records the ledger names ([`ColdStore::adopt`]); a page whose
    /// record it cannot take is marked lost.
    pub fn open_with_cold_store(arena: OwnedFd, cfg: PoolConfig, store: Box<dyn ColdStore>) -> Result<(Pool, Reopened)> {
        Self::open_on(arena, cfg, Some(store))
    }

    fn open_on(arena: OwnedFd, cfg: PoolConfig, store: Option<Box<dyn ColdStore>>) -> Result<(Pool, Reopened)> {
        let t = Instant::now();
        if cfg.ledger_keys.is_none() {
            return Err(ZmemError::Config("opening a pool again needs the ledger_keys it was made with".into()));
        }
        cfg.check()?;
        // No limit while the pages go back in: they are held already.
        let budget = Arc::new(Budget::new(None));
        let (alloc, found) = ZsPool::open(arena, Arc::clone(&budget)).map_err(|e| ZmemError::Reopen(e.to_string()))?;
        let e = Engine::build(cfg, store, Some((alloc, budget)))?;
        let mut report = e.rebuild(found)?;
        e.install_given_dict()?;
        e.budget().set_limit(e.cfg.mem_limit);
        let pool = Pool::start(e)?;
        report.took = t.elapsed();
        Ok((pool, report))
    }
}

impl Engine {
    /// Put every key the ledger records back (or mark it lost): the objects
    /// in RAM on the tier's LRU, the written-back pages' records taken
    /// over by the cold store; then free the objects no key names.
    fn rebuild(&self, found: Vec<Handle>) -> Result<Reopened> {
        let ledger = self.index.ledger().ok_or_else(|| ZmemError::Reopen("the pool keeps no ledger".into()))?;
        let mut unnamed: HashSet<u64> = found.iter().map(|h| h.to_raw()).collect();
        let b = self.budget();
        // An object written with a dictionary the pool did not get back
        // (`Dicts::restore`) cannot be read.
        let dict_gone = |info: ObjInfo| {
            let (slot, _) = info.dict()?;
            self.objects.dicts().and_then(|d| d.get(slot)).is_none().then(|| format!("was written with dictionary slot {slot}, which the pool does not hold"))
        };
        // The records the ledger names, for the cold store to take over.
        let backed: Vec<RecordId> = ledger
            .entries()
            .filter_map(|(_, rec)| match rec {
                Recorded::Entry(e) => match e.slot() {
                    Slot::Backed(id, info) if dict_gone(info).is_none() => Some(RecordId::from_raw(id)),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        // (Asked with no records too: a store also learns what is free.)
        let taken: HashSet<u64> = if !self.tier.writes_back() {
            HashSet::new()
        } else {
            let kept = self.tier.adopt(&backed, b).map_err(|e| ZmemError::Reopen(format!("the cold store could not take its records over: {e}")))?;
            backed.iter().zip(kept).filter(|(_, k)| *k).map(|(id, _)| id.to_raw()).collect()
        };
        let (mut pages, mut lost) = (0, 0);
        let mut cold_blocks: Vec<u64> = Vec::new();
        for (key, rec) in ledger.entries() {
            let why = match rec {
                Recorded::Entry(e) => match e.slot() {
                    // (Its object, if in RAM, is freed with the strays.)
                    Slot::Obj(_, info) | Slot::Backed(_, info) if dict_gone(info).is_some() => dict_gone(info),
                    Slot::Obj(h, _) if unnamed.remove(&h.to_raw()) => None,
                    Slot::Obj(h, _) => Some(format!("names object {:#x}, which the arena does not hold", h.to_raw())),
                    Slot::Same(_) => None,
                    Slot::Backed(id, _) if taken.contains(&id) => None,
                    Slot::Backed(id, _) if self.tier.writes_back() => Some(format!("names record {id:#x}, which the cold store could not take")),
                    Slot::Backed(..) => Some("is written back, and this pool has no cold store".into()),
                    Slot::Dedup(..) => Some("is shared, which a pool with a ledger cannot have yet".into()),
                },
                Recorded::Lost => Some("was lost at an earlier opening".into()),
                Recorded::Damaged => Some("has a damaged ledger entry".into()),
            };
            let mut s = self.index.shard(key).lock();
            match (rec, why) {
                (Recorded::Entry(e), None) => {
                    // As a store publishes: an object goes on the tier's
                    // LRU (every page as young as the others).
                    let p = self.publish_locked(&mut s, key, e)?;
                    drop(s);
                    self.tier.queue(self, p.place, p.key, p.gen, p.live);
                    if matches!(e.slot(), Slot::Backed(..)) && cold_blocks.last() != Some(&(key & !crate::index::BLOCK_MASK)) {
                        cold_blocks.push(key & !crate::index::BLOCK_MASK);
                    }
                    pages += 1;
                }
                (_, why) => {
                    if let Some(why) = why.filter(|_| rec != Recorded::Lost) {
                        tracing::warn!("opening the pool: key {key:#x} {why}: its page is lost (reads fail until it is written)");
                    }
                    s.mark_lost(key);
                    lost += 1;
                }
            }
        }
        // The written-back keys to their cold blocks, as a writeback leaves them.
        for key in cold_blocks {
            self.index.shard(key).lock().make_cold(&[key], b);
        }
        for &raw in &unnamed {
            self.objects.free(Handle::from_raw(raw)).map_err(|err| ZmemError::Reopen(format!("freeing an unnamed object: {err}")))?;
        }
        Ok(Reopened { pages, strays_freed: unnamed.len() as u64, lost, took: Duration::ZERO })
    }
}
