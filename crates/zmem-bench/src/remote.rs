//! `zmem bench remote`: the writeback tier's cold store on a throttled
//! local disk against a Redis Cluster on loopback, same pages, same pool
//! cap, one run.
//!
//! For each cold store, a fresh pool capped at a share of the data:
//! 1. **store**: every page stored (the shrinker writes the coldest back
//!    as the pool reaches its cap), timed, then the shrinker settles;
//! 2. **writeback**: every page stored into a pool without a cap (and a
//!    cold store of its own), then all written back at once
//!    (`Pool::writeback(All)`), timed: MB/s of original data;
//! 3. **load**: every page loaded in order and compared, timed (most come
//!    from the cold store), in 128 KiB requests whose written-back pages
//!    are read ahead together first (`Pool::prefetch`), as the NBD and
//!    FUSE frontends do;
//! 4. **read latency**: everything written back again, then single loads
//!    of pages spread over the device, each timed: p50 and p99 of a load
//!    of a written-back page, decompression included;
//! 5. **bytes per page written back**: what left the machine (the
//!    masters' `total_net_input_bytes`) or reached the disk (its write
//!    bytes), per page written back in steps 1 and 2; for the cluster also
//!    what the masters sent their replicas.
//!
//! The disk is a loop device with direct I/O holding an ext4, throttled
//! with blkio to 3,000 IOPS and 125 MB/s each way (a small cloud disk);
//! it needs root, and without it the run has the cluster alone. The
//! cluster is 3 masters and 3 replicas of the machine's `redis-server`,
//! started for the run and stopped after it, with `--remote-replicas 1`;
//! then the same over TLS (`cluster-tls`: a cluster that speaks TLS only,
//! certificates made for the run, zmem trusting its CA).
//!
//! Last, **reads through a failover** (`--failover`, on the plain cluster,
//! node timeout 5 s): every page written back, then single loads of
//! random pages for [`FAILOVER_SECS`], one master SIGKILLed after the
//! first second; each load timed (p50, p99, the longest) and any failure
//! counted (none should be: the replicas answer until one is promoted).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use zmem_compress::Compressor;
use zmem_core::{ColdStore, Pool, PoolConfig, WritebackMode};
use zmem_host::{LoopDisk, Throttle};
use zmem_rig::redis_cluster::{self, LocalCluster};

use crate::pages::{self, PAGE_SIZE};
use crate::store::mbps;

/// Pages per read request of the load pass (128 KiB).
const REQUEST: usize = 32;

/// The throttled disk: a small cloud disk's limits.
pub const DISK: Throttle = Throttle { iops: 3000, bps: 125_000_000 };

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Files or directories to read (default /usr/lib/x86_64-linux-gnu).
    pub paths: Vec<PathBuf>,
    /// Stop reading input after this much data.
    pub max_bytes: u64,
    pub compressor: Compressor,
    /// The pool's cap as `1/den` of the data set.
    pub pool_share_den: u64,
    /// Single loads timed for the latency percentiles.
    pub samples: usize,
    /// Where the disk's image goes (a directory on the host's disk).
    pub scratch: PathBuf,
    /// Leave out the throttled disk.
    pub no_disk: bool,
    /// Time single reads while a master dies.
    pub failover: bool,
}

/// One cold store's figures.
#[derive(Debug, Clone, Serialize)]
pub struct System {
    pub name: String,
    pub store_mbps: f64,
    pub writeback_mbps: f64,
    pub load_mbps: f64,
    pub read_p50_us: f64,
    pub read_p99_us: f64,
    /// The mean and the slowest: a throttled disk answers most reads at
    /// once and makes one wait a whole throttle slice now and then.
    pub read_mean_us: f64,
    pub read_max_us: f64,
    pub written_back_pages: u64,
    /// Bytes that left for the cold store per page written back.
    pub bytes_per_page: f64,
    /// The cluster's masters' bytes to their replicas, per page.
    pub replication_bytes_per_page: Option<f64>,
    pub failed_writebacks: u64,
    /// A cluster's masters' memory (`used_memory`) before steps 1, 3 and
    /// 4 (after step 2's store closed and deleted its records), with
    /// every page written back, and once every page was discarded and
    /// its record deleted; each without the buffers of replication (a
    /// ring per master that the first writes fill and that then stays,
    /// whatever was written) and of client connections (zmem's own, open
    /// while it runs): neither holds records.
    pub memory_empty: Option<u64>,
    pub memory_full: Option<u64>,
    pub memory_after_frees: Option<u64>,
    /// Those buffers at the end.
    pub replication_buffers: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Reads through a failover (the plain cluster), if it ran.
    pub failover: Option<FailoverReads>,
    pub pages: u64,
    pub data_bytes: u64,
    pub max_pool_bytes: u64,
    pub compressor: String,
    pub systems: Vec<System>,
    /// Why a system did not run.
    pub notes: Vec<String>,
}

