//! `zmem bench swap`: the seed experiment (zswap v4's kernel build under
//! memory pressure) as a command, on this machine.
//!
//! A workload (by default a clean `cargo build --release` of zmem itself)
//! runs in a memory cgroup whose limit forces it to swap, once per system:
//!
//! * **disk**: a swap file;
//! * **zswap**: kernel zswap over the same swap file;
//! * **zram**: kernel zram as swap, with the same swap file at a lower
//!   priority for what does not fit (the usual distribution setup; this
//!   kernel's zram has no writeback);
//! * **zmem**: `zmem swap on` with its backing file next to the swap file.
//!
//! All of them live on one disk: a loop device (direct I/O) over an image
//! on the host's disk, holding an ext4 with the swap file and zmem's
//! backing file. That device's `/sys/block/loopN/stat` counts the I/O that
//! matters, the same way for every system; the workload's own files are
//! elsewhere. The disk runs as it is (`real`) and throttled by the blkio
//! controller to a cloud volume (`throttled`: 3,000 IOPS, 125 MB/s) or to
//! the seed's HDD (`hdd`: 150 IOPS, 58 MB/s).
//!
//! **Equal memory.** Each run has a budget B for workload plus compressed
//! pool, and a pool cap P. No compressed pool here is charged to the
//! workload's memory cgroup: zram's and zmem's live outside it by design,
//! and this kernel does not charge zswap's to a cgroup v1 either (measured:
//! `memory.usage_in_bytes` equals the cgroup's RSS plus cache while zswap
//! holds 91 MiB of its pages; the run reports the cgroup's kmem peak and
//! says so again if that changes). So the pool shares B the way zswap's
//! pool shares a machine's RAM: a [`SharedBudget`] keeps the workload
//! cgroup's limit at B − pool, every 10 ms, where pool is zswap's
//! `pool_total_size`, zram's `mem_used_total`, and the zmem server's whole
//! resident memory (pool, tables, buffers, binary: everything it holds).
//! The zmem server runs from a copy of its binary in the scratch
//! directory: the bench and the `kv` workload run the same binary, and
//! the kernel reclaims no page two processes map, so the start-up code a
//! server gives back once running would stay resident here and nowhere
//! else (where it runs for real, no other process maps its binary).
//! Each pool is also capped at P: zram's `mem_limit`, zmem's
//! `--max-pool`, and zswap's `max_pool_percent`, which is whole percents
//! of RAM, so on a machine with much RAM its smallest cap is above P; then
//! zswap's cap is not equal (the report says so and shows every pool's
//! peak). The `mem` column is the peak of cgroup usage + pool, sampled by
//! the keeper. Disk swap has no pool: its cgroup's limit is B.
//!
//! (A first version gave the compressed systems a fixed B − P. That wastes
//! the cap whenever the pool holds less, and it made every compressed
//! system swap 2.7 to 3.6 times as often as disk swap.)
//!
//! Before the limited runs, one run without a limit and without swap gives
//! the baseline time and the workload's peak of anonymous memory; budgets
//! may be given as a share of that peak (the page cache a build also fills
//! is not what swap is about: it is dropped, not swapped).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::kernel_zram;
use zmem_host::shared_budget::{self, BudgetStats, SharedBudget};
use zmem_host::{self as host, DiskStat, LoopDisk, MemCgroup, SwapOn, Throttle, ZswapParams};

/// A system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum System {
    Disk,
    Zswap,
    Zram,
    Zmem,
    /// zmem with a Redis Cluster on loopback as its cold tier instead of
    /// a backing file on the disk (`zmem swap on --remote`).
    #[serde(rename = "zmem-remote")]
    ZmemRemote,
    /// zmem with `Config::zmem_b_args` after the common zmem arguments: a
    /// second setting of zmem in the same set.
    #[serde(rename = "zmem-b")]
    ZmemB,
}

impl System {
    pub const ALL: [System; 6] = [System::Disk, System::Zswap, System::Zram, System::Zmem, System::ZmemRemote, System::ZmemB];

    /// A zmem swap device, with either cold tier.
    pub fn is_zmem(self) -> bool {
        matches!(self, System::Zmem | System::ZmemRemote | System::ZmemB)
    }

    pub fn name(self) -> &'static str {
        match self {
            System::Disk => "disk",
            System::Zswap => "zswap",
            System::Zram => "zram",
            System::Zmem => "zmem",
            System::ZmemRemote => "zmem-remote",
            System::ZmemB => "zmem-b",
        }
    }
}

impl std::str::FromStr for System {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        System::ALL.into_iter().find(|x| x.name() == s).ok_or_else(|| format!("unknown system `{s}`: use disk, zswap, zram, zmem, zmem-remote or zmem-b"))
    }
}

/// How the disk under the swap file and the backing file behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskKind {
    /// The host's disk as it is.
    Real,
    /// A cloud volume: 3,000 IOPS and 125 MB/s each way.
    Throttled,
    /// The seed's 58 MB/s HDD: 150 IOPS, 58 MB/s.
    Hdd,
}

impl DiskKind {
    pub fn name(self) -> &'static str {
        match self {
            DiskKind::Real => "real",
            DiskKind::Throttled => "throttled",
            DiskKind::Hdd => "hdd",
        }
    }

    pub fn throttle(self) -> Option<Throttle> {
        match self {
            DiskKind::Real => None,
            DiskKind::Throttled => Some(Throttle { iops: 3000, bps: 125_000_000 }),
            DiskKind::Hdd => Some(Throttle { iops: 150, bps: 58_000_000 }),
        }
    }
}

impl std::str::FromStr for DiskKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [DiskKind::Real, DiskKind::Throttled, DiskKind::Hdd]
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| format!("unknown disk `{s}`: use real, throttled or hdd"))
    }
}

/// A memory budget: bytes, or a percentage of the workload's peak of
/// anonymous memory in the unlimited run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Amount {
    Bytes(u64),
    Percent(u32),
}

