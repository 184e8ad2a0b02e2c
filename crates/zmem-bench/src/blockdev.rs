//! `zmem bench blockdev`: the NBD block device against its neighbours.
//!
//! The same fio jobs, with the same data, against:
//! * **zmem**: `zmem serve` (the binary in [`Config::zmem`]) over a Unix
//!   socket, fio's `nbd` engine (libnbd);
//! * **nbdkit**: `nbdkit memory SIZE allocator=zstd` (a compressed RAM disk
//!   in userspace), same engine, same transport;
//! * **nbdkit-raw**: `nbdkit memory SIZE` (uncompressed RAM): what the NBD
//!   transport alone costs, the ceiling for any server behind it;
//! * **zram**: kernel zram (as root) with the same algorithm if the kernel
//!   has it, fio `io_uring` with `O_DIRECT` on `/dev/zramN` (a
//!   [`kernel_zram::Device`]);
//! * **zmem-fuse**: the block device `zmem swap` builds (as root): `zmem
//!   serve --fuse`, a loop device with direct I/O over its FUSE file, fio
//!   `io_uring` with `O_DIRECT` on `/dev/loopN`, as on zram.
//!
//! Jobs, in order, each on a fresh device: `fill`, `randread`, `read-qd1`,
//! `randwrite` (4 KiB, time-based; the random jobs at `iodepth`, `read-qd1`
//! one synchronous read at a time, fio's `psync` engine, or `nbd` at depth
//! 1: what a swap-in waits for), `seqread` (1 MiB). Every job reports its
//! mean and p99 completion latency. Every device is
//! first filled with **real data**: the first `size` bytes (rounded down
//! to 1 MiB) of `data`, by default a tar of `/usr/lib/x86_64-linux-gnu`
//! kept in `bench-data/usrlib.tar` (created if missing). The fill goes
//! through a real client: `nbdcopy --request-size=1M` from a pipe for the
//! NBD servers, `dd bs=1M oflag=direct` for zram; the `fill` row is that
//! copy, timed (IOPS = 1 MiB requests per second). nbdcopy and dd both write
//! zero blocks the cheap way (a zero request / a zram same-filled page).
//! The random and sequential jobs then run over the filled range only, so
//! every 4 KiB read decompresses real data.
//!
//! fio cannot write a file's content at random offsets, so `randwrite`
//! writes fio's `buffer_compress_percentage` data (refilled for every
//! write, chunked per 4 KiB) at the compressibility **measured on the real
//! data**: `100 * (1 - compr_data_size / orig_data_size)` of zmem's pool
//! after its fill (`zmem stat`; override with `compress_percentage`). Each
//! written page then compresses about as well as the tar does on average.
//!
//! After `fill`, memory is read from each target: the pool's
//! `mem_used_total` (zmem), zram's `mm_stat` `mem_used_total`, and the
//! process RSS growth for the userspace servers (nbdkit reports no
//! accounting of its own). Ratios (zmem / nbdkit, zmem / zram) are computed
//! for every job's IOPS and for memory, from the same run.
//!
//! Numbers only: nothing here passes or fails on speed. The userspace
//! servers pay for a socket round trip and copies that zram does not; the
//! comparison between zmem and nbdkit is the like-for-like one.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::kernel_zram;
use crate::zmem_stats;
use zmem_host::shared_budget::{device_rss_of, served_by};
use zmem_host::{cpu_secs, have, run_limited, run_tool, wait_for_file, wait_for_socket, ChildGuard, Step, UnmountIfMounted};

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `zmem` binary (for `zmem serve` and `zmem stat`).
    pub zmem: PathBuf,
    /// Device size for every target: a multiple of 1 MiB, at least 4 MiB.
    pub size: u64,
    /// zmem's compressor (zram uses the same if the kernel has it).
    pub compressor: String,
    /// zmem dedup.
    pub dedup: bool,
    /// Seconds for each time-based random job.
    pub runtime: u64,
    /// fio iodepth for the random jobs.
    pub iodepth: u32,
    /// fio buffer_compress_percentage for randwrite data (`None`: the fill
    /// data's compressibility, measured by zmem's pool).
    pub compress_percentage: Option<u32>,
    /// Fill source (`None`: bench-data/usrlib.tar, a tar of
    /// /usr/lib/x86_64-linux-gnu, created if missing).
    pub data: Option<PathBuf>,
    /// Run the nbdkit targets.
    pub nbdkit: bool,
    /// Run kernel zram (as root).
    pub zram: bool,
    /// Run the FUSE file + loop device target (as root).
    pub fuse: bool,
}

