//! The kernel yardstick: run the same pages through a real zram device.
//!
//! [`run`] configures a free `/dev/zramN` (zram0 if it is unused, otherwise
//! a hot-added device), writes the pages to it, reads back the kernel's
//! `mm_stat` accounting, reads all data back and verifies it, and finally
//! resets the device (and hot-removes it if we added it) — on success and
//! on every error path, via a guard with `Drop`.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::pages::PAGE_SIZE;

/// Result of one kernel zram run. Byte counts come from
/// `/sys/block/zramN/mm_stat` right after the write + fsync.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ZramResult {
    /// Device used, e.g. `zram0`.
    pub device: String,
    /// zram's name of the algorithm used, e.g. `lz4`, `lzo-rle`.
    pub algorithm: String,
    /// `orig_data_size`: uncompressed bytes stored (same-filled pages excluded).
    pub orig_bytes: u64,
    /// `compr_data_size`: compressed bytes stored.
    pub compr_bytes: u64,
    /// `mem_used_total`: memory consumed, including allocator overhead.
    pub mem_used_bytes: u64,
    /// `same_pages`: pages stored as a single repeated word (e.g. zeros).
    pub same_pages: u64,
    /// `huge_pages`: incompressible pages stored uncompressed.
    pub huge_pages: u64,
    /// `pages_compacted`.
    pub pages_compacted: u64,
    /// The raw `mm_stat` line.
    pub mm_stat: String,
    /// Write throughput, MB/s (10^6 bytes per second), see [`run`].
    pub write_mbps: f64,
    /// Read throughput, MB/s (10^6 bytes per second), see [`run`].
    pub read_mbps: f64,
}

/// Kernel zram could not be used (or the run failed); `reason` says why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct Unavailable {
    pub reason: String,
}

impl Unavailable {
    fn new(reason: impl Into<String>) -> Self {
        Unavailable { reason: reason.into() }
    }
}

fn unavail(reason: impl Into<String>) -> Unavailable {
    Unavailable::new(reason)
}

/// Parsed `/sys/block/zramN/mm_stat`.
///
/// Field order (Documentation/admin-guide/blockdev/zram.rst):
/// `orig_data_size compr_data_size mem_used_total mem_limit mem_used_max
/// same_pages pages_compacted huge_pages huge_pages_since`. Kernels before
/// 4.19 lack `huge_pages` (7 fields), before 6.1 lack `huge_pages_since`
/// (8 fields); missing trailing fields read as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct MmStat {
    pub orig_data_size: u64,
    pub compr_data_size: u64,
    pub mem_used_total: u64,
    pub mem_limit: u64,
    pub mem_used_max: u64,
    pub same_pages: u64,
    pub pages_compacted: u64,
    pub huge_pages: u64,
    pub huge_pages_since: u64,
}

/// Parse an `mm_stat` line. At least 7 numeric fields are required; extra
/// trailing fields (future kernels) are ignored. Never panics.
pub fn parse_mm_stat(line: &str) -> Result<MmStat, Unavailable> {
    let mut v = Vec::with_capacity(9);
    for tok in line.split_ascii_whitespace() {
        let n: u64 = tok.parse().map_err(|_| unavail(format!("malformed mm_stat {line:?}: field {tok:?} is not a number")))?;
        v.push(n);
    }
    if v.len() < 7 {
        return Err(unavail(format!("malformed mm_stat {line:?}: {} fields, expected at least 7", v.len())));
    }
    let f = |i: usize| v.get(i).copied().unwrap_or(0);
    Ok(MmStat {
        orig_data_size: f(0),
        compr_data_size: f(1),
        mem_used_total: f(2),
        mem_limit: f(3),
        mem_used_max: f(4),
        same_pages: f(5),
        pages_compacted: f(6),
        huge_pages: f(7),
        huge_pages_since: f(8),
    })
}