impl Amount {
    pub fn of(self, whole: u64) -> u64 {
        match self {
            Amount::Bytes(b) => b,
            Amount::Percent(p) => whole / 100 * p as u64,
        }
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The workload's argv; `{jobs}` in it is replaced by each of `jobs`.
    pub workload: Vec<String>,
    /// Its working directory.
    pub workload_dir: PathBuf,
    /// Extra environment for it.
    pub workload_env: Vec<(String, String)>,
    /// Run (outside the cgroup) before every run, e.g. to remove a target
    /// directory so every build starts clean.
    pub prepare: Option<Vec<String>>,
    /// Values of `{jobs}` (the -jN sweep).
    pub jobs: Vec<u32>,
    /// Budgets for workload plus pool, one set of runs each.
    pub budgets: Vec<Amount>,
    /// The compressed pool's cap, a size or a share of the budget.
    pub pool_cap: Amount,
    pub systems: Vec<System>,
    pub disks: Vec<DiskKind>,
    /// The `zmem` binary (for `zmem swap on|off|status`).
    pub zmem: PathBuf,
    /// The `zmem` binary of the zmem-b runs, if not `zmem` (two builds in
    /// one set).
    pub zmem_b: Option<PathBuf>,
    /// Compressor for every system (kernel name: lzo, lzo-rle, lz4, ...).
    pub compressor: String,
    /// Size of the swap file and of zmem's swap device.
    pub swap_size: u64,
    /// Where the disk image and logs go.
    pub scratch: PathBuf,
    /// memory.swappiness of the workload's cgroup.
    pub swappiness: u32,
    /// zswap's shrinker (writes back cold entries under memcg pressure).
    pub zswap_shrinker: bool,
    /// zram's disksize as a multiple of the pool cap (the compression
    /// ratio it is sized for; past it, swap goes to the swap file).
    pub zram_ratio: f64,
    /// Extra arguments for `zmem swap on` (to compare zmem's settings:
    /// `--exclusive-loads off`, `--dedup on`, ...).
    pub zmem_args: Vec<String>,
    /// More arguments for `zmem swap on` in the `zmem-b` runs alone.
    pub zmem_b_args: Vec<String>,
    /// A run taking longer than this is killed and reported failed.
    pub timeout: Duration,
    /// Sets of runs for each budget (at least 1): every second set runs
    /// the systems in the reverse order ([`set_order`]).
    pub sets: u32,
    /// Replace the `zmem-b` runs' server this often while the workload
    /// runs (`zmem swap restart`): what a planned restart costs.
    pub zmem_b_restart_every: Option<Duration>,
}

/// One run's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub system: System,
    /// `None` for the unlimited baseline.
    pub disk: Option<DiskKind>,
    pub jobs: u32,
    /// Workload plus pool (0: unlimited).
    pub budget_bytes: u64,
    /// Which set of runs of its budget this was, from 0 (`Config::sets`).
    pub set: u32,
    /// The workload cgroup's limit (0: unlimited).
    pub cgroup_limit_bytes: u64,
    pub pool_cap_bytes: u64,
    /// How workload and pool were given the same memory.
    pub memory_rule: String,
    pub exit_ok: bool,
    pub error: Option<String>,
    pub wall_secs: f64,
    /// The workload's CPU (user + system), reclaim it did itself included.
    pub cpu_secs: f64,
    /// zmem's server.
    pub server_cpu_secs: f64,
    pub kswapd_cpu_secs: f64,
    /// The whole machine's CPU over the run (every process and kernel
    /// thread: the workload, a server, the loop device's workers,
    /// interrupts), and its context switches.
    pub machine: Option<host::MachineCpu>,
    pub pswpin: u64,
    pub pswpout: u64,
    pub pgmajfault: u64,
    /// The kernel's swap read-ahead (`swap_ra`, `swap_ra_hit` in
    /// /proc/vmstat): pages it read ahead of a fault, and those a later
    /// fault found. Part of `pswpin`; none on zram, which the kernel reads
    /// without read-ahead (a synchronous device).
    pub swap_ra: u64,
    pub swap_ra_hit: u64,
    /// Faults on anonymous pages evicted recently
    /// (`workingset_refault_anon`): the workload wanting back what reclaim
    /// took from it.
    pub workingset_refault_anon: u64,
    /// Pages zswap stored, loaded and wrote back (`zswpout`, `zswpin`,
    /// `zswpwb` in /proc/vmstat).
    pub zswpout: u64,
    pub zswpin: u64,
    pub zswpwb: u64,
    /// The disk holding the swap file and the backing file.
    pub disk_io: DiskStat,
    pub cgroup_peak_bytes: u64,
    /// Peak of the cgroup's anonymous memory, resident plus swapped
    /// (`total_rss + total_swap`, sampled every 200 ms): what swap is for.
    pub anon_peak_bytes: u64,
    pub cgroup_kmem_peak_bytes: u64,
    /// Compressed pool's peak (zswap: sampled `pool_total_size`; zram and
    /// zmem: `mem_used_max`).
    pub pool_peak_bytes: u64,
    /// Pages the pool wrote back to the disk (zswap, zmem).
    pub written_back_pages: u64,
    /// How the workload's limit followed the pool (compressed systems).
    pub shared_budget: Option<BudgetStats>,
    /// The zmem server's own counters at the end of the run (`zmem stat
    /// --json`'s `stats`): backing reads and their operations, records
    /// loaded from the file, what the pool held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_stats: Option<serde_json::Value>,
    /// Pages zmem held for slots the kernel had already freed, sampled
    /// through the run (zmem only: kernel zram and zswap hear of every
    /// freed slot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead: Option<DeadShare>,
    /// Times the zmem server was replaced during the run
    /// ([`Config::zmem_b_restart_every`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub restarts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The dead share of a pool: pages it holds (in RAM and in its backing
/// file) against the slots the kernel has allocated on its swap device
/// (`/proc/swaps` `Used`). A block device hears of a freed slot only
/// through a discard, so every page past the kernel's count is a page
/// whose slot was freed: `held - used` is a lower bound on the dead pages
/// (a slot allocated but not yet written counts as live).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DeadShare {
    pub samples: u64,
    /// Mean over the samples of dead / held.
    pub mean_share: f64,
    /// Dead / held when the pool held the most pages.
    pub share_at_peak: f64,
    pub held_pages_peak: u64,
    pub dead_pages_max: u64,
    /// Mean over the samples of the kernel's used slots that the
    /// workload's page tables point to (`/proc/PID/pagemap`): how much of
    /// what is live a page-table scan would see.
    pub mapped_share_mean: f64,
    /// Mean over the samples of held pages that no page table points to:
    /// dead, or held by the swap cache or tmpfs.
    pub unmapped_share_mean: f64,
    /// The most used slots seen in page tables at once.
    pub mapped_pages_max: u64,
    /// The longest page-table scan, in milliseconds; the scans made, and
    /// the time they took in all (at most 1 % of the run's: a scan waits
    /// 100 times its own length before the next).
    pub scan_ms_max: f64,
    pub scans: u64,
    pub scan_secs: f64,
    /// The pool's share of compressed data (`Stats::pool_data_share`)
    /// when what `max_pool` counts was highest, and its mean.
    pub data_share_at_peak: f64,
    pub data_share_mean: f64,
    /// RAM per written-back page, every table included
    /// (`Stats::table_bytes_per_backed_page`): mean and highest.
    pub table_bytes_per_backed_page_mean: f64,
    pub table_bytes_per_backed_page_max: f64,
    /// Of the mean, the cold store's record tables' share (the rest is
    /// the index's).
    pub store_bytes_per_backed_page_mean: f64,
    /// Means of the written-back pages whose index keys are in cold
    /// blocks (`Stats::cold_index_pages / bd_count`), and of the keys a
    /// cold block holds.
    pub cold_index_share_mean: f64,
    pub keys_per_cold_block_mean: f64,
    /// Samples of the pool (the two above), and its highest `max_pool` use.
    pub pool_samples: u64,
    pub pool_used_peak: u64,
    /// Where the cap went (`max_pool`, which `--pool-size auto` moves):
    /// its least, its mean over the samples and its last value, in bytes
    /// (0 without a cap).
    pub cap_min_bytes: u64,
    pub cap_mean_bytes: f64,
    pub cap_last_bytes: u64,
    pub cap_samples: u64,
    pub backed_samples: u64,
    /// Mean over the samples of the server's own count (`zmem swap on`'s
    /// scan of the page tables) of the pages in RAM that no page table
    /// pointed to at its last scan (`first_out_named / first_out_of`):
    /// the share of the pool's RAM that dead pages (or swap-cache and
    /// tmpfs pages) held; and the pages written back first for that.
    pub ram_unmapped_share_mean: f64,
    pub ram_unmapped_samples: u64,
    pub written_first: u64,
    /// The server's resident memory beside its pool (its whole RSS less
    /// the pool's `mem_used_total`: code, I/O buffers, stacks, malloc's
    /// free memory), in bytes: mean and highest over the samples, and
    /// the most malloc held free.
    pub beside_pool_mean: f64,
    pub beside_pool_max: u64,
    pub malloc_free_max: u64,
    pub server_samples: u64,
}

impl DeadShare {
    /// Add a sample of the pool's own counters: what its cap holds.
    pub fn add_pool(&mut self, st: &zmem_core::Stats) {
        if st.max_pool_bytes > 0 {
            let cap = st.max_pool_bytes;
            self.cap_min_bytes = if self.cap_samples == 0 { cap } else { self.cap_min_bytes.min(cap) };
            self.cap_samples += 1;
            fold_mean(&mut self.cap_mean_bytes, cap as f64, self.cap_samples);
            self.cap_last_bytes = cap;
        }
        if let Some(share) = st.pool_data_share() {
            self.pool_samples += 1;
            fold_mean(&mut self.data_share_mean, share, self.pool_samples);
            let used = if st.max_pool_bytes > 0 { st.max_pool_used_bytes } else { st.mem_used_total };
            if used >= self.pool_used_peak {
                self.pool_used_peak = used;
                self.data_share_at_peak = share;
            }
        }
        if st.first_out_of > 0 {
            self.ram_unmapped_samples += 1;
            let share = st.first_out_named as f64 / st.first_out_of as f64;
            fold_mean(&mut self.ram_unmapped_share_mean, share, self.ram_unmapped_samples);
        }
        self.written_first = st.first_out_taken;
        if let Some(b) = st.table_bytes_per_backed_page() {
            self.backed_samples += 1;
            fold_mean(&mut self.table_bytes_per_backed_page_mean, b, self.backed_samples);
            self.table_bytes_per_backed_page_max = self.table_bytes_per_backed_page_max.max(b);
            let store = st.backing_metadata_bytes.saturating_sub(st.backing_buffer_bytes) as f64 / st.bd_count as f64;
            fold_mean(&mut self.store_bytes_per_backed_page_mean, store, self.backed_samples);
            let cold = st.cold_index_pages as f64 / st.bd_count as f64;
            fold_mean(&mut self.cold_index_share_mean, cold, self.backed_samples);
            let per_block = st.cold_index_pages as f64 / st.cold_index_blocks.max(1) as f64;
            fold_mean(&mut self.keys_per_cold_block_mean, per_block, self.backed_samples);
        }
    }

    /// Add a sample of the server's memory: `rss` resident bytes, `pool`
    /// of them the pool's (`mem_used_total`), `malloc_free` held free by
    /// malloc.
    pub fn add_server(&mut self, rss: u64, pool: u64, malloc_free: u64) {
        let beside = rss.saturating_sub(pool);
        self.server_samples += 1;
        fold_mean(&mut self.beside_pool_mean, beside as f64, self.server_samples);
        self.beside_pool_max = self.beside_pool_max.max(beside);
        self.malloc_free_max = self.malloc_free_max.max(malloc_free);
    }

    /// Add a sample: `held` pages in the pool, `used` slots on its device,
    /// and, if the page tables were scanned for it, `mapped` of them seen
    /// there.
    pub fn add(&mut self, held: u64, used: u64, mapped: Option<u64>) {
        if held == 0 {
            return;
        }
        let dead = held.saturating_sub(used);
        let share = dead as f64 / held as f64;
        fold_mean(&mut self.mean_share, share, self.samples + 1);
        if let Some(mapped) = mapped {
            let seen = if used > 0 { mapped.min(used) as f64 / used as f64 } else { 1.0 };
            fold_mean(&mut self.mapped_share_mean, seen, self.scans + 1);
            let unmapped = held.saturating_sub(mapped) as f64 / held as f64;
            fold_mean(&mut self.unmapped_share_mean, unmapped, self.scans + 1);
            self.scans += 1;
            self.mapped_pages_max = self.mapped_pages_max.max(mapped);
        }
        self.samples += 1;
        self.dead_pages_max = self.dead_pages_max.max(dead);
        if held >= self.held_pages_peak {
            self.held_pages_peak = held;
            self.share_at_peak = share;
        }
    }
}

/// Fold `value`, the `n`th sample (counting from 1), into the running
/// `mean` of the samples before it.
fn fold_mean(mean: &mut f64, value: f64, n: u64) {
    *mean += (value - *mean) / n as f64;
}

/// Samples a zmem server's [`DeadShare`] once a second, through its
/// control socket and `/proc/swaps`.
struct DeadSampler {
    zmem: PathBuf,
    control: PathBuf,
    /// The loop devices of the device's swap areas.
    areas: Vec<String>,
    /// The workload's cgroup: whose page tables are scanned.
    cgroup: PathBuf,
    next: Instant,
    /// When the page tables may be scanned next.
    next_scan: Instant,
    share: DeadShare,
}

impl DeadSampler {
    const EVERY: Duration = Duration::from_secs(1);

    fn tick(&mut self) {
        if Instant::now() < self.next {
            return;
        }
        self.next = Instant::now() + Self::EVERY;
        let Ok(st) = crate::zmem_stats(&self.zmem, &self.control) else { return };
        let n = |k: &str| st["stats"][k].as_u64();
        let (Some(ram), Some(file)) = (n("stored_pages"), n("bd_count")) else { return };
        if let Ok(pool) = serde_json::from_value::<zmem_core::Stats>(st["stats"].clone()) {
            self.share.add_pool(&pool);
            let m = |k: &str| st["server_memory"][k].as_u64();
            if let (Some(anon), Some(file)) = (m("rss_anon_bytes"), m("rss_file_bytes")) {
                let shmem = m("rss_shmem_bytes").unwrap_or(0);
                self.share.add_server(anon + file + shmem, pool.mem_used_total, m("malloc_free_bytes").unwrap_or(0));
            }
        }
        let swaps = host::swap_areas();
        let Some(areas) = self.areas.iter().map(|dev| host::loop_swap_area(&swaps, dev)).collect::<Option<Vec<_>>>() else { return };
        let used_pages: u64 = areas.iter().map(|a| a.used_bytes / PAGE).sum();
        // The page-table scan reads every pagemap of the workload: on two
        // CPUs it took up to seconds, which the zmem runs alone paid. It
        // waits 100 times its own length before the next: at most 1 % of
        // the run, every other sample without it.
        let mut mapped = None;
        let t0 = Instant::now();
        if t0 >= self.next_scan {
            let pids: Vec<u32> =
                std::fs::read_to_string(self.cgroup.join("cgroup.procs")).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect();
            let mut slots = std::collections::HashSet::new();
            host::swapped_slots(&pids, &areas, &mut |slot| {
                slots.insert(slot);
            });
            let took = t0.elapsed();
            self.next_scan = Instant::now() + (took * 100).max(Self::EVERY);
            self.share.scan_ms_max = self.share.scan_ms_max.max(took.as_secs_f64() * 1e3);
            self.share.scan_secs += took.as_secs_f64();
            mapped = Some(slots.len() as u64);
        }
        self.share.add(ram + file, used_pages, mapped);
    }
}

