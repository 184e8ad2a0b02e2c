//! The machine as zmem's servers and benchmarks change it: tools, memory
//! cgroups, loop disks with an ext4 on them, blkio throttles, swap areas,
//! zswap's parameters, the mount table, and the counters the kernel keeps
//! about all of them; and [`shared_budget`], one memory budget for a
//! cgroup and a pool outside it. Both the swap server and `zmem-bench`
//! use these, so neither carries the other's code.
//!
//! Every change is a guard that undoes it on drop, in the reverse order of
//! making it, so a run that fails half way, or is interrupted (the caller
//! turns SIGINT into an error), leaves the machine as it found it. An undo
//! that fails is logged with the command that finishes it by hand; it does
//! not stop the other undos.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod error;
pub mod shared_budget;

pub use error::{HostError, Result};

/// Sizes as zramctl prints them: 0B, 512B, 4K, 1.5M, 2G.
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || (v - v.round()).abs() < 0.05 {
        format!("{}{}", v.round() as u64, UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// Whether `tool` is a file in a directory of PATH.
pub fn have(tool: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false)
}

/// Run a tool to completion; its stdout, or an error with its stderr.
pub fn run_tool(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().map_err(|e| HostError::spawn(cmd, e))?;
    if !out.status.success() {
        return Err(HostError::ToolFailed { cmd: format!("{cmd:?}"), status: out.status, stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A file's contents, trimmed.
pub fn read_trim(path: impl AsRef<Path>) -> Result<String> {
    let p = path.as_ref();
    Ok(std::fs::read_to_string(p).map_err(|e| HostError::file("read", p, e))?.trim().to_string())
}

/// Write a sysfs or cgroup attribute.
pub fn write_attr(path: impl AsRef<Path>, value: &str) -> Result<()> {
    let p = path.as_ref();
    std::fs::write(p, value).map_err(|e| HostError::file(format!("write {value:?} to"), p, e))
}

/// Write dirty pages back, then drop the kernel's clean caches.
pub fn drop_caches() -> Result<()> {
    run_tool(&mut Command::new("sync"))?;
    write_attr("/proc/sys/vm/drop_caches", "3")
}

/// Whether a file system is mounted exactly at `dir`.
pub fn is_mounted(dir: &Path) -> bool {
    mounts().iter().any(|m| m == dir)
}

/// Whether a file system is mounted at `dir` or below it.
pub fn is_mounted_under(dir: &Path) -> bool {
    mounts().iter().any(|m| m.starts_with(dir))
}

/// The mount points of /proc/mounts (with its octal escapes undone).
fn mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/mounts").unwrap_or_default().lines().filter_map(|l| l.split(' ').nth(1)).map(|m| PathBuf::from(unescape(m))).collect()
}

/// The kernel's tables (/proc/mounts, /proc/swaps) escape spaces and the
/// like in names as octal (\040).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let Some(v) = octal.map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'))).filter(|&v| v <= 255) {
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Retry an undo a few times (a device is often briefly busy after its
/// last user closed it); log it with the hand-made fix if it never works.
pub fn undo(what: &str, by_hand: &str, mut f: impl FnMut() -> Result<()>) {
    let mut last = None;
    for _ in 0..50 {
        match f() {
            Ok(()) => return,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if let Some(e) = last {
        tracing::error!("could not {what}: {e}; finish it by hand: {by_hand}");
        eprintln!("zmem: could not {what}: {e}; finish it by hand: {by_hand}");
    }
}

/// Undoes one step of a stack a bench built (a loop device, a mount) on
/// drop: retried, and logged with the command to finish it by hand if it
/// never works.
pub struct Step {
    what: String,
    argv: Vec<String>,
}

impl Step {
    pub fn new(what: &str, argv: &[&str]) -> Step {
        Step { what: what.into(), argv: argv.iter().map(|s| s.to_string()).collect() }
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        let by_hand = self.argv.join(" ");
        undo(&self.what, &by_hand, || run_tool(Command::new(&self.argv[0]).args(&self.argv[1..])).map(drop));
    }
}

/// Unmounts a directory on drop, if something is mounted there.
pub struct UnmountIfMounted(pub PathBuf);

impl Drop for UnmountIfMounted {
    fn drop(&mut self) {
        let dir = self.0.to_str().unwrap_or_default();
        if is_mounted(&self.0) {
            undo(&format!("unmount {dir}"), &format!("umount {dir}"), || run_tool(Command::new("umount").arg(&self.0)).map(drop));
        }
    }
}

/// `/proc/vmstat` as a map.
pub fn vmstat() -> HashMap<String, u64> {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The kernel's USER_HZ, the unit of /proc's CPU times: 100 on every
/// Linux architecture zmem runs on.
const USER_HZ: f64 = 100.0;

/// Fields of `/proc/PID/stat` after the command name (field 3 is index 0).
fn proc_stat_fields(pid: &str) -> Option<Vec<u64>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    Some(rest.split_whitespace().skip(1).map(|t| t.parse().unwrap_or(0)).collect())
}

/// A process's CPU seconds (`/proc/PID/stat`): its own, and those of the
/// children it has waited for, with their own waited-for descendants
/// (getrusage's RUSAGE_CHILDREN, read from /proc without unsafe code).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTimes {
    pub user: f64,
    pub system: f64,
    pub children_user: f64,
    pub children_system: f64,
}

/// The CPU times of process `pid` (a number, or "self").
pub fn cpu_times(pid: &str) -> Option<CpuTimes> {
    let f = proc_stat_fields(pid)?;
    let secs = |i: usize| Some(*f.get(i)? as f64 / USER_HZ);
    Some(CpuTimes { user: secs(10)?, system: secs(11)?, children_user: secs(12)?, children_system: secs(13)? })
}

/// CPU seconds (user + system) a process has used itself.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    cpu_times(&pid.to_string()).map(|t| t.user + t.system)
}

/// CPU seconds (user + system) of this process's children that it has
/// waited for ([`CpuTimes`]).
pub fn children_cpu_secs() -> f64 {
    cpu_times("self").map_or(0.0, |t| t.children_user + t.children_system)
}

/// The whole machine's CPU ticks since boot by kind (`/proc/stat`'s first
/// line: user, nice, system, idle, iowait, ...).
fn machine_ticks() -> Option<Vec<u64>> {
    cpu_line_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The ticks of `/proc/stat`'s first line (`cpu`, all CPUs together).
fn cpu_line_ticks(stat: &str) -> Option<Vec<u64>> {
    let mut cpu = stat.lines().next()?.split_whitespace();
    (cpu.next()? == "cpu").then_some(())?;
    cpu.map(|t| t.parse().ok()).collect()
}

/// The whole machine's CPU time by kind, in seconds of all its CPUs
/// together, and its context switches (`/proc/stat`): since boot
/// ([`machine_cpu`]), or over a span ([`MachineCpu::since`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct MachineCpu {
    /// User time, niced included.
    pub user_secs: f64,
    /// Kernel time: system, hard and soft interrupts.
    pub system_secs: f64,
    pub idle_secs: f64,
    /// Idle with I/O outstanding.
    pub iowait_secs: f64,
    /// Time the hypervisor ran something else while a CPU had work.
    pub steal_secs: f64,
    pub context_switches: u64,
}

/// The machine's CPU time and context switches since boot.
pub fn machine_cpu() -> Option<MachineCpu> {
    parse_machine_cpu(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_machine_cpu(stat: &str) -> Option<MachineCpu> {
    // user nice system idle iowait irq softirq steal (older kernels stop
    // after idle or later: what is missing counts 0).
    let t = cpu_line_ticks(stat).filter(|t| t.len() >= 4)?;
    let secs = |i: &[usize]| i.iter().map(|&i| t.get(i).copied().unwrap_or(0)).sum::<u64>() as f64 / USER_HZ;
    let context_switches = stat.lines().find_map(|l| l.strip_prefix("ctxt ")?.trim().parse().ok()).unwrap_or(0);
    Some(MachineCpu {
        user_secs: secs(&[0, 1]),
        system_secs: secs(&[2, 5, 6]),
        idle_secs: secs(&[3]),
        iowait_secs: secs(&[4]),
        steal_secs: secs(&[7]),
        context_switches,
    })
}

impl MachineCpu {
    /// What was spent between `before` and `self`.
    pub fn since(&self, before: &MachineCpu) -> MachineCpu {
        let d = |a: f64, b: f64| (a - b).max(0.0);
        MachineCpu {
            user_secs: d(self.user_secs, before.user_secs),
            system_secs: d(self.system_secs, before.system_secs),
            idle_secs: d(self.idle_secs, before.idle_secs),
            iowait_secs: d(self.iowait_secs, before.iowait_secs),
            steal_secs: d(self.steal_secs, before.steal_secs),
            context_switches: self.context_switches.saturating_sub(before.context_switches),
        }
    }

    /// CPU seconds the machine worked (user and kernel).
    pub fn busy_secs(&self) -> f64 {
        self.user_secs + self.system_secs
    }

    /// The share of its CPU time the machine had nothing to run (idle,
    /// waiting for I/O included); `None` over no time.
    pub fn idle_share(&self) -> Option<f64> {
        let all = self.busy_secs() + self.idle_secs + self.iowait_secs + self.steal_secs;
        (all > 0.0).then(|| (self.idle_secs + self.iowait_secs) / all)
    }
}

/// The whole machine's CPU seconds since boot (`/proc/stat`'s first line):
/// user (with nice), and system.
pub fn machine_cpu_secs() -> Option<(f64, f64)> {
    let t = machine_ticks()?;
    let (user, nice, system) = (*t.first()?, *t.get(1)?, *t.get(2)?);
    Some(((user + nice) as f64 / USER_HZ, system as f64 / USER_HZ))
}

/// The time, in microseconds since boot, that some task, and that every
/// task, waited for memory (`/proc/pressure/memory`'s `some` and `full`
/// totals: reclaim, and swap-ins of pages the workload had recently
/// used). `None` without PSI.
pub fn memory_stall_us() -> Option<(u64, u64)> {
    parse_pressure(&std::fs::read_to_string("/proc/pressure/memory").ok()?)
}

/// The `some` and `full` totals of a `/proc/pressure/*` file.
fn parse_pressure(text: &str) -> Option<(u64, u64)> {
    let total = |kind: &str| {
        let line = text.lines().find(|l| l.split_whitespace().next() == Some(kind))?;
        line.split_whitespace().find_map(|f| f.strip_prefix("total="))?.parse::<u64>().ok()
    };
    Some((total("some")?, total("full").unwrap_or(0)))
}

/// The CPU seconds the machine's CPUs have spent idle since boot, the time
/// they waited for I/O included (`/proc/stat`'s idle and iowait).
pub fn machine_idle_secs() -> Option<f64> {
    let t = machine_ticks()?;
    Some((*t.get(3)? + *t.get(4)?) as f64 / USER_HZ)
}

/// CPU seconds (user + system) the calling thread has used
/// (`/proc/thread-self/stat`, in ticks of 10 ms).
pub fn thread_cpu_secs() -> Option<f64> {
    cpu_times("thread-self").map(|t| t.user + t.system)
}

/// CPU seconds of all kswapd threads (reclaim done in the background).
pub fn kswapd_cpu_secs() -> f64 {
    let Ok(rd) = std::fs::read_dir("/proc") else { return 0.0 };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end().starts_with("kswapd")))
        .filter_map(cpu_secs)
        .sum()
}

/// One line of `/proc/swaps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapArea {
    pub name: String,
    /// Slots the kernel has allocated on it, in bytes (`Used`, KiB there).
    pub used_bytes: u64,
}

/// Swap areas in use (`/proc/swaps`), in the kernel's order.
pub fn swap_areas() -> Vec<SwapArea> {
    parse_swaps(&std::fs::read_to_string("/proc/swaps").unwrap_or_default())
}

fn parse_swaps(text: &str) -> Vec<SwapArea> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            // Filename Type Size Used Priority
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(SwapArea { name: unescape(f.first()?), used_bytes: f.get(3)?.parse::<u64>().ok()? * 1024 })
        })
        .collect()
}

/// A loop device's swap area, as [`swapped_slots`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopSwap {
    /// Its index in the kernel's table: its line in `swaps` (the kernel
    /// lists areas by type; a type freed by a swapoff below it and not
    /// reused would shift this).
    pub swap_type: u64,
    /// The page of the loop device's backing file where the area starts
    /// (the loop device's `offset`).
    pub first_page: u64,
    /// Slots the kernel has allocated on it, in bytes.
    pub used_bytes: u64,
}

