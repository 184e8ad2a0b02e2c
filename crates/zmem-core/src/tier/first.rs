//! Pages named to go first: a user of the pool that knows which pages are
//! most likely unneeded (a swap device's pages that no page table points
//! to) names them ([`Pool::write_back_first`](crate::Pool::write_back_first)),
//! and the shrinker takes them before the LRUs' cold end. A hint: it
//! orders writeback and never drops a page.

use zmem_alloc::Budget;

use super::holder::Found;
use super::{Parts, Tier, Victim, BATCH};
use crate::entry::{Entry, Slot};
use crate::stats::Stats;

/// The pages a user of the pool named as most likely unneeded (a swap
/// device's pages that no page table points to): the shrinker writes
/// them back before anything on the LRUs. A hint orders writeback and
/// never drops a page: one that changed since it was named (stored again,
/// loaded, freed) is passed over.
#[derive(Default)]
pub(super) struct FirstOut {
    /// Keys with the entries they held when named; taken from the end.
    keys: Vec<(u64, Entry)>,
    /// What the budget holds for `keys` (its capacity).
    charged: u64,
    /// The last hint: pages named, of the objects in RAM then.
    named: u64,
    of: u64,
    /// Pages the shrinker took from hints.
    taken: u64,
}

/// The keys whose pages are objects in RAM (not shared, not same-filled,
/// not written back) at one moment, with what each held: a caller keeps
/// those it finds unneeded and hands them to
/// [`Pool::write_back_first`](crate::Pool::write_back_first).
pub struct Resident {
    items: Vec<(u64, Entry)>,
    of: u64,
}

impl Resident {
    pub(crate) fn new(items: Vec<(u64, Entry)>) -> Resident {
        let of = items.len() as u64;
        Resident { items, of }
    }

    /// How many pages it names.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Keep the keys `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.items.retain(|&(k, _)| keep(k));
    }
}

impl Tier {
    /// Replace the pages to write back first with `r`'s (see [`FirstOut`]).
    /// Its table is charged to the budget; without room (or without a
    /// cold store) the hint is dropped. Returns the pages it names.
    pub(crate) fn write_first(&self, b: &Budget, mut r: Resident) -> usize {
        if !self.on {
            return 0; // nothing is written back
        }
        let mut f = self.first.lock();
        (f.named, f.of) = (r.items.len() as u64, r.of);
        b.uncharge(std::mem::take(&mut f.charged));
        f.keys = Vec::new();
        r.items.shrink_to_fit();
        let bytes = (r.items.capacity() * std::mem::size_of::<(u64, Entry)>()) as u64;
        if b.try_charge(bytes).is_err() {
            return 0;
        }
        f.charged = bytes;
        // Taken from the end: the lowest keys first.
        r.items.sort_unstable_by_key(|&(k, _)| std::cmp::Reverse(k));
        f.keys = r.items;
        f.keys.len()
    }

    /// Drop from `items` the pages named to go first (with the entry they
    /// were named with) and not yet taken; returns how many it dropped.
    /// Takes the list's lock: not to be called under a shard's.
    pub(crate) fn retain_not_named_first(&self, items: &mut Vec<(u64, Entry)>) -> usize {
        let f = self.first.lock();
        if f.keys.is_empty() {
            return 0;
        }
        let before = items.len();
        // `keys` is sorted by key, highest first.
        items.retain(|&(k, e)| f.keys.binary_search_by(|&(fk, _)| k.cmp(&fk)).map_or(true, |i| f.keys[i].1 != e));
        before - items.len()
    }

    /// Take the pages named to go first ([`FirstOut`]) into the batch,
    /// those still holding what they held when named and not loaded since.
    /// Their LRU items stay queued and are skipped once they have gone.
    /// Returns the names it looked at.
    pub(super) fn pick_first(&self, p: &Parts<'_>, victims: &mut Vec<Victim>, buf: &mut Vec<u8>, max_bytes: usize) -> usize {
        let mut f = self.first.lock();
        let mut looked = 0;
        let mut taken = 0;
        while victims.len() < BATCH && buf.len() < max_bytes {
            let Some((key, was)) = f.keys.pop() else { break };
            looked += 1;
            let src = p.index.shard_index(key);
            let s = p.index.shards()[src].lock();
            let Some(e) = s.get(key).filter(|&e| e == was) else { continue };
            let Slot::Obj(handle, info) = e.slot() else { continue };
            if victims.iter().any(|v| v.src == src && v.obj.key == key) {
                continue;
            }
            let Some(off) = p.objects.copy_out(handle, info, buf) else { continue };
            victims.push(Victim { src, obj: Found::own(key, e, handle, info), item: None, off });
            taken += 1;
        }
        f.taken += taken;
        looked
    }

    /// The last hint's counts, and its table's bytes as LRU memory.
    pub(super) fn fill_first_stats(&self, st: &mut Stats) {
        let f = self.first.lock();
        st.lru_bytes += f.charged;
        (st.first_out_named, st.first_out_of, st.first_out_taken) = (f.named, f.of, f.taken);
    }
}