/// One job's figures on one target.
#[derive(Debug, Clone, Serialize)]
pub struct JobResult {
    pub job: String,
    pub mb_per_s: f64,
    pub iops: f64,
    pub mean_us: f64,
    pub p99_us: f64,
    /// CPU (user + system) the serving process used per request, in µs:
    /// userspace servers only, not `fill`.
    pub server_us_per_io: Option<f64>,
}

/// One target's jobs and memory, or why it was skipped.
#[derive(Debug, Clone, Serialize)]
pub struct TargetResult {
    pub target: String,
    pub detail: String,
    pub jobs: Vec<JobResult>,
    /// Memory the target reports for what `fill` stored (its own accounting).
    pub mem_used_bytes: Option<u64>,
    /// RSS growth of the server process across `fill` (userspace targets).
    pub rss_growth_bytes: Option<u64>,
    pub skipped: Option<String>,
}

/// zmem's figures over another target's: `<job>_iops` and `memory`.
/// `None` where either was skipped.
pub type Ratios = Option<BTreeMap<String, f64>>;

/// zmem against each other target.
#[derive(Debug, Clone, Serialize)]
pub struct RatioSet {
    pub zmem_vs_nbdkit: Ratios,
    pub zmem_vs_nbdkit_raw: Ratios,
    pub zmem_vs_zram: Ratios,
    pub zmem_fuse_vs_zram: Ratios,
}

/// A whole run. (`zmem bench blockdev --json` prints it through a
/// `serde_json::Value`, whose objects order their keys by name.)
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub size: u64,
    pub data: PathBuf,
    pub fill_bytes: u64,
    pub runtime_s: u64,
    pub iodepth: u32,
    pub compress_percentage: u32,
    /// zmem, nbdkit, nbdkit-raw, zram, zmem-fuse, in this order.
    pub targets: Vec<TargetResult>,
    pub ratios: RatioSet,
}

struct Job {
    name: &'static str,
    rw: &'static str,
    bs: &'static str,
    time_based: bool,
    /// One synchronous request at a time (else `iodepth` for 4 KiB jobs).
    sync: bool,
}

const JOBS: [Job; 5] = [
    Job { name: "fill", rw: "write", bs: "1M", time_based: false, sync: false },
    Job { name: "randread", rw: "randread", bs: "4k", time_based: true, sync: false },
    Job { name: "read-qd1", rw: "randread", bs: "4k", time_based: true, sync: true },
    Job { name: "randwrite", rw: "randwrite", bs: "4k", time_based: true, sync: false },
    Job { name: "seqread", rw: "read", bs: "1M", time_based: false, sync: false },
];

/// What every target is filled with, and how the random jobs write.
struct Plan {
    data: PathBuf,
    /// Bytes of `data` written to each device (a multiple of 1 MiB).
    fill_len: u64,
    /// fio buffer_compress_percentage for randwrite (set after zmem's fill
    /// unless given).
    compress_percentage: u32,
}

/// The default fill source: a tar of /usr/lib/x86_64-linux-gnu.
const DEFAULT_DATA: &str = "bench-data/usrlib.tar";
const DEFAULT_DATA_DIR: &str = "/usr/lib/x86_64-linux-gnu";