/// Map our algorithm names to zram's. `lz4`, `lzo`, `lzo-rle`, `zstd`,
/// `lz4hc`, `842`, `deflate` are passed through (zram uses the same names).
pub fn zram_algorithm_name(ours: &str) -> &str {
    match ours {
        "lzo1x" | "lzo1x-1" => "lzo",
        "lzorle" | "lzo_rle" => "lzo-rle",
        other => other,
    }
}

/// Parse `comp_algorithm` (`lzo [lzo-rle] lz4 zstd`) into names.
pub fn parse_comp_algorithms(s: &str) -> Vec<String> {
    s.split_ascii_whitespace().map(|t| t.trim_matches(|c| c == '[' || c == ']').to_string()).collect()
}

const MIB: u64 = 1 << 20;
const CHUNK: usize = 1 << 20;

fn sys(dev: &str, attr: &str) -> PathBuf {
    Path::new("/sys/block").join(dev).join(attr)
}

fn read_attr(dev: &str, attr: &str) -> Result<String, Unavailable> {
    let p = sys(dev, attr);
    fs::read_to_string(&p).map(|s| s.trim().to_string()).map_err(|e| unavail(format!("cannot read {}: {e}", p.display())))
}

fn write_attr(dev: &str, attr: &str, value: &str) -> Result<(), Unavailable> {
    let p = sys(dev, attr);
    fs::write(&p, value).map_err(|e| unavail(format!("cannot write {value:?} to {}: {e}", p.display())))
}

use zmem_rig::effective_uid;

/// Is `/sys/block/<dev>` unused: disksize 0, initstate 0, not swapped on,
/// not mounted?
fn device_is_free(dev: &str) -> Result<bool, Unavailable> {
    if read_attr(dev, "disksize")? != "0" || read_attr(dev, "initstate")? != "0" {
        return Ok(false);
    }
    let node = format!("/dev/{dev}");
    if zmem_host::swap_areas().iter().any(|a| a.name == node) {
        return Ok(false);
    }
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    if mounts.lines().any(|l| l.split_ascii_whitespace().next() == Some(node.as_str())) {
        return Ok(false);
    }
    Ok(true)
}