/// A zmem swap device's loop devices from its state (`zmem swap status
/// --json`): its areas', or, in a state without them, its one `loop_dev`.
fn zmem_areas(state: &serde_json::Value) -> Vec<String> {
    match state["areas"].as_array() {
        Some(a) if !a.is_empty() => a.iter().filter_map(|x| Some(x["dev"].as_str()?.to_string())).collect(),
        _ => state["loop_dev"].as_str().map(|d| vec![d.to_string()]).unwrap_or_default(),
    }
}

impl RunResult {
    pub fn disk_bytes(&self) -> u64 {
        self.disk_io.read_bytes + self.disk_io.write_bytes
    }

    /// Disk read operations per page swapped in (every system alike).
    pub fn read_ops_per_swapin(&self) -> Option<f64> {
        ratio(self.disk_io.read_ops as f64, self.pswpin as f64)
    }

    /// zmem: disk read operations per page read from its backing file.
    pub fn read_ops_per_file_page(&self) -> Option<f64> {
        let pages = self.server_stats.as_ref()?["bd_reads"].as_u64()?;
        ratio(self.disk_io.read_ops as f64, pages as f64)
    }

    /// zmem: bytes its backing file's reads cost per byte of the records
    /// they served (read-ahead that a later load used counts as wanted).
    pub fn file_read_amplification(&self) -> Option<f64> {
        self.server()?.backing_read_amplification()
    }

    /// zmem: what a read of its backing file cost, in milliseconds: the
    /// time with one in flight over the reads (however many overlapped).
    pub fn file_read_cost_ms(&self) -> Option<f64> {
        Some(self.server()?.backing_read_cost_ns()? as f64 / 1e6)
    }

    /// zmem: the share of what its backing file's reads read ahead (past
    /// the records they wanted) that later loads used.
    pub fn readahead_used_share(&self) -> Option<f64> {
        self.server()?.readahead_used_share()
    }

    fn server(&self) -> Option<zmem_core::Stats> {
        serde_json::from_value(self.server_stats.clone()?).ok()
    }

    /// zmem: the server's CPU per page swapped in or out, in microseconds.
    pub fn server_us_per_page(&self) -> Option<f64> {
        self.system.is_zmem().then(|| ratio(self.server_cpu_secs * 1e6, (self.pswpin + self.pswpout) as f64)).flatten()
    }

    /// The whole machine's CPU (user and kernel) per page swapped in, in
    /// microseconds: what a swap-in costs every CPU together, the
    /// workload's own work included.
    pub fn machine_us_per_swapin(&self) -> Option<f64> {
        ratio(self.machine?.busy_secs() * 1e6, self.pswpin as f64)
    }
}

/// All runs of a bench.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub workload: Vec<String>,
    pub compressor: String,
    pub mem_total_bytes: u64,
    pub zswap_max_pool_percent: u64,
    /// The extra arguments zmem's runs were started with.
    pub zmem_args: Vec<String>,
    /// And the `zmem-b` runs' own.
    pub zmem_b_args: Vec<String>,
    /// The `zmem-b` runs' binary, if not the zmem runs'.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zmem_b_bin: Option<PathBuf>,
    /// Seconds between the `zmem-b` runs' server restarts, if they restart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zmem_b_restart_every_secs: Option<u64>,
    pub notes: Vec<String>,
    pub runs: Vec<RunResult>,
}

/// Progress of a bench, for the caller to show.
pub enum Progress<'a> {
    Start { index: usize, total: usize, what: &'a str },
    Done { index: usize, total: usize, result: &'a RunResult },
}

const CGROUP: &str = "zmem-bench-swap";
/// The name of zmem's swap device in the bench's run directory.
const ZMEM_NAME: &str = "bench";
const PAGE: u64 = 4096;
/// What a pool may take past its share between two ticks of the budget
/// keeper before the report calls it over the budget.
const OVER_BUDGET_SLACK: u64 = 16 << 20;

/// Run the whole bench. `stop` turns true on SIGINT: the current run's
/// workload is killed, everything is undone, and the report holds the runs
/// so far (the interrupted one marked failed).
pub fn run(cfg: &Config, stop: &Arc<AtomicBool>, mut progress: impl FnMut(Progress)) -> anyhow::Result<Report> {
    preflight(cfg)?;
    std::fs::create_dir_all(&cfg.scratch).with_context(|| format!("cannot create {}", cfg.scratch.display()))?;
    let mem_total = ZswapParams::mem_total();
    let mut report = Report {
        workload: cfg.workload.clone(),
        compressor: cfg.compressor.clone(),
        mem_total_bytes: mem_total,
        zswap_max_pool_percent: 0,
        zmem_args: cfg.zmem_args.clone(),
        zmem_b_args: cfg.zmem_b_args.clone(),
        zmem_b_bin: cfg.zmem_b.clone(),
        zmem_b_restart_every_secs: cfg.zmem_b_restart_every.map(|d| d.as_secs()),
        notes: Vec::new(),
        runs: Vec::new(),
    };
    let sets = cfg.sets.max(1);
    let per_jobs = cfg.budgets.len() * cfg.disks.len() * cfg.systems.len() * sets as usize + 1;
    let total = per_jobs * cfg.jobs.len();
    let mut index = 0;
    let mut smallest_cap = u64::MAX;
    let mut charged_note = None;

    // One disk for every run: the image, its ext4, the swap file on it.
    let mut disk = LoopDisk::create(&cfg.scratch.join("disk.img"), cfg.swap_size + cfg.swap_size / 2 + (256 << 20), &cfg.scratch.join("disk"))?;
    let swapfile = disk.mnt().join("swapfile");
    SwapOn::make_file(&swapfile, cfg.swap_size)?;
    host::run_tool(Command::new("mkswap").arg("-q").arg(&swapfile))?;
    let zswap = ZswapParams::save()?;
    // Only the zswap runs have zswap in front of their swap.
    zswap.set("enabled", "N")?;

    'all: for &jobs in &cfg.jobs {
        index += 1;
        let what = format!("-j{jobs} baseline: no limit, no swap");
        progress(Progress::Start { index, total, what: &what });
        let base = measure(cfg, jobs, None, &disk, System::Disk, 0, 0, String::from("no limit"), stop, &zswap)?;
        progress(Progress::Done { index, total, result: &base });
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted during the baseline run");
        }
        if !base.exit_ok {
            bail!("the workload fails without a memory limit: {} (log in {})", base.error.clone().unwrap_or_default(), cfg.scratch.display());
        }
        let peak = base.anon_peak_bytes;
        report.runs.push(base);
        for &kind in &cfg.disks {
            disk.throttle(kind.throttle())?;
            for &budget in &cfg.budgets {
                let b = budget.of(peak) / PAGE * PAGE;
                let cap = cfg.pool_cap.of(b) / PAGE * PAGE;
                if cap >= b {
                    bail!("the pool cap ({cap} bytes) must be below the budget ({b} bytes)");
                }
                smallest_cap = smallest_cap.min(cap);
                let pct = zswap_percent(cap, mem_total);
                report.zswap_max_pool_percent = pct;
                for (set, sys) in (0..sets).flat_map(|set| set_order(&cfg.systems, set).into_iter().map(move |sys| (set, sys))) {
                    index += 1;
                    let of_sets = if sets > 1 { format!(", set {} of {sets}", set + 1) } else { String::new() };
                    let what = format!("-j{jobs} {} disk, budget {} MiB (pool cap {} MiB){of_sets}: {}", kind.name(), b >> 20, cap >> 20, sys.name());
                    progress(Progress::Start { index, total, what: &what });
                    if stop.load(Ordering::Relaxed) {
                        report.notes.push("interrupted: the runs after this point did not happen".into());
                        break 'all;
                    }
                    let rule = match sys {
                        System::Disk => "workload cgroup = budget (no pool)".to_string(),
                        System::Zswap => format!("workload cgroup = budget - zswap pool_total_size; zswap max_pool_percent = {pct} % of RAM"),
                        System::Zram => "workload cgroup = budget - zram mem_used_total; zram mem_limit = pool cap".to_string(),
                        System::Zmem | System::ZmemB => "workload cgroup = budget - zmem server RSS; zmem --max-pool = pool cap".to_string(),
                        System::ZmemRemote => {
                            "workload cgroup = budget - zmem server RSS; zmem --max-pool = pool cap; the cluster's RAM is another machine's (here loopback, outside the budget)"
                                .to_string()
                        }
                    };
                    let mut r = measure(cfg, jobs, Some(kind), &disk, sys, b, cap, rule, stop, &zswap)?;
                    r.set = set;
                    progress(Progress::Done { index, total, result: &r });
                    if sys == System::Zswap && r.pool_peak_bytes > 0 && r.cgroup_kmem_peak_bytes >= r.pool_peak_bytes / 2 && charged_note.is_none() {
                        charged_note = Some(format!(
                            "zswap's pool looks charged to the workload's cgroup here (kmem peak {} MiB, pool peak {} MiB): it then counts twice",
                            r.cgroup_kmem_peak_bytes >> 20,
                            r.pool_peak_bytes >> 20
                        ));
                    }
                    if let Some(sb) = r.shared_budget.filter(|sb| sb.peak_total > sb.budget + OVER_BUDGET_SLACK) {
                        report.notes.push(format!(
                            "{}: {}'s pool went over the budget: workload + pool peaked at {} MiB of {} MiB (pool peak {} MiB{})",
                            what,
                            sys.name(),
                            sb.peak_total >> 20,
                            sb.budget >> 20,
                            sb.pool_peak >> 20,
                            if sys == System::Zswap { ", and zswap's cap cannot be set below 1 % of RAM" } else { "" }
                        ));
                    }
                    report.runs.push(r);
                }
            }
        }
        disk.throttle(None)?;
    }
    if let Some(p) = &cfg.prepare {
        // The prepare command cleans up after the last run too (the default
        // removes the build's target directory).
        let (cmd, args) = p.split_first().context("empty prepare command")?;
        let _ = Command::new(cmd).args(args).current_dir(&cfg.workload_dir).status();
    }
    report.notes.extend(charged_note);
    let pct = report.zswap_max_pool_percent;
    if pct * mem_total / 100 > smallest_cap {
        report.notes.push(format!(
            "zswap's max_pool_percent is whole percents of RAM: {pct} % = {} MiB here, so above the pool cap given to zram and zmem: zswap's pool is bounded by its shrinker and that cap, see its pool peak",
            (pct * mem_total / 100) >> 20
        ));
    }
    Ok(report)
}

