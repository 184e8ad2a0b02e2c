//! Making a pool and stopping it: the engine's components, built and
//! charged in one place; the pool's threads (the shrinker, `zmem-dict`),
//! started with it and joined when it is dropped; and what those threads
//! and the writeback tier see of the engine ([`TierHost`]: its parts, the
//! clock and a publish).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use zmem_alloc::{AllocConfig, Budget, ZsPool};
use zmem_compress::Algorithm;

use super::{Engine, Pool, PoolConfig};
use crate::admission::Admission;
use crate::cold::ColdStore;
use crate::dedup::DedupTable;
use crate::dict::{DictSource, Dicts, TrainReport};
use crate::entry::Entry;
use crate::error::{Result, ZmemError};
use crate::ledger::Ledger;
use crate::objects::Objects;
use crate::shard::Index;
use crate::stats::Counters;
use crate::tier::{Loads, Parts, Tier, TierHost};

impl Pool {
    pub(super) fn build(cfg: PoolConfig, store: Option<Box<dyn ColdStore>>) -> Result<Pool> {
        let e = Engine::build(cfg, store, None)?;
        e.install_given_dict()?;
        Self::start(e)
    }

    /// A pool around a built engine: its threads started.
    pub(super) fn start(e: Engine) -> Result<Pool> {
        let e = Arc::new(e);
        let shrinker = if e.tier.writes_back() {
            let worker = Arc::clone(&e);
            let h = std::thread::Builder::new()
                .name("zmem-shrink".into())
                .spawn(move || crate::tier::shrinker_main(&*worker, &worker.tier))
                .map_err(|err| ZmemError::Config(format!("cannot start the shrinker thread: {err}")))?;
            Some(h)
        } else {
            None
        };
        let mut pool = Pool { e, shrinker, trainer: None };
        if pool.e.objects.dicts().is_some_and(|d| d.cfg.background) {
            let worker = Arc::clone(&pool.e);
            let h = std::thread::Builder::new()
                .name("zmem-dict".into())
                .spawn(move || worker.dict_main())
                .map_err(|err| ZmemError::Config(format!("cannot start the dictionary thread: {err}")))?;
            pool.trainer = Some(h);
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let (Some(h), Some(d)) = (self.trainer.take(), self.e.objects.dicts()) {
            d.stop.store(true, Relaxed);
            h.thread().unpark();
            if h.join().is_err() {
                tracing::error!("the dictionary thread panicked");
            }
        }
        if let Some(h) = self.shrinker.take() {
            self.e.tier.stop();
            if h.join().is_err() {
                tracing::error!("the shrinker thread panicked; pages it was writing back stayed in RAM");
            }
        }
    }
}

impl Engine {
    /// The engine of `cfg`, over `store`; over `opened` (an allocator
    /// opened on an arena another process left, and its budget) if given.
    pub(super) fn build(cfg: PoolConfig, store: Option<Box<dyn ColdStore>>, opened: Option<(ZsPool, Arc<Budget>)>) -> Result<Engine> {
        cfg.check()?;
        if cfg.ledger_keys.is_some() && store.as_ref().is_some_and(|s| !s.adoptable()) {
            return Err(ZmemError::Config("a pool that can be opened again (a ledger) can have no cold store but a backing file yet".into()));
        }
        // One budget for everything the pool holds: the allocator charges
        // its pages and tables to it, the index, dedup table and the tier's
        // queues their growth, the tier the backing store's tables. The shard arrays are
        // a fixed cost, charged now. The limit is the budget's.
        let (alloc, budget) = opened.unwrap_or_else(|| {
            let budget = Arc::new(Budget::new(cfg.mem_limit));
            (ZsPool::with_budget(AllocConfig { max_span_pages: cfg.max_span_pages, limit_bytes: None }, Arc::clone(&budget)), budget)
        });
        let ledger = match cfg.ledger_keys {
            Some(keys) => {
                let table = alloc.shared_table(crate::ledger::table_entries(keys)).map_err(|e| ZmemError::Config(format!("the ledger: {e}")))?;
                Some(Arc::new(Ledger::new(table, keys, Arc::clone(&budget))))
            }
            None => None,
        };
        // What an opened arena holds already (pages, tables): not a fixed cost.
        let held = budget.used().saturating_sub(ZsPool::fixed_bytes());
        let index = Index::new(cfg.shards, ledger.clone());
        // (With a tier, the table keeps a record for every shared page.)
        let dedup = cfg.dedup.then(|| DedupTable::new(store.is_none()));
        let loads = Loads { exclusive: cfg.exclusive_loads, promote: cfg.promote_loads };
        let tier = Tier::new(store, loads, index.shards().len(), dedup.as_ref().map_or(0, |d| d.shards().len()));
        budget.force_charge(index.fixed_bytes() + if dedup.is_some() { DedupTable::fixed_bytes() } else { 0 } + tier.fixed_bytes());
        let fixed = budget.used() - held;
        if let Some(limit) = cfg.mem_limit {
            if fixed > limit {
                return Err(ZmemError::Config(format!("mem_limit {limit} is below the {fixed} bytes a pool holds before it stores anything")));
            }
        }
        let counters = Counters::default();
        let dicts = match &cfg.dict.source {
            DictSource::Off => None,
            _ => {
                let levels: Vec<i32> = std::iter::once(cfg.compressor)
                    .chain(cfg.recomp_algorithms.iter().copied())
                    .filter(|c| c.algorithm == Algorithm::Zstd)
                    .map(|c| c.level)
                    .collect();
                let d = Dicts::new(cfg.dict.clone(), levels, ledger.clone());
                // An opened pool's dictionaries, which its objects need; a
                // given one is installed after its keys are back
                // (`Engine::install_given_dict`).
                d.restore(&budget);
                Some(d)
            }
        };
        Ok(Engine {
            objects: Objects::new(alloc, cfg.compressor, dicts, cfg.huge_threshold, cfg.store_incompressible),
            admission: Admission::new(cfg.max_pool, cfg.accept_threshold_percent, fixed),
            tier,
            epoch: Instant::now(),
            cfg,
            index,
            dedup,
            counters,
        })
    }