/// Single loads of written-back pages while a master dies and its
/// replica takes over.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReads {
    pub reads: u64,
    pub failed: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Of the reads, those a replica answered.
    pub replica_reads: u64,
}

/// How long the failover step reads.
pub const FAILOVER_SECS: u64 = 12;

/// Counters of the cold store's medium, read before and after a phase.
trait Medium {
    /// (bytes sent to it, bytes it sent on to replicas).
    fn sent(&self) -> anyhow::Result<(u64, u64)>;
    /// The memory it holds and, of that, the buffers of its replication
    /// links and client connections (a cluster), if it is memory.
    fn memory(&self) -> anyhow::Result<Option<(u64, u64)>> {
        Ok(None)
    }
}

struct Disk(LoopDisk);

impl Medium for Disk {
    fn sent(&self) -> anyhow::Result<(u64, u64)> {
        Ok((self.0.stat().write_bytes, 0))
    }
}

impl Medium for LocalCluster {
    fn sent(&self) -> anyhow::Result<(u64, u64)> {
        let (mut input, mut repl) = (0, 0);
        for (m, _) in self.masters()? {
            let f = |k: &str| -> anyhow::Result<u64> { self.info_field(m, k)?.parse::<u64>().with_context(|| format!("INFO {k} on {m}")) };
            input += f("total_net_input_bytes")?;
            repl += f("total_net_repl_output_bytes")?;
        }
        Ok((input, repl))
    }

    fn memory(&self) -> anyhow::Result<Option<(u64, u64)>> {
        let (mut used, mut repl) = (0, 0);
        for (m, _) in self.masters()? {
            let f = |k: &str| -> anyhow::Result<u64> { self.info_field(m, k)?.parse::<u64>().with_context(|| format!("INFO {k} on {m}")) };
            used += f("used_memory")?;
            repl += f("mem_total_replication_buffers")? + f("mem_clients_normal")?;
        }
        Ok(Some((used, repl)))
    }
}