/// The order of the systems in set `set` (from 0): as given in the even
/// sets, reversed in the odd ones, so that across two sets each system
/// runs as often early as late (a machine's pace drifts through a bench:
/// page cache, the disk image's layout, the VM's neighbours).
pub fn set_order(systems: &[System], set: u32) -> Vec<System> {
    let mut v = systems.to_vec();
    if set % 2 == 1 {
        v.reverse();
    }
    v
}

/// zswap's `max_pool_percent` for a pool cap: whole percents of RAM, at
/// least 1, never below the cap.
fn zswap_percent(cap: u64, mem_total: u64) -> u64 {
    (cap * 100).div_ceil(mem_total.max(1)).max(1)
}

fn preflight(cfg: &Config) -> anyhow::Result<()> {
    if zmem_rig::effective_uid() != Some(0) {
        bail!("zmem bench swap needs root (memory cgroups, loop devices, swapon)");
    }
    let swaps = host::active_swaps();
    if !swaps.is_empty() {
        bail!("swap is already on ({}): the kernel would spread the workload's pages over it too; swapoff first", swaps.join(", "));
    }
    for t in ["mkswap", "swapon", "swapoff", "sh"] {
        if !host::have(t) {
            bail!("`{t}` is missing (bash scripts/setup.sh installs it)");
        }
    }
    if cfg.systems.iter().any(|s| s.is_zmem()) && !cfg.zmem.is_file() {
        bail!("the zmem binary {} does not exist", cfg.zmem.display());
    }
    if cfg.systems.contains(&System::ZmemRemote) && !zmem_rig::redis_cluster::available() {
        bail!("zmem-remote needs redis-server and redis-cli (bash scripts/setup.sh installs them)");
    }
    if cfg.jobs.len() > 1 && !cfg.workload.iter().any(|a| a.contains("{jobs}")) {
        bail!("a -j sweep needs `{{jobs}}` in the workload's command line");
    }
    if cfg.budgets.is_empty() || cfg.systems.is_empty() || cfg.disks.is_empty() || cfg.jobs.is_empty() {
        bail!("nothing to run: give at least one budget, system, disk and jobs value");
    }
    Ok(())
}

/// What a system needs set up for one run; dropped after it.
#[derive(Default)]
struct Setup {
    // Drop order = field order: swap areas off before their devices go.
    swaps: Vec<SwapOn>,
    zram: Option<kernel_zram::Device>,
    zmem: Option<ZmemSwap>,
    /// zmem-remote's cluster, stopped after the device that uses it.
    cluster: Option<zmem_rig::redis_cluster::LocalCluster>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        while let Some(s) = self.swaps.pop() {
            drop(s);
        }
    }
}

/// `zmem swap on`, undone with `zmem swap off` on drop.
struct ZmemSwap {
    /// The server's own copy of the binary (see the module doc), removed
    /// on drop.
    zmem: PathBuf,
    run_dir: PathBuf,
    backing: PathBuf,
}

impl ZmemSwap {
    fn status(&self) -> Option<serde_json::Value> {
        let out = host::run_tool(Command::new(&self.zmem).args(["swap", "status", "--json", "--run-dir"]).arg(&self.run_dir)).ok()?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        v.as_array()?.first().cloned()
    }
}

impl Drop for ZmemSwap {
    fn drop(&mut self) {
        if let Err(e) = host::run_tool(Command::new(&self.zmem).args(["swap", "off", "--all", "--run-dir"]).arg(&self.run_dir)) {
            eprintln!("zmem: `zmem swap off` failed: {e:#}; finish it by hand: zmem swap off --all --run-dir {}", self.run_dir.display());
        }
        let _ = std::fs::remove_file(&self.backing);
        let _ = std::fs::remove_file(&self.zmem);
    }
}

fn set_up(cfg: &Config, sys: System, cap: u64, disk: &LoopDisk, zswap: &ZswapParams) -> anyhow::Result<Setup> {
    let swapfile = disk.mnt().join("swapfile");
    let mut s = Setup::default();
    match sys {
        System::Disk => s.swaps.push(SwapOn::on(&swapfile, 10, false)?),
        System::Zswap => {
            zswap.set("enabled", "N")?;
            zswap.set("compressor", &cfg.compressor).with_context(|| format!("kernel zswap has no {}", cfg.compressor))?;
            zswap.set("max_pool_percent", &zswap_percent(cap, ZswapParams::mem_total()).to_string())?;
            zswap.set("shrinker_enabled", if cfg.zswap_shrinker { "Y" } else { "N" })?;
            s.swaps.push(SwapOn::on(&swapfile, 10, false)?);
            zswap.set("enabled", "Y")?;
        }
        System::Zram => {
            let disksize = ((cap as f64 * cfg.zram_ratio) as u64).min(cfg.swap_size) / PAGE * PAGE;
            let dev = kernel_zram::Device::configure(&cfg.compressor, disksize, Some(cap))?;
            s.swaps.push(SwapOn::on(&swapfile, 10, false)?);
            s.swaps.push(SwapOn::on(dev.node(), 100, true)?);
            s.zram = Some(dev);
        }
        System::Zmem | System::ZmemRemote | System::ZmemB => {
            let args = if sys == System::ZmemB { with_b_args(&cfg.zmem_args, &cfg.zmem_b_args) } else { cfg.zmem_args.clone() };
            let run_dir = cfg.scratch.join("run");
            let backing = disk.mnt().join("zmem.backing");
            let bin = cfg.zmem_b.as_ref().filter(|_| sys == System::ZmemB).unwrap_or(&cfg.zmem);
            let zmem = cfg.scratch.join("zmem-server");
            std::fs::copy(bin, &zmem).with_context(|| format!("cannot copy {} to {}", bin.display(), zmem.display()))?;
            let z = ZmemSwap { zmem: zmem.clone(), run_dir: run_dir.clone(), backing: backing.clone() };
            host::run_tool(
                Command::new(&zmem)
                    .args(["swap", "on", "--name", ZMEM_NAME, "--size"])
                    .arg(cfg.swap_size.to_string())
                    .args(zmem_compressor(&cfg.compressor, &args))
                    .args(zmem_max_pool(cap, &args))
                    .args(cold_tier(sys, &backing, &mut s)?)
                    .arg("--run-dir")
                    .arg(&run_dir)
                    .args(zmem_workload_cgroup(&args))
                    .args(&args),
            )
            .context("zmem swap on")?;
            s.zmem = Some(z);
        }
    }
    Ok(s)
}

/// `zmem swap on`'s cold tier: the backing file on the disk, or for
/// zmem-remote a loopback cluster started now (kept in `s`).
fn cold_tier(sys: System, backing: &Path, s: &mut Setup) -> anyhow::Result<Vec<std::ffi::OsString>> {
    if sys != System::ZmemRemote {
        return Ok(vec!["--backing".into(), backing.into(), "--force".into()]);
    }
    let c = zmem_rig::redis_cluster::LocalCluster::start(3, 1, 5000).map_err(|e| anyhow::anyhow!("starting a Redis cluster for zmem-remote: {e}"))?;
    let url = c.url();
    s.cluster = Some(c);
    Ok(vec!["--remote".into(), url.into(), "--remote-namespace".into(), "bench-swap".into()])
}

/// The zmem arguments with `b`'s options in place of the same options
/// in `common` (`--flag value` or `--flag=value`).
fn with_b_args(common: &[String], b: &[String]) -> Vec<String> {
    let flag = |a: &str| a.split('=').next().unwrap_or(a).to_string();
    let ours: Vec<String> = b.iter().filter(|a| a.starts_with("--")).map(|a| flag(a)).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < common.len() {
        let a = &common[i];
        if a.starts_with("--") && ours.contains(&flag(a)) {
            // Skip its value too, unless it came in the same word.
            let joined = a.contains('=');
            i += if !joined && common.get(i + 1).is_some_and(|v| !v.starts_with("--")) { 2 } else { 1 };
            continue;
        }
        out.push(a.clone());
        i += 1;
    }
    out.extend(b.iter().cloned());
    out
}

/// `--workload-cgroup` for `zmem swap on`: the workload's cgroup (made
/// just after the device), whose CPU time `--pool-size auto` counts as
/// its work, unless the zmem arguments name another.
fn zmem_workload_cgroup(zmem_args: &[String]) -> Vec<std::ffi::OsString> {
    if zmem_args.iter().any(|a| a == "--workload-cgroup" || a.starts_with("--workload-cgroup=")) {
        return Vec::new();
    }
    vec!["--workload-cgroup".into(), Path::new(host::MEMCG_ROOT).join(CGROUP).into()]
}

/// `--max-pool` for `zmem swap on`: the pool cap, unless the zmem
/// arguments name one of their own (a zmem-b run with a smaller pool in
/// the same set: `--zmem-b-arg=--max-pool --zmem-b-arg=24M`).
fn zmem_max_pool(cap: u64, zmem_args: &[String]) -> Vec<String> {
    if zmem_args.iter().any(|a| a == "--max-pool" || a.starts_with("--max-pool=")) {
        return vec![];
    }
    vec!["--max-pool".into(), cap.to_string()]
}

