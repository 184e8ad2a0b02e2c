//! zmem as a swap device (zswap's job): `zmem swap on | off | status`, and
//! the server behind a device.
//!
//! [`on`] starts a server process (`zmem swap serve`, hidden) that holds the
//! pool and serves it as one file in a FUSE filesystem of its own
//! (`zmem-fuse`), cuts that file into swap areas at descending priorities
//! ([`area_layout`]: so that the slots in use gather in the first ones),
//! puts a loop device with direct I/O over each, runs mkswap and `swapon
//! --discard`, so that slots the kernel frees leave the pool (zram's
//! `notify_free`; but a block device other than zram learns of a freed
//! slot only through a discard, and the kernel discards whole clusters,
//! 512 slots, once every slot in them is free: a slot freed alone keeps
//! its page in the pool until the kernel writes it again, or until
//! `unmapped.rs` finds no page table pointing to it). Each area is
//! declared rotational before swapon: the kernel then hands out its slots
//! in one sequence, not per CPU, and reads ahead by slot (the
//! `page-cluster` slots around a fault), so slots zmem keeps side by side
//! are what a swap-in asks for together (docs/experiments/).
//! Everything a device is made of lives under one directory, `RUN_DIR/NAME/`: the mountpoint `mnt/` (with `image`),
//! the control socket, the server's log and `state.json`. [`off`] undoes
//! every step in reverse from what it finds there and in the kernel's own
//! tables (/proc/swaps, the loop devices' backing files, the mount table),
//! so it also cleans up after a crash half way through `on` or a server
//! that died. It never kills a server whose device is still swapped on.
//!
//! The kernel path: the NBD driver would spare the FUSE hop where a kernel
//! has it, but this path is not built yet; every kernel has FUSE and loop.
//!
//! The server ([`serve`]) protects itself from reclaim, since the kernel
//! may need it to finish a swap-out in order to free memory
//! (`zmem_server::reclaim`), before it builds its pool.
//!
//! The `zmem` binary turns its arguments (and a config file's sections)
//! into a [`Device`] or a [`ServerConfig`] and prints what these return.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zmem_export::Export;
use zmem_host::human_size as human;
use zmem_server::control::{bind_unix, Frontend, Info};
use zmem_server::policy::Policies;
use zmem_server::protocol::StatsReply;
use zmem_server::side::{SideJob, SideThreads};

mod error;
mod replace;
mod unmapped;
pub use error::{Result, SwapError};
pub use zmem_server::keeper::{keep, Built, KeeperConfig, Kept, PoolFiles, Served, CRASH_LIMIT, EXIT_LEFT, QUICK_DEATH};

/// The FUSE file a device's server serves, under its mountpoint.
pub const IMAGE: &str = "image";
/// Where devices keep their runtime state unless told otherwise.
pub const DEFAULT_RUN_DIR: &str = "/run/zmem/swap";

/// A swap device to bring up ([`on`]).
#[derive(Clone, Debug)]
pub struct Device {
    /// Its directory under `run_dir` (see [`parse_name`]).
    pub name: String,
    /// Bytes; a positive multiple of 4096.
    pub size: u64,
    /// swapon priority (of the first area).
    pub priority: i32,
    /// Swap areas the device is cut into ([`area_layout`]); 0 for as many
    /// as its size makes worth it.
    pub areas: u32,
    pub run_dir: PathBuf,
    /// The memory cgroup whose limit the server's memory counts against.
    pub charge_to: Option<PathBuf>,
    /// The pool's cap (checked against `charge_to`'s budget) and its
    /// compressor's name (for the state file).
    pub max_pool: u64,
    pub compressor: String,
    /// The command that runs the device's server (program and arguments);
    /// `--dir DIR` is added.
    pub server: Vec<std::ffi::OsString>,
    /// Its environment beyond ours: what must not show in the process
    /// list (a cluster URL with its password).
    pub server_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

/// What the server behind a device runs with ([`serve`]).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub size: u64,
    /// Threads serving the FUSE image.
    pub threads: u16,
    /// Threads reading written-back pages off the FUSE threads
    /// (`zmem_fuse::FuseConfig::read_threads`).
    pub read_threads: u16,
    /// The device's directory (mountpoint, control socket, ready file).
    pub dir: PathBuf,
    /// Join this cgroup before allocating anything.
    pub cgroup: Option<PathBuf>,
    /// Count the server's memory against this memory cgroup's limit.
    pub charge_to: Option<PathBuf>,
    pub max_pool: u64,
    pub dedup: bool,
    /// Where cold pages go (a backing file, a cluster), as `zmem stat`
    /// shows it.
    pub backing: Option<String>,
    /// The policy threads beside the pool.
    pub policies: Policies,
    /// Serve Prometheus metrics here (off: `None`).
    pub metrics: Option<zmem_server::metrics::MetricsAddr>,
}

/// A device name: 1 to 32 letters, digits, `-` or `_`.
pub fn parse_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty() && s.len() <= 32 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!("bad device name `{s}`: 1 to 32 letters, digits, '-' or '_'"))
    }
}

fn require_root(what: &'static str) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        return Err(SwapError::NotRoot(what));
    }
    Ok(())
}