    /// Install the dictionary the configuration gives (`DictSource::Bytes`),
    /// if any: in a new pool at once, in one opened again once its keys
    /// are back (see `Dicts::install_given`).
    pub(super) fn install_given_dict(&self) -> Result<()> {
        if let (Some(d), DictSource::Bytes(bytes)) = (self.objects.dicts(), &self.cfg.dict.source) {
            d.install_given(bytes, self.budget()).map_err(|e| ZmemError::Config(format!("the dictionary: {e}")))?;
        }
        Ok(())
    }

    /// The `zmem-dict` thread: a dictionary round a second until the pool
    /// is dropped.
    fn dict_main(&self) {
        let Some(d) = self.objects.dicts() else { return };
        while !d.stop.load(Relaxed) {
            std::thread::park_timeout(crate::dict::TRAIN_PERIOD);
            if d.stop.load(Relaxed) {
                break;
            }
            if let Err(e) = self.dict_round(false) {
                self.counters.warn.warn(|| format!("dictionary training: {e}"));
            }
        }
    }

    /// Free unused dictionaries, then (with `--dict auto`) train one if
    /// the samples call for it (`force`: whatever they hold).
    pub(super) fn dict_round(&self, force: bool) -> Result<TrainReport> {
        let Some(d) = self.objects.dicts() else {
            return Err(ZmemError::Config("this pool has no dictionaries: create it with --dict auto".into()));
        };
        d.retire_unused(self.budget(), |slot| self.dict_objects(slot));
        // The compressor whose bytes decide: the first that would use it.
        let eval = std::iter::once(self.objects.compressor())
            .chain(self.cfg.recomp_algorithms.iter().copied())
            .find(|c| c.algorithm == Algorithm::Zstd || (c.algorithm == Algorithm::Lz4 && d.cfg.lz4));
        let (Some(eval), DictSource::Auto) = (eval, &d.cfg.source) else {
            return Ok(TrainReport::default());
        };
        let pages = self.index.len() as u64;
        d.round(eval, pages, self.budget(), force).map_err(ZmemError::Config)
    }

    /// After a store: wake the shrinker if the pool is at its high mark.
    pub(super) fn kick_shrinker(&self) {
        self.tier.kick_if_high(self);
    }
}

impl TierHost for Engine {
    fn parts(&self) -> Parts<'_> {
        Engine::parts(self)
    }
    fn now(&self) -> u32 {
        Engine::now(self)
    }
    fn publish_over(&self, key: u64, id: u64, make: impl FnOnce() -> Option<Entry>) -> bool {
        let (r, new) = {
            let mut s = self.index.shard(key).lock();
            if s.get(key).and_then(Entry::record) != Some(id) {
                return false;
            }
            let Some(new) = make() else { return false };
            (self.publish_locked(&mut s, key, new), new)
        };
        match self.or_release(r, new) {
            Ok(p) => {
                // (The record the page came from is freed with its last page.)
                self.finish(p);
                true
            }
            Err(_) => false,
        }
    }
}