/// The `--compressor` argument for `zmem swap on`: the bench's compressor
/// for every system (zmem's own LZO for the kernel's lzo and lzo-rle),
/// unless the zmem arguments name one of their own (zstd with a trained
/// dictionary is something only zmem has: the kernel here has no zstd).
fn zmem_compressor<'a>(bench: &'a str, zmem_args: &[String]) -> Vec<&'a str> {
    if zmem_args.iter().any(|a| a == "--compressor" || a.starts_with("--compressor=")) {
        return vec![];
    }
    vec!["--compressor", if bench.starts_with("lzo") { "lzo" } else { bench }]
}

/// What a system's pool holds in memory now, read on the budget keeper's
/// thread.
fn pool_gauge(sys: System, s: &Setup, zmem: Option<&ZmemProcs>) -> anyhow::Result<Box<dyn FnMut() -> Option<u64> + Send>> {
    let field_of = |p: PathBuf, field: usize| move || std::fs::read_to_string(&p).ok()?.split_whitespace().nth(field)?.parse().ok();
    Ok(match sys {
        System::Disk => bail!("disk swap has no pool"),
        System::Zswap => Box::new(field_of(host::zswap_counter_path("pool_total_size"), 0)),
        System::Zram => {
            let dev = s.zram.as_ref().context("no zram device")?;
            Box::new(field_of(PathBuf::from("/sys/block").join(dev.name()).join("mm_stat"), 2))
        }
        System::Zmem | System::ZmemRemote | System::ZmemB => {
            let z = zmem.context("the zmem server's pid is unknown")?.clone();
            Box::new(move || z.rss())
        }
    })
}

/// A zmem device's processes: its keeper, and its server now (which a
/// restart replaces), or the server alone (a zmem from before keepers).
#[derive(Clone, Debug)]
struct ZmemProcs {
    keeper: Option<u32>,
    /// The server when the run began.
    first: u32,
    /// The file a server writes its pid to once it serves.
    ready: PathBuf,
}

impl ZmemProcs {
    /// From `zmem swap status` of the device in `dir`.
    fn of(status: &serde_json::Value, dir: &Path) -> Option<ZmemProcs> {
        let first = status["state"]["pid"].as_u64().map(|p| p as u32)?;
        let ready = dir.join("ready");
        Some(match status["server_pid"].as_u64().map(|p| p as u32) {
            Some(s) if s != first => ZmemProcs { keeper: Some(first), first: s, ready },
            _ => ZmemProcs { keeper: None, first, ready },
        })
    }

    /// The server serving now.
    fn server(&self) -> u32 {
        let now = std::fs::read_to_string(&self.ready).ok().and_then(|s| s.trim().parse::<u32>().ok());
        now.filter(|_| self.keeper.is_some()).filter(|p| Path::new(&format!("/proc/{p}")).exists()).unwrap_or(self.first)
    }

    /// The device's memory: the server's, and its keeper's own (the keeper
    /// maps the server's pool, which the server's RSS counts already).
    fn rss(&self) -> Option<u64> {
        Some(shared_budget::rss_of(self.server())? + self.keeper.and_then(shared_budget::rss_private_of).unwrap_or(0))
    }

    /// CPU seconds the device has used: the keeper's, the servers' it has
    /// reaped, and the serving one's.
    fn cpu(&self) -> f64 {
        let keeper = self.keeper.and_then(|k| host::cpu_times(&k.to_string())).map_or(0.0, |t| t.user + t.system + t.children_user + t.children_system);
        keeper + host::cpu_secs(self.server()).unwrap_or(0.0)
    }
}

/// The workload's command for `jobs`.
fn argv(cfg: &Config, jobs: u32) -> Vec<String> {
    cfg.workload.iter().map(|a| a.replace("{jobs}", &jobs.to_string())).collect()
}

/// One system's run of the workload: set up, start it in its cgroup, sample while it runs, gather the counters, undo the setup.
#[allow(clippy::too_many_arguments)]
fn measure(
    cfg: &Config,
    jobs: u32,
    kind: Option<DiskKind>,
    disk: &LoopDisk,
    sys: System,
    budget: u64,
    cap: u64,
    rule: String,
    stop: &Arc<AtomicBool>,
    zswap: &ZswapParams,
) -> anyhow::Result<RunResult> {
    let trial = Trial { cfg, jobs, kind, disk, sys, budget, cap, stop, zswap };
    let mut rig = trial.set_up_run()?;
    let before = trial.counters();
    let mut w = trial.start_workload(&rig.cg)?;
    let sampled = trial.sample(&mut rig, &mut w)?;
    let r = trial.collect(&mut rig, &w, &before, sampled, rule);
    trial.tear_down(rig, &w.log_path, &r)?;
    Ok(r)
}

/// One system's run, as [`measure`] was asked for it.
struct Trial<'a> {
    cfg: &'a Config,
    jobs: u32,
    kind: Option<DiskKind>,
    disk: &'a LoopDisk,
    sys: System,
    budget: u64,
    cap: u64,
    stop: &'a AtomicBool,
    zswap: &'a ZswapParams,
}

/// What a run holds while its workload runs. Fields drop in this order:
/// the budget keeper, then the workload's cgroup, then the system's setup.
struct Rig {
    keeper: Option<SharedBudget>,
    dead: Option<DeadSampler>,
    cg: MemCgroup,
    setup: Option<Setup>,
    /// The zmem device's processes (its keeper and its server).
    zmem: Option<ZmemProcs>,
    /// The zmem server's (and keeper's) CPU time when the run began.
    server_cpu0: f64,
}

/// The counters a run is measured by, read just before its workload starts.
struct Counters {
    vmstat: std::collections::HashMap<String, u64>,
    disk: DiskStat,
    kswapd_secs: f64,
    cpu_secs: f64,
    machine: Option<host::MachineCpu>,
    written_back: u64,
}

/// The workload, running.
struct Workload {
    child: std::process::Child,
    /// When it was started.
    t0: Instant,
    log_path: PathBuf,
}

/// What sampling saw while the workload ran.
struct Sampled {
    /// `None` when it was killed (interrupted or timed out).
    status: Option<std::process::ExitStatus>,
    /// zswap's pool, sampled (zswap runs only).
    pool_peak: u64,
    anon_peak: u64,
    error: Option<String>,
    /// Server restarts made ([`Config::zmem_b_restart_every`]).
    restarts: u32,
}

/// What the pool did: its peak, the pages it wrote back, the zmem server's CPU and counters.
struct PoolFigures {
    peak: u64,
    written_back: u64,
    server_cpu: f64,
    server_stats: Option<serde_json::Value>,
}