pub fn run(cfg: &Config, mut note: impl FnMut(&str)) -> anyhow::Result<Report> {
    if cfg.pool_share_den < 2 || cfg.samples == 0 {
        bail!("the pool must be at most half the data (--max-pool 1/N, N >= 2) and --samples at least 1");
    }
    let paths = if cfg.paths.is_empty() { vec![PathBuf::from("/usr/lib/x86_64-linux-gnu")] } else { cfg.paths.clone() };
    let set = pages::read_paths(&paths, Some(cfg.max_bytes)).with_context(|| format!("reading {}", paths[0].display()))?;
    if set.is_empty() {
        bail!("no pages to benchmark: the inputs were empty");
    }
    let data = &set.data;
    let max_pool = (data.len() as u64 / cfg.pool_share_den).max(PAGE_SIZE as u64);
    let mut report = Report {
        pages: set.pages() as u64,
        data_bytes: data.len() as u64,
        max_pool_bytes: max_pool,
        compressor: cfg.compressor.to_string(),
        systems: Vec::new(),
        notes: Vec::new(),
        failover: None,
    };
    let pool_cfg = PoolConfig { compressor: cfg.compressor, max_pool: Some(max_pool), ..PoolConfig::default() };
    if cfg.no_disk {
        report.notes.push("the throttled disk was left out (--no-disk)".into());
    } else if rustix::process::geteuid().is_root() {
        note("the throttled disk...");
        let img = cfg.scratch.join("zmem-bench-remote.img");
        let mnt = cfg.scratch.join("zmem-bench-remote.mnt");
        let mut disk = LoopDisk::create(&img, data.len() as u64 * 2 + (256 << 20), &mnt)?;
        disk.throttle(Some(DISK))?;
        let disk = Disk(disk);
        let mut buffered = None;
        let open = |name: &str| -> anyhow::Result<Box<dyn ColdStore>> {
            let (store, why) = zmem_backing::BackingStore::open(&mnt.join(format!("{name}.img")), None, zmem_backing::Existing::Refuse)?;
            buffered = buffered.take().or(why);
            Ok(Box::new(store))
        };
        let r = measure("disk", &pool_cfg, open, &disk, data, cfg.samples);
        report.notes.extend(buffered);
        drop(disk);
        let _ = std::fs::remove_dir(&mnt);
        report.systems.push(r?);
    } else {
        report.notes.push("the throttled disk needs root (a loop device and a blkio throttle); run as root to compare".into());
    }
    if !redis_cluster::available() {
        bail!("redis-server and redis-cli are missing (bash scripts/setup.sh installs them)");
    }
    note("the loopback cluster...");
    let mut cluster = LocalCluster::start(3, 1, 5000).map_err(|e| anyhow::anyhow!("starting a Redis cluster: {e}"))?;
    let open = |name: &str| -> anyhow::Result<Box<dyn ColdStore>> {
        Ok(Box::new(zmem_remote::RemoteStore::open(zmem_remote::RemoteConfig::new(&cluster.url(), &format!("bench-{name}"))?)?))
    };
    report.systems.push(measure("cluster", &pool_cfg, open, &cluster, data, cfg.samples)?);
    if cfg.failover {
        note("reads through a failover...");
        report.failover = Some(failover_reads(&pool_cfg, &mut cluster, data)?);
    }
    drop(cluster);
    // The same over TLS (rediss://, the cluster's CA), every other step alike.
    note("the loopback cluster over TLS...");
    let cluster = LocalCluster::start_tls(3, 1, 5000).map_err(|e| anyhow::anyhow!("starting a TLS Redis cluster: {e}"))?;
    let ca = std::fs::read(cluster.certs().context("a TLS cluster has certificates")?.file("ca.crt"))?;
    let open = |name: &str| -> anyhow::Result<Box<dyn ColdStore>> {
        let mut rc = zmem_remote::RemoteConfig::new(&cluster.url(), &format!("bench-{name}"))?;
        rc.tls = Some(zmem_remote::Tls { ca: Some(ca.clone()), client: None });
        Ok(Box::new(zmem_remote::RemoteStore::open(rc)?))
    };
    report.systems.push(measure("cluster-tls", &pool_cfg, open, &cluster, data, cfg.samples)?);
    Ok(report)
}