/// Loop device `dev`'s swap area among `swaps` ([`swap_areas`]); None
/// while it is not swapped on.
pub fn loop_swap_area(swaps: &[SwapArea], dev: &str) -> Option<LoopSwap> {
    let ty = swaps.iter().position(|a| a.name == dev)?;
    let offset = std::fs::read_to_string(Path::new("/sys/block").join(dev.trim_start_matches("/dev/")).join("loop/offset")).ok()?;
    Some(LoopSwap { swap_type: ty as u64, first_page: offset.trim().parse::<u64>().ok()? / 4096, used_bytes: swaps[ty].used_bytes })
}

/// Call `mark` with each slot of the swap areas `areas` that the page
/// tables of processes `pids` point to: their anonymous pages that are
/// swapped out there (`/proc/PID/pagemap`, root); a slot that several
/// point to (after a fork) comes as often, offset by the area's
/// `first_page`. Slots held only by the swap cache or by tmpfs are not
/// seen. Processes that exit meanwhile are skipped.
pub fn swapped_slots(pids: &[u32], areas: &[LoopSwap], mark: &mut dyn FnMut(u64)) {
    use std::os::unix::fs::FileExt;
    const PM_SWAP: u64 = 1 << 62;
    const PAGE: u64 = 4096;
    let mut buf = vec![0u8; 8 << 16];
    for pid in pids {
        // A process none of whose pages is swapped out has nothing to find
        // (VmSwap counts the swap entries in its page tables): most of a
        // build's short processes.
        if std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| vm_swap_is_zero(&s)) {
            continue;
        }
        let (Ok(maps), Ok(pm)) = (std::fs::read_to_string(format!("/proc/{pid}/maps")), std::fs::File::open(format!("/proc/{pid}/pagemap"))) else { continue };
        for l in maps.lines() {
            let mut f = l.split_whitespace();
            let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
            // Only private writable mappings hold anonymous pages.
            if !perms.starts_with("rw") || perms.ends_with('s') {
                continue;
            }
            let Some((a, b)) = range.split_once('-') else { continue };
            let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else { continue };
            let mut page = a / PAGE;
            while page < b / PAGE {
                let n = ((b / PAGE - page) as usize).min(buf.len() / 8);
                let Ok(got) = pm.read_at(&mut buf[..n * 8], page * 8) else { break };
                for e in buf[..got].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())) {
                    if e & PM_SWAP != 0 {
                        if let Some(a) = areas.iter().find(|a| a.swap_type == e & 0x1f) {
                            mark(a.first_page + ((e >> 5) & ((1 << 50) - 1)));
                        }
                    }
                }
                if got < n * 8 {
                    break;
                }
                page += n as u64;
            }
        }
    }
}