fn prepare_data(cfg: &Config, progress: &mut impl FnMut(&str)) -> anyhow::Result<PathBuf> {
    if let Some(p) = &cfg.data {
        if !p.is_file() {
            bail!("--data {}: not a file", p.display());
        }
        return Ok(p.clone());
    }
    let p = PathBuf::from(DEFAULT_DATA);
    if p.is_file() {
        return Ok(p);
    }
    if !Path::new(DEFAULT_DATA_DIR).is_dir() {
        bail!("{DEFAULT_DATA_DIR} does not exist: pass --data FILE");
    }
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d)?;
    }
    progress(&format!("creating {} (tar of {DEFAULT_DATA_DIR})", p.display()));
    let tmp = p.with_extension("tar.part");
    let st = Command::new("tar")
        .args(["cf"])
        .arg(&tmp)
        .args(["-C", "/", DEFAULT_DATA_DIR.trim_start_matches('/')])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running tar")?;
    // GNU tar exits 1 when files changed while being read; the archive is
    // still usable as data.
    if !matches!(st.code(), Some(0) | Some(1)) {
        bail!("tar of {DEFAULT_DATA_DIR} failed: {st}");
    }
    std::fs::rename(&tmp, &p)?;
    Ok(p)
}

/// Fill a device with the first `plan.fill_len` bytes of the data through a
/// real client; returns the `fill` row (1 MiB requests).
fn fill(plan: &Plan, engine: &str, target: &str) -> anyhow::Result<JobResult> {
    let t0 = Instant::now();
    if engine == "nbd" {
        // nbdcopy wants the source no larger than the destination: feed it
        // exactly fill_len bytes through a pipe.
        let mut child = Command::new("nbdcopy")
            .args(["--request-size=1048576", "--", "-", target])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting nbdcopy")?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let mut f = std::fs::File::open(&plan.data).with_context(|| format!("opening {}", plan.data.display()))?.take(plan.fill_len);
        let copied = std::io::copy(&mut f, &mut stdin);
        drop(stdin);
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("nbdcopy failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        if copied? != plan.fill_len {
            bail!("{} is shorter than expected", plan.data.display());
        }
    } else {
        let mut c = Command::new("dd");
        c.arg(format!("if={}", plan.data.display()))
            .arg(format!("of={target}"))
            .args(["bs=1M", "iflag=fullblock", "oflag=direct", "status=none"])
            .arg(format!("count={}", plan.fill_len >> 20));
        run_limited(&mut c, Duration::from_secs(600))?;
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-6);
    let iops = (plan.fill_len >> 20) as f64 / secs;
    Ok(JobResult { job: "fill".into(), mb_per_s: plan.fill_len as f64 / secs / 1e6, iops, mean_us: 1e6 / iops, p99_us: 0.0, server_us_per_io: None })
}