/// Steps 1 to 5 of the module notes on one cold store.
fn measure(
    name: &str,
    cfg: &PoolConfig,
    mut open: impl FnMut(&str) -> anyhow::Result<Box<dyn ColdStore>>,
    medium: &dyn Medium,
    data: &[u8],
    samples: usize,
) -> anyhow::Result<System> {
    let n = data.len() / PAGE_SIZE;
    let writeback_mbps = writeback_all(cfg, open("writeback")?, data)?;
    let pool = Pool::with_cold_store(cfg.clone(), open("main")?)?;
    let mem0 = medium.memory()?;
    let before = medium.sent()?;
    let t = Instant::now();
    for i in 0..n {
        pool.store(i as u64, &data[i * PAGE_SIZE..][..PAGE_SIZE]).with_context(|| format!("storing page {i}"))?;
    }
    let store_secs = t.elapsed().as_secs_f64();
    pool.settle(Duration::from_secs(120));
    pool.writeback(WritebackMode::All, None)?;
    let written = pool.stats().written_back_pages;
    let after = medium.sent()?;
    let mem1 = medium.memory()?;
    let mut buf = vec![0u8; PAGE_SIZE];
    // In 128 KiB requests, as the NBD and FUSE frontends read: each
    // request's written-back pages are read ahead together first.
    let t = Instant::now();
    for i in 0..n {
        if i % REQUEST == 0 {
            pool.prefetch(i as u64..(i + REQUEST).min(n) as u64);
        }
        pool.load(i as u64, &mut buf).with_context(|| format!("loading page {i}"))?;
        if buf[..] != data[i * PAGE_SIZE..][..PAGE_SIZE] {
            bail!("page {i} read back wrong from {name}: this is a bug, please report it");
        }
    }
    let load_secs = t.elapsed().as_secs_f64();
    pool.writeback(WritebackMode::All, None)?;
    // Pages in a random order: neighbours would share the disk store's
    // read-ahead windows and time a RAM copy instead of a read.
    let mut lat: Vec<f64> = Vec::with_capacity(samples);
    let mut rng = zmem_rig::XorShift::new(0x5eed);
    for _ in 0..samples.min(n) {
        let i = rng.below(n as u64);
        let t = Instant::now();
        pool.load(i, &mut buf)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    let st = pool.stats();
    let mem2 = discard_all(&pool, n, medium)?;
    let without = |m: Option<(u64, u64)>| m.map(|(used, repl)| used.saturating_sub(repl));
    let per_page = |b: u64| if written > 0 { b as f64 / written as f64 } else { 0.0 };
    Ok(System {
        name: name.to_string(),
        store_mbps: mbps(data.len() as u64, store_secs),
        writeback_mbps,
        load_mbps: mbps(data.len() as u64, load_secs),
        read_p50_us: pct(0.50),
        read_p99_us: pct(0.99),
        read_mean_us: lat.iter().sum::<f64>() / lat.len().max(1) as f64,
        read_max_us: lat.last().copied().unwrap_or(0.0),
        written_back_pages: written,
        bytes_per_page: per_page(after.0 - before.0),
        replication_bytes_per_page: (after.1 > before.1).then(|| per_page(after.1 - before.1)),
        failed_writebacks: st.writeback_fail,
        memory_empty: without(mem0),
        memory_full: without(mem1),
        memory_after_frees: without(mem2),
        replication_buffers: mem2.map(|m| m.1),
    })
}

/// Reads through a failover (see the module notes).
fn failover_reads(cfg: &PoolConfig, cluster: &mut LocalCluster, data: &[u8]) -> anyhow::Result<FailoverReads> {
    let n = data.len() / PAGE_SIZE;
    let store = zmem_remote::RemoteStore::open(zmem_remote::RemoteConfig::new(&cluster.url(), "bench-failover")?)?;
    let pool = Pool::with_cold_store(cfg.clone(), Box::new(store))?;
    for (i, page) in data.chunks_exact(PAGE_SIZE).enumerate() {
        pool.store(i as u64, page).with_context(|| format!("storing page {i}"))?;
    }
    pool.settle(Duration::from_secs(120));
    pool.writeback(WritebackMode::All, None)?;
    let victim = cluster.masters().map_err(|e| anyhow::anyhow!("{e}"))?.first().map(|m| m.0).context("the cluster has no master")?;
    let before = pool.stats().backing_replica_reads;
    let (mut lat, mut failed) = (Vec::new(), 0u64);
    let mut rng = zmem_rig::XorShift::new(0xfa11);
    let mut buf = vec![0u8; PAGE_SIZE];
    let start = Instant::now();
    let mut killed = false;
    while start.elapsed() < Duration::from_secs(FAILOVER_SECS) {
        if !killed && start.elapsed() > Duration::from_secs(1) {
            cluster.kill(victim).map_err(|e| anyhow::anyhow!("{e}"))?;
            killed = true;
        }
        let i = rng.below(n as u64) as usize;
        let t = Instant::now();
        match pool.load(i as u64, &mut buf) {
            Ok(()) if buf[..] == data[i * PAGE_SIZE..][..PAGE_SIZE] => lat.push(t.elapsed().as_secs_f64() * 1e6),
            Ok(()) => bail!("page {i} read back wrong during a failover: this is a bug, please report it"),
            Err(_) => failed += 1,
        }
    }
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| if lat.is_empty() { 0.0 } else { lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1] };
    Ok(FailoverReads {
        reads: lat.len() as u64,
        failed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        max_us: lat.last().copied().unwrap_or(0.0),
        replica_reads: pool.stats().backing_replica_reads - before,
    })
}