impl Trial<'_> {
    /// The prepare command, caches dropped, the system set up, the workload's cgroup, zmem's dead-share sampler and the budget keeper.
    fn set_up_run(&self) -> anyhow::Result<Rig> {
        let (cfg, sys) = (self.cfg, self.sys);
        if let Some(p) = &cfg.prepare {
            let (cmd, args) = p.split_first().context("empty --prepare command")?;
            host::run_tool(Command::new(cmd).args(args).current_dir(&cfg.workload_dir)).context("the prepare command failed")?;
        }
        // Best effort: a run with some page cache left is still a run.
        let _ = host::drop_caches();
        let setup = if self.kind.is_some() { Some(set_up(cfg, sys, self.cap, self.disk, self.zswap)?) } else { None };
        // The workload's cgroup starts at the budget; for a compressed system
        // the keeper below then takes the pool's share from it.
        let cg = MemCgroup::create(CGROUP, (self.budget > 0).then_some(self.budget), cfg.swappiness)?;
        let zstatus = setup.as_ref().and_then(|s| s.zmem.as_ref()).and_then(|z| z.status());
        let zmem = setup.as_ref().and_then(|s| s.zmem.as_ref()).zip(zstatus.as_ref()).and_then(|(z, v)| ZmemProcs::of(v, &z.run_dir.join(ZMEM_NAME)));
        let dead = match (setup.as_ref().and_then(|s| s.zmem.as_ref()), zstatus.as_ref().map(|v| zmem_areas(&v["state"]))) {
            (Some(z), Some(areas)) if !areas.is_empty() => Some(DeadSampler {
                zmem: z.zmem.clone(),
                control: z.run_dir.join(ZMEM_NAME).join("control.sock"),
                areas,
                cgroup: cg.path().to_path_buf(),
                next: Instant::now(),
                next_scan: Instant::now(),
                share: DeadShare::default(),
            }),
            _ => None,
        };
        let server_cpu0 = zmem.as_ref().map_or(0.0, ZmemProcs::cpu);
        let keeper = match (&setup, sys) {
            (None, _) | (_, System::Disk) => None,
            (Some(s), _) => Some(SharedBudget::start(cg.path(), self.budget, self.budget / 4, pool_gauge(sys, s, zmem.as_ref())?)?),
        };
        Ok(Rig { keeper, dead, cg, setup, zmem, server_cpu0 })
    }

    /// The counters before the run: /proc/vmstat, the disk's, kswapd's and the children's CPU, zswap's pages written back.
    fn counters(&self) -> Counters {
        Counters {
            vmstat: host::vmstat(),
            disk: self.disk.stat(),
            kswapd_secs: host::kswapd_cpu_secs(),
            cpu_secs: host::children_cpu_secs(),
            machine: host::machine_cpu(),
            written_back: self.zswap.counter("written_back_pages"),
        }
    }

    /// The workload started in its cgroup, its output in the run's log.
    fn start_workload(&self, cg: &MemCgroup) -> anyhow::Result<Workload> {
        let (cfg, jobs) = (self.cfg, self.jobs);
        let label = format!("{}-{}-{}-j{jobs}", self.sys.name(), self.kind.map_or("none", |k| k.name()), self.budget >> 20);
        let log_path = cfg.scratch.join(format!("{label}.log"));
        let log = std::fs::File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
        let args = argv(cfg, jobs);
        let t0 = Instant::now();
        // The shell joins the cgroup, then becomes the workload: nothing of the
        // workload runs outside the cgroup.
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$1/cgroup.procs" || exit 125; shift; exec "$@""#)
            .arg("sh")
            .arg(cg.path())
            .args(&args)
            .current_dir(&cfg.workload_dir)
            .envs(cfg.workload_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {args:?}"))?;
        Ok(Workload { child, t0, log_path })
    }

    /// Every 200 ms until the workload ends (every 20 ms in its first two
    /// seconds: a short workload's peak can last less than 200 ms): its
    /// anonymous peak, zmem's dead share (at its own pace), zswap's pool;
    /// on `stop` or past the timeout, kill it.
    fn sample(&self, rig: &mut Rig, w: &mut Workload) -> anyhow::Result<Sampled> {
        let (cfg, cg, child, stop) = (self.cfg, &rig.cg, &mut w.child, self.stop);
        let mut pool_peak = 0u64;
        let mut anon_peak = 0u64;
        let mut error = None;
        let every = self.cfg.zmem_b_restart_every.filter(|_| self.sys == System::ZmemB);
        let mut next_restart = every.map(|p| Instant::now() + p);
        let mut restarts = 0;
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break Some(st);
            }
            anon_peak = anon_peak.max(cg.stat("total_rss") + cg.stat("total_swap"));
            if let Some(d) = rig.dead.as_mut() {
                d.tick();
            }
            if self.sys == System::Zswap && self.kind.is_some() {
                pool_peak = pool_peak.max(self.zswap.counter("pool_total_size"));
            }
            if let (Some(t), Some(p), Some(z)) = (next_restart, every, rig.setup.as_ref().and_then(|s| s.zmem.as_ref())) {
                if Instant::now() >= t {
                    // (Returns once the new server serves.)
                    match host::run_tool(Command::new(&z.zmem).args(["swap", "restart", "--all", "--run-dir"]).arg(&z.run_dir)) {
                        Ok(_) => restarts += 1,
                        Err(e) => {
                            error.get_or_insert(format!("zmem swap restart failed: {e:#}"));
                        }
                    }
                    next_restart = Some(t + p);
                }
            }
            if stop.load(Ordering::Relaxed) || w.t0.elapsed() > cfg.timeout {
                error = Some(if stop.load(Ordering::Relaxed) { "interrupted".to_string() } else { format!("timed out after {:?}", cfg.timeout) });
                for t in std::fs::read_to_string(cg.path().join("cgroup.procs")).unwrap_or_default().lines() {
                    let _ = Command::new("kill").arg("-KILL").arg(t).status();
                }
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(if w.t0.elapsed() < Duration::from_secs(2) { 20 } else { 200 }));
        };
        Ok(Sampled { status, pool_peak, anon_peak, error, restarts })
    }

    /// The run's result: its times, the counters since `before`, why it failed if it did, the pool's figures.
    fn collect(&self, rig: &mut Rig, w: &Workload, before: &Counters, s: Sampled, rule: String) -> RunResult {
        let (sys, kind) = (self.sys, self.kind);
        let wall = w.t0.elapsed().as_secs_f64();
        let shared_budget = rig.keeper.take().map(SharedBudget::finish);
        let cpu = host::children_cpu_secs() - before.cpu_secs;
        let machine = host::machine_cpu().zip(before.machine).map(|(now, b)| now.since(&b));
        let v1 = host::vmstat();
        let dv = |k: &str| v1.get(k).copied().unwrap_or(0).saturating_sub(before.vmstat.get(k).copied().unwrap_or(0));
        let disk_io = self.disk.stat().since(&before.disk);
        let exit_ok = s.status.is_some_and(|s| s.success());
        let mut error = s.error;
        if error.is_none() && !exit_ok {
            let oom = rig.cg.keyed("memory.oom_control", "oom_kill");
            error = Some(format!(
                "the workload failed ({}){}; log: {}",
                s.status.map_or("killed".into(), |s| s.to_string()),
                if oom > 0 { ", OOM-killed in its cgroup" } else { "" },
                w.log_path.display()
            ));
        }
        let pool = self.pool_figures(rig, before.written_back, s.pool_peak);
        RunResult {
            system: sys,
            disk: kind,
            jobs: self.jobs,
            budget_bytes: self.budget,
            set: 0,
            cgroup_limit_bytes: self.budget,
            pool_cap_bytes: if kind.is_some() && sys != System::Disk { self.cap } else { 0 },
            memory_rule: rule,
            exit_ok,
            error,
            wall_secs: wall,
            cpu_secs: cpu,
            server_cpu_secs: pool.server_cpu,
            kswapd_cpu_secs: host::kswapd_cpu_secs() - before.kswapd_secs,
            machine,
            pswpin: dv("pswpin"),
            pswpout: dv("pswpout"),
            pgmajfault: dv("pgmajfault"),
            swap_ra: dv("swap_ra"),
            swap_ra_hit: dv("swap_ra_hit"),
            workingset_refault_anon: dv("workingset_refault_anon"),
            zswpout: dv("zswpout"),
            zswpin: dv("zswpin"),
            zswpwb: dv("zswpwb"),
            disk_io,
            cgroup_peak_bytes: rig.cg.counter("memory.max_usage_in_bytes"),
            anon_peak_bytes: s.anon_peak,
            cgroup_kmem_peak_bytes: rig.cg.counter("memory.kmem.max_usage_in_bytes"),
            pool_peak_bytes: pool.peak,
            written_back_pages: pool.written_back,
            shared_budget,
            server_stats: pool.server_stats,
            dead: rig.dead.take().map(|d| d.share),
            restarts: s.restarts,
        }
    }

    /// The pool's figures at the end of the run: zswap's pages written back since `wb0`, zram's and zmem's peaks (else `sampled_peak`), zmem's server.
    fn pool_figures(&self, rig: &Rig, wb0: u64, sampled_peak: u64) -> PoolFigures {
        let mut f = PoolFigures { peak: sampled_peak, written_back: 0, server_cpu: 0.0, server_stats: None };
        match self.sys {
            System::Zswap if self.kind.is_some() => f.written_back = self.zswap.counter("written_back_pages").saturating_sub(wb0),
            System::Zram => {
                if let Some(z) = rig.setup.as_ref().and_then(|s| s.zram.as_ref()) {
                    f.peak = z.mm_stat().map(|m| m.mem_used_max).unwrap_or(0);
                }
            }
            System::Zmem | System::ZmemRemote | System::ZmemB => {
                if let Some(v) = rig.setup.as_ref().and_then(|s| s.zmem.as_ref()).and_then(|z| z.status()) {
                    let st = &v["server"]["stats"];
                    f.peak = st["mem_used_max"].as_u64().unwrap_or(0);
                    f.written_back = st["written_back_pages"].as_u64().unwrap_or(0);
                    f.server_stats = Some(st.clone());
                }
                f.server_cpu = rig.zmem.as_ref().map_or(0.0, ZmemProcs::cpu) - rig.server_cpu0;
            }
            _ => {}
        }
        f
    }

    /// The cgroup removed, then the system's setup undone, zswap off again after a zswap run, and the result appended to the run's log.
    fn tear_down(&self, rig: Rig, log_path: &Path, r: &RunResult) -> anyhow::Result<()> {
        drop(rig.cg);
        drop(rig.setup);
        if self.sys == System::Zswap {
            self.zswap.set("enabled", "N")?;
        }
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(log_path) {
            let _ = writeln!(f, "{}", serde_json::to_string(r).unwrap_or_default());
        }
        Ok(())
    }
}

/// `a / b`, or `None` when `b` is 0 or either run failed.
fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// The runs of a report with their ratios against disk swap, zswap and
/// kernel zram in the same set (same jobs, disk, budget and set).
#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    pub wall_vs_disk: Option<f64>,
    pub wall_vs_zswap: Option<f64>,
    pub wall_vs_zram: Option<f64>,
    pub disk_bytes_vs_disk: Option<f64>,
    pub disk_bytes_vs_zswap: Option<f64>,
    /// Disk swap's wall time over the unlimited baseline (the issue wants
    /// budgets where this is at least 2).
    pub disk_slowdown: Option<f64>,
}

pub fn ratios(report: &Report, r: &RunResult) -> Ratios {
    let peer = |s: System| {
        report.runs.iter().find(|o| o.system == s && o.disk == r.disk && o.jobs == r.jobs && o.budget_bytes == r.budget_bytes && o.set == r.set && o.exit_ok)
    };
    let base = report.runs.iter().find(|o| o.disk.is_none() && o.jobs == r.jobs);
    let ok = |x: Option<f64>| if r.exit_ok { x } else { None };
    let d = peer(System::Disk);
    let z = peer(System::Zswap);
    let zr = peer(System::Zram);
    Ratios {
        wall_vs_disk: ok(d.and_then(|d| ratio(r.wall_secs, d.wall_secs))),
        wall_vs_zswap: ok(z.and_then(|z| ratio(r.wall_secs, z.wall_secs))),
        wall_vs_zram: ok(zr.and_then(|z| ratio(r.wall_secs, z.wall_secs))),
        disk_bytes_vs_disk: ok(d.and_then(|d| ratio(r.disk_bytes() as f64, d.disk_bytes() as f64))),
        disk_bytes_vs_zswap: ok(z.and_then(|z| ratio(r.disk_bytes() as f64, z.disk_bytes() as f64))),
        disk_slowdown: r.disk.and(d).zip(base).and_then(|(d, b)| ratio(d.wall_secs, b.wall_secs)),
    }
}

/// A system's wall time over a yardstick's, across the sets of one (jobs,
/// disk, budget): each set's ratio is taken within the set, and the
/// spread of those ratios is what a single set cannot show.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    pub jobs: u32,
    pub disk: Option<DiskKind>,
    pub budget_bytes: u64,
    pub system: System,
    /// The yardstick: disk swap or kernel zram.
    pub against: System,
    /// Each set's ratio, in set order (sets without both runs finished
    /// left out).
    pub ratios: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The median of `sorted` (ascending, not empty).
pub(crate) fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// The [`Spread`] of every system but disk swap against disk swap and
/// kernel zram, for each (jobs, disk, budget) run in two sets or more.
pub fn spreads(report: &Report) -> Vec<Spread> {
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for r in report.runs.iter().filter(|r| r.disk.is_some() && r.system != System::Disk) {
        let key = (r.jobs, r.disk, r.budget_bytes, r.system);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let same = || report.runs.iter().filter(|o| (o.jobs, o.disk, o.budget_bytes, o.system) == key);
        for against in [System::Disk, System::Zram].into_iter().filter(|&a| a != r.system) {
            let ratios: Vec<f64> = same()
                .filter_map(|o| {
                    let q = ratios(report, o);
                    if against == System::Disk {
                        q.wall_vs_disk
                    } else {
                        q.wall_vs_zram
                    }
                })
                .collect();
            if ratios.len() < 2 {
                continue;
            }
            let mut sorted = ratios.clone();
            sorted.sort_by(f64::total_cmp);
            out.push(Spread {
                jobs: r.jobs,
                disk: r.disk,
                budget_bytes: r.budget_bytes,
                system: r.system,
                against,
                median: median(&sorted),
                min: sorted[0],
                max: sorted[sorted.len() - 1],
                ratios,
            });
        }
    }
    out
}