/// Whether a `/proc/PID/status` says no page of the process is swapped
/// out (`VmSwap:  0 kB`). A kernel thread, with no such line, has none.
fn vm_swap_is_zero(status: &str) -> bool {
    status.lines().find_map(|l| l.strip_prefix("VmSwap:")).is_none_or(|v| v.trim() == "0 kB")
}

/// The value, in bytes, of a `NAME:  N kB` line of a `/proc` text
/// (`/proc/meminfo`, `/proc/PID/status`); `None` if there is no such line
/// or its value is not in kB.
pub fn proc_kb_field(text: &str, name: &str) -> Option<u64> {
    let v = text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?;
    let kb: u64 = v.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kb << 10)
}

/// Every process's pid but this one's (`/proc`).
pub fn other_pids() -> Vec<u32> {
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()).filter(|&p| p != me).collect()
}

/// Swap areas in use (`/proc/swaps`), by name.
pub fn active_swaps() -> Vec<String> {
    swap_areas().into_iter().map(|a| a.name).collect()
}

// ---- child processes ---------------------------------------------------

/// Kills (SIGTERM, then SIGKILL) a child process on drop.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    /// Start `cmd` with no stdin or stdout and `stderr` as given.
    pub fn spawn(cmd: &mut Command, stderr: Stdio) -> Result<ChildGuard> {
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr).spawn().map_err(|e| HostError::spawn(cmd, e))?;
        Ok(ChildGuard(Some(child)))
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().map(|c| c.id()).unwrap_or(0)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // Our own child, not reaped yet: the pid cannot have been reused.
            let _ = rustix::process::kill_process(rustix::process::Pid::from_child(&c), rustix::process::Signal::TERM);
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Wait up to 10 s for a server, `child`, to listen on the unix socket
/// `path`, failing early if it exits.
pub fn wait_for_socket(path: &Path, child: &mut ChildGuard) -> Result<()> {
    const WITHIN: Duration = Duration::from_secs(10);
    let end = Instant::now() + WITHIN;
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        if let Some(Ok(Some(status))) = child.0.as_mut().map(|c| c.try_wait()) {
            return Err(HostError::Exited { what: format!("the server for {}", path.display()), status, log: None });
        }
        if Instant::now() > end {
            return Err(HostError::NotReady { what: format!("the server did not listen on {}", path.display()), within: WITHIN });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Wait up to 20 s for `file` to appear (a FUSE file its server mounts),
/// failing early if `child`, the process that serves it, exits (its log is
/// `log`).
pub fn wait_for_file(file: &Path, child: &mut ChildGuard, log: &Path) -> Result<()> {
    const WITHIN: Duration = Duration::from_secs(20);
    let end = Instant::now() + WITHIN;
    while !file.exists() {
        if let Some(Ok(Some(status))) = child.0.as_mut().map(|c| c.try_wait()) {
            return Err(HostError::Exited { what: format!("the process serving {}", file.display()), status, log: Some(log.to_path_buf()) });
        }
        if Instant::now() > end {
            return Err(HostError::NotReady { what: format!("{} did not appear", file.display()), within: WITHIN });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Run a command with a hard time limit; returns stdout, errors with stderr.
pub fn run_limited(c: &mut Command, limit: Duration) -> Result<String> {
    let dir = tempfile::tempdir().map_err(|e| HostError::file("make a directory in", std::env::temp_dir(), e))?;
    let (op, ep) = (dir.path().join("out"), dir.path().join("err"));
    let create = |p: &Path| std::fs::File::create(p).map_err(|e| HostError::file("create", p, e));
    let mut child = c.stdin(Stdio::null()).stdout(create(&op)?).stderr(create(&ep)?).spawn().map_err(|e| HostError::spawn(c, e))?;
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| HostError::spawn(c, e))? {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return Err(HostError::TimedOut { cmd: format!("{c:?}"), limit });
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&op).map_err(|e| HostError::file("read", &op, e))?;
    if !status.success() {
        return Err(HostError::ToolFailed { cmd: format!("{c:?}"), status, stderr: std::fs::read_to_string(&ep).unwrap_or_default().trim().to_string() });
    }
    Ok(out)
}

// ---- memory cgroups ----------------------------------------------------

/// The cgroup v1 memory hierarchy's root.
pub const MEMCG_ROOT: &str = "/sys/fs/cgroup/memory";

/// A memory cgroup (v1) made for a run; removed on drop after every task
/// still in it is killed.
pub struct MemCgroup {
    path: PathBuf,
}

impl MemCgroup {
    /// Create `MEMCG_ROOT/name` (an existing one is removed first if it
    /// holds no task) with a limit and a swappiness.
    pub fn create(name: &str, limit: Option<u64>, swappiness: u32) -> Result<MemCgroup> {
        let path = Path::new(MEMCG_ROOT).join(name);
        if !Path::new(MEMCG_ROOT).join("memory.limit_in_bytes").exists() {
            return Err(HostError::Unsupported {
                what: "cgroup v1 memory controller",
                path: MEMCG_ROOT,
                needs: "mount it there (zmem's benchmarks and --charge-to use cgroup v1)",
            });
        }
        if path.exists() {
            std::fs::remove_dir(&path).map_err(|e| HostError::file("remove the cgroup left from an earlier run (are tasks still in it?)", &path, e))?;
        }
        std::fs::create_dir(&path).map_err(|e| HostError::file("create", &path, e))?;
        let cg = MemCgroup { path };
        if let Some(l) = limit {
            write_attr(cg.path.join("memory.limit_in_bytes"), &l.to_string())?;
        }
        write_attr(cg.path.join("memory.swappiness"), &swappiness.to_string())?;
        Ok(cg)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A `memory.*` counter.
    pub fn counter(&self, name: &str) -> u64 {
        read_trim(self.path.join(name)).ok().and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    /// One key of `memory.stat`.
    pub fn stat(&self, key: &str) -> u64 {
        self.keyed("memory.stat", key)
    }

    /// `key`'s number in a `key value` file of the cgroup (`memory.stat`,
    /// `memory.oom_control`); 0 if absent.
    pub fn keyed(&self, file: &str, key: &str) -> u64 {
        std::fs::read_to_string(self.path.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    }

    fn tasks(&self) -> Vec<String> {
        std::fs::read_to_string(self.path.join("cgroup.procs")).unwrap_or_default().lines().map(String::from).collect()
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        let by_hand = format!("kill the tasks in {0}/cgroup.procs, then rmdir {0}", self.path.display());
        undo(&format!("remove {}", self.path.display()), &by_hand, || {
            for t in self.tasks() {
                let _ = Command::new("kill").arg("-KILL").arg(&t).status();
            }
            std::fs::remove_dir(&self.path).map_err(|e| HostError::file("remove", &self.path, e))
        });
    }
}

// ---- disks -------------------------------------------------------------

/// Read and write counts of a block device (`/sys/block/DEV/stat`).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DiskStat {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
}

impl DiskStat {
    pub fn of(dev: &str) -> DiskStat {
        let f: Vec<u64> =
            std::fs::read_to_string(format!("/sys/block/{dev}/stat")).unwrap_or_default().split_whitespace().map(|t| t.parse().unwrap_or(0)).collect();
        let g = |i: usize| f.get(i).copied().unwrap_or(0);
        DiskStat { read_ops: g(0), read_bytes: g(2) * 512, write_ops: g(4), write_bytes: g(6) * 512 }
    }

    pub fn since(&self, before: &DiskStat) -> DiskStat {
        DiskStat {
            read_ops: self.read_ops.saturating_sub(before.read_ops),
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            write_ops: self.write_ops.saturating_sub(before.write_ops),
            write_bytes: self.write_bytes.saturating_sub(before.write_bytes),
        }
    }
}

/// A blkio throttle: IOPS and bytes per second, each way.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Throttle {
    pub iops: u64,
    pub bps: u64,
}

const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";
const THROTTLE_FILES: [&str; 4] =
    ["blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device", "blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"];

/// A file on the host's disk seen as a block device (a loop device with
/// direct I/O, so the host's page cache does not stand in front of the
/// disk) holding a fresh ext4, mounted. Its `/sys/block/loopN/stat` counts
/// exactly the I/O of what lives on it. Drop lifts the throttle, unmounts,
/// detaches and deletes the image.
pub struct LoopDisk {
    image: PathBuf,
    dev: String,
    majmin: String,
    mnt: PathBuf,
    mounted: bool,
    throttled: bool,
}

impl LoopDisk {
    /// Make a `size`-byte image at `image` (fully allocated, so the host
    /// file system does no allocation work during a run), attach it, make
    /// the file system with every table written now (no lazy init running
    /// in the background during a run), mount it at `mnt`.
    pub fn create(image: &Path, size: u64, mnt: &Path) -> Result<LoopDisk> {
        if let Some(t) = ["losetup", "mkfs.ext4", "mount", "umount", "fallocate"].into_iter().find(|t| !have(t)) {
            return Err(HostError::MissingTool(t.to_string()));
        }
        let _ = std::fs::remove_file(image);
        run_tool(Command::new("fallocate").arg("-l").arg(size.to_string()).arg(image))?;
        let dev = match run_tool(Command::new("losetup").args(["--find", "--show", "--direct-io=on"]).arg(image)) {
            Ok(d) => d.trim().trim_start_matches("/dev/").to_string(),
            Err(e) => {
                let _ = std::fs::remove_file(image);
                return Err(e);
            }
        };
        let majmin = read_trim(format!("/sys/block/{dev}/dev")).unwrap_or_default();
        let mut disk = LoopDisk { image: image.to_path_buf(), dev, majmin, mnt: mnt.to_path_buf(), mounted: false, throttled: false };
        run_tool(Command::new("mkfs.ext4").args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", "-m", "0"]).arg(disk.node()))?;
        std::fs::create_dir_all(mnt).map_err(|e| HostError::file("create", mnt, e))?;
        run_tool(Command::new("mount").arg(disk.node()).arg(mnt))?;
        disk.mounted = true;
        Ok(disk)
    }

    /// `loopN`.
    pub fn dev(&self) -> &str {
        &self.dev
    }

    pub fn node(&self) -> PathBuf {
        PathBuf::from(format!("/dev/{}", self.dev))
    }

    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    pub fn stat(&self) -> DiskStat {
        DiskStat::of(&self.dev)
    }

    /// Unmount the file system; the device stays attached.
    pub fn unmount(&mut self) -> Result<()> {
        if self.mounted {
            run_tool(Command::new("umount").arg(&self.mnt))?;
            self.mounted = false;
        }
        Ok(())
    }

    /// Mount the file system again at its mount point, with `options`
    /// (`ro`, …).
    pub fn mount(&mut self, options: &str) -> Result<()> {
        if !self.mounted {
            run_tool(Command::new("mount").args(["-o", options]).arg(self.node()).arg(&self.mnt))?;
            self.mounted = true;
        }
        Ok(())
    }

    /// Throttle the device for every task (rules on the root blkio
    /// cgroup), or lift the throttle (`None`).
    pub fn throttle(&mut self, t: Option<Throttle>) -> Result<()> {
        if !Path::new(BLKIO_ROOT).join(THROTTLE_FILES[0]).exists() {
            return Err(HostError::Unsupported {
                what: "cgroup v1 blkio controller with throttling",
                path: BLKIO_ROOT,
                needs: "mount it there, on a kernel built with CONFIG_BLK_DEV_THROTTLING",
            });
        }
        let vals = match t {
            Some(t) => [t.iops, t.iops, t.bps, t.bps],
            None => [0; 4],
        };
        for (f, v) in THROTTLE_FILES.iter().zip(vals) {
            write_attr(Path::new(BLKIO_ROOT).join(f), &format!("{} {v}", self.majmin))?;
        }
        self.throttled = t.is_some();
        Ok(())
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if self.throttled {
            let by_hand = format!("echo '{} 0' > {BLKIO_ROOT}/blkio.throttle.{{read,write}}_{{iops,bps}}_device", self.majmin);
            undo(&format!("lift the throttle on {}", self.dev), &by_hand, || self.throttle(None));
        }
        if self.mounted {
            undo(&format!("unmount {}", self.mnt.display()), &format!("umount {}", self.mnt.display()), || {
                run_tool(Command::new("umount").arg(&self.mnt)).map(drop)
            });
        }
        let node = self.node();
        undo(&format!("detach {}", node.display()), &format!("losetup -d {}", node.display()), || {
            run_tool(Command::new("losetup").arg("-d").arg(&node)).map(drop)
        });
        let _ = std::fs::remove_file(&self.image);
    }
}

// ---- swap --------------------------------------------------------------

/// A swap area turned on; `swapoff` on drop.
pub struct SwapOn {
    path: PathBuf,
}

impl SwapOn {
    /// `mkswap` (if `format`) and `swapon --discard` at `priority`.
    pub fn on(path: &Path, priority: i32, format: bool) -> Result<SwapOn> {
        if format {
            run_tool(Command::new("mkswap").arg("-q").arg(path))?;
        }
        run_tool(Command::new("swapon").arg("--discard").arg("-p").arg(priority.to_string()).arg(path))?;
        Ok(SwapOn { path: path.to_path_buf() })
    }

    /// A swap file of `size` bytes, fully allocated, mode 0600.
    pub fn make_file(path: &Path, size: u64) -> Result<()> {
        let _ = std::fs::remove_file(path);
        run_tool(Command::new("fallocate").arg("-l").arg(size.to_string()).arg(path))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| HostError::file("make private (mode 0600)", path, e))
    }
}

impl Drop for SwapOn {
    fn drop(&mut self) {
        let p = self.path.display().to_string();
        undo(&format!("swapoff {p}"), &format!("swapoff {p}"), || run_tool(Command::new("swapoff").arg(&self.path)).map(drop));
    }
}

// ---- zswap -------------------------------------------------------------

const ZSWAP_PARAMS: &str = "/sys/module/zswap/parameters";
const ZSWAP_DEBUGFS: &str = "/sys/kernel/debug/zswap";

/// Where zswap's debugfs counter `name` is (debugfs mounted: see
/// [`ZswapParams::save`]).
pub fn zswap_counter_path(name: &str) -> PathBuf {
    Path::new(ZSWAP_DEBUGFS).join(name)
}

/// zswap's module parameters as found; restored on drop (disabled first,
/// so nothing is stored while the others change back, `enabled` last).
pub struct ZswapParams {
    saved: Vec<(String, String)>,
    debugfs_mounted_by_us: bool,
}

impl ZswapParams {
    /// Save every parameter, and mount debugfs (for zswap's counters) if
    /// it is not mounted.
    pub fn save() -> Result<ZswapParams> {
        let mut saved = Vec::new();
        let params = std::fs::read_dir(ZSWAP_PARAMS).map_err(|_| HostError::Unsupported {
            what: "zswap",
            path: ZSWAP_PARAMS,
            needs: "a kernel built with CONFIG_ZSWAP",
        })?;
        for e in params.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            saved.push((name, read_trim(e.path())?));
        }
        let mut p = ZswapParams { saved, debugfs_mounted_by_us: false };
        if !Path::new(ZSWAP_DEBUGFS).exists() {
            run_tool(Command::new("mount").args(["-t", "debugfs", "debugfs", "/sys/kernel/debug"]))?;
            p.debugfs_mounted_by_us = true;
        }
        Ok(p)
    }

    pub fn set(&self, name: &str, value: &str) -> Result<()> {
        write_attr(Path::new(ZSWAP_PARAMS).join(name), value)
    }

    /// One of zswap's debugfs counters (`stored_pages`, `pool_total_size`,
    /// `written_back_pages`, `reject_*`).
    pub fn counter(&self, name: &str) -> u64 {
        read_trim(zswap_counter_path(name)).ok().and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    /// RAM in bytes (`MemTotal`), against which `max_pool_percent` counts.
    pub fn mem_total() -> u64 {
        proc_kb_field(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default(), "MemTotal").unwrap_or(0)
    }
}

impl Drop for ZswapParams {
    fn drop(&mut self) {
        let _ = self.set("enabled", "N");
        for (k, v) in self.saved.iter().filter(|(k, _)| k != "enabled") {
            undo(&format!("restore zswap's {k}"), &format!("echo {v} > {ZSWAP_PARAMS}/{k}"), || self.set(k, v));
        }
        if let Some((_, v)) = self.saved.iter().find(|(k, _)| k == "enabled") {
            undo("restore zswap's enabled", &format!("echo {v} > {ZSWAP_PARAMS}/enabled"), || self.set("enabled", v));
        }
        if self.debugfs_mounted_by_us {
            let _ = Command::new("umount").arg("/sys/kernel/debug").status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_stat_since_never_underflows() {
        let a = DiskStat { read_ops: 5, read_bytes: 10, write_ops: 1, write_bytes: 2 };
        let b = DiskStat { read_ops: 7, read_bytes: 4096, write_ops: 1, write_bytes: 1 };
        let d = b.since(&a);
        assert_eq!((d.read_ops, d.read_bytes, d.write_ops, d.write_bytes), (2, 4086, 0, 0));
    }

    #[test]
    fn pressure_totals_parse_and_junk_is_none() {
        let text = "some avg10=0.00 avg60=0.00 avg300=3.62 total=477275426\nfull avg10=0.00 avg60=0.00 avg300=2.18 total=219166603\n";
        assert_eq!(parse_pressure(text), Some((477_275_426, 219_166_603)));
        assert_eq!(parse_pressure("some avg10=0.00 total=12\n"), Some((12, 0)), "cpu's file has no full line on old kernels");
        assert_eq!(parse_pressure("full avg10=0.00 total=12\n"), None);
        assert_eq!(parse_pressure("some avg10=0.00 total=x\n"), None);
        assert_eq!(parse_pressure(""), None);
        if std::path::Path::new("/proc/pressure/memory").exists() {
            assert!(memory_stall_us().is_some(), "this kernel has PSI: its totals parse");
        }
    }

    #[test]
    fn vm_swap_zero_only_when_it_says_so() {
        assert!(vm_swap_is_zero("Name:\tsh\nVmSwap:\t       0 kB\nThreads:\t1\n"));
        assert!(!vm_swap_is_zero("Name:\tcc1\nVmSwap:\t    1234 kB\n"));
        assert!(vm_swap_is_zero("Name:\tkthreadd\nThreads:\t1\n"), "a kernel thread has no pages");
        let me = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(me.contains("VmSwap:"), "this kernel reports VmSwap");
        assert!(!other_pids().contains(&std::process::id()) && other_pids().contains(&1));
    }

    #[test]
    fn own_cpu_time_is_readable() {
        let t0 = cpu_secs(std::process::id()).expect("/proc/self/stat");
        let end = std::time::Instant::now() + Duration::from_millis(300);
        let mut x = 0u64;
        while std::time::Instant::now() < end {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let t1 = cpu_secs(std::process::id()).unwrap();
        assert!(t1 - t0 >= 0.1, "300 ms of spinning counted as {} s", t1 - t0);
    }

    /// A thread's own CPU time counts its spinning and not the sleep of
    /// another; the machine's idle time is there and never runs back.
    #[test]
    fn a_threads_cpu_time_and_the_machines_idle_time_are_readable() {
        let idle0 = machine_idle_secs().expect("/proc/stat");
        let sleeper = std::thread::spawn(|| {
            let t0 = thread_cpu_secs().expect("/proc/thread-self/stat");
            std::thread::sleep(Duration::from_millis(300));
            thread_cpu_secs().unwrap() - t0
        });
        let t0 = thread_cpu_secs().expect("/proc/thread-self/stat");
        let end = std::time::Instant::now() + Duration::from_millis(300);
        let mut x = 0u64;
        while std::time::Instant::now() < end {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let spun = thread_cpu_secs().unwrap() - t0;
        let slept = sleeper.join().unwrap();
        assert!(spun >= 0.1, "300 ms of spinning counted as {spun} s");
        assert!(slept < 0.1, "300 ms of sleep counted as {slept} s of CPU");
        assert!(machine_idle_secs().unwrap() >= idle0);
    }

    /// `/proc/stat` read by kind, with the context switches, and a span
    /// as the difference of two readings.
    #[test]
    fn the_machines_cpu_by_kind_and_its_context_switches() {
        let t0 = "cpu  100 20 300 4000 500 6 7 8 0 0\ncpu0 50 10 150 2000 250 3 3 4 0 0\nintr 1 2 3\nctxt 123456\nbtime 1\n";
        let t1 = "cpu  200 20 500 4100 600 6 17 28 0 0\nctxt 223456\n";
        let (a, b) = (parse_machine_cpu(t0).unwrap(), parse_machine_cpu(t1).unwrap());
        assert_eq!(a, MachineCpu { user_secs: 1.2, system_secs: 3.13, idle_secs: 40.0, iowait_secs: 5.0, steal_secs: 0.08, context_switches: 123456 });
        let d = b.since(&a);
        assert!((d.user_secs - 1.0).abs() < 1e-9 && (d.system_secs - 2.1).abs() < 1e-9, "{d:?}");
        assert!((d.idle_secs - 1.0).abs() < 1e-9 && (d.iowait_secs - 1.0).abs() < 1e-9 && (d.steal_secs - 0.2).abs() < 1e-9, "{d:?}");
        assert_eq!(d.context_switches, 100_000);
        assert!((d.idle_share().unwrap() - 2.0 / 5.3).abs() < 1e-9);
        assert_eq!(MachineCpu::default().idle_share(), None);
        // An older kernel's shorter line, a file without `ctxt`, and what is not `/proc/stat`.
        assert_eq!(parse_machine_cpu("cpu 1 2 3 4\n").map(|c| (c.iowait_secs, c.context_switches)), Some((0.0, 0)));
        assert_eq!(parse_machine_cpu("cpu 1 2\n"), None);
        assert_eq!(parse_machine_cpu("intr 1\ncpu 1 2 3 4\n"), None);
        assert_eq!(parse_machine_cpu(""), None);
        let now = machine_cpu().expect("/proc/stat");
        assert!(now.busy_secs() > 0.0 && now.context_switches > 0, "{now:?}");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(512), "512B");
        assert_eq!(human_size(4096), "4K");
        assert_eq!(human_size(1536 << 10), "1.5M");
        assert_eq!(human_size(1 << 30), "1G");
    }

    #[test]
    fn mount_table_escapes() {
        assert_eq!(unescape(r"/run/a\040b"), "/run/a b");
        assert_eq!(unescape(r"/x\\y"), r"/x\\y");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(parse_swaps("Filename Type Size Used Priority\n/var/a\\040b file 8 4 -2\n")[0].name, "/var/a b");
    }

    #[test]
    fn proc_swaps_lines_parse() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                    /dev/loop3                              partition\t4194300\t\t123456\t\t100\n\
                    /var/tmp/x/swapfile                     file\t\t1048572\t\t0\t\t-2\n\
                    garbage\n";
        assert_eq!(
            parse_swaps(text),
            vec![SwapArea { name: "/dev/loop3".into(), used_bytes: 123456 * 1024 }, SwapArea { name: "/var/tmp/x/swapfile".into(), used_bytes: 0 }]
        );
        assert!(parse_swaps("Filename Type Size Used Priority\n").is_empty());
    }

    #[test]
    fn vmstat_has_swap_counters() {
        let v = vmstat();
        assert!(v.contains_key("pswpin") && v.contains_key("pswpout"), "{:?}", v.keys().take(5).collect::<Vec<_>>());
    }
}
