//! `zmem bench cache`: zcache's iozone experiment, on this machine.
//!
//! zcache kept the clean pages the kernel evicted, compressed, and gave
//! them back instead of the disk: with 1 GB of RAM, iozone's reads ran
//! about 2.5 × faster and its random reads about 3 ×. Here the same
//! question is asked of `zmem serve --origin`, in one run:
//!
//! * **The origin** is an image file on this machine's disk behind a loop
//!   device with direct I/O, throttled by the blkio controller like a cloud
//!   volume (default 3,000 IOPS and 125 MB/s each way). An ext4 on it holds
//!   a real data set: regular files of `/usr/lib`, a fixed sample spread
//!   over the tree (in the order of a hash of their paths), until
//!   `data_bytes` (default 2 × the budget).
//! * **The reader** is fio over those files (`opendir`): sequential passes
//!   (128 KiB reads, a file at a time) and then time-based 4 KiB random
//!   reads, in a memory cgroup whose limit is the **budget**, so the page
//!   cache can hold at most that much of the data.
//! * **direct**: the ext4 mounted straight from the throttled device.
//! * **zmem**: `zmem serve --origin /dev/loopN` (its pool capped at
//!   `pool_percent` of the budget; zstd:3, dedup, every page that
//!   compresses at all kept: the settings measured best for an inclusive
//!   cache, below), its own FUSE file (`--fuse`; or with
//!   [`Frontend::Nbd`], nbdfuse over its NBD socket), a second loop device
//!   (direct I/O, the origin disk's read-ahead) over that file, the ext4
//!   mounted from that. zmem's memory counts in the budget: the reader's
//!   limit is budget − (the RSS of the server, and of nbdfuse), kept there
//!   by [`SharedBudget`] every 10 ms (never below [`reader_floor`]: an
//!   eighth of the budget, and at least 48 MiB, or fio itself is killed
//!   for want of memory; the report says how low the limit went, and with
//!   nbdfuse it is this floor).
//!
//! Both runs start with the kernel's caches dropped and an empty pool. The
//! first sequential pass is cold (every page comes from the origin once);
//! the next passes and the random reads are what the cache is for. Reported
//! per phase: MB/s, IOPS, the origin's read ops and bytes (its
//! `/sys/block/loopN/stat`); for zmem also hits, misses, pages not kept,
//! pages dropped for room, and its memory. Ratios zmem ÷ direct come from
//! the same run. Numbers only: nothing here passes or fails on speed.
//!
//! The cache is inclusive (a block device sees reads, not the page cache's
//! evictions, so a page read is in the pool and in the page cache at once);
//! zcache, fed by evictions, was exclusive. The pool therefore has to hold
//! the working set by itself, which is why it gets most of the budget, and
//! why it keeps pages that compress poorly too (zcache's half-page rule
//! assumed the page cache would hold them; here the pool squeezes it).
//! Measured on this machine's /usr/lib sample (budget 256 MiB, 522 MiB of
//! data, seq warm ÷ direct, through nbdfuse with 128 KiB read-ahead): lz4
//! keeping pages below half a page, pool 75 %: 1.06 (most pages refused);
//! zstd:3 keeping every page that compresses, 75 %: 2.18; with dedup,
//! 85 %: 2.30; 90 %: 2.37 and 2.55.
//!
//! **The frontend.** A single sequential reader of small files waits for
//! each request, so the path's latency, not the cache, set those figures:
//! with every page a hit, nbdfuse + loop gave 235–250 MB/s, and nbdkit's
//! file plugin serving the image from the host's page cache only
//! 245–280 MB/s, where zmem's own FUSE file gave 355 MB/s. nbdfuse's
//! memory (20–50 MiB, growing with the request size) also comes out of the
//! reader's budget. With `--fuse` (the default here) the same cache gives
//! 3.9–4.5 × sequential and 7.6–8.0 × random (0.05–0.24 × the origin's
//! read operations; 512 MiB in 9,467 files, five runs).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::zmem_stats;
use zmem_host::shared_budget::{device_rss_of, rss_of, BudgetStats, SharedBudget};
use zmem_host::{
    self as host, have, run_limited, run_tool, wait_for_file, wait_for_socket, ChildGuard, DiskStat, LoopDisk, MemCgroup, Step, Throttle, UnmountIfMounted,
};

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `zmem` binary that serves the cache.
    pub zmem: PathBuf,
    /// Where the image, the mounts and the sockets go (on a real disk).
    pub workdir: PathBuf,
    /// Where the data set's files come from.
    pub data_dir: PathBuf,
    /// The reader's memory: its page cache, and with zmem, zmem's memory too.
    pub budget: u64,
    /// Bytes of files in the data set [default: 2 × budget].
    pub data_bytes: Option<u64>,
    /// zmem's --max-pool, in percent of the budget.
    pub pool_percent: u32,
    pub compressor: String,
    /// zmem's --dedup.
    pub dedup: bool,
    /// zmem's --cache-max-compressed.
    pub max_compressed: u16,
    /// More arguments for `zmem serve` (`--dict auto`, …).
    pub zmem_args: Vec<String>,
    pub throttle: Throttle,
    /// Sequential passes after the cold one.
    pub warm_passes: u32,
    /// Seconds of random reads.
    pub random_secs: u64,
    /// fio jobs reading at random at once.
    pub random_jobs: u32,
    /// How the kernel reaches zmem's device.
    pub frontend: Frontend,
}