/// The report as a table, one block per (jobs, disk).
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let f2 = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
    let mb = |b: u64| format!("{:.0}", b as f64 / 1e6);
    for base in report.runs.iter().filter(|r| r.disk.is_none()) {
        out += &format!(
            "-j{}: no limit, no swap: {:.1} s wall, {:.1} s CPU, peak {} MiB, of which anonymous {} MiB\n",
            base.jobs,
            base.wall_secs,
            base.cpu_secs,
            base.cgroup_peak_bytes >> 20,
            base.anon_peak_bytes >> 20
        );
    }
    if !report.zmem_args.is_empty() {
        out += &format!("zmem swap on with: {}\n", report.zmem_args.join(" "));
    }
    if !report.zmem_b_args.is_empty() {
        out += &format!("zmem-b adds: {}\n", report.zmem_b_args.join(" "));
    }
    if let Some(bin) = &report.zmem_b_bin {
        out += &format!("zmem-b runs: {}\n", bin.display());
    }
    if let Some(secs) = report.zmem_b_restart_every_secs {
        let made: Vec<String> = report.runs.iter().filter(|r| r.system == System::ZmemB).map(|r| r.restarts.to_string()).collect();
        out += &format!("zmem-b replaces its server every {secs} s (`zmem swap restart`): {} restarts a run\n", made.join(", "));
    }
    let head = [
        "jobs", "disk", "budget", "system", "wall s", "cpu s", "srv s", "pswpin", "pswpout", "majflt", "rd ops", "rd MB", "wr ops", "wr MB", "pool MB",
        "mem MB", "cap MB", "wb pages", "ops/in", "ops/fpg", "rd/rec", "ms/rd", "ra use%", "dead%", "ramunm%", "data%", "B/wbpg", "us/pg", "idle%", "mus/in",
        "t/disk", "t/zswap", "t/zram", "io/disk", "io/zswap", "side MB", "set",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for r in report.runs.iter().filter(|r| r.disk.is_some()) {
        let q = ratios(report, r);
        rows.push(vec![
            r.jobs.to_string(),
            r.disk.map_or("-", |d| d.name()).to_string(),
            format!("{}M", r.budget_bytes >> 20),
            if r.exit_ok { r.system.name().to_string() } else { format!("{} FAILED", r.system.name()) },
            format!("{:.1}", r.wall_secs),
            format!("{:.1}", r.cpu_secs),
            format!("{:.1}", r.server_cpu_secs),
            r.pswpin.to_string(),
            r.pswpout.to_string(),
            r.pgmajfault.to_string(),
            r.disk_io.read_ops.to_string(),
            mb(r.disk_io.read_bytes),
            r.disk_io.write_ops.to_string(),
            mb(r.disk_io.write_bytes),
            mb(r.pool_peak_bytes),
            mb(r.shared_budget.map_or(r.cgroup_peak_bytes + r.pool_peak_bytes, |b| b.peak_total)),
            r.dead.filter(|d| d.cap_samples > 0).map_or("-".to_string(), |d| format!("{:.0}", d.cap_mean_bytes / 1e6)),
            r.written_back_pages.to_string(),
            f2(r.read_ops_per_swapin()),
            f2(r.read_ops_per_file_page()),
            f2(r.file_read_amplification()),
            f2(r.file_read_cost_ms()),
            r.readahead_used_share().map_or("-".to_string(), |u| format!("{:.0}", u * 100.0)),
            r.dead.map_or("-".to_string(), |d| format!("{:.0}", d.mean_share * 100.0)),
            r.dead.filter(|d| d.ram_unmapped_samples > 0).map_or("-".to_string(), |d| format!("{:.0}", d.ram_unmapped_share_mean * 100.0)),
            r.dead.filter(|d| d.pool_samples > 0).map_or("-".to_string(), |d| format!("{:.0}", d.data_share_at_peak * 100.0)),
            r.dead.filter(|d| d.backed_samples > 0).map_or("-".to_string(), |d| format!("{:.1}", d.table_bytes_per_backed_page_mean)),
            r.server_us_per_page().map_or("-".to_string(), |u| format!("{u:.1}")),
            r.machine.and_then(|m| m.idle_share()).map_or("-".to_string(), |i| format!("{:.0}", i * 100.0)),
            r.machine_us_per_swapin().map_or("-".to_string(), |u| format!("{u:.0}")),
            f2(q.wall_vs_disk),
            f2(q.wall_vs_zswap),
            f2(q.wall_vs_zram),
            f2(q.disk_bytes_vs_disk),
            f2(q.disk_bytes_vs_zswap),
            r.dead.filter(|d| d.server_samples > 0).map_or("-".to_string(), |d| mb(d.beside_pool_max)),
            (r.set + 1).to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..head.len()).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, v)| if (1..=3).contains(&c) { format!("{v:<w$}", w = widths[c]) } else { format!("{v:>w$}", w = widths[c]) })
            .collect();
        out += cells.join(" ").trim_end();
        out += "\n";
    }
    let mut seen = Vec::new();
    let several_sets = report.runs.iter().any(|r| r.set > 0);
    for r in report.runs.iter().filter(|r| r.disk.is_some()) {
        let key = (r.jobs, r.disk, r.budget_bytes, r.set);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        if let Some(s) = ratios(report, r).disk_slowdown {
            out += &format!(
                "-j{} {} disk, budget {} MiB{}: disk swap takes {s:.2} x the unlimited run{}\n",
                r.jobs,
                r.disk.map_or("-", |d| d.name()),
                r.budget_bytes >> 20,
                if several_sets { format!(", set {}", r.set + 1) } else { String::new() },
                if s < 2.0 { " (under the 2 x the seed experiment asks for: give a smaller budget)" } else { "" }
            );
        }
    }
    for s in spreads(report) {
        out += &format!(
            "-j{} {} disk, budget {} MiB, {} over {}: median {:.2} x, {:.2} to {:.2} over {} sets ({})\n",
            s.jobs,
            s.disk.map_or("-", |d| d.name()),
            s.budget_bytes >> 20,
            s.system.name(),
            s.against.name(),
            s.median,
            s.min,
            s.max,
            s.ratios.len(),
            s.ratios.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ")
        );
    }
    let mut ruled = Vec::new();
    for r in report.runs.iter().filter(|r| r.system != System::Disk) {
        if !ruled.contains(&r.system) {
            ruled.push(r.system);
            out += &format!("memory, {}: {}\n", r.system.name(), r.memory_rule);
        }
    }
    for n in &report.notes {
        out += &format!("note: {n}\n");
    }
    for r in report.runs.iter().filter(|r| r.error.is_some()) {
        out += &format!(
            "failed: {} {} {} MiB -j{}: {}\n",
            r.system.name(),
            r.disk.map_or("-", |d| d.name()),
            r.budget_bytes >> 20,
            r.jobs,
            r.error.as_deref().unwrap_or("")
        );
    }
    out
}

/// A report of `runs` with nothing else, for tests.
#[cfg(test)]
pub(crate) fn test_report(runs: Vec<RunResult>) -> Report {
    Report {
        workload: vec![],
        compressor: "lzo".into(),
        mem_total_bytes: 0,
        zswap_max_pool_percent: 1,
        zmem_args: vec![],
        zmem_b_args: vec![],
        zmem_b_bin: None,
        zmem_b_restart_every_secs: None,
        notes: vec![],
        runs,
    }
}