// ---- on ------------------------------------------------------------------

/// Bring a device up: server, FUSE image, loop device, mkswap, swapon.
/// Remains of an earlier run under the same name are cleaned up first; if
/// a step fails, every step before it is undone. Returns the device's
/// status table.
pub fn on(a: &Device) -> Result<String> {
    require_root("on")?;
    let size = a.size;
    if size == 0 || !size.is_multiple_of(4096) {
        return Err(SwapError::BadSize(size));
    }
    if let Some(t) = ["losetup", "mkswap", "swapon", "swapoff", "umount"].into_iter().find(|t| !zmem_host::have(t)) {
        return Err(zmem_host::HostError::MissingTool(t.to_string()).into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(SwapError::NoFuse);
    }
    let dir = a.run_dir.join(&a.name);
    if dir.exists() {
        let st = read_state(&dir);
        if let Some(st) = st.as_ref().filter(|s| swap_active(&s.loop_dev)) {
            return Err(SwapError::AlreadyOn { name: a.name.clone(), dev: st.loop_dev.clone() });
        }
        eprintln!("zmem: {} has remains of an earlier run; cleaning them up first", a.name);
        teardown(&dir)?;
    }
    if Path::new("/sys/module/nbd").exists() {
        eprintln!("zmem: the kernel has an nbd driver, but zmem swap uses its FUSE image (the NBD path is not built yet)");
    }
    std::fs::create_dir_all(dir.join("mnt")).map_err(|e| SwapError::file("create", &dir, e))?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(|e| SwapError::file("make private (mode 0700)", &dir, e))?;
    match bring_up(a, &dir) {
        Ok(st) => Ok(render_status(&[status_of(&dir, Some(&st))])),
        Err(e) => {
            eprintln!("zmem: `swap on` failed; undoing what it did");
            if let Err(e2) = teardown(&dir) {
                eprintln!("zmem: cleanup failed too: {e2}");
            }
            Err(e)
        }
    }
}

fn bring_up(a: &Device, dir: &Path) -> Result<State> {
    let charge = match &a.charge_to {
        Some(cg) => {
            // A second keeper would take the first one's lowered limit for
            // the budget, and the two would fight over it.
            if let Some(other) = charged_by_another(&a.run_dir, dir, cg) {
                return Err(SwapError::CgroupTaken { cgroup: cg.clone(), other });
            }
            Some((cg.as_path(), charge_budget(cg, a.max_pool)?))
        }
        None => None,
    };
    let log_path = dir.join("server.log");
    let log = std::fs::File::create(&log_path).map_err(|e| SwapError::file("create", &log_path, e))?;
    let (exe, args) = a.server.split_first().ok_or(SwapError::NoServer)?;
    let mut cmd = Command::new(exe);
    let log_out = log.try_clone().map_err(|e| SwapError::file("open", &log_path, e))?;
    cmd.args(args).arg("--dir").arg(dir).envs(a.server_env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null()).stdout(log_out).stderr(log);
    // Its own process group: a ^C at the terminal that ran `on` must not
    // stop the swap device.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().map_err(SwapError::Spawn)?;
    let pid = child.id();
    let mut st = State {
        name: a.name.clone(),
        pid,
        loop_dev: String::new(),
        areas: Vec::new(),
        size: a.size,
        priority: a.priority,
        algorithm: a.compressor.clone(),
        charge_to: charge.map(|(cg, budget)| Charge { cgroup: cg.to_path_buf(), budget }),
    };
    write_state(dir, &st)?;
    let ready = dir.join("ready");
    let end = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        if let Some(status) = child.try_wait().map_err(SwapError::Spawn)? {
            return Err(SwapError::ServerExited { status, log: log_tail(dir) });
        }
        if Instant::now() > end {
            return Err(SwapError::ServerNotReady { log: log_tail(dir) });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let image = dir.join("mnt").join(IMAGE);
    let areas = if a.areas == 0 { auto_areas(a.size, zmem_host::swap_areas().len() as u32) } else { a.areas };
    for (i, area) in area_layout(a.size, areas, a.priority).into_iter().enumerate() {
        let dev = tool(
            Command::new("losetup")
                .args(["--direct-io=on", "--show", "-f", "--offset", &area.offset.to_string(), "--sizelimit", &area.len.to_string()])
                .arg(&image),
        )?;
        if i == 0 {
            st.loop_dev = dev.clone();
        }
        st.areas.push(AreaState { dev: dev.clone(), offset: area.offset, len: area.len });
        write_state(dir, &st)?;
        // Writeback throttling would make a swap-out that the server's own
        // reclaim starts wait for writes only the server can finish (seen:
        // both FUSE workers asleep in wbt_wait under swap_writeout). Off,
        // while the queue is still idle (changing it later waits for the
        // queue to drain).
        let queue = Path::new("/sys/block").join(dev.trim_start_matches("/dev/")).join("queue");
        let wbt = queue.join("wbt_lat_usec");
        if wbt.exists() {
            zmem_host::write_attr(&wbt, "0")?;
        }
        zmem_host::write_attr(queue.join("rotational"), "1")?;
        let label = if i == 0 { format!("zmem-{}", a.name) } else { format!("zmem-{}-{i}", a.name) };
        tool(Command::new("mkswap").args(["-q", "-L", &label]).arg(&dev))?;
        let prio = area.priority.map(|p| vec!["-p".to_string(), p.to_string()]).unwrap_or_default();
        tool(Command::new("swapon").arg("--discard").args(prio).arg(&dev))?;
    }
    Ok(st)
}

/// One swap area of a device: a loop device over `len` bytes of the image
/// from `offset`, swapped on at `priority` (`None`: the kernel's own,
/// lower than every area before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Area {
    pub offset: u64,
    pub len: u64,
    pub priority: Option<i32>,
}

/// The smallest area [`area_layout`] cuts when it chooses the count.
pub const AREA_MIN: u64 = 256 << 20;
/// The most areas [`area_layout`] cuts when it chooses the count (the
/// smaller the areas, the fewer dead pages the frontier area holds;
/// [`auto_areas`] also leaves the swap types other areas take): 24 areas
/// measured no better than 16 on the build (docs/experiments/swap-areas.md).
pub const AREAS_AUTO_MAX: u32 = 16;
/// The most areas a device may be cut into: the swap types every x86
/// kernel has (32 less those its configuration takes for migration,
/// device-private and poisoned entries and PTE markers: at most 8).
pub const AREAS_MAX: u32 = 24;

/// The areas `--areas auto` cuts a device of `size` bytes into, on a
/// machine with `others` swap areas on: one per [`AREA_MIN`], at most
/// [`AREAS_AUTO_MAX`], and never more than the swap types left of
/// [`AREAS_MAX`] (one at least: swapon then says what is wrong).
pub fn auto_areas(size: u64, others: u32) -> u32 {
    (size / AREA_MIN).clamp(1, u64::from(AREAS_AUTO_MAX.min(AREAS_MAX.saturating_sub(others)).max(1))) as u32
}

/// How a device of `size` bytes is cut into swap areas, at descending
/// priorities from `priority`.
///
/// Why: the kernel frees a swap slot without telling a loop device, and
/// within an area it takes slots from wholly free clusters before it
/// reuses freed slots in used ones; on one large area a build leaves most
/// of what the pool holds as pages of exited processes. Across areas it
/// fills the highest priority first, and takes the next only when that one
/// has no free slot at all. Cut into areas, the slots in use gather in the
/// first ones, whose freed slots are written again soon (which drops their
/// pages from the pool); the later areas only drain, so their clusters
/// come wholly free and are discarded.
///
/// `areas` 0 chooses as [`auto_areas`] does on a machine with no swap on. Every area is a whole number of pages, the last
/// takes the rest. A priority below `areas − 1` leaves room for fewer
/// areas (swapon's priorities go down to 0); priority −1 leaves every
/// area's to the kernel, which gives each one swapped on a lower one.
pub fn area_layout(size: u64, areas: u32, priority: i32) -> Vec<Area> {
    const PAGE: u64 = 4096;
    let pages = size / PAGE;
    let mut n = u64::from(if areas == 0 { auto_areas(size, 0) } else { areas.min(AREAS_MAX) });
    // mkswap needs 10 pages an area.
    n = n.min(pages / 16).max(1);
    if priority >= 0 {
        n = n.min(priority as u64 + 1);
    }
    let each = pages / n;
    (0..n)
        .map(|i| Area {
            offset: i * each * PAGE,
            len: if i + 1 == n { (pages - i * each) * PAGE } else { each * PAGE },
            priority: (priority >= 0).then(|| priority - i as i32),
        })
        .collect()
}

fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Run a system tool ([`zmem_host::run_tool`]: its stderr in the error if
/// it fails); its output, trimmed.
fn tool(cmd: &mut Command) -> Result<String, zmem_host::HostError> {
    Ok(zmem_host::run_tool(cmd)?.trim().to_string())
}

// ---- state -----------------------------------------------------------------

/// What `on` recorded (`state.json`): enough for `off` and `status`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct State {
    name: String,
    pid: u32,
    /// The first area's loop device.
    loop_dev: String,
    /// Every area, the first included (a state written before areas has
    /// none: its one area is `loop_dev`).
    #[serde(default)]
    areas: Vec<AreaState>,
    size: u64,
    priority: i32,
    algorithm: String,
    /// The cgroup whose limit the server moves, and the budget to give it
    /// back (`off` does, should the server have died without doing it).
    #[serde(default)]
    charge_to: Option<Charge>,
}

/// One area as `on` set it up: its loop device and the image's bytes it covers.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct AreaState {
    pub dev: String,
    pub offset: u64,
    pub len: u64,
}