/// Step 2: every page into a pool with no cap, then all of it written
/// back at once, timed: MB/s of original data.
fn writeback_all(cfg: &PoolConfig, store: Box<dyn ColdStore>, data: &[u8]) -> anyhow::Result<f64> {
    let pool = Pool::with_cold_store(PoolConfig { max_pool: None, ..cfg.clone() }, store)?;
    for (i, page) in data.chunks_exact(PAGE_SIZE).enumerate() {
        pool.store(i as u64, page).with_context(|| format!("storing page {i}"))?;
    }
    let t = Instant::now();
    let wb = pool.writeback(WritebackMode::All, None)?;
    Ok(mbps(wb * PAGE_SIZE as u64, t.elapsed().as_secs_f64()))
}

/// Discard every page (the engine frees their records), wait until the
/// cold store has deleted them, and read the medium's memory.
fn discard_all(pool: &Pool, n: usize, medium: &dyn Medium) -> anyhow::Result<Option<(u64, u64)>> {
    pool.invalidate_range(0..n as u64);
    let end = Instant::now() + Duration::from_secs(60);
    while pool.stats().backing_frees_pending > 0 {
        if Instant::now() > end {
            bail!("the cold store did not delete the discarded pages' records in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The cluster resizes its emptied tables in its next cron runs.
    std::thread::sleep(Duration::from_millis(1500));
    medium.memory()
}

pub fn render(r: &Report) -> String {
    let mut out = format!(
        "{} pages ({:.0} MiB), {}, pool capped at {:.0} MiB (1/{} of the data)\n\n",
        r.pages,
        r.data_bytes as f64 / (1 << 20) as f64,
        r.compressor,
        r.max_pool_bytes as f64 / (1 << 20) as f64,
        r.data_bytes / r.max_pool_bytes.max(1)
    );
    out += &format!("{:<34}", "");
    for s in &r.systems {
        out += &format!("{:>12}", s.name);
    }
    out.push('\n');
    let row = |label: &str, f: &dyn Fn(&System) -> String| {
        let mut l = format!("{label:<34}");
        for s in &r.systems {
            l += &format!("{:>12}", f(s));
        }
        l + "\n"
    };
    out += &row("store MB/s (under writeback)", &|s| format!("{:.0}", s.store_mbps));
    out += &row("writeback MB/s (original data)", &|s| format!("{:.0}", s.writeback_mbps));
    out += &row("load MB/s (from the cold store)", &|s| format!("{:.0}", s.load_mbps));
    out += &row("read of a written-back page p50", &|s| format!("{:.0} µs", s.read_p50_us));
    out += &row("                            p99", &|s| format!("{:.0} µs", s.read_p99_us));
    out += &row("                           mean", &|s| format!("{:.0} µs", s.read_mean_us));
    out += &row("                            max", &|s| format!("{:.0} µs", s.read_max_us));
    out += &row("pages written back", &|s| s.written_back_pages.to_string());
    out += &row("bytes out per page written back", &|s| format!("{:.0}", s.bytes_per_page));
    out += &row("  and on to replicas", &|s| s.replication_bytes_per_page.map_or("-".into(), |b| format!("{b:.0}")));
    let mib = |b: Option<u64>| b.map_or("-".into(), |b| format!("{:.1} MiB", b as f64 / (1 << 20) as f64));
    out += &row("cluster memory: empty", &|s| mib(s.memory_empty));
    out += &row("  every page written back", &|s| mib(s.memory_full));
    out += &row("  after discarding them all", &|s| mib(s.memory_after_frees));
    out += &row("  (+ replication, client buffers)", &|s| mib(s.replication_buffers));
    out += &row("writeback batches refused", &|s| s.failed_writebacks.to_string());
    if let Some(f) = &r.failover {
        out += &format!(
            "\nreads through a failover (a master killed 1 s in, {FAILOVER_SECS} s of single loads): {} reads, {} failed, p50 {:.0} µs, p99 {:.0} µs, longest {:.1} ms; {} answered by a replica\n",
            f.reads,
            f.failed,
            f.p50_us,
            f.p99_us,
            f.max_us / 1000.0,
            f.replica_reads
        );
    }
    out += "\ndisk: a loop device (direct I/O, ext4) throttled to 3,000 IOPS and 125 MB/s each way\n";
    out += "cluster: Redis Cluster on loopback, 3 masters + 3 replicas, a batch acknowledged by a replica (WAIT 1)\n";
    for n in &r.notes {
        out += &format!("note: {n}\n");
    }
    out
}