/// How the kernel reaches the device (this kernel has no nbd driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Frontend {
    /// `zmem serve --fuse`: the server's own FUSE file, one process on the
    /// path.
    Fuse,
    /// nbdfuse over zmem's NBD socket: two processes and a socket on the
    /// path (the NBD server as a client with a kernel driver would see it).
    Nbd,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            zmem: PathBuf::from("zmem"),
            workdir: PathBuf::from("/var/tmp/zmem-bench-cache"),
            data_dir: PathBuf::from("/usr/lib"),
            budget: 256 << 20,
            data_bytes: None,
            pool_percent: 90,
            compressor: "zstd:3".into(),
            dedup: true,
            max_compressed: 4095,
            zmem_args: Vec::new(),
            frontend: Frontend::Fuse,
            throttle: Throttle { iops: 3000, bps: 125_000_000 },
            warm_passes: 2,
            random_secs: 30,
            random_jobs: 2,
        }
    }
}

/// One phase of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub phase: String,
    pub secs: f64,
    pub mb_per_s: f64,
    pub iops: f64,
    /// What the origin device did meanwhile.
    pub origin: DiskStat,
}

/// zmem's side of its run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ZmemSide {
    pub hits: u64,
    pub misses: u64,
    pub hit_rate: f64,
    pub not_kept: u64,
    pub dropped_for_room: u64,
    pub stale: u64,
    /// Fetched pages not kept because the pool was full.
    pub not_admitted: u64,
    pub pool_pages: u64,
    pub mem_used_total: u64,
    pub max_pool: u64,
    /// zmem's (and nbdfuse's) RSS at the end.
    pub rss: u64,
    pub budget: BudgetStats,
    /// Whether the second loop device does direct I/O (else the kernel
    /// caches the FUSE file too).
    pub loop_direct_io: bool,
    /// The second loop device's read-ahead, set to the origin disk's: a
    /// loop device over a FUSE file gets the kernel's default (128 KiB)
    /// where the one over the host's disk inherits that disk's (2.5 MiB
    /// here), and the two runs are to read alike.
    pub read_ahead_kb: u64,
}

/// One configuration's run.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub target: String,
    pub phases: Vec<Phase>,
    /// The reader's cgroup's peak usage.
    pub cgroup_peak: u64,
    pub zmem: Option<ZmemSide>,
}