/// Run one fio job over the filled range; `target` is either ("nbd", uri)
/// or ("io_uring", path). Returns the job's figures and its request count.
fn fio(cfg: &Config, plan: &Plan, job: &Job, engine: &str, target: &str) -> anyhow::Result<(JobResult, f64)> {
    let mut c = Command::new("fio");
    c.args([
        "--output-format=json",
        &format!("--name={}", job.name),
        &format!("--rw={}", job.rw),
        &format!("--bs={}", job.bs),
        &format!("--size={}", plan.fill_len),
        &format!("--buffer_compress_percentage={}", plan.compress_percentage),
        "--buffer_compress_chunk=4096",
        "--refill_buffers=1",
        "--randseed=1234",
        "--norandommap=1",
        "--randrepeat=0",
        &format!(
            "--iodepth={}",
            if job.sync {
                1
            } else if job.bs == "4k" {
                cfg.iodepth
            } else {
                4
            }
        ),
    ]);
    if job.time_based {
        c.args(["--time_based=1", &format!("--runtime={}", cfg.runtime.max(1))]);
    }
    match engine {
        "nbd" => c.args(["--ioengine=nbd", &format!("--uri={target}")]),
        _ => c.args([if job.sync { "--ioengine=psync" } else { "--ioengine=io_uring" }, "--direct=1", &format!("--filename={target}")]),
    };
    let limit = Duration::from_secs(cfg.runtime.max(1) + 300);
    let out = run_limited(&mut c, limit)?;
    // fio's nbd engine prints "fio: connected to NBD server" before the JSON.
    let json = out.find("\n{").map(|i| &out[i + 1..]).unwrap_or(&out);
    let v: serde_json::Value = serde_json::from_str(json).context("parsing fio's JSON")?;
    let j = &v["jobs"][0];
    if j["error"].as_i64().unwrap_or(0) != 0 {
        bail!("fio job {} failed with error {}", job.name, j["error"]);
    }
    let side = if job.rw.contains("read") { &j["read"] } else { &j["write"] };
    let p99 = side["clat_ns"]["percentile"]["99.000000"].as_f64().unwrap_or(0.0) / 1000.0;
    let r = JobResult {
        job: job.name.to_string(),
        mb_per_s: side["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        iops: side["iops"].as_f64().unwrap_or(0.0),
        mean_us: side["clat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1000.0,
        p99_us: p99,
        server_us_per_io: None,
    };
    Ok((r, side["total_ios"].as_f64().unwrap_or(0.0)))
}

/// Fill (timed: the `fill` row), or fill then run `job`; with the CPU
/// the serving process `server` used during the job.
fn fill_and_run(cfg: &Config, plan: &Plan, job: &Job, engine: &str, target: &str, server: Option<u32>) -> anyhow::Result<JobResult> {
    let f = fill(plan, engine, target)?;
    if job.name == "fill" {
        return Ok(f);
    }
    let cpu0 = server.and_then(cpu_secs);
    let (mut r, ios) = fio(cfg, plan, job, engine, target)?;
    r.server_us_per_io = match (cpu0, server.and_then(cpu_secs)) {
        (Some(a), Some(b)) if ios > 0.0 => Some((b - a) * 1e6 / ios),
        _ => None,
    };
    Ok(r)
}

/// How much the resident memory of the device `pid` started grew past
/// `rss0` (its server's and its keeper's own: `device_rss_of`).
fn rss_growth(pid: u32, rss0: Option<u64>) -> Option<u64> {
    device_rss_of(pid).zip(rss0).map(|(b, a)| b.saturating_sub(a))
}

/// `zmem serve` with the bench's settings, on NBD socket `sock` and control
/// socket `ctl`.
fn serve(cfg: &Config, sock: &Path, ctl: &Path) -> Command {
    let mut c = Command::new(&cfg.zmem);
    c.args(["serve", "--size", &cfg.size.to_string(), "--compressor", &cfg.compressor])
        .args(["--dedup", if cfg.dedup { "on" } else { "off" }])
        .arg("--socket")
        .arg(sock)
        .arg("--control")
        .arg(ctl);
    c
}

fn bench_zmem(cfg: &Config, plan: &mut Plan, dir: &Path) -> anyhow::Result<TargetResult> {
    let sock = dir.join("zmem.sock");
    let ctl = dir.join("zmem.ctl");
    let mut jobs = Vec::new();
    let (mut mem, mut rss) = (None, None);
    for job in &JOBS {
        // A fresh device per job: every job sees the same starting state
        // (freshly filled with the data).
        let mut server = ChildGuard::spawn(&mut serve(cfg, &sock, &ctl), Stdio::null())?;
        wait_for_socket(&sock, &mut server)?;
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        let rss0 = device_rss_of(server.pid());
        jobs.push(fill_and_run(cfg, plan, job, "nbd", &uri, Some(served_by(server.pid())))?);
        if job.name == "fill" {
            let v = zmem_stats(&cfg.zmem, &ctl)?;
            let st = &v["stats"];
            mem = st["mem_used_total"].as_u64();
            rss = rss_growth(server.pid(), rss0);
            if cfg.compress_percentage.is_none() {
                let orig = st["orig_data_size"].as_u64().unwrap_or(0);
                let compr = st["compr_data_size"].as_u64().unwrap_or(0);
                if orig > 0 {
                    let saved = 100.0 * (1.0 - compr as f64 / orig as f64);
                    plan.compress_percentage = saved.round().clamp(0.0, 99.0) as u32;
                }
            }
        }
        drop(server);
    }
    Ok(TargetResult {
        target: "zmem".into(),
        detail: format!("{}{}, nbd over unix socket", cfg.compressor, if cfg.dedup { "+dedup" } else { "" }),
        jobs,
        mem_used_bytes: mem,
        rss_growth_bytes: rss,
        skipped: None,
    })
}

/// `nbdkit memory` with `allocator` (`None`: its default, uncompressed).
fn bench_nbdkit(cfg: &Config, plan: &Plan, dir: &Path, allocator: Option<&str>) -> anyhow::Result<TargetResult> {
    let sock = dir.join("nbdkit.sock");
    let mut jobs = Vec::new();
    let mut rss = None;
    for job in &JOBS {
        let _ = std::fs::remove_file(&sock);
        let mut server = ChildGuard::spawn(
            Command::new("nbdkit").args(["-f", "-U"]).arg(&sock).args(["memory", &cfg.size.to_string()]).args(allocator.map(|al| format!("allocator={al}"))),
            Stdio::null(),
        )?;
        wait_for_socket(&sock, &mut server)?;
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        let rss0 = device_rss_of(server.pid());
        jobs.push(fill_and_run(cfg, plan, job, "nbd", &uri, Some(served_by(server.pid())))?);
        if job.name == "fill" {
            rss = rss_growth(server.pid(), rss0);
        }
        drop(server);
    }
    Ok(TargetResult {
        target: if allocator.is_some() { "nbdkit" } else { "nbdkit-raw" }.into(),
        detail: format!("memory {}, nbd over unix socket", allocator.map_or("(uncompressed)".into(), |al| format!("allocator={al}"))),
        jobs,
        mem_used_bytes: None,
        rss_growth_bytes: rss,
        skipped: None,
    })
}

fn bench_zram(cfg: &Config, plan: &Plan) -> anyhow::Result<TargetResult> {
    // zmem's LZO against the kernel's default LZO flavour; a zstd level
    // has no zram equivalent.
    let alg = match cfg.compressor.split(':').next().unwrap_or("") {
        "lzo" => "lzo-rle".to_string(),
        x => x.to_string(),
    };
    let mut jobs = Vec::new();
    let mut mem = None;
    let mut dev = String::new();
    for job in &JOBS {
        // A fresh device per job; dropping it resets it.
        let z = kernel_zram::Device::configure(&alg, cfg.size, None)?;
        dev = z.name().to_string();
        let target = z.node().to_string_lossy().into_owned();
        jobs.push(fill_and_run(cfg, plan, job, "io_uring", &target, None)?);
        if job.name == "fill" {
            mem = Some(z.mm_stat()?.mem_used_total);
        }
    }
    Ok(TargetResult {
        target: "zram".into(),
        detail: format!("kernel {dev}, {alg}, fio io_uring O_DIRECT"),
        jobs,
        mem_used_bytes: mem,
        rss_growth_bytes: None,
        skipped: None,
    })
}

/// The swap frontend's block device: `zmem serve --fuse`, and a loop device
/// with direct I/O over its file.
fn bench_zmem_fuse(cfg: &Config, plan: &Plan, dir: &Path) -> anyhow::Result<TargetResult> {
    let (sock, ctl, mnt, log) = (dir.join("fuse.sock"), dir.join("fuse.ctl"), dir.join("fuse"), dir.join("fuse-serve.log"));
    std::fs::create_dir_all(&mnt)?;
    let mut jobs = Vec::new();
    let (mut mem, mut rss) = (None, None);
    for job in &JOBS {
        let mut cmd = serve(cfg, &sock, &ctl);
        cmd.arg("--fuse").arg(&mnt);
        let mut server = ChildGuard::spawn(&mut cmd, std::fs::File::create(&log)?.into())?;
        // Unmounts the file if its server did not (it had to be killed).
        let unmount = UnmountIfMounted(mnt.clone());
        let image = mnt.join("image");
        wait_for_file(&image, &mut server, &log)?;
        let lo = run_tool(Command::new("losetup").args(["--find", "--show", "--direct-io=on"]).arg(&image))?.trim().to_string();
        let detach = Step::new(&format!("detach {lo}"), &["losetup", "-d", &lo]);
        let rss0 = device_rss_of(server.pid());
        jobs.push(fill_and_run(cfg, plan, job, "io_uring", &lo, Some(served_by(server.pid())))?);
        if job.name == "fill" {
            mem = zmem_stats(&cfg.zmem, &ctl)?["stats"]["mem_used_total"].as_u64();
            rss = rss_growth(server.pid(), rss0);
        }
        // The loop device first (the server unmounts its file as it stops).
        drop(detach);
        drop(server);
        drop(unmount);
    }
    Ok(TargetResult {
        target: "zmem-fuse".into(),
        detail: format!("{}{}, FUSE file + loop device (direct I/O), fio io_uring O_DIRECT", cfg.compressor, if cfg.dedup { "+dedup" } else { "" }),
        jobs,
        mem_used_bytes: mem,
        rss_growth_bytes: rss,
        skipped: None,
    })
}

fn skipped(target: &str, why: String) -> TargetResult {
    TargetResult { target: target.into(), detail: String::new(), jobs: vec![], mem_used_bytes: None, rss_growth_bytes: None, skipped: Some(why) }
}

/// zmem's figure over another target's, per job (IOPS) and for memory.
fn ratios(zmem: &TargetResult, other: &TargetResult) -> Ratios {
    if other.skipped.is_some() || zmem.skipped.is_some() {
        return None;
    }
    let mut m = BTreeMap::new();
    for j in &zmem.jobs {
        if let Some(o) = other.jobs.iter().find(|o| o.job == j.job) {
            if o.iops > 0.0 {
                m.insert(format!("{}_iops", j.job), j.iops / o.iops);
            }
        }
    }
    // Like with like: the targets' own accounting where the other has one
    // (zram), else process RSS growth (nbdkit).
    let mem = match other.mem_used_bytes {
        Some(o) => zmem.mem_used_bytes.zip(Some(o)),
        None => zmem.rss_growth_bytes.zip(other.rss_growth_bytes),
    };
    if let Some((z, o)) = mem {
        if o > 0 {
            m.insert("memory".into(), z as f64 / o as f64);
        }
    }
    Some(m)
}

/// Run the bench; `progress` hears of slow preparations (creating the
/// default data).
pub fn run(cfg: &Config, mut progress: impl FnMut(&str)) -> anyhow::Result<Report> {
    if !have("fio") {
        bail!("fio is not installed (scripts/setup.sh installs it)");
    }
    if cfg.size < (4 << 20) || !cfg.size.is_multiple_of(1 << 20) {
        bail!("--size must be a multiple of 1 MiB, at least 4 MiB");
    }
    if !have("nbdcopy") {
        bail!("nbdcopy is not installed (libnbd-bin; scripts/setup.sh installs it)");
    }
    let data = prepare_data(cfg, &mut progress)?;
    let data_len = std::fs::metadata(&data)?.len();
    let fill_len = cfg.size.min(data_len) & !((1 << 20) - 1);
    if fill_len < (4 << 20) {
        bail!("{}: at least 4 MiB of data are needed", data.display());
    }
    let mut plan = Plan { data, fill_len, compress_percentage: cfg.compress_percentage.unwrap_or(50).min(99) };
    let dir = tempfile::Builder::new().prefix("zmem-bench-").tempdir()?;
    let mut targets = vec![bench_zmem(cfg, &mut plan, dir.path()).context("zmem")?];
    for (name, allocator) in [("nbdkit", Some("zstd")), ("nbdkit-raw", None)] {
        targets.push(if !cfg.nbdkit {
            skipped(name, "--no-nbdkit".into())
        } else if !have("nbdkit") {
            skipped(name, "nbdkit is not installed".into())
        } else {
            bench_nbdkit(cfg, &plan, dir.path(), allocator).unwrap_or_else(|e| skipped(name, format!("{e:#}")))
        });
    }
    let root = zmem_rig::effective_uid() == Some(0);
    targets.push(if !cfg.zram {
        skipped("zram", "--no-zram".into())
    } else if !root {
        skipped("zram", "needs root".into())
    } else {
        bench_zram(cfg, &plan).unwrap_or_else(|e| skipped("zram", format!("{e:#}")))
    });
    let name = "zmem-fuse";
    targets.push(if !cfg.fuse {
        skipped(name, "--no-fuse".into())
    } else if !root {
        skipped(name, "needs root".into())
    } else if !have("losetup") {
        skipped(name, "losetup is not installed".into())
    } else {
        bench_zmem_fuse(cfg, &plan, dir.path()).context(name)?
    });
    let ratios = RatioSet {
        zmem_vs_nbdkit: ratios(&targets[0], &targets[1]),
        zmem_vs_nbdkit_raw: ratios(&targets[0], &targets[2]),
        zmem_vs_zram: ratios(&targets[0], &targets[3]),
        zmem_fuse_vs_zram: ratios(&targets[4], &targets[3]),
    };
    Ok(Report {
        size: cfg.size,
        data: plan.data,
        fill_bytes: plan.fill_len,
        runtime_s: cfg.runtime,
        iodepth: cfg.iodepth,
        compress_percentage: plan.compress_percentage,
        targets,
        ratios,
    })
}

/// The report as tables: every job on every target, then memory after
/// `fill`, then zmem's ratios to each other target.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    out += &format!(
        "zmem bench blockdev: {} MiB device filled with {} MiB of {}; randwrite data {}% compressible (fio); 4k jobs iodepth {} for {} s; MB/s = 10^6 B/s\n",
        r.size >> 20,
        r.fill_bytes >> 20,
        r.data.display(),
        r.compress_percentage,
        r.iodepth,
        r.runtime_s
    );
    out += &format!("{:<15} {:<10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "TARGET", "JOB", "MB/s", "IOPS", "mean us", "p99 us", "srv us/io");
    for t in &r.targets {
        if let Some(why) = &t.skipped {
            out += &format!("{:<15} skipped: {why}\n", t.target);
            continue;
        }
        for j in &t.jobs {
            let srv = j.server_us_per_io.map_or("-".to_string(), |u| format!("{u:.1}"));
            out += &format!("{:<15} {:<10} {:>10.1} {:>10.0} {:>10.1} {:>10.1} {:>10}\n", t.target, j.job, j.mb_per_s, j.iops, j.mean_us, j.p99_us, srv);
        }
    }
    out.push('\n');
    out += &format!("{:<15} {:>14} {:>14}  detail\n", "TARGET", "MEM AFTER FILL", "RSS GROWTH");
    let mib = |v: Option<u64>| v.map(|b| format!("{:.1} MiB", b as f64 / 1048576.0)).unwrap_or_else(|| "-".into());
    for t in r.targets.iter().filter(|t| t.skipped.is_none()) {
        out += &format!("{:<15} {:>14} {:>14}  {}\n", t.target, mib(t.mem_used_bytes), mib(t.rss_growth_bytes), t.detail);
    }
    let q = &r.ratios;
    let pairs = [
        ("zmem", "nbdkit", &q.zmem_vs_nbdkit),
        ("zmem", "nbdkit-raw", &q.zmem_vs_nbdkit_raw),
        ("zmem", "zram", &q.zmem_vs_zram),
        ("zmem-fuse", "zram", &q.zmem_fuse_vs_zram),
    ];
    for (ours, name, v) in pairs {
        if let Some(m) = v {
            let parts: Vec<String> = m.iter().map(|(k, x)| format!("{k} {x:.2}")).collect();
            out += &format!("{ours} / {name}: {}\n", parts.join(", "));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(name: &str, iops: &[(&str, f64)], mem: Option<u64>, rss: Option<u64>) -> TargetResult {
        TargetResult {
            target: name.into(),
            detail: format!("{name} detail"),
            jobs: iops
                .iter()
                .map(|&(job, iops)| JobResult { job: job.into(), mb_per_s: iops / 10.0, iops, mean_us: 1e6 / iops, p99_us: 1.5, server_us_per_io: Some(2.5) })
                .collect(),
            mem_used_bytes: mem,
            rss_growth_bytes: rss,
            skipped: None,
        }
    }

    #[test]
    fn ratios_compare_like_with_like() {
        let z = target("zmem", &[("fill", 100.0), ("randread", 50.0)], Some(10 << 20), Some(30 << 20));
        let nbdkit = target("nbdkit", &[("fill", 200.0), ("randread", 0.0)], None, Some(20 << 20));
        let zram = target("zram", &[("fill", 50.0)], Some(5 << 20), None);
        let q = ratios(&z, &nbdkit).unwrap();
        assert_eq!(q.get("fill_iops"), Some(&0.5));
        assert_eq!(q.get("randread_iops"), None, "no ratio over 0 IOPS");
        assert_eq!(q.get("memory"), Some(&1.5), "RSS against RSS");
        let q = ratios(&z, &zram).unwrap();
        assert_eq!((q.get("fill_iops"), q.get("memory")), (Some(&2.0), Some(&2.0)), "the pools' own accounting");
        assert_eq!(ratios(&z, &skipped("zram", "--no-zram".into())), None);
    }

    #[test]
    fn renders_and_serialises_as_before() {
        let z = target("zmem", &[("fill", 100.0)], Some(1 << 20), Some(2 << 20));
        let raw = target("nbdkit-raw", &[("fill", 400.0)], None, Some(4 << 20));
        let zram = target("zram", &[("fill", 50.0)], Some(1 << 19), None);
        let fuse = target("zmem-fuse", &[("fill", 80.0)], Some(1 << 20), Some(2 << 20));
        let targets = vec![z.clone(), skipped("nbdkit", "--no-nbdkit".into()), raw.clone(), zram.clone(), fuse.clone()];
        let r = Report {
            size: 16 << 20,
            data: PathBuf::from("/tmp/data"),
            fill_bytes: 16 << 20,
            runtime_s: 1,
            iodepth: 16,
            compress_percentage: 42,
            ratios: RatioSet { zmem_vs_nbdkit: None, zmem_vs_nbdkit_raw: ratios(&z, &raw), zmem_vs_zram: None, zmem_fuse_vs_zram: ratios(&fuse, &zram) },
            targets,
        };
        let table = render(&r);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("zmem bench blockdev: 16 MiB device filled with 16 MiB of /tmp/data; randwrite data 42%"), "{table}");
        assert_eq!(lines[1], "TARGET          JOB              MB/s       IOPS    mean us     p99 us  srv us/io");
        assert_eq!(lines[2], "zmem            fill             10.0        100    10000.0        1.5        2.5");
        assert_eq!(lines[3], "nbdkit          skipped: --no-nbdkit");
        assert_eq!(lines[6], "zmem-fuse       fill              8.0         80    12500.0        1.5        2.5");
        assert_eq!(lines[7], "");
        assert_eq!(lines[9], "zmem                   1.0 MiB        2.0 MiB  zmem detail");
        assert_eq!(lines[lines.len() - 2], "zmem / nbdkit-raw: fill_iops 0.25, memory 0.50");
        assert_eq!(lines.last(), Some(&"zmem-fuse / zram: fill_iops 1.60, memory 2.00"));
        // The JSON `zmem bench blockdev --json` prints (keys sorted by name).
        let v = serde_json::to_value(&r).unwrap();
        let text = serde_json::to_string_pretty(&v).unwrap();
        assert!(text.starts_with("{\n  \"compress_percentage\": 42,\n  \"data\": \"/tmp/data\","), "{text}");
        assert!(v["ratios"]["zmem_vs_nbdkit"].is_null());
        assert_eq!(v["ratios"]["zmem_vs_nbdkit_raw"]["fill_iops"], 0.25);
        assert_eq!(v["targets"][1]["skipped"], "--no-nbdkit");
        assert_eq!(v["targets"][4]["jobs"][0]["mean_us"], 12500.0);
        assert_eq!(v["ratios"]["zmem_fuse_vs_zram"]["fill_iops"], 1.6);
    }
}