/// Owns a configured device: resets it on drop (and hot-removes it if we
/// hot-added it). All file handles on the device must be closed first.
struct DeviceGuard {
    dev: String,
    id: u32,
    hot_added: bool,
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        // reset fails with EBUSY while the block device is still open
        // somewhere (e.g. udev probing after our close); retry briefly.
        let mut ok = false;
        for _ in 0..50 {
            if fs::write(sys(&self.dev, "reset"), "1").is_ok() {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !ok {
            tracing::error!("could not reset /dev/{}; run `echo 1 > /sys/block/{}/reset`", self.dev, self.dev);
        }
        if self.hot_added {
            for _ in 0..50 {
                if fs::write("/sys/class/zram-control/hot_remove", self.id.to_string()).is_ok() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            tracing::error!("could not hot_remove zram{}", self.id);
        }
    }
}

/// Serialises runs within this process; across processes the O_EXCL open
/// and the free-device checks protect us.
static RUN_LOCK: Mutex<()> = Mutex::new(());
/// Serialises claiming a free device with configuring it (after which it
/// is no longer free) among [`Device::configure`] callers of this process.
static CLAIM_LOCK: Mutex<()> = Mutex::new(());

fn acquire_device() -> Result<DeviceGuard, Unavailable> {
    if device_is_free("zram0")? {
        return Ok(DeviceGuard { dev: "zram0".into(), id: 0, hot_added: false });
    }
    let ctl = Path::new("/sys/class/zram-control/hot_add");
    if !ctl.exists() {
        return Err(unavail("zram0 is in use and /sys/class/zram-control/hot_add is not available"));
    }
    let id: u32 = fs::read_to_string(ctl)
        .map_err(|e| unavail(format!("zram0 is in use and hot_add failed: {e}")))?
        .trim()
        .parse()
        .map_err(|_| unavail("zram0 is in use and hot_add returned garbage"))?;
    let guard = DeviceGuard { dev: format!("zram{id}"), id, hot_added: true };
    if !device_is_free(&guard.dev)? {
        return Err(unavail(format!("hot-added {} is not free", guard.dev)));
    }
    Ok(guard)
}

/// Wait for udev to create `/dev/zramN` (hot-added devices), or create the
/// node ourselves from `/sys/block/zramN/dev`.
fn ensure_node(dev: &str) -> Result<PathBuf, Unavailable> {
    let node = PathBuf::from(format!("/dev/{dev}"));
    for _ in 0..100 {
        if node.exists() {
            return Ok(node);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let majmin = read_attr(dev, "dev")?;
    let (maj, min) = majmin.split_once(':').ok_or_else(|| unavail(format!("bad {dev}/dev {majmin:?}")))?;
    let st = std::process::Command::new("mknod").arg(&node).arg("b").arg(maj).arg(min).status();
    match st {
        Ok(s) if s.success() && node.exists() => Ok(node),
        _ => Err(unavail(format!("{} does not exist and could not be created", node.display()))),
    }
}

fn open_direct(node: &Path, write: bool) -> Result<File, Unavailable> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        // O_EXCL on a block device: exclusive claim, fails with EBUSY if
        // mounted, swapped on or claimed by someone else.
        .custom_flags(libc::O_DIRECT | libc::O_EXCL)
        .open(node)
        .map_err(|e| unavail(format!("cannot open {} with O_DIRECT: {e}", node.display())))
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    let secs = d.as_secs_f64();
    if secs > 0.0 {
        bytes as f64 / 1e6 / secs
    } else {
        f64::INFINITY
    }
}

/// A configured kernel zram device, owned: reset (and hot-removed if it
/// was hot-added) on drop, on success and on every error path. The one
/// place zmem's benchmarks claim and set up a zram device (`zmem bench
/// store`, `blockdev` and `swap` all come here).
pub struct Device {
    guard: DeviceGuard,
    node: PathBuf,
    algorithm: String,
}

impl Device {
    /// Claim a free device (zram0 if it is unused, otherwise a hot-added
    /// one), set its algorithm (our name mapped by [`zram_algorithm_name`];
    /// an error lists what zram offers), `mem_limit` if given, and
    /// `disksize`, then wait for `/dev/zramN`. Needs root.
    pub fn configure(algorithm: &str, disksize: u64, mem_limit: Option<u64>) -> Result<Device, Unavailable> {
        match effective_uid() {
            Some(0) => {}
            Some(uid) => return Err(unavail(format!("kernel zram needs root (euid is {uid})"))),
            None => return Err(unavail("cannot determine euid from /proc/self/status")),
        }
        if !Path::new("/sys/block/zram0").exists() {
            return Err(unavail("/sys/block/zram0 does not exist (modprobe zram)"));
        }
        // Claiming (a free device) and configuring it (no longer free) are
        // one step for the threads of this process.
        let _lock = CLAIM_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let guard = acquire_device()?;
        let dev = guard.dev.clone();
        let algo = zram_algorithm_name(algorithm).to_string();
        let available = parse_comp_algorithms(&read_attr(&dev, "comp_algorithm")?);
        if !available.contains(&algo) {
            return Err(unavail(format!("zram does not support algorithm {algo:?} (available: {})", available.join(" "))));
        }
        write_attr(&dev, "comp_algorithm", &algo)?;
        if let Some(limit) = mem_limit {
            write_attr(&dev, "mem_limit", &limit.to_string())?;
        }
        write_attr(&dev, "disksize", &disksize.to_string())?;
        let node = ensure_node(&dev)?;
        Ok(Device { guard, node, algorithm: algo })
    }

    /// `zram0`, `zram1`, ...
    pub fn name(&self) -> &str {
        &self.guard.dev
    }

    /// `/dev/zramN`.
    pub fn node(&self) -> &Path {
        &self.node
    }

    /// zram's name of the algorithm in use.
    pub fn algorithm(&self) -> &str {
        &self.algorithm
    }

    /// One attribute of `/sys/block/zramN`, trimmed.
    pub fn attr(&self, attr: &str) -> Result<String, Unavailable> {
        read_attr(&self.guard.dev, attr)
    }

    /// The device's `mm_stat`, parsed.
    pub fn mm_stat(&self) -> Result<MmStat, Unavailable> {
        parse_mm_stat(&self.attr("mm_stat")?)
    }
}

/// Run `pages` through a kernel zram device compressed with `algorithm`.
///
/// Steps:
/// 1. Requires euid 0 and `/sys/block/zram0`. Uses zram0 if it is free
///    (disksize 0, initstate 0, not in `/proc/swaps`, not in
///    `/proc/mounts`), otherwise hot-adds a device through
///    `/sys/class/zram-control/hot_add` (hot-removed afterwards).
/// 2. Sets `comp_algorithm` (our name mapped by [`zram_algorithm_name`];
///    error if zram does not list it) and `disksize` = data length rounded
///    up to 1 MiB.
/// 3. Writes all pages to `/dev/zramN` with `O_DIRECT` (so the page cache
///    is bypassed and every write is compressed synchronously by zram), in
///    1 MiB chunks from a 4096-aligned anonymous mapping, then `fsync`.
/// 4. Reads `mm_stat` and parses it ([`parse_mm_stat`]).
/// 5. Reads everything back with `O_DIRECT` in 1 MiB chunks and verifies
///    it byte for byte against the input (mismatch is an error).
/// 6. Always resets the device (`echo 1 > reset`), also on every error
///    path.
///
/// **Timing method:** wall-clock (`Instant`) time summed over the
/// `pwrite` syscalls plus the final `fsync` (write), and over the `pread`
/// syscalls (read). The userspace copies into/out of the aligned buffer
/// and the verification compare are *not* timed. Both are single-threaded
/// and synchronous, so MB/s (= bytes / 10^6 / seconds, bytes = input
/// length) is essentially single-core compress/decompress speed plus
/// block-layer and zsmalloc overhead.
///
/// `pages.len()` must be a non-zero multiple of [`PAGE_SIZE`].
pub fn run(pages: &[u8], algorithm: &str) -> Result<ZramResult, Unavailable> {
    if pages.is_empty() || !pages.len().is_multiple_of(PAGE_SIZE) {
        return Err(unavail(format!("data length {} is not a non-zero multiple of {PAGE_SIZE}", pages.len())));
    }
    let _lock = RUN_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let disksize = (pages.len() as u64).div_ceil(MIB) * MIB;
    let device = Device::configure(algorithm, disksize, None)?;
    let (dev, algo, node) = (device.name().to_string(), device.algorithm().to_string(), device.node().to_path_buf());

    // All file handles live inside `io_pass`, so they are closed before the
    // guard's Drop resets the device.
    let (write_time, read_time, mm_line) = io_pass(&node, pages)?;
    let mm = parse_mm_stat(&mm_line)?;
    drop(device);
    Ok(ZramResult {
        device: dev,
        algorithm: algo,
        orig_bytes: mm.orig_data_size,
        compr_bytes: mm.compr_data_size,
        mem_used_bytes: mm.mem_used_total,
        same_pages: mm.same_pages,
        huge_pages: mm.huge_pages,
        pages_compacted: mm.pages_compacted,
        mm_stat: mm_line,
        write_mbps: mbps(pages.len(), write_time),
        read_mbps: mbps(pages.len(), read_time),
    })
}

fn io_err(what: &str, node: &Path, off: usize, e: io::Error) -> Unavailable {
    unavail(format!("{what} {} at offset {off} failed: {e}", node.display()))
}

/// Write, fsync, snapshot mm_stat, read back + verify.
fn io_pass(node: &Path, pages: &[u8]) -> Result<(Duration, Duration, String), Unavailable> {
    let dev = node.file_name().and_then(|n| n.to_str()).unwrap_or("zram0").to_string();
    let mut buf = memmap2::MmapMut::map_anon(CHUNK).map_err(|e| unavail(format!("cannot map 1 MiB buffer: {e}")))?;

    let f = open_direct(node, true)?;
    let mut write_time = Duration::ZERO;
    for (i, chunk) in pages.chunks(CHUNK).enumerate() {
        let off = i * CHUNK;
        buf[..chunk.len()].copy_from_slice(chunk);
        let t = Instant::now();
        f.write_all_at(&buf[..chunk.len()], off as u64).map_err(|e| io_err("write to", node, off, e))?;
        write_time += t.elapsed();
    }
    let t = Instant::now();
    f.sync_all().map_err(|e| unavail(format!("fsync {} failed: {e}", node.display())))?;
    write_time += t.elapsed();
    drop(f);

    let mm_line = read_attr(&dev, "mm_stat")?;

    let f = open_direct(node, false)?;
    let mut read_time = Duration::ZERO;
    for (i, chunk) in pages.chunks(CHUNK).enumerate() {
        let off = i * CHUNK;
        let t = Instant::now();
        f.read_exact_at(&mut buf[..chunk.len()], off as u64).map_err(|e| io_err("read from", node, off, e))?;
        read_time += t.elapsed();
        if buf[..chunk.len()] != *chunk {
            let pos = buf[..chunk.len()].iter().zip(chunk).position(|(a, b)| a != b).unwrap_or(0);
            return Err(unavail(format!("data read back from {} differs from input at byte {}", node.display(), off + pos)));
        }
    }
    Ok((write_time, read_time, mm_line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mm_stat_nine_fields() {
        let line = "  8531968   112394   262144        0   262144      512        3        7        9";
        let m = parse_mm_stat(line).unwrap();
        assert_eq!(
            m,
            MmStat {
                orig_data_size: 8531968,
                compr_data_size: 112394,
                mem_used_total: 262144,
                mem_limit: 0,
                mem_used_max: 262144,
                same_pages: 512,
                pages_compacted: 3,
                huge_pages: 7,
                huge_pages_since: 9,
            }
        );
    }

    #[test]
    fn mm_stat_eight_and_seven_fields() {
        let m = parse_mm_stat("16777216 4194304 4456448 0 4456448 1024 0 12\n").unwrap();
        assert_eq!(m.orig_data_size, 16777216);
        assert_eq!(m.compr_data_size, 4194304);
        assert_eq!(m.mem_used_total, 4456448);
        assert_eq!(m.same_pages, 1024);
        assert_eq!(m.huge_pages, 12);
        assert_eq!(m.huge_pages_since, 0);
        let m = parse_mm_stat("1 2 3 4 5 6 7").unwrap();
        assert_eq!(m.pages_compacted, 7);
        assert_eq!(m.huge_pages, 0);
        // Future kernels may append fields.
        assert_eq!(parse_mm_stat("1 2 3 4 5 6 7 8 9 10").unwrap().huge_pages_since, 9);
    }

    #[test]
    fn mm_stat_malformed() {
        for l in ["", "   ", "1 2 3", "1 2 3 4 5 6", "a b c d e f g h", "1 2 3 4 5 6 -7 8", "1 2 3 4 5 6 7 8x", "99999999999999999999999 2 3 4 5 6 7 8"] {
            let e = parse_mm_stat(l).unwrap_err();
            assert!(e.reason.contains("malformed mm_stat"), "{l:?}: {e}");
        }
    }

    #[test]
    fn algorithm_names() {
        assert_eq!(parse_comp_algorithms("[lzo-rle] lzo lz4 \n"), vec!["lzo-rle", "lzo", "lz4"]);
        assert_eq!(zram_algorithm_name("lz4"), "lz4");
        assert_eq!(zram_algorithm_name("lzo"), "lzo");
        assert_eq!(zram_algorithm_name("zstd"), "zstd");
    }

    #[test]
    fn rejects_bad_lengths() {
        assert!(run(&[], "lz4").is_err());
        assert!(run(&[0u8; 100], "lz4").is_err());
    }
}