/// zmem ÷ direct.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ratios {
    pub seq_cold: f64,
    pub seq_warm: f64,
    pub random: f64,
    /// Origin read ops over the warm passes and the random reads.
    pub origin_read_ops: f64,
    pub origin_read_bytes: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub data_dir: String,
    pub data_files: u64,
    pub data_bytes: u64,
    pub budget: u64,
    pub max_pool: u64,
    pub compressor: String,
    pub dedup: bool,
    pub max_compressed: u16,
    pub zmem_args: Vec<String>,
    pub frontend: Frontend,
    pub throttle: Throttle,
    pub runs: Vec<Run>,
    pub ratios: Ratios,
}

const CGROUP: &str = "zmem-bench-cache";

/// A fixed, well-spread order of paths: FNV-1a, then splitmix64's
/// finaliser (FNV alone orders paths that differ in their last bytes
/// nearly by those bytes).
fn path_hash(p: &Path) -> u64 {
    crate::mix64(p.as_os_str().as_encoded_bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3)))
}

/// The data set: a sample of the regular, non-empty files under `dir`
/// (not following symbolic links), taken in the order of a hash of their
/// paths until `want` bytes (and at most 1 % more), so that it is spread
/// over the whole tree and the same on every run. Returns the paths and their total size.
fn pick_files(dir: &Path, want: u64) -> anyhow::Result<(Vec<PathBuf>, u64)> {
    let mut stack = vec![dir.to_path_buf()];
    let mut all = Vec::new();
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue }; // unreadable: not part of the set
        for p in rd.filter_map(Result::ok).map(|e| e.path()) {
            let Ok(m) = std::fs::symlink_metadata(&p) else { continue };
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() && m.len() > 0 {
                all.push((path_hash(&p), p, m.len()));
            }
        }
    }
    all.sort_unstable();
    let mut total = 0;
    let mut files = Vec::new();
    // A file that would take the total more than 1 % past `want` is
    // skipped (one big library would otherwise make the set 10 % bigger
    // on one machine than on the next).
    let most = want + want / 100;
    for (_, p, len) in all {
        if total >= want {
            break;
        }
        if total + len > most {
            continue;
        }
        total += len;
        files.push(p);
    }
    if total < want {
        bail!(
            "{} holds only {total} bytes of files in a set of at most {most} bytes; the data set needs {want} (give a smaller --budget or another --data-dir)",
            dir.display()
        );
    }
    Ok((files, total))
}

/// Copy `files` (absolute paths) under `dest`, keeping their paths.
fn copy_files(files: &[PathBuf], dest: &Path, scratch: &Path) -> anyhow::Result<()> {
    let list = scratch.join("files.list");
    let mut bytes = Vec::new();
    for f in files {
        bytes.extend_from_slice(f.as_os_str().as_encoded_bytes());
        bytes.push(0);
    }
    std::fs::write(&list, bytes)?;
    std::fs::create_dir_all(dest)?;
    let st = Command::new("sh")
        .arg("-c")
        .arg("tar -C / --null -T \"$1\" -cf - 2>/dev/null | tar -C \"$2\" -xf -")
        .arg("sh")
        .arg(&list)
        .arg(dest)
        .status()
        .context("running tar")?;
    if !st.success() {
        bail!("copying the data set into {} failed: {st}", dest.display());
    }
    Ok(())
}

