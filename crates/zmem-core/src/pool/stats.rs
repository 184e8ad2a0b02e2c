//! What the pool reports: zram's `mm_stat` and the rest of [`Stats`],
//! gathered from every component under its own lock, one at a time, and
//! where one page lives ([`Residency`]).

use std::sync::atomic::Ordering::Relaxed;

use super::Engine;
use super::Residency;
use crate::dedup::{DedupTable, Loc};
use crate::entry::{Slot, DICT_SLOTS, PAGE_SIZE};
use crate::stats::Stats;

impl Engine {
    /// Bring charges that lag behind frees up to date (the backing
    /// store's tables shrink when its segments empty).
    pub(super) fn settle_charges(&self) {
        self.tier.settle_backing(self.budget(), 0);
    }

    pub(super) fn stats(&self) -> Stats {
        self.settle_charges();
        let mut st = Stats::default();
        let (mut index_bytes, mut backed_index_bytes) = (0, 0);
        for s in self.index.shards() {
            let (all, backed) = s.lock().add_stats(&mut st);
            index_bytes += all;
            backed_index_bytes += backed;
        }
        let own_backed_pages = st.bd_count;
        // Pages whose data is on the backing store: their own records, and
        // the pages that share a written-back object.
        let mut backed_pages = st.bd_count;
        index_bytes += self.index.fixed_bytes();
        st.ledger_bytes = self.index.ledger().map_or(0, crate::ledger::Ledger::bytes);
        index_bytes += st.ledger_bytes;
        let mut dedup_bytes = 0;
        if let Some(d) = &self.dedup {
            for ds in d.shards() {
                let (backed, table) = ds.lock().add_stats(&mut st);
                backed_pages += backed;
                dedup_bytes += table;
            }
            dedup_bytes += DedupTable::fixed_bytes();
        }
        let keys = st.stored_pages;
        st.stored_pages -= backed_pages;
        let a = self.objects.alloc_stats();
        st.orig_data_size = st.stored_pages * PAGE_SIZE as u64;
        st.pool_pages = a.pages_used;
        st.alloc_metadata_bytes = a.metadata_bytes;
        st.index_bytes = index_bytes;
        st.meta_data_size = dedup_bytes;
        st.dedup_full = self.dedup.as_ref().is_some_and(DedupTable::full);
        st.dedup_switches = self.dedup.as_ref().map_or(0, DedupTable::switches);
        if let Some(d) = self.objects.dicts() {
            (st.dict_count, st.dict_bytes) = d.usage();
            st.dict_id = d.current_dict().map_or(0, |c| c.id());
            st.dict_pages = (0..DICT_SLOTS).map(|slot| self.dict_objects(slot)).sum();
            st.dict_trainings = d.trainings.load(Relaxed);
            st.dict_installs = d.installs.load(Relaxed);
            st.dict_retired = d.retired.load(Relaxed);
            st.dict_collecting = d.collecting();
        }
        self.tier.fill_stats(&mut st);
        let tier_bytes = st.lru_bytes + st.backing_metadata_bytes;
        if keys > 0 {
            // The index's bytes for the written-back pages (its cold blocks
            // whole, and their share of the blocks in RAM); a page sharing a
            // written-back object costs the index what an average key does.
            // The written-back ones also hold the cold store's records.
            let shared = backed_pages - own_backed_pages;
            let index_share = backed_index_bytes + (index_bytes as u128 * shared as u128 / keys as u128) as u64;
            st.backed_table_bytes = index_share + st.backing_metadata_bytes.saturating_sub(st.backing_buffer_bytes);
        }
        let meta = a.metadata_bytes + index_bytes + dedup_bytes + tier_bytes + st.dict_bytes;
        st.mem_used_total = a.pages_used * PAGE_SIZE as u64 + meta;
        // Everything is charged before it is taken, so the budget's
        // high-water mark bounds every total ever held.
        st.mem_used_max = self.budget().max_used().max(st.mem_used_total);
        st.mem_limit = self.budget().limit().unwrap_or(0);
        st.pages_compacted = a.pages_compacted;
        st.same_filled_pages = st.same_pages;
        st.pool_total_size = a.pages_used * PAGE_SIZE as u64;
        st.objs_used = a.objs_used;
        st.objs_allocated = a.objs_allocated;
        self.admission.fill_stats(&mut st, self.held_pages());
        self.counters.fill(&mut st);
        self.objects.fill_stats(&mut st);
        st
    }

    /// Objects written with the dictionary in `slot`, in RAM or written back.
    pub(super) fn dict_objects(&self, slot: usize) -> u64 {
        let keys: u64 = self.index.shards().iter().map(|s| s.lock().dict_objects(slot)).sum();
        let shared: u64 = self.dedup.iter().flat_map(|d| d.shards()).map(|ds| ds.lock().dict_objects(slot)).sum();
        keys + shared
    }

    /// Where `key`'s page lives, if it is stored.
    pub(super) fn residency(&self, key: u64) -> Option<Residency> {
        let e = self.index.shard(key).lock().get(key)?;
        Some(match e.slot() {
            Slot::Obj(..) => Residency::Ram,
            Slot::Same(_) => Residency::SameFilled,
            Slot::Dedup(hash, _) => {
                let d = self.dedup.as_ref()?;
                match d.shard(hash).lock().loc(hash)? {
                    Loc::Ram(_) => Residency::Shared,
                    Loc::Backed(_) => Residency::Backed,
                    Loc::Dropped => return None,
                }
            }
            Slot::Backed(..) => Residency::Backed,
        })
    }
}