impl State {
    /// The loop devices of its areas, first first.
    pub fn devices(&self) -> Vec<&str> {
        if self.areas.is_empty() {
            vec![self.loop_dev.as_str()]
        } else {
            self.areas.iter().map(|a| a.dev.as_str()).collect()
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
struct Charge {
    cgroup: PathBuf,
    budget: u64,
}

/// The device under `run_dir`, other than `me`, whose server counts its
/// memory against `cgroup`, if any.
fn charged_by_another(run_dir: &Path, me: &Path, cgroup: &Path) -> Option<String> {
    let same = |p: &Path| std::fs::canonicalize(p).ok() == std::fs::canonicalize(cgroup).ok();
    std::fs::read_dir(run_dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|d| d != me)
        .filter_map(|d| read_state(&d))
        .find(|st| st.charge_to.as_ref().is_some_and(|c| same(&c.cgroup)) && is_our_server(st.pid, &run_dir.join(&st.name)))
        .map(|st| st.name)
}

/// The budget of `--charge-to CGROUP` (its limit now), checked against the
/// pool's cap: the processes must keep at least a quarter of it.
fn charge_budget(cgroup: &Path, max_pool: u64) -> Result<u64> {
    let budget = zmem_host::shared_budget::SharedBudget::budget_of(cgroup)?;
    if max_pool >= budget / 4 * 3 {
        return Err(SwapError::PoolTooLarge { max_pool, cgroup: cgroup.to_path_buf(), budget });
    }
    Ok(budget)
}

fn write_state(dir: &Path, st: &State) -> Result<()> {
    let (tmp, path) = (dir.join("state.json.tmp"), dir.join("state.json"));
    // (A state of strings and numbers always serializes.)
    let json = serde_json::to_vec_pretty(st).unwrap_or_default();
    std::fs::write(&tmp, json).map_err(|e| SwapError::file("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| SwapError::file("write", &path, e))
}

fn read_state(dir: &Path) -> Option<State> {
    serde_json::from_slice(&std::fs::read(dir.join("state.json")).ok()?).ok()
}

/// Whether `dev` is an active swap device (/proc/swaps).
fn swap_active(dev: &str) -> bool {
    !dev.is_empty() && zmem_host::swap_areas().iter().any(|a| a.name == dev)
}

/// Loop devices whose backing file is `file`.
pub(crate) fn loops_backed_by(file: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    let mut v: Vec<String> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let bf = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            let bf = bf.trim().trim_end_matches(" (deleted)");
            (name.starts_with("loop") && Path::new(bf) == file).then(|| format!("/dev/{name}"))
        })
        .collect();
    v.sort();
    v
}

/// Whether `pid` is this device's server (and not a reused pid).
fn is_our_server(pid: u32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let has = |w: &[u8]| args.contains(&w);
    has(b"serve") && has(dir.as_os_str().as_encoded_bytes())
}

// ---- off -------------------------------------------------------------------

/// Undo every step `on` did, in reverse, for device `name` under `run_dir`
/// (every device there with `None`), also after a crash.
pub fn off(run_dir: &Path, name: Option<&str>) -> Result<()> {
    require_root("off")?;
    let dirs: Vec<PathBuf> = match name {
        None => device_dirs(run_dir),
        Some(n) => vec![run_dir.join(n)],
    };
    let mut failed = 0;
    let mut did = 0;
    for dir in &dirs {
        if !dir.exists() {
            continue;
        }
        did += 1;
        if let Err(e) = teardown(dir) {
            eprintln!("zmem: {}: {e}", dir.display());
            failed += 1;
        }
    }
    if did == 0 {
        eprintln!("zmem: no zmem swap device {} under {}", name.unwrap_or("at all"), run_dir.display());
    }
    if failed > 0 {
        return Err(SwapError::NotStopped(failed));
    }
    Ok(())
}

/// The device directories under `run_dir`, sorted.
fn device_dirs(run_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(run_dir).map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect()).unwrap_or_default();
    v.sort();
    v
}

/// Undo a device, whatever state it is in: swapoff and detach every loop
/// device over its image, stop its server, unmount, remove the directory.
/// Stops at a failed swapoff: the pages are still in the pool, and
/// stopping the server would lose them.
fn teardown(dir: &Path) -> Result<()> {
    let st = read_state(dir);
    let image = dir.join("mnt").join(IMAGE);
    let mut loops = loops_backed_by(&image);
    if let Some(st) = &st {
        for dev in st.devices() {
            if !dev.is_empty() && !loops.iter().any(|l| l == dev) && swap_active(dev) {
                loops.push(dev.to_string());
            }
        }
    }
    for lo in &loops {
        if swap_active(lo) {
            tool(Command::new("swapoff").arg(lo)).map_err(|source| SwapError::SwapoffFailed { dev: lo.clone(), source })?;
            eprintln!("zmem: swapoff {lo}");
        }
        tool(Command::new("losetup").arg("-d").arg(lo))?;
        eprintln!("zmem: detached {lo}");
    }
    // The keeper passes the stop on to its server; a server whose keeper
    // is gone (killed) is stopped by itself.
    let server = replace::server_pid(dir);
    if let Some(pid) = st.as_ref().map(|s| s.pid).filter(|&p| is_our_server(p, dir)) {
        stop_server(pid, dir)?;
        eprintln!("zmem: stopped keeper {pid} and its server");
    }
    // (Asked again: it is gone by now if its keeper stopped it.)
    if let Some(pid) = server.filter(|&p| is_our_server(p, dir)) {
        stop_server(pid, dir)?;
        eprintln!("zmem: stopped server {pid}, whose keeper was gone");
    }
    if let Some(c) = st.as_ref().and_then(|s| s.charge_to.as_ref()) {
        // The server gives the budget back when it stops; this is for one
        // that died first. Writing it twice is harmless.
        let f = c.cgroup.join("memory.limit_in_bytes");
        if c.cgroup.exists() {
            zmem_host::write_attr(&f, &c.budget.to_string())?;
        }
    }
    let mnt = dir.join("mnt");
    if zmem_host::is_mounted(&mnt) {
        if tool(Command::new("umount").arg(&mnt)).is_err() {
            tool(Command::new("umount").arg("-l").arg(&mnt))?;
        }
        eprintln!("zmem: unmounted {}", mnt.display());
    }
    for f in ["control.sock", "ready", "state.json", "state.json.tmp", "server.log"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let _ = std::fs::remove_dir(&mnt);
    std::fs::remove_dir(dir).map_err(|e| SwapError::file("remove", dir, e))
}

/// Stops the server and waits until it is gone. The wait follows the
/// process by its start time, not by [`is_our_server`]: an exiting process
/// loses its command line (its memory is released) well before it is gone,
/// while it still holds its files and its FUSE mount.
fn stop_server(pid: u32, dir: &Path) -> Result<()> {
    use rustix::process::{kill_process, Pid, Signal};
    let Some(p) = Pid::from_raw(pid as i32) else { return Ok(()) };
    let Some(born) = proc_stat(pid).map(|s| s.start) else { return Ok(()) };
    if !is_our_server(pid, dir) {
        return Ok(());
    }
    let running = || proc_stat(pid).is_some_and(|s| s.start == born && s.state != 'Z');
    let _ = kill_process(p, Signal::TERM);
    let end = Instant::now() + Duration::from_secs(15);
    while running() {
        if Instant::now() > end {
            eprintln!("zmem: server {pid} did not stop in 15 s; killing it");
            let _ = kill_process(p, Signal::KILL);
            let end = Instant::now() + Duration::from_secs(5);
            while running() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// What `/proc/PID/stat` says of a process: its state letter and its start
/// time (clock ticks since boot), which tells it from a later process that
/// got the same pid.
struct ProcStat {
    state: char,
    start: u64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces and parentheses:
    // state is field 3 of stat(5), starttime field 22.
    let rest: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    Some(ProcStat { state: rest.first()?.chars().next()?, start: rest.get(19)?.parse().ok()? })
}

// ---- restart ---------------------------------------------------------------

/// Replace the server of device `name` under `run_dir` with a new one
/// (from the binary on disk now: an upgrade) while swap stays on: requests
/// pause, none fails. Returns what happened, for the user.
pub fn restart(run_dir: &Path, name: &str) -> Result<String> {
    require_root("restart")?;
    let dir = run_dir.join(name);
    let st = read_state(&dir).ok_or_else(|| SwapError::Keeper(format!("no device {name} under {}", run_dir.display())))?;
    if !is_our_server(st.pid, &dir) {
        return Err(SwapError::Keeper(format!("device {name} has no keeper running (pid {} is gone): `zmem swap off --name {name}` cleans it up", st.pid)));
    }
    // Only a server whose pool the next one can open is replaced, and only
    // by a binary that reads what it leaves.
    // (No server answering: the keeper is starting one, or gave up after a
    // crash loop, and a restart is what starts one again.)
    let version = zmem_server::protocol::stats(&dir.join("control.sock")).ok().map(|s| s.recovery.as_ref().map_or(0, |r| r.state_version));
    match version.unwrap_or(zmem_core::STATE_VERSION) {
        0 => return Err(SwapError::Keeper(format!("device {name}'s pool cannot be handed to another server (dedup): a restart would lose its pages"))),
        v if v != zmem_core::STATE_VERSION => {
            return Err(SwapError::Keeper(format!(
                "device {name}'s pool is of state version {v}, which this zmem (version {}) cannot read: its server keeps serving",
                zmem_core::STATE_VERSION
            )))
        }
        _ => {}
    }
    if replace::server_pid(&dir) == Some(st.pid) {
        // A server from before keepers: SIGHUP would end it, and its pages.
        return Err(SwapError::Keeper(format!("device {name}'s server {} has no keeper (an older zmem started it): it cannot be restarted in place; `zmem swap off --name {name}` and `on` again when memory allows", st.pid)));
    }
    let t = Instant::now();
    let (old, new) = replace::restart(&dir, st.pid, Duration::from_secs(60))?;
    let old = old.map_or("none".to_string(), |p| p.to_string());
    Ok(format!("{name}: server {old} replaced by {new} in {} ms\n", t.elapsed().as_millis()))
}

// ---- status ----------------------------------------------------------------

/// One device's row (`zmem swap status`; with `--json`, these fields).
#[derive(Debug, serde::Serialize)]
pub struct Status {
    pub name: String,
    /// What `on` recorded, if anything.
    pub state: Option<State>,
    /// What its server reports, if it answers.
    #[serde(rename = "server")]
    pub stats: Option<StatsReply>,
    /// Bytes the kernel has on it, if it is swapped on.
    #[serde(rename = "swap_used")]
    pub used: Option<u64>,
    /// The keeper's pid, if it runs (`keeper.rs`).
    pub keeper: Option<u32>,
    /// The pid of the server serving the device now, if one does.
    pub server_pid: Option<u32>,
}

fn status_of(dir: &Path, st: Option<&State>) -> Status {
    let state = st.cloned().or_else(|| read_state(dir));
    let stats = zmem_server::protocol::stats(&dir.join("control.sock")).ok();
    let used = state.as_ref().and_then(|s| s.devices().into_iter().map(swap_used).sum::<Option<u64>>());
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let keeper = state.as_ref().map(|s| s.pid).filter(|&p| is_our_server(p, dir));
    Status { name, state, stats, used, keeper, server_pid: replace::server_pid(dir) }
}

/// Bytes used on swap device `dev` (/proc/swaps).
fn swap_used(dev: &str) -> Option<u64> {
    zmem_host::swap_areas().into_iter().find(|a| a.name == dev).map(|a| a.used_bytes)
}

/// The zramctl-like table of `rows`.
pub fn render_status(rows: &[Status]) -> String {
    let head = ["NAME", "DEVICE", "DISKSIZE", "DATA", "COMPR", "TOTAL", "ALGORITHM", "PRIO", "USED", "STATE"];
    let mut table: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        let h = |k: fn(&zmem_core::Stats) -> u64| r.stats.as_ref().map_or("-".to_string(), |v| human(k(&v.stats)));
        let state = match (&r.state, &r.stats, r.used) {
            (Some(_), Some(_), Some(_)) => "swap",
            (Some(_), Some(_), None) => "no swap",
            // The keeper holds the pages and starts a new server.
            (Some(_), None, _) if r.keeper.is_some() => "restarting",
            (Some(_), None, _) => "server down",
            (None, _, _) => "remains",
        };
        table.push(vec![
            r.name.clone(),
            r.state.as_ref().map_or("-".into(), |s| match s.devices().len() {
                1 => s.loop_dev.clone(),
                n => format!("{} (+{})", s.loop_dev, n - 1),
            }),
            r.state.as_ref().map_or("-".into(), |s| human(s.size)),
            h(|s| s.orig_data_size),
            h(|s| s.compr_data_size),
            h(|s| s.mem_used_total),
            r.stats.as_ref().map_or("-".into(), |v| v.algorithm.clone()),
            r.state.as_ref().map_or("-".into(), |s| s.priority.to_string()),
            r.used.map_or("-".into(), human),
            state.into(),
        ]);
    }
    let widths: Vec<usize> = (0..head.len()).map(|c| table.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in &table {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, v)| if c == 0 || c == 1 || c == 9 { format!("{v:<w$}", w = widths[c]) } else { format!("{v:>w$}", w = widths[c]) })
            .collect();
        out += cells.join(" ").trim_end();
        out += "\n";
    }
    out
}

/// One [`Status`] per device under `run_dir`.
pub fn status(run_dir: &Path) -> Vec<Status> {
    device_dirs(run_dir).iter().map(|d| status_of(d, None)).collect()
}

// ---- the server ------------------------------------------------------------

/// The server behind a device: protect itself from reclaim, join or charge
/// its cgroup, build the pool (`build_pool`, only now, so that all of it
/// is locked and charged), serve it as the FUSE file `IMAGE` under
/// `DIR/mnt`, answer the control socket, and run the policy threads, until
/// `stop` is set and no loop device uses the image any more.
pub fn serve(
    a: &ServerConfig,
    mut kept: Option<Kept>,
    build_pool: impl FnOnce(Option<PoolFiles>) -> Result<Built, Box<dyn std::error::Error + Send + Sync>>,
    stop: &AtomicBool,
    leave: &AtomicBool,
) -> Result<Served> {
    let safety = zmem_server::reclaim::protect()?;
    // (`on` is waiting for this server, or for its keeper, to be ready: it
    // is the parent now. A keeper stays.)
    let mut startup_code = if kept.is_some() { zmem_server::reclaim::StartupCode::at_once() } else { zmem_server::reclaim::StartupCode::new() };
    if let (Some(cg), Some(why)) = (&a.cgroup, &safety.io_flusher) {
        // Seen here: with the server charged to the same memory cgroup as
        // the processes that swap to it, a page fault of the server at the
        // cgroup's limit enters reclaim, which writes swap to the server's
        // own device and waits for it (wbt_wait, then blk_mq_get_tag under
        // swap_writeout): a deadlock. PR_SET_IO_FLUSHER keeps its reclaim
        // from doing that I/O; without it, sharing a cgroup is refused.
        return Err(SwapError::SharedCgroup { cgroup: cg.clone(), why: why.clone() });
    }
    let budget = match &a.charge_to {
        Some(cg) => {
            let budget = charge_budget(cg, a.max_pool)?;
            // The device's memory: this server's, and its keeper's if it
            // has one (its parent).
            let me = std::process::id();
            let parent = kept.as_ref().and_then(|_| rustix::process::getppid()).map(|p| p.as_raw_nonzero().get() as u32);
            // (The keeper's own: it maps and locks the pool this server
            // counts already.)
            let rss = move || Some(zmem_host::shared_budget::rss_of(me)? + parent.and_then(zmem_host::shared_budget::rss_private_of).unwrap_or(0));
            let keeper = zmem_host::shared_budget::SharedBudget::start(cg, budget, budget / 4, rss)?;
            eprintln!("zmem: counting the server's memory against {} (budget {})", cg.display(), human(budget));
            Some(Arc::new(keeper))
        }
        None => None,
    };
    if let Some(cg) = &a.cgroup {
        zmem_host::write_attr(cg.join("cgroup.procs"), &format!("{}\n", std::process::id()))?;
    }
    let left = kept.as_mut().and_then(|k| k.left.take());
    let fresh = left.is_none();
    let restarts = kept.as_ref().map(|k| k.restarts);
    let built = build_pool(left).map_err(SwapError::Pool)?;
    let recovery = restarts.map(|n| built.recovery(n));
    let Built { pool, comp, backing, .. } = built;
    if let (Some(k), Some(arena), true) = (&kept, pool.arena(), fresh) {
        k.hand_over(&zmem_server::keeper::HandOver { pool: Some((arena, backing.as_ref().map(std::os::fd::AsFd::as_fd))), ..Default::default() })?;
    }
    drop(backing);
    let export = Arc::new(Export::new(Arc::new(pool), a.size));
    let mnt = a.dir.join("mnt");
    let cfg = zmem_fuse::FuseConfig { file_name: IMAGE.into(), threads: a.threads.into(), allow_other: false, read_threads: a.read_threads.into() };
    let mount_err = |source| SwapError::Mount { mnt: mnt.clone(), source };
    let mounted = match kept {
        // The keeper mounted it; the first server answers INIT, a later
        // one has the last one's unanswered requests sent again.
        Some(k) => {
            let start = if k.restarts == 0 { zmem_fuse::Start::Fresh } else { zmem_fuse::Start::TakeOver };
            let channel = zmem_fuse::Channel::from_fds(k.fuse).map_err(mount_err)?;
            zmem_fuse::serve(Arc::clone(&export), &mnt, channel, &cfg, start).map_err(mount_err)?
        }
        // (Not under a keeper: the mountpoint is touched only here, since
        // under one it is the served file system's root, which answers
        // nothing until this server does.)
        None => {
            std::fs::create_dir_all(&mnt).map_err(|e| SwapError::file("create", &mnt, e))?;
            zmem_fuse::mount(Arc::clone(&export), &mnt, &cfg).map_err(mount_err)?
        }
    };
    // The workers' stacks and request buffers are locked as they are
    // touched (MCL_ONFAULT), not faulted in whole: a request buffer holds
    // the largest write (1 MiB), which a swap device is rarely sent.
    let control_path = a.dir.join("control.sock");
    let control = bind_unix(&control_path, 0o600, None)?;
    let metrics = a.metrics.as_ref().map(zmem_server::metrics::MetricsServer::bind).transpose()?;
    let info = Info {
        device: a.dir.file_name().map_or_else(|| "zmem".into(), |n| n.to_string_lossy().into_owned()),
        export: Arc::clone(&export),
        frontend: Frontend::Fuse { stats: Arc::clone(mounted.stats()), safety, budget },
        algorithm: comp.to_string(),
        dedup: a.dedup,
        endpoint: mnt.join(IMAGE).display().to_string(),
        backing: a.backing.clone(),
        recovery,
    };
    let ready = a.dir.join("ready");
    std::fs::write(&ready, format!("{}\n", std::process::id())).map_err(|e| SwapError::file("write", &ready, e))?;
    let image = mnt.join(IMAGE);
    let (pool, scanned, size) = (export.pool(), &image, a.size);
    let jobs: Vec<SideJob> = vec![Box::new(move |quit| unmapped::run(pool, scanned, size, quit))];
    // The side threads stop when the loop below ends, not at every
    // signal: a stray SIGTERM to an active device's server is refused
    // there, and the control socket, the metrics and the policies must go
    // on answering.
    let side = SideThreads { control: Some(control), metrics, policies: a.policies.clone(), jobs };
    let ready_line = format!("serving {} bytes as {}", a.size, info.endpoint);
    side.run(
        &info,
        || {
            zmem_server::notify::ready(&ready_line);
            eprintln!("zmem: swap server {} ready: {} bytes, {comp}, image {}", std::process::id(), a.size, info.endpoint);
        },
        || loop {
            while !stop.load(Ordering::Relaxed) && !leave.load(Ordering::Relaxed) {
                match startup_code.tick() {
                    Some(Ok(n)) => eprintln!("zmem: start-up code given back ({} of read-only file mappings gone over)", human(n)),
                    Some(Err(e)) => eprintln!("zmem: warning: could not give back the start-up code ({e}): it stays locked"),
                    None => {}
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if leave.load(Ordering::Relaxed) {
                break;
            }
            // A stray SIGTERM must not take the pages of an active swap
            // device with it: keep serving until its loop device is gone.
            let users = loops_backed_by(&image);
            if users.is_empty() {
                zmem_server::notify::stopping();
                break;
            }
            eprintln!("zmem: asked to stop, but {} still use the image; `zmem swap off` detaches them first", users.join(" "));
            zmem_server::notify::status(&format!("asked to stop, but {} still use the image", users.join(" ")));
            stop.store(false, Ordering::SeqCst);
        },
    );
    let _ = std::fs::remove_file(&control_path);
    if leave.load(Ordering::Relaxed) {
        // A restart: the side threads are stopped; what the workers are
        // answering is finished, the rest left to the next server. The
        // budget stays lowered (the next server keeps it so).
        let drained = mounted.leave(Duration::from_secs(2));
        export.pool().leave();
        eprintln!(
            "zmem: swap server {} leaves the device to the next one ({})",
            std::process::id(),
            if drained { "every request taken answered" } else { "some requests left to be sent again" }
        );
        std::mem::forget(info);
        return Ok(Served::Left);
    }
    let _ = std::fs::remove_file(a.dir.join("ready"));
    let st = export.pool().stats();
    mounted.unmount().map_err(SwapError::Unmount)?;
    // With it the budget keeper: the cgroup gets its budget back.
    drop(info);
    let mut err = std::io::stderr();
    let _ = writeln!(err, "zmem: swap server stopped; mm_stat {}", st.mm_stat().split_whitespace().collect::<Vec<_>>().join(" "));
    Ok(Served::Stopped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain() {
        assert!(parse_name("zmem0").is_ok());
        assert!(parse_name("a-b_c").is_ok());
        for bad in ["", "../x", "a/b", "a b", &"x".repeat(33)] {
            assert!(parse_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn areas_tile_the_device_at_descending_priorities() {
        const M: u64 = 1 << 20;
        for (size, areas, prio) in
            [(4096 * M, 0, 100), (4096 * M + 4096 * 3, 0, 100), (1000 * M, 3, 5), (64 * M, 0, 100), (100 * 4096, 16, 32767), (8 * M, 2, -1), (512 * M, 4, 1)]
        {
            let v = area_layout(size, areas, prio);
            assert!(!v.is_empty());
            // Whole pages, side by side from 0 to the device's last page.
            let mut at = 0;
            for a in &v {
                assert_eq!(a.offset, at, "{size} {areas}: {v:?}");
                assert!(a.len % 4096 == 0 && a.len >= 16 * 4096, "{v:?}");
                at += a.len;
            }
            assert_eq!(at, size / 4096 * 4096, "{v:?}");
            // Each below the one before, none below 0; -1 leaves them to the kernel.
            for (i, a) in v.iter().enumerate() {
                assert_eq!(a.priority, (prio >= 0).then(|| prio - i as i32), "{v:?}");
                assert!(a.priority.is_none_or(|p| p >= 0));
            }
        }
        assert_eq!(area_layout(4096 << 20, 0, 100).len(), AREAS_AUTO_MAX as usize, "4 GiB: the most it chooses");
        assert_eq!(area_layout(1 << 30, 0, 100).len(), 4, "1 GiB: one per 256 MiB");
        assert_eq!(area_layout(64 << 20, 0, 100).len(), 1, "below 512 MiB: one");
        assert_eq!(
            (auto_areas(4096 << 20, 3), auto_areas(4096 << 20, 12), auto_areas(4096 << 20, 30), auto_areas(1 << 30, 22)),
            (16, 12, 1, 2),
            "the swap types left"
        );
        assert_eq!(area_layout(512 << 20, 4, 1).len(), 2, "priority 1 leaves room for 2");
        assert_eq!(area_layout(100 * 4096, 16, 32767).len(), 6, "16 pages an area at least");
        assert_eq!(area_layout(1 << 30, 99, 100).len(), AREAS_MAX as usize);
    }

    #[test]
    fn status_table_has_a_row_per_device() {
        let st = State {
            name: "zmem0".into(),
            pid: 1,
            loop_dev: "/dev/loop7".into(),
            areas: Vec::new(),
            size: 8 << 30,
            priority: 100,
            algorithm: "lz4".into(),
            charge_to: None,
        };
        let mut stats = StatsReply { algorithm: "lz4".into(), ..Default::default() };
        (stats.stats.orig_data_size, stats.stats.compr_data_size, stats.stats.mem_used_total) = (1 << 30, 300 << 20, 310 << 20);
        let row = |stats| Status { name: "zmem0".into(), state: Some(st.clone()), stats, used: Some(1 << 30), keeper: Some(2), server_pid: Some(3) };
        let out = render_status(&[row(Some(stats))]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("NAME"));
        for want in ["zmem0", "/dev/loop7", "8G", "1G", "300M", "310M", "lz4", "100", "swap"] {
            assert!(lines[1].contains(want), "{want} missing from {}", lines[1]);
        }
        // No server answers, but the keeper runs: it is starting one.
        let out = render_status(&[row(None)]);
        assert!(out.lines().nth(1).is_some_and(|l| l.ends_with("restarting")), "{out}");
        let out = render_status(&[Status { keeper: None, ..row(None) }]);
        assert!(out.lines().nth(1).is_some_and(|l| l.ends_with("server down")), "{out}");
    }
}