/// fio over every file under `dir`, in the memory cgroup `cg`.
fn fio(cg: &MemCgroup, dir: &Path, args: &[String], limit: Duration) -> anyhow::Result<(f64, f64)> {
    let out = tempfile::NamedTempFile::new()?;
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("echo $$ > \"$1/cgroup.procs\" && shift && exec fio \"$@\"")
        .arg("sh")
        .arg(cg.path())
        .arg(format!("--opendir={}", dir.display()))
        .args(["--ioengine=psync", "--openfiles=64", "--group_reporting", "--output-format=json"])
        .arg(format!("--output={}", out.path().display()))
        .args(args);
    run_limited(&mut c, limit)?;
    let text = std::fs::read_to_string(out.path())?;
    // fio writes its warnings (files it skips) into the output file too.
    let json = text.find("\n{").map(|i| &text[i + 1..]).or_else(|| text.strip_prefix('{').map(|_| &text[..])).unwrap_or(&text);
    let v: serde_json::Value = serde_json::from_str(json).context("parsing fio's JSON")?;
    let j = &v["jobs"][0];
    if j["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio failed with error {}", j["error"]);
    }
    Ok((j["read"]["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6, j["read"]["iops"].as_f64().unwrap_or(0.0)))
}

/// The phases, against the ext4 mounted at `mnt`, reading the origin's
/// counters from `origin`.
fn phases(cfg: &Config, cg: &MemCgroup, mnt: &Path, origin: &str, progress: &mut impl FnMut(&str)) -> anyhow::Result<Vec<Phase>> {
    let data = mnt.join("data");
    let seq = |loops: u32| {
        vec!["--name=seq".to_string(), "--rw=read".into(), "--bs=128k".into(), "--file_service_type=sequential".into(), format!("--loops={loops}")]
    };
    let limit = Duration::from_secs(3600);
    let mut out = Vec::new();
    let mut run = |name: &str, args: Vec<String>| -> anyhow::Result<()> {
        progress(&format!("  {name}"));
        let before = DiskStat::of(origin);
        let t = Instant::now();
        let (mb, iops) = fio(cg, &data, &args, limit)?;
        out.push(Phase { phase: name.into(), secs: t.elapsed().as_secs_f64(), mb_per_s: mb, iops, origin: DiskStat::of(origin).since(&before) });
        Ok(())
    };
    run("seq cold", seq(1))?;
    run("seq warm", seq(cfg.warm_passes.max(1)))?;
    run(
        "random",
        vec![
            "--name=rand".into(),
            "--rw=randread".into(),
            "--bs=4k".into(),
            "--file_service_type=random".into(),
            "--randrepeat=0".into(),
            "--time_based=1".into(),
            format!("--runtime={}", cfg.random_secs.max(1)),
            format!("--numjobs={}", cfg.random_jobs.max(1)),
        ],
    )?;
    Ok(out)
}

/// Removes a scratch directory on drop (only once nothing is mounted in it).
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        if host::is_mounted_under(&self.0) {
            eprintln!("zmem: leaving {}: something is still mounted in it", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn run_direct(cfg: &Config, disk: &mut LoopDisk, progress: &mut impl FnMut(&str)) -> anyhow::Result<Run> {
    progress("direct: ext4 straight on the throttled disk");
    host::drop_caches()?;
    disk.mount("ro,noatime")?;
    let cg = MemCgroup::create(CGROUP, Some(cfg.budget), 0)?;
    let phases = phases(cfg, &cg, disk.mnt(), disk.dev(), progress);
    let peak = cg.counter("memory.max_usage_in_bytes");
    drop(cg);
    disk.unmount()?;
    Ok(Run { target: "direct".into(), phases: phases?, cgroup_peak: peak, zmem: None })
}

fn run_zmem(cfg: &Config, disk: &LoopDisk, max_pool: u64, progress: &mut impl FnMut(&str)) -> anyhow::Result<Run> {
    progress("zmem: ext4 on zmem serve --origin (the throttled disk)");
    host::drop_caches()?;
    let dir = cfg.workdir.join("zmem");
    std::fs::create_dir_all(&dir)?;
    let (sock, ctl, fuse_dir) = (dir.join("nbd.sock"), dir.join("ctl.sock"), dir.join("fuse"));
    let log = std::fs::File::create(dir.join("serve.log"))?;
    std::fs::create_dir_all(&fuse_dir)?;
    let mut serve = Command::new(&cfg.zmem);
    serve
        .args(["serve", "--origin"])
        .arg(disk.node())
        .args(["--max-pool", &max_pool.to_string(), "--compressor", &cfg.compressor])
        .args(["--cache-max-compressed", &cfg.max_compressed.to_string()])
        .args(["--dedup", if cfg.dedup { "on" } else { "off" }])
        .args(&cfg.zmem_args)
        .arg("--socket")
        .arg(&sock)
        .arg("--control")
        .arg(&ctl);
    if cfg.frontend == Frontend::Fuse {
        serve.arg("--fuse").arg(&fuse_dir);
    }
    let mut server = ChildGuard::spawn(&mut serve, log.into())?;
    // Unmounts the FUSE file if its server did not (nbdfuse's always;
    // zmem's if it had to be killed).
    let fuse_unmount = UnmountIfMounted(fuse_dir.clone());
    wait_for_socket(&sock, &mut server)?;
    let (mut nbdfuse, file) = match cfg.frontend {
        Frontend::Fuse => (None, fuse_dir.join("image")),
        Frontend::Nbd => (Some(ChildGuard::spawn(Command::new("nbdfuse").arg(&fuse_dir).arg("--unix").arg(&sock), Stdio::null())?), fuse_dir.join("nbd")),
    };
    wait_for_file(&file, nbdfuse.as_mut().unwrap_or(&mut server), &dir.join("serve.log"))?;
    let lo = run_tool(Command::new("losetup").args(["--find", "--show", "--direct-io=on", "--read-only"]).arg(&file))?.trim().to_string();
    let detach = Step::new(&format!("detach {lo}"), &["losetup", "-d", &lo]);
    let lo_name = lo.trim_start_matches("/dev/").to_string();
    let dio = host::read_trim(format!("/sys/block/{lo_name}/loop/dio")).is_ok_and(|v| v == "1");
    let ra = host::read_trim(format!("/sys/block/{}/queue/read_ahead_kb", disk.dev()))?;
    host::write_attr(format!("/sys/block/{lo_name}/queue/read_ahead_kb"), &ra)?;
    let read_ahead_kb = host::read_trim(format!("/sys/block/{lo_name}/queue/read_ahead_kb"))?.parse().unwrap_or(0);
    let mnt = cfg.workdir.join("mnt");
    run_tool(Command::new("mount").args(["-o", "ro,noatime", &lo]).arg(&mnt))?;
    let unmount = Step::new(&format!("unmount {}", mnt.display()), &["umount", mnt.to_str().unwrap_or_default()]);

    let cg = MemCgroup::create(CGROUP, Some(cfg.budget), 0)?;
    let (spid, fpid) = (server.pid(), nbdfuse.as_ref().map(|f| f.pid()));
    let keeper = SharedBudget::start(cg.path(), cfg.budget, reader_floor(cfg.budget), move || Some(device_rss_of(spid)? + fpid.and_then(rss_of).unwrap_or(0)))?;
    let phases = phases(cfg, &cg, &mnt, disk.dev(), progress);
    let budget = keeper.finish();
    let peak = cg.counter("memory.max_usage_in_bytes");
    let v = zmem_stats(&cfg.zmem, &ctl);
    let rss = device_rss_of(spid).unwrap_or(0) + fpid.and_then(rss_of).unwrap_or(0);
    drop(cg);
    drop(unmount);
    drop(detach);
    drop(nbdfuse);
    drop(server);
    drop(fuse_unmount);
    let phases = phases?;
    let v = v?;
    let (o, st) = (&v["origin"], &v["stats"]);
    let n = |x: &serde_json::Value, k: &str| x[k].as_u64().unwrap_or(0);
    let (hits, misses) = (n(o, "cache_hits"), n(o, "cache_misses"));
    Ok(Run {
        target: "zmem".into(),
        phases,
        cgroup_peak: peak,
        zmem: Some(ZmemSide {
            hits,
            misses,
            hit_rate: if hits + misses == 0 { 0.0 } else { hits as f64 / (hits + misses) as f64 },
            not_kept: n(o, "cache_refused"),
            dropped_for_room: n(o, "evicted_pages"),
            stale: n(o, "cache_stale"),
            not_admitted: n(o, "cache_not_admitted"),
            pool_pages: n(st, "orig_data_size") / 4096,
            mem_used_total: n(st, "mem_used_total"),
            max_pool,
            rss,
            budget,
            loop_direct_io: dio,
            read_ahead_kb,
        }),
    })
}

/// The least memory the reader keeps whatever zmem uses: an eighth of the
/// budget, at least 48 MiB, at most half the budget. With less, fio's own
/// memory and the pages being read ahead (2.5 MiB a file here, locked
/// until the slow device answers) do not fit and the memory cgroup kills
/// it: seen at 32 MiB through nbdfuse, whose RSS grows to 50 MiB.
pub fn reader_floor(budget: u64) -> u64 {
    (budget / 8).max(48 << 20).min(budget / 2)
}

fn phase<'a>(r: &'a Run, name: &str) -> Option<&'a Phase> {
    r.phases.iter().find(|p| p.phase == name)
}

fn ratios(direct: &Run, zmem: &Run) -> Ratios {
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let mb = |name: &str| div(phase(zmem, name).map_or(0.0, |p| p.mb_per_s), phase(direct, name).map_or(0.0, |p| p.mb_per_s));
    let origin = |r: &Run, f: fn(&DiskStat) -> u64| r.phases.iter().filter(|p| p.phase != "seq cold").map(|p| f(&p.origin)).sum::<u64>() as f64;
    Ratios {
        seq_cold: mb("seq cold"),
        seq_warm: mb("seq warm"),
        random: mb("random"),
        origin_read_ops: div(origin(zmem, |d| d.read_ops), origin(direct, |d| d.read_ops)),
        origin_read_bytes: div(origin(zmem, |d| d.read_bytes), origin(direct, |d| d.read_bytes)),
    }
}

/// Run the experiment (root only).
pub fn run(cfg: &Config, mut progress: impl FnMut(&str)) -> anyhow::Result<Report> {
    if rustix::process::geteuid().as_raw() != 0 {
        bail!("zmem bench cache needs root (loop devices, mounts, cgroups, blkio throttles)");
    }
    let nbdfuse = (cfg.frontend == Frontend::Nbd).then_some("nbdfuse");
    for t in ["fio", "losetup", "mkfs.ext4", "mount", "umount", "tar"].into_iter().chain(nbdfuse) {
        if !have(t) {
            bail!("`{t}` is missing (bash scripts/setup.sh installs it)");
        }
    }
    if cfg.pool_percent == 0 || cfg.pool_percent >= 100 {
        bail!("the pool's share of the budget must be between 1 and 99 percent, got {}", cfg.pool_percent);
    }
    let want = cfg.data_bytes.unwrap_or(cfg.budget * 2);
    let (files, bytes) = pick_files(&cfg.data_dir, want)?;
    progress(&format!("data set: {} files, {} MiB from {}", files.len(), bytes >> 20, cfg.data_dir.display()));
    let _ = std::fs::remove_dir_all(&cfg.workdir);
    std::fs::create_dir_all(&cfg.workdir).with_context(|| format!("cannot create {}", cfg.workdir.display()))?;
    // Dropped last: after the disk, its mount and the zmem stack are gone.
    let _workdir = RemoveDir(cfg.workdir.clone());
    // Blocks of 4 KiB per file, plus room for ext4's tables and journal.
    let blocks: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len().div_ceil(4096) * 4096).sum();
    let image_size = (blocks + blocks / 8 + (192 << 20)).div_ceil(1 << 20) << 20;
    let mut disk = LoopDisk::create(&cfg.workdir.join("origin.img"), image_size, &cfg.workdir.join("mnt"))?;
    progress(&format!("copying it onto the ext4 on {} ({} MiB image)", disk.dev(), image_size >> 20));
    copy_files(&files, &disk.mnt().join("data"), &cfg.workdir)?;
    disk.unmount()?;
    disk.throttle(Some(cfg.throttle))?;
    let max_pool = cfg.budget / 100 * cfg.pool_percent as u64;
    let direct = run_direct(cfg, &mut disk, &mut progress)?;
    let zmem = run_zmem(cfg, &disk, max_pool, &mut progress)?;
    drop(disk);
    Ok(Report {
        data_dir: cfg.data_dir.display().to_string(),
        data_files: files.len() as u64,
        data_bytes: bytes,
        budget: cfg.budget,
        max_pool,
        compressor: cfg.compressor.clone(),
        dedup: cfg.dedup,
        max_compressed: cfg.max_compressed,
        zmem_args: cfg.zmem_args.clone(),
        frontend: cfg.frontend,
        throttle: cfg.throttle,
        ratios: ratios(&direct, &zmem),
        runs: vec![direct, zmem],
    })
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1 << 20) as f64)
}