/// A finished run with made-up figures, for tests.
#[cfg(test)]
pub(crate) fn test_run(system: System, disk: Option<DiskKind>, budget: u64, wall: f64, io: u64) -> RunResult {
    RunResult {
        system,
        disk,
        jobs: 4,
        budget_bytes: budget,
        set: 0,
        cgroup_limit_bytes: budget,
        pool_cap_bytes: 0,
        memory_rule: String::new(),
        exit_ok: true,
        error: None,
        wall_secs: wall,
        cpu_secs: 1.0,
        server_cpu_secs: 0.0,
        kswapd_cpu_secs: 0.0,
        machine: None,
        pswpin: 0,
        pswpout: 0,
        pgmajfault: 0,
        swap_ra: 0,
        swap_ra_hit: 0,
        workingset_refault_anon: 0,
        zswpout: 0,
        zswpin: 0,
        zswpwb: 0,
        disk_io: DiskStat { read_ops: 1, read_bytes: io, write_ops: 1, write_bytes: io },
        cgroup_peak_bytes: 0,
        anon_peak_bytes: 0,
        cgroup_kmem_peak_bytes: 0,
        pool_peak_bytes: 0,
        written_back_pages: 0,
        shared_budget: None,
        server_stats: None,
        dead: None,
        restarts: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_run as run;

    use super::test_report as report;

    /// `--zmem-bin` may run a server older than the bench: its stats lack
    /// the counters added since, and must still be read (the dead-share
    /// sampler and the report skip stats that do not parse).
    #[test]
    fn an_older_servers_stats_still_parse() {
        let mut st = serde_json::to_value(zmem_core::Stats { loads: 7, bd_reads: 3, first_out_taken: 2, ..Default::default() }).unwrap();
        st.as_object_mut().unwrap().retain(|k, _| !k.starts_with("first_out"));
        let read: zmem_core::Stats = serde_json::from_value(st).expect("stats without the newer counters");
        assert_eq!((read.loads, read.bd_reads, read.first_out_taken), (7, 3, 0));
    }

    #[test]
    fn the_report_says_how_often_zmem_b_was_restarted() {
        let mut b = run(System::ZmemB, Some(DiskKind::Real), 100 << 20, 50.0, 1);
        b.restarts = 7;
        let mut rep = report(vec![run(System::Zmem, Some(DiskKind::Real), 100 << 20, 48.0, 1), b]);
        assert!(!render(&rep).contains("replaces its server"));
        rep.zmem_b_restart_every_secs = Some(30);
        let text = render(&rep);
        assert!(text.contains("zmem-b replaces its server every 30 s (`zmem swap restart`): 7 restarts a run"), "{text}");
    }

    #[test]
    fn b_args_replace_the_same_options() {
        let v = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            with_b_args(&v("--read-ahead 0 --threads 4 --compressor=zstd"), &v("--read-ahead auto --compressor=lz4")),
            v("--threads 4 --read-ahead auto --compressor=lz4")
        );
        assert_eq!(with_b_args(&v("--dedup on"), &[]), v("--dedup on"));
    }

    #[test]
    fn a_max_pool_of_the_runs_own_replaces_the_cap() {
        let v = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(zmem_max_pool(1 << 20, &v("--dedup on")), v("--max-pool 1048576"));
        assert!(zmem_max_pool(1 << 20, &v("--max-pool 24M")).is_empty());
        assert!(zmem_max_pool(1 << 20, &v("--dedup on --max-pool=24M")).is_empty());
    }

    #[test]
    fn zmem_takes_the_bench_compressor_unless_told_its_own() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(zmem_compressor("lzo-rle", &[]), ["--compressor", "lzo"]);
        assert_eq!(zmem_compressor("lz4", &args(&["--dict", "auto"])), ["--compressor", "lz4"]);
        assert!(zmem_compressor("lzo", &args(&["--compressor", "zstd", "--dict", "auto"])).is_empty());
        assert!(zmem_compressor("lzo", &args(&["--compressor=zstd"])).is_empty());
    }

    #[test]
    fn ratios_compare_within_the_same_set_only() {
        let t = Some(DiskKind::Throttled);
        let rep = report(vec![
            run(System::Disk, None, 0, 100.0, 0),
            run(System::Disk, t, 300, 300.0, 1000),
            run(System::Zswap, t, 300, 200.0, 500),
            run(System::Zmem, t, 300, 150.0, 100),
            run(System::Disk, t, 200, 900.0, 9000),
        ]);
        let q = ratios(&rep, &rep.runs[3]);
        assert_eq!(q.wall_vs_disk, Some(0.5));
        assert_eq!(q.wall_vs_zswap, Some(0.75));
        assert_eq!(q.disk_bytes_vs_disk, Some(0.1));
        assert_eq!(q.disk_bytes_vs_zswap, Some(0.2));
        assert_eq!(q.disk_slowdown, Some(3.0));
        let table = render(&rep);
        assert!(table.contains("disk swap takes 3.00 x"), "{table}");
        assert!(table.contains("disk swap takes 9.00 x"), "{table}");
    }

    #[test]
    fn every_second_set_runs_the_systems_backwards() {
        let sys = [System::Disk, System::Zram, System::Zmem];
        assert_eq!(set_order(&sys, 0), sys);
        assert_eq!(set_order(&sys, 1), [System::Zmem, System::Zram, System::Disk]);
        assert_eq!(set_order(&sys, 2), sys);
    }

    /// Each set's ratio is taken within the set, and the spread over the
    /// sets is their median and range; a set whose yardstick failed has
    /// no ratio and is left out of it.
    #[test]
    fn sets_are_compared_within_and_spread_across() {
        let t = Some(DiskKind::Throttled);
        let in_set = |mut r: RunResult, set: u32| {
            r.set = set;
            r
        };
        let mut failed = in_set(run(System::Disk, t, 300, 1.0, 1), 3);
        failed.exit_ok = false;
        let rep = report(vec![
            run(System::Disk, None, 0, 100.0, 0),
            in_set(run(System::Disk, t, 300, 400.0, 1), 0),
            in_set(run(System::Zram, t, 300, 200.0, 1), 0),
            in_set(run(System::Zmem, t, 300, 200.0, 1), 0),
            in_set(run(System::Zmem, t, 300, 300.0, 1), 1),
            in_set(run(System::Zram, t, 300, 600.0, 1), 1),
            in_set(run(System::Disk, t, 300, 200.0, 1), 1),
            in_set(run(System::Disk, t, 300, 1000.0, 1), 2),
            in_set(run(System::Zmem, t, 300, 800.0, 1), 2),
            failed,
            in_set(run(System::Zmem, t, 300, 5.0, 1), 3),
        ]);
        let q = ratios(&rep, &rep.runs[4]);
        assert_eq!((q.wall_vs_disk, q.wall_vs_zram), (Some(1.5), Some(0.5)));
        assert_eq!(ratios(&rep, &rep.runs[8]).wall_vs_zram, None, "set 3 has no zram run");
        let s = spreads(&rep);
        let zmem_disk = s.iter().find(|s| s.system == System::Zmem && s.against == System::Disk).unwrap();
        assert_eq!(zmem_disk.ratios, [0.5, 1.5, 0.8]);
        assert_eq!((zmem_disk.median, zmem_disk.min, zmem_disk.max), (0.8, 0.5, 1.5));
        let zmem_zram = s.iter().find(|s| s.system == System::Zmem && s.against == System::Zram).unwrap();
        assert_eq!((zmem_zram.ratios.len(), zmem_zram.median), (2, 0.75));
        let zram_disk = s.iter().find(|s| s.system == System::Zram).unwrap();
        assert_eq!((zram_disk.against, zram_disk.median), (System::Disk, 1.75));
        assert!(!s.iter().any(|s| s.system == System::Disk), "{s:?}");
        let table = render(&rep);
        assert!(table.contains("budget 0 MiB, zmem over disk: median 0.80 x, 0.50 to 1.50 over 3 sets (0.50, 1.50, 0.80)"), "{table}");
        assert_eq!(table.matches("memory, zmem:").count(), 1, "{table}");
        assert!(table.contains("budget 0 MiB, set 2: disk swap takes 2.00 x") && table.contains("budget 0 MiB, set 1: disk swap takes 4.00 x"), "{table}");
    }

    #[test]
    fn a_failed_run_has_no_ratios_and_is_listed() {
        let t = Some(DiskKind::Real);
        let mut z = run(System::Zmem, t, 300, 10.0, 1);
        z.exit_ok = false;
        z.error = Some("OOM".into());
        let rep = report(vec![run(System::Disk, t, 300, 300.0, 1000), z]);
        let q = ratios(&rep, &rep.runs[1]);
        assert!(q.wall_vs_disk.is_none() && q.disk_bytes_vs_disk.is_none());
        let table = render(&rep);
        assert!(table.contains("zmem FAILED") && table.contains("failed: zmem real 0 MiB -j4: OOM"), "{table}");
    }

    #[test]
    fn dead_share_is_pages_past_the_kernels_count() {
        let mut d = DeadShare::default();
        d.add(0, 5, Some(5)); // an empty pool is no sample
        d.add(100, 100, Some(100));
        d.add(200, 150, Some(75));
        d.add(150, 200, Some(150)); // slots allocated, not yet written: none dead
        d.add(150, 200, None); // not scanned: counts for the dead share only
        assert_eq!((d.samples, d.scans), (4, 3));
        assert!((d.mean_share - 0.25 / 4.0).abs() < 1e-9, "{d:?}");
        assert_eq!((d.held_pages_peak, d.dead_pages_max, d.mapped_pages_max), (200, 50, 150));
        assert!((d.share_at_peak - 0.25).abs() < 1e-9);
        assert!((d.mapped_share_mean - (1.0 + 0.5 + 0.75) / 3.0).abs() < 1e-9, "{d:?}");
        assert!((d.unmapped_share_mean - (0.0 + 0.625 + 0.0) / 3.0).abs() < 1e-9, "{d:?}");
        let mut z = run(System::Zmem, Some(DiskKind::Throttled), 300, 10.0, 1);
        z.dead = Some(d);
        z.pswpin = 1000;
        z.pswpout = 3000;
        z.server_cpu_secs = 0.02;
        let st = zmem_core::Stats {
            bd_reads: 4,
            backing_bytes_read: 9000,
            backing_compaction_bytes_read: 1000,
            backing_record_bytes_read: 3200,
            backing_readahead_bytes: 4000,
            backing_readahead_used_bytes: 1480,
            ..zmem_core::Stats::default()
        };
        z.server_stats = Some(serde_json::to_value(st).unwrap());
        assert_eq!(z.read_ops_per_swapin(), Some(0.001));
        assert_eq!(z.read_ops_per_file_page(), Some(0.25));
        assert_eq!(z.file_read_amplification(), Some(2.5));
        assert_eq!(z.readahead_used_share(), Some(0.37));
        assert_eq!(z.server_us_per_page(), Some(5.0));
        let table = render(&report(vec![z]));
        assert!(table.contains(" 6 ") && table.contains(" 5.0 ") && table.contains(" 2.50 ") && table.contains(" 37 "), "{table}");
    }

    /// The cap's least, mean and last value, over the samples that had one.
    #[test]
    fn the_caps_course_is_sampled() {
        let mut d = DeadShare::default();
        for cap in [0, 120, 30, 60] {
            d.add_pool(&zmem_core::Stats { max_pool_bytes: cap, ..zmem_core::Stats::default() });
        }
        assert_eq!((d.cap_samples, d.cap_min_bytes, d.cap_last_bytes), (3, 30, 60), "{d:?}");
        assert!((d.cap_mean_bytes - 70.0).abs() < 1e-9, "{d:?}");
        let mut z = run(System::Zmem, Some(DiskKind::Throttled), 300, 10.0, 1);
        d.cap_mean_bytes = 70e6;
        z.dead = Some(d);
        let table = render(&report(vec![z]));
        assert!(table.contains("cap MB") && table.contains(" 70 "), "{table}");
    }

    /// The machine's CPU over a run: its idle share and its CPU a swap-in,
    /// for every system alike; none where it was not read.
    #[test]
    fn the_machines_cpu_a_swap_in() {
        let mut d = run(System::Disk, Some(DiskKind::Throttled), 300, 10.0, 1);
        assert_eq!(d.machine_us_per_swapin(), None);
        d.pswpin = 50_000;
        d.machine = Some(host::MachineCpu { user_secs: 1.0, system_secs: 12.0, idle_secs: 5.0, iowait_secs: 2.0, steal_secs: 0.0, context_switches: 9 });
        assert_eq!(d.machine_us_per_swapin(), Some(260.0));
        let table = render(&report(vec![d]));
        assert!(table.contains("idle%") && table.contains(" 35 ") && table.contains(" 260 "), "{table}");
        let v = serde_json::to_value(run(System::Zram, None, 0, 1.0, 0)).unwrap();
        assert!(v["machine"].is_null(), "{v}");
    }

    #[test]
    fn names_parse_back() {
        for s in System::ALL {
            assert_eq!(s.name().parse::<System>().unwrap(), s);
        }
        assert!("zcache".parse::<System>().is_err());
        assert_eq!("hdd".parse::<DiskKind>().unwrap().throttle(), Some(Throttle { iops: 150, bps: 58_000_000 }));
        assert_eq!(Amount::Percent(50).of(1000), 500);
        assert_eq!(Amount::Bytes(7).of(1000), 7);
    }
}