/// The report as a table.
pub fn render(r: &Report) -> String {
    let mut s = format!(
        "data: {} files, {} from {}; reader's budget {} (zmem's pool at most {}, {}{}, pages kept below {} B{}; {}); origin throttled to {} IOPS, {} MB/s\n\n",
        r.data_files,
        mib(r.data_bytes),
        r.data_dir,
        mib(r.budget),
        mib(r.max_pool),
        r.compressor,
        if r.dedup { ", dedup" } else { "" },
        r.max_compressed,
        if r.zmem_args.is_empty() { String::new() } else { format!(", {}", r.zmem_args.join(" ")) },
        match r.frontend {
            Frontend::Fuse => "its own FUSE file",
            Frontend::Nbd => "nbdfuse over NBD",
        },
        r.throttle.iops,
        r.throttle.bps / 1_000_000
    );
    s += &format!("{:<8} {:<9} {:>8} {:>10} {:>10} {:>12} {:>12}\n", "target", "phase", "secs", "MB/s", "IOPS", "origin reads", "origin MiB");
    for run in &r.runs {
        for p in &run.phases {
            s += &format!(
                "{:<8} {:<9} {:>8.1} {:>10.1} {:>10.0} {:>12} {:>12.1}\n",
                run.target,
                p.phase,
                p.secs,
                p.mb_per_s,
                p.iops,
                p.origin.read_ops,
                p.origin.read_bytes as f64 / (1 << 20) as f64
            );
        }
    }
    if let Some(z) = r.runs.iter().find_map(|run| run.zmem.as_ref()) {
        s += &format!(
            "\nzmem: {} hits, {} misses (hit rate {:.1}%), {} pages not kept (compress to {} B or more), {} not admitted (pool full), {} dropped for room, {} stale fetches; pool {} pages in {}; {} RSS {} (peak pool gauge {}); reader's limit down to {}; loop direct I/O {}, read-ahead {} KiB (as the origin disk's)\n",
            z.hits,
            z.misses,
            100.0 * z.hit_rate,
            z.not_kept,
            r.max_compressed,
            z.not_admitted,
            z.dropped_for_room,
            z.stale,
            z.pool_pages,
            mib(z.mem_used_total),
            if r.frontend == Frontend::Nbd { "zmem+nbdfuse" } else { "zmem" },
            mib(z.rss),
            mib(z.budget.pool_peak),
            mib(z.budget.limit_min),
            if z.loop_direct_io { "on" } else { "off" },
            z.read_ahead_kb
        );
    }
    for run in &r.runs {
        s += &format!("{}: reader's cgroup peak {}\n", run.target, mib(run.cgroup_peak));
    }
    let x = &r.ratios;
    s += &format!(
        "\nzmem ÷ direct: seq cold {:.2}, seq warm {:.2} (zcache: 2.5), random {:.2} (zcache: 3), origin read ops {:.2} (goal ≤ 0.3), origin read bytes {:.2}\n",
        x.seq_cold, x.seq_warm, x.random, x.origin_read_ops, x.origin_read_bytes
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_a_fixed_sample_until_enough() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..400 {
            let f = d.path().join(format!("d{}/f{i}", i % 4));
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, vec![1u8; 10]).unwrap();
        }
        std::fs::write(d.path().join("empty"), b"").unwrap();
        // Bigger than the whole set may be (`want` + 1 %): never taken,
        // wherever its path's hash puts it in the order.
        std::fs::write(d.path().join("d1/big"), vec![2u8; 2000]).unwrap();
        std::os::unix::fs::symlink(d.path().join("d0/f0"), d.path().join("link")).unwrap();
        let (files, total) = pick_files(d.path(), 995).unwrap();
        assert_eq!((files.len(), total), (100, 1000));
        assert!(files.iter().all(|f| f.to_str().unwrap().contains("/d") && !f.ends_with("big")), "no empty file, no link, not the big file: {files:?}");
        for i in 0..4 {
            let n = files.iter().filter(|f| f.to_str().unwrap().contains(&format!("/d{i}/"))).count();
            assert!((5..=60).contains(&n), "spread over the tree: {n} of 100 from d{i}");
        }
        assert_eq!(pick_files(d.path(), 995).unwrap().0, files, "the same every time");
        let e = pick_files(d.path(), 1 << 20).unwrap_err().to_string();
        assert!(e.contains("holds only 6000 bytes"), "{e}");
        // Where the set may be big enough for it, the big file is taken
        // (without it the tree holds only 4000 bytes).
        let (files, total) = pick_files(d.path(), 5990).unwrap();
        assert!((5990..=6000).contains(&total) && files.iter().any(|f| f.ends_with("big")), "{total}: {files:?}");
    }

    fn run_of(target: &str, mbs: [f64; 3], ops: [u64; 3]) -> Run {
        let names = ["seq cold", "seq warm", "random"];
        Run {
            target: target.into(),
            phases: (0..3)
                .map(|i| Phase {
                    phase: names[i].into(),
                    secs: 1.0,
                    mb_per_s: mbs[i],
                    iops: 1.0,
                    origin: DiskStat { read_ops: ops[i], read_bytes: ops[i] * 4096, ..Default::default() },
                })
                .collect(),
            cgroup_peak: 0,
            zmem: None,
        }
    }

    #[test]
    fn ratios_compare_the_same_phases_and_leave_out_the_cold_pass() {
        let d = run_of("direct", [100.0, 100.0, 10.0], [1000, 800, 200]);
        let z = run_of("zmem", [90.0, 300.0, 40.0], [1000, 100, 0]);
        let r = ratios(&d, &z);
        assert!((r.seq_cold - 0.9).abs() < 1e-9 && (r.seq_warm - 3.0).abs() < 1e-9 && (r.random - 4.0).abs() < 1e-9);
        assert!((r.origin_read_ops - 0.1).abs() < 1e-9, "{r:?}");
        let text = render(&Report {
            data_dir: "/usr/lib".into(),
            data_files: 3,
            data_bytes: 1 << 30,
            budget: 256 << 20,
            max_pool: 192 << 20,
            compressor: "lz4".into(),
            dedup: false,
            max_compressed: 2048,
            zmem_args: vec![],
            frontend: Frontend::Nbd,
            throttle: Throttle { iops: 3000, bps: 125_000_000 },
            ratios: r,
            runs: vec![d, z],
        });
        assert!(text.contains("seq warm 3.00") && text.contains("origin read ops 0.10") && text.contains("nbdfuse over NBD"), "{text}");
    }

    #[test]
    fn the_reader_keeps_at_least_48_mib_and_at_most_half() {
        assert_eq!(reader_floor(256 << 20), 48 << 20);
        assert_eq!(reader_floor(1 << 30), 128 << 20);
        assert_eq!(reader_floor(96 << 20), 48 << 20);
        assert_eq!(reader_floor(64 << 20), 32 << 20);
    }
}
