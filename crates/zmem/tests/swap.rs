//! `zmem swap on | off | status` for real (root: FUSE, loop devices,
//! swapon, memory cgroups). Each test runs in its own --run-dir, and a guard
//! runs `zmem swap off --all` there (then detaches by hand whatever is left)
//! even when an assertion fails.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(180);

/// A run directory whose devices are all torn down on drop.
struct RunDir {
    dir: tempfile::TempDir,
}

impl RunDir {
    fn new() -> RunDir {
        RunDir { dir: tempfile::Builder::new().prefix("zmem-swap-").tempdir().unwrap() }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn zmem(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(ZMEM);
        cmd.args(args).arg("--run-dir").arg(self.path());
        run_timeout(&mut cmd, T)
    }
    fn ok(&self, args: &[&str]) -> String {
        let out = self.zmem(args);
        assert!(out.status.success(), "zmem {args:?} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    fn device(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }
    /// Device `name`'s state file, as `on` wrote it.
    fn state(&self, name: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.device(name).join("state.json")).unwrap()).unwrap()
    }
    /// The loop device `on` attached for `name`.
    fn loop_dev(&self, name: &str) -> String {
        self.state(name)["loop_dev"].as_str().unwrap().to_string()
    }
    /// The pid `on` recorded: device `name`'s keeper.
    fn server_pid(&self, name: &str) -> u32 {
        self.state(name)["pid"].as_u64().unwrap() as u32
    }
    /// The pid of the server serving device `name` now (its keeper's
    /// child), once one is ready.
    fn serving_pid(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.device(name).join("ready")).ok()?.trim().parse().ok().filter(|&p| alive(p))
    }
    /// Wait (at most a minute) for a server of device `name` other than
    /// `old` to be ready; its pid.
    fn next_server(&self, name: &str, old: u32) -> u32 {
        let t = std::time::Instant::now();
        loop {
            if let Some(p) = self.serving_pid(name).filter(|&p| p != old) {
                return p;
            }
            let log = std::fs::read_to_string(self.device(name).join("server.log")).unwrap_or_default();
            assert!(t.elapsed() < Duration::from_secs(60), "no server took over from {old} in 60 s: {log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    /// `zmem stat --json` of device `name`'s server.
    fn server_stats(&self, name: &str) -> serde_json::Value {
        let control = self.device(name).join("control.sock");
        serde_json::from_str(&run_ok(Command::new(ZMEM).args(["stat", "--json", "--control"]).arg(&control), T)).unwrap()
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = self.zmem(&["swap", "off", "--all"]);
        // If that failed, do it by hand: nothing may outlive the test.
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        for lo in loops_under(self.path()) {
            if swaps.contains(&lo) {
                let _ = Command::new("swapoff").arg(&lo).status();
            }
            let _ = Command::new("losetup").arg("-d").arg(&lo).status();
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for m in mounts.lines().filter_map(|l| l.split(' ').nth(4)).filter(|m| m.starts_with(&*self.path().to_string_lossy())) {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
    }
}

fn swap_active(dev: &str) -> bool {
    std::fs::read_to_string("/proc/swaps").unwrap().lines().skip(1).any(|l| l.split_whitespace().next() == Some(dev))
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| s.rsplit_once(')').map(|(_, r)| !r.trim_start().starts_with('Z'))).unwrap_or(false)
}

fn usable() -> bool {
    if !is_root() {
        zmem_testkit::ci::skip("zmem swap needs root (loop devices, mount, swapon)");
        return false;
    }
    for t in ["losetup", "mkswap", "swapon", "swapoff", "umount", "python3"] {
        if !have(t) {
            zmem_testkit::ci::skip(&format!("`{t}` is not installed"));
            return false;
        }
    }
    if !Path::new("/dev/fuse").exists() {
        zmem_testkit::ci::skip("/dev/fuse is missing");
        return false;
    }
    true
}

/// The tests take turns, with each other and with other test binaries'
/// (zmem_testkit::machine): the kernel spreads swap-outs over every active
/// swap device (round robin within the highest priority, then down), so a
/// device of another test running at the same time would take part of a
/// workload's pages, and its `off` would have to swap them back in.
fn exclusive() -> zmem_testkit::machine::Turn {
    zmem_testkit::machine::turn()
}

/// [`usable`], and memory cgroups (v1) to put workloads in.
fn usable_with_cgroups() -> bool {
    if !usable() {
        return false;
    }
    if !Path::new(CGROUP_V1).join("memory.limit_in_bytes").exists() {
        zmem_testkit::ci::skip(&format!("memory cgroup v1 is not mounted at {CGROUP_V1}"));
        return false;
    }
    true
}

/// Everything `on` made is gone: swap, loop device, mount, server, directory.
fn assert_gone(run: &RunDir, name: &str, lo: &str, pid: u32) {
    assert!(!swap_active(lo), "{lo} is still swapped on");
    assert!(loops_under(run.path()).is_empty(), "a loop device is still attached");
    assert!(!alive(pid), "server {pid} still runs");
    assert!(!run.device(name).exists(), "{} is still there", run.device(name).display());
}

/// A process in a 64 MiB memory cgroup (removed after) touches 160 MiB
/// and verifies every byte: what does not fit (at least 72 MiB, as the
/// limit is raised by 24 MiB at most when the kernel's reclaim stalls: see
/// [`Cgroup::run_riding_stalls`]) goes to zmem swap. Discards free the
/// slots when it exits.
fn swap_160m_in_64m(run: &RunDir, tag: &str) {
    let cg = Cgroup::create(&format!("zmem-swap-test-{tag}{}", std::process::id()), 64 << 20);
    let script = run.path().join("w.py");
    std::fs::write(&script, WORKLOAD).unwrap();
    let (out, raised) = cg.python_ok_riding_stalls(&script, "160", T, 24 << 20);
    assert_eq!(out.trim(), "OK", "workload output: {out}");
    assert!(cg.get("memory.max_usage_in_bytes") <= (64 << 20) + raised);
}

/// The helper the workloads above run in: a cgroup that stalls at its
/// limit (here 24 MiB for 40 MiB, with swap out of reach: swappiness 0) is
/// given 8 MiB at a time until the workload fits, and no further than
/// asked; one that still stalls past that bound is ended by the OOM
/// killer (turned back on), not left waiting.
#[test]
fn a_workload_stalled_at_its_limit_is_given_room_up_to_a_bound() {
    if !usable_with_cgroups() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("w.py");
    std::fs::write(&script, WORKLOAD).unwrap();
    let cg = Cgroup::create(&format!("zmem-stall-test-{}", std::process::id()), 24 << 20);
    cg.set("memory.swappiness", "0");
    let (o, raised) = cg.run_riding_stalls(cg.python(&script, "40").stderr(Stdio::piped()), T, 64 << 20);
    assert!(o.status.success(), "{} (limit raised by {} MiB): {}", o.status, raised >> 20, String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "OK");
    assert!((16 << 20..=64 << 20).contains(&raised) && raised % (8 << 20) == 0, "raised by {raised}");
    assert_eq!(cg.get("memory.limit_in_bytes"), (24 << 20) + raised);
    drop(cg);
    let cg = Cgroup::create(&format!("zmem-stall-test-{}", std::process::id()), 24 << 20);
    cg.set("memory.swappiness", "0");
    let t = std::time::Instant::now();
    let (o, raised) = cg.run_riding_stalls(cg.python(&script, "64").stderr(Stdio::piped()), T, 8 << 20);
    assert_eq!(o.status.signal(), Some(9), "64 MiB ran in a limit of 32 MiB: {}", o.status);
    assert!(t.elapsed() < T / 2, "the stall past the bound was waited out ({:?})", t.elapsed());
    assert_eq!((raised, cg.get("memory.limit_in_bytes")), (8 << 20, 32 << 20), "raised past its bound");
    let oom = std::fs::read_to_string(cg.0.join("memory.oom_control")).unwrap();
    assert!(oom.contains("oom_kill_disable 0") && oom.contains("oom_kill 1"), "{oom}");
}

#[test]
fn swap_on_a_workload_then_off() {
    if !usable_with_cgroups() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    let metrics = format!("127.0.0.1:{}", free_port());
    let out = run.ok(&["swap", "on", "--name", "t0", "--size", "512M", "--max-pool", "256M", "--priority", "32767", "--metrics", &metrics]);
    assert!(out.contains("t0") && out.contains("swap"), "{out}");
    let lo = run.loop_dev("t0");
    let pid = run.server_pid("t0");
    assert!(swap_active(&lo));
    assert_eq!(rotational(&lo), "1", "by default the device is declared rotational");
    // `on` has exited: the server gives back the code it ran only to start
    // (pages `on` mapped too could not be reclaimed before).
    let log = run.device("t0").join("server.log");
    let given_back = || std::fs::read_to_string(&log).unwrap_or_default().contains("start-up code given back");
    let t0 = std::time::Instant::now();
    while !given_back() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(given_back(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
    let status = run.ok(&["swap", "status"]);
    assert!(status.lines().nth(1).is_some_and(|l| l.starts_with("t0") && l.contains(&lo)), "{status}");

    swap_160m_in_64m(&run, "");

    let stats = run.server_stats("t0");
    let st = &stats["stats"];
    eprintln!("after the workload: {}", stats["mm_stat"]);
    assert!(st["stores"].as_u64().unwrap() >= 8192, "at least 32 MiB went to swap: {st}");
    assert_eq!(st["failed_writes"].as_u64(), Some(0));
    assert_eq!(st["failed_reads"].as_u64(), Some(0));
    assert!(stats["fuse"]["writes"].as_u64().unwrap() > 0);
    // The workload is gone: its slots were discarded, and the pages left the pool.
    assert!(stats["fuse"]["discards"].as_u64().unwrap() > 0, "{}", stats["fuse"]);
    assert!(st["notify_free"].as_u64().unwrap() >= 4096, "{st}");
    assert_eq!(stats["reclaim_safety"]["mlockall"], true);
    // The server's own memory is reported, its pool part of it.
    let mem = &stats["server_memory"];
    let rss = ["rss_anon_bytes", "rss_file_bytes", "rss_shmem_bytes"].iter().map(|k| mem[k].as_u64().unwrap()).sum::<u64>();
    assert!(rss > st["mem_used_total"].as_u64().unwrap() && mem["rss_max_bytes"].as_u64().unwrap() >= rss, "{mem} {st}");
    // A scrape of the live device has every counter `zmem stat` shows.
    let (_, text) = scrape(&format!("http://{metrics}/metrics"));
    let got = samples(&text, "t0");
    let n = every_field_is_there(&stats["stats"], &got, &run.server_stats("t0")["stats"]);
    assert!(n > 50, "only {n} fields held still: {st}");
    assert!(got["zmem_fuse_writes_total"] > 0.0 && got["zmem_reclaim_mlockall"] == 1.0, "{text}");
    assert!(got["zmem_fuse_request_duration_seconds"] >= got["zmem_fuse_writes_total"], "every write was timed: {text}");
    let server = run.serving_pid("t0").expect("a server serves");
    assert_ne!(server, pid, "the keeper runs the server as its child");
    assert!(status_kib(pid, "VmLck:") > 0 && status_kib(server, "VmLck:") > 0, "the keeper's and the server's memory is locked");
    // Locked as touched, not faulted in whole: a worker's request buffer
    // holds 1 MiB, of which a swap device's requests fill little; beyond
    // what the pool accounts for, the server holds less than 16 MiB.
    let anon = status_kib(server, "RssAnon:");
    let books = st["mem_used_total"].as_u64().unwrap() >> 10;
    assert!(anon < books + (16 << 10), "the server holds {anon} KiB of anonymous memory, its pool {books} KiB");

    let out = run.zmem(&["swap", "off", "--name", "t0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_gone(&run, "t0", &lo, pid);
    assert!(!alive(server), "server {server} still runs");
    // Off again: nothing to do, and that is not an error.
    run.ok(&["swap", "off", "--name", "t0"]);
}

/// `--areas 4`: four loop devices over one image, swapped on at 32767
/// down to 32764. The kernel fills the first before it takes the second,
/// and the pages that land in the second (keys from its offset in the
/// image) read back right; `status` names the first and counts the rest;
/// `off` takes all four down. `--areas` takes auto or 1 to 24.
#[test]
fn areas_fill_in_priority_order_and_read_back_right() {
    if !usable_with_cgroups() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    for bad in ["0", "25", "many"] {
        let out = run.zmem(&["swap", "on", "--name", "a0", "--size", "256M", "--areas", bad]);
        assert!(!out.status.success(), "--areas {bad} was taken");
        assert!(String::from_utf8_lossy(&out.stderr).contains("auto or 1 to 24"), "{}", String::from_utf8_lossy(&out.stderr));
    }
    run.ok(&["swap", "on", "--name", "a0", "--size", "256M", "--max-pool", "256M", "--priority", "32767", "--areas", "4"]);
    let (lo, pid) = (run.loop_dev("a0"), run.server_pid("a0"));
    let areas: Vec<String> = run.state("a0")["areas"].as_array().unwrap().iter().map(|a| a["dev"].as_str().unwrap().to_string()).collect();
    assert_eq!(areas.len(), 4, "{areas:?}");
    assert_eq!(areas[0], lo);
    let swaps = |dev: &str| -> (u64, u64, i64) {
        let text = std::fs::read_to_string("/proc/swaps").unwrap();
        let l = text.lines().find(|l| l.split_whitespace().next() == Some(dev)).unwrap_or_else(|| panic!("{dev} is not swapped on: {text}"));
        let f: Vec<&str> = l.split_whitespace().collect();
        (f[2].parse().unwrap(), f[3].parse().unwrap(), f[4].parse().unwrap())
    };
    for (i, dev) in areas.iter().enumerate() {
        let (size_kib, _, prio) = swaps(dev);
        assert_eq!(prio, 32767 - i as i64, "{dev}");
        // 64 MiB less the header page.
        assert_eq!(size_kib, (64 << 10) - 4, "{dev}");
    }
    let status = run.ok(&["swap", "status"]);
    assert!(status.contains(&format!("{lo} (+3)")), "{status}");

    // What the first two areas held at most while the workload ran.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (first, second) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let (mut first, mut second) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                first = first.max(swaps(&areas[0]).1);
                second = second.max(swaps(&areas[1]).1);
                std::thread::sleep(Duration::from_millis(20));
            }
            (first, second)
        });
        let stopping = SetOnDrop(&stop);
        swap_160m_in_64m(&run, "areas-");
        drop(stopping);
        sampler.join().unwrap()
    });
    eprintln!("areas used at most: first {first} KiB, second {second} KiB");
    assert!(second > 0, "nothing went past the first area (first held {first} KiB)");
    assert!(first >= (64 << 10) * 9 / 10, "the second area was used while the first held only {first} KiB");
    let st = &run.server_stats("a0")["stats"];
    assert_eq!(st["failed_reads"].as_u64(), Some(0), "{st}");

    run.ok(&["swap", "off", "--name", "a0"]);
    assert_gone(&run, "a0", &lo, pid);
    for dev in &areas {
        assert!(!swap_active(dev), "{dev} is still swapped on");
    }
}

/// The loop device's queue flag, "0" or "1".
fn rotational(lo: &str) -> String {
    let p = Path::new("/sys/block").join(lo.trim_start_matches("/dev/")).join("queue/rotational");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_string()
}

/// `zmem swap on` at the highest priority with a backing file in the run
/// directory, and `extra` options.
fn on_with_backing(run: &RunDir, name: &str, size: &str, max_pool: &str, extra: &[&str]) {
    let backing = run.path().join(format!("{name}-backing.img"));
    let mut args = vec!["swap", "on", "--name", name, "--size", size, "--max-pool", max_pool, "--priority", "32767"];
    args.extend(["--backing", backing.to_str().unwrap()]);
    args.extend(extra);
    run.ok(&args);
}

/// `--exclusive-loads auto` follows the kernel's `vm_swap_full()`: while
/// the workload has more than half of the swap in use, its swap-ins are
/// loads the pool treats as exclusive (queued at the cold end); once it
/// has exited and its slots are discarded, loads are not exclusive again.
/// (The rule reads the system's swap totals: this must be the only swap.)
#[test]
fn auto_exclusive_loads_follow_swap_fullness() {
    if !usable_with_cgroups() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    on_with_backing(&run, "x0", "160M", "64M", &["--exclusive-loads", "auto"]);
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    assert_eq!(swaps.lines().count(), 2, "another swap is active, so the share in use is not ours to control:\n{swaps}");
    let before = run.server_stats("x0");
    assert_eq!(before["stats"]["exclusive_loads"], false, "an empty swap is not half full: {}", before["stats"]);
    // 160 MiB in 64 MiB: over 96 MiB of the 160 MiB device in use while
    // the workload reads its pages back.
    swap_160m_in_64m(&run, "auto-");
    let mut st = run.server_stats("x0")["stats"].clone();
    for _ in 0..50 {
        if st["exclusive_loads"] == false {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        st = run.server_stats("x0")["stats"].clone();
    }
    eprintln!("auto exclusive loads: {} loads, {} queued at the cold end", st["loads"], st["cold_queued_pages"]);
    assert!(st["cold_queued_pages"].as_u64().unwrap() > 1000, "swap-ins while over half full were exclusive: {st}");
    assert_eq!(st["exclusive_loads"], false, "the swap is empty again: {st}");
    assert_eq!(st["failed_reads"].as_u64(), Some(0));
    run.ok(&["swap", "off", "--name", "x0"]);
}

/// The swap-cache case: pages swapped out, faulted back read-only (the
/// kernel keeps their slots: the page tables point to the pages, no longer
/// to the slots, so the server names them and the shrinker writes them
/// back first), evicted clean while another buffer pushes them out (the kernel
/// writes nothing, its copy on swap is current), then read again: every
/// byte comes back from the pool or its file. A named page is written
/// back, never dropped.
const SWAP_CACHE_WORKLOAD: &str = r#"
import hashlib, mmap, os, sys, time
n = int(sys.argv[1]) * 256
a = mmap.mmap(-1, n * 4096)
sums = []
for i in range(n):
    p = i.to_bytes(8, "little") * 256 + os.urandom(2048)
    a[i * 4096:(i + 1) * 4096] = p
    sums.append(hashlib.blake2b(p, digest_size=8).digest())
b = mmap.mmap(-1, n * 4096)
def fill_b(tag):
    for i in range(n):
        b[i * 4096:i * 4096 + 16] = (i + tag).to_bytes(16, "little")
fill_b(1)
# Read faults: a's pages come back read-only and keep their slots.
bad = sum(hashlib.blake2b(a[i * 4096:(i + 1) * 4096], digest_size=8).digest() != sums[i] for i in range(n))
time.sleep(3)
# a's pages, clean, are evicted again without a write.
fill_b(2)
time.sleep(3)
bad += sum(hashlib.blake2b(a[i * 4096:(i + 1) * 4096], digest_size=8).digest() != sums[i] for i in range(n))
print("OK" if bad == 0 else "BAD %d" % bad, flush=True)
os._exit(0)
"#;

#[test]
fn unmapped_first_writes_back_swap_cache_pages_and_reads_them_right() {
    if !usable_with_cgroups() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    on_with_backing(&run, "u0", "512M", "16M", &["--exclusive-loads", "off"]);
    let cg = Cgroup::create(&format!("zmem-swap-test-unmapped-{}", std::process::id()), 64 << 20);
    let script = run.path().join("sc.py");
    std::fs::write(&script, SWAP_CACHE_WORKLOAD).unwrap();
    let out = run_ok(cg.python(&script, "96").stderr(Stdio::piped()), T);
    assert_eq!(out.trim(), "OK", "workload output: {out}");
    let st = run.server_stats("u0")["stats"].clone();
    eprintln!(
        "unmapped first: {} named of {} in RAM at the last scan, {} taken; {} written back, {} read back",
        st["first_out_named"], st["first_out_of"], st["first_out_taken"], st["written_back_pages"], st["bd_reads"]
    );
    assert!(st["first_out_of"].as_u64().unwrap() > 0, "the server scanned: {st}");
    assert!(st["first_out_taken"].as_u64().unwrap() > 0, "named pages were written back first: {st}");
    assert!(st["bd_reads"].as_u64().unwrap() > 0, "pages came back from the file: {st}");
    assert_eq!(st["failed_reads"].as_u64(), Some(0), "{st}");
    assert_eq!(st["failed_writes"].as_u64(), Some(0), "{st}");
    run.ok(&["swap", "off", "--name", "u0"]);
}

/// `on` twice is refused; `off` cleans up after a server killed with
/// SIGKILL, and after an `on` that stopped half way; a stray SIGTERM to the
/// server of an active device does not stop it.
#[test]
fn off_undoes_crashes_and_half_done_ons() {
    if !usable() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    run.ok(&["swap", "on", "--name", "c0", "--size", "64M"]);
    let again = run.zmem(&["swap", "on", "--name", "c0", "--size", "64M"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already on"), "{}", String::from_utf8_lossy(&again.stderr));

    // A stray SIGTERM: the device is in use, so the server keeps serving.
    let pid = run.server_pid("c0");
    let lo = run.loop_dev("c0");
    run_ok(Command::new("kill").args(["-TERM", &pid.to_string()]), T);
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(pid), "a SIGTERM stopped the server of an active swap device");
    let mut dev = std::fs::File::open(&lo).unwrap();
    let mut buf = vec![0u8; 4096];
    std::io::Read::read_exact(&mut dev, &mut buf).unwrap();
    // And its control socket still answers (its threads did not take the
    // signal for a stop).
    assert!(run.server_stats("c0")["stats"].is_object(), "the control socket went quiet after a stray SIGTERM");

    // SIGKILL of the server: its keeper starts another, which serves.
    let server = run.serving_pid("c0").expect("a server serves c0");
    run_ok(Command::new("kill").args(["-KILL", &server.to_string()]), T);
    let server = run.next_server("c0", server);
    std::io::Read::read_exact(&mut dev, &mut buf).unwrap();
    assert!(run.ok(&["swap", "status"]).contains(" swap"), "the device is on again");
    // SIGKILL of the keeper and the server: the image is gone; off must
    // still undo swap, loop and mount.
    for p in [pid, server] {
        run_ok(Command::new("kill").args(["-KILL", &p.to_string()]), T);
    }
    std::thread::sleep(Duration::from_millis(300));
    let status = run.ok(&["swap", "status"]);
    assert!(status.contains("server down"), "{status}");
    run.ok(&["swap", "off", "--name", "c0"]);
    assert_gone(&run, "c0", &lo, pid);
    assert!(!alive(server));

    // Half done: swapoff and loop detach already happened (by hand), the
    // server and mount remain. Then an `on` over the remains of a device.
    run.ok(&["swap", "on", "--name", "c1", "--size", "64M"]);
    let (lo, pid) = (run.loop_dev("c1"), run.server_pid("c1"));
    run_ok(Command::new("swapoff").arg(&lo), T);
    run_ok(Command::new("losetup").arg("-d").arg(&lo), T);
    run.ok(&["swap", "off", "--name", "c1"]);
    assert_gone(&run, "c1", &lo, pid);

    run.ok(&["swap", "on", "--name", "c2", "--size", "64M"]);
    let (lo, pid) = (run.loop_dev("c2"), run.server_pid("c2"));
    run_ok(Command::new("swapoff").arg(&lo), T);
    run.ok(&["swap", "on", "--name", "c2", "--size", "64M"]);
    assert!(!alive(pid), "the old server was stopped");
    let (lo2, pid2) = (run.loop_dev("c2"), run.server_pid("c2"));
    assert!(swap_active(&lo2));
    run.ok(&["swap", "off", "--all"]);
    assert_gone(&run, "c2", &lo2, pid2);
    assert!(!Path::new(&lo).exists() || !swap_active(&lo));
}

/// The device outlives its server: while a process in a 64 MiB cgroup
/// keeps 160 MiB of changing pages ([`CHURN`]), most of them on the
/// device, its server is SIGKILLed and restarted on purpose (`zmem swap
/// restart`) in turn. Each time the keeper starts a new server on the same
/// pool and connection; the process never sees an error and every page
/// reads back right. The last server reports what it took over. First a
/// device whose pool holds every page in RAM (5 replacements), then one
/// with a backing file that holds most of them (the keeper holds the file
/// too: 2 replacements). A device whose pool cannot be handed over
/// (dedup) refuses a restart.
///
/// The churn stalls at its cgroup's limit 4 to 6 times in 40 s with or
/// without the replacements, and over a plain swap file too (the kernel's
/// memcg reclaim, see [`Cgroup::run_riding_stalls`]): the limit may rise
/// by up to 64 MiB, and each replacement must find pages on the device.
#[test]
fn the_device_outlives_its_server() {
    if !usable_with_cgroups() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    run.ok(&["swap", "on", "--name", "r0", "--size", "512M", "--max-pool", "256M", "--priority", "32767"]);
    let (keeper, lo) = (run.server_pid("r0"), run.loop_dev("r0"));
    let (server, _, held) = churn_through_replacements(&run, "r0", "40", 5);
    // The keeper holds the pool's pages (mapped in its locked mapping: a
    // server locks only what it touches), those of the last second aside.
    let (kept, pool) = held.expect("the workload ran past the last replacement");
    assert!(kept >= pool / 2, "the keeper holds {kept} B of a pool of {pool} B in RAM");
    run.ok(&["swap", "off", "--name", "r0"]);
    assert_gone(&run, "r0", &lo, keeper);
    assert!(!alive(server), "server {server} still runs");

    // With a backing file: the pages written back are handed over too.
    on_with_backing(&run, "r1", "512M", "4M", &[]);
    cold_pages_through_replacements(&run, "r1");

    // A pool with dedup cannot be handed over yet: a restart is refused,
    // and the server goes on.
    run.ok(&["swap", "on", "--name", "r2", "--size", "64M", "--dedup", "on"]);
    let server = run.serving_pid("r2").expect("a server serves r2");
    let out = run.zmem(&["swap", "restart", "--name", "r2"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("cannot be handed"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(run.serving_pid("r2"), Some(server));
    assert_eq!(run.server_stats("r2")["recovery"]["state_version"].as_u64(), Some(0));
}

/// [`CHURN`] of 160 MiB for `secs` in a 64 MiB cgroup, swapping to device
/// `name` (alone at its priority), whose server is replaced `events` times
/// 1.5 s apart once the device holds 32 MiB: SIGKILL, then `zmem swap
/// restart`, in turn. Checks that the workload saw every page right, the
/// keeper stayed, and the last server took over with nothing lost;
/// returns that server, the most pages written back when a server was
/// replaced (sampled just before each replacement), and (if the workload still ran 1.5 s
/// after the last replacement) the bytes of the pool the keeper then
/// held in RAM against the bytes the pool's allocator held.
fn churn_through_replacements(run: &RunDir, name: &str, secs: &str, events: u32) -> (u32, u64, Option<(u64, u64)>) {
    let (keeper, lo) = (run.server_pid(name), run.loop_dev(name));
    let mut server = run.serving_pid(name).expect("a server serves the device");
    let script = run.path().join("churn.py");
    std::fs::write(&script, CHURN).unwrap();
    let cg = Cgroup::create(&format!("zmem-swap-test-restart-{name}-{}", std::process::id()), 64 << 20);
    let used = || {
        std::fs::read_to_string("/proc/swaps")
            .unwrap()
            .lines()
            .filter(|l| l.starts_with(&lo))
            .filter_map(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
            .sum::<u64>()
    };
    let out = std::thread::scope(|s| {
        let w = s.spawn(|| cg.python_ok_riding_stalls(&script, &format!("160 {secs}"), T, 64 << 20).0);
        let t = std::time::Instant::now();
        while used() < 32 << 10 && !w.is_finished() {
            assert!(t.elapsed() < Duration::from_secs(120), "the workload put less than 32 MiB on the device");
            std::thread::sleep(Duration::from_millis(50));
        }
        // The most pages written back when a server was replaced.
        let mut cold = 0;
        for round in 0..events {
            assert!(used() >= 16 << 10 || w.is_finished(), "event {round}: the device holds only {} KiB", used());
            cold = cold.max(run.server_stats(name)["stats"]["bd_count"].as_u64().unwrap_or(0));
            if round % 2 == 0 {
                run_ok(Command::new("kill").args(["-KILL", &server.to_string()]), T);
            } else {
                let said = run.ok(&["swap", "restart", "--name", name]);
                assert!(said.contains("replaced by"), "{said}");
            }
            server = run.next_server(name, server);
            std::thread::sleep(Duration::from_millis(1500));
        }
        let pool = run.server_stats(name)["stats"]["pool_pages"].as_u64().unwrap() * 4096;
        let held = (!w.is_finished()).then(|| (status_kib(keeper, "RssShmem:") << 10, pool));
        (w.join().unwrap(), held, cold)
    });
    let (out, held, cold) = out;
    assert!(out.trim().starts_with("OK"), "the workload saw wrong pages: {out}");
    assert!(alive(keeper), "the keeper stays");
    let stats = run.server_stats(name);
    let r = &stats["recovery"];
    assert_eq!(r["restarts"].as_u64(), Some(u64::from(events)), "{stats}");
    assert_eq!(r["lost_pages"].as_u64(), Some(0), "{r}");
    assert!(r["pages"].as_u64().unwrap() > 0, "the last server found the pages: {r}");
    assert_eq!(stats["stats"]["failed_reads"].as_u64(), Some(0));
    assert_eq!(stats["fuse"]["errors"].as_u64(), Some(0), "{}", stats["fuse"]);
    let status = run.ok(&["swap", "status"]);
    assert!(status.lines().any(|l| l.starts_with(name) && l.ends_with("swap")), "{status}");
    (server, cold, held)
}

/// Device `name` (up with a cold store) through a churn with a SIGKILL
/// and a restart: pages were written back, and every one read back right
/// ([`churn_through_replacements`]); then off, and everything gone.
fn cold_pages_through_replacements(run: &RunDir, name: &str) {
    let (keeper, lo) = (run.server_pid(name), run.loop_dev(name));
    let (server, cold, _) = churn_through_replacements(run, name, "20", 2);
    eprintln!("{name}: at most {cold} pages written back when a server was replaced");
    assert!(cold > 0, "no page was written back when the servers were replaced");
    run.ok(&["swap", "off", "--name", name]);
    assert_gone(run, name, &lo, keeper);
    assert!(!alive(server), "server {server} still runs");
}

/// The shipped example config brings a device up (`on --config`), and a
/// config with two devices brings up both; `off --all` takes them down.
#[test]
fn a_config_file_brings_devices_up() {
    if !usable() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd/swap.conf");
    let text = std::fs::read_to_string(&example).unwrap().replace("size = 8G", "size = 64M");
    let conf = run.path().join("swap.conf");
    std::fs::write(&conf, format!("{text}\n[second]\nsize = 32M\ncompressor = zstd:1\npriority = 7\n")).unwrap();
    run.ok(&["swap", "on", "--config", conf.to_str().unwrap()]);
    let status = run.ok(&["swap", "status"]);
    let rows: Vec<&str> = status.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{status}");
    assert!(rows.iter().any(|r| r.starts_with("second") && r.contains("zstd") && r.contains(" 7 ")), "{status}");
    assert!(rows.iter().any(|r| r.starts_with("zmem0") && r.contains("64M") && r.contains("lz4")), "{status}");
    let (lo, pid) = (run.loop_dev("second"), run.server_pid("second"));
    let (lo0, pid0) = (run.loop_dev("zmem0"), run.server_pid("zmem0"));
    assert!(swap_active(&lo) && swap_active(&lo0));
    run.ok(&["swap", "off", "--all"]);
    assert_gone(&run, "second", &lo, pid);
    assert_gone(&run, "zmem0", &lo0, pid0);
    // A bad config changes nothing.
    std::fs::write(&conf, "[x]\nsize = 1G\nbogus = 2\n").unwrap();
    let out = run.zmem(&["swap", "on", "--config", conf.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("[x]"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read_dir(run.path()).unwrap().flatten().all(|e| !e.path().is_dir()));
}

/// `--charge-to`: the cgroup's limit makes room for the server at once,
/// a second device may not count against the same cgroup, a cgroup with no
/// limit has no budget, and `off` gives the budget back, also after the
/// server was killed.
#[test]
fn charge_to_lends_the_cgroup_s_budget_and_off_gives_it_back() {
    if !usable_with_cgroups() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    const BUDGET: u64 = 256 << 20;
    let cg = Cgroup::create(&format!("zmem-charge-test-{}", std::process::id()), BUDGET);
    let cgp = cg.0.to_str().unwrap();
    run.ok(&["swap", "on", "--name", "a", "--size", "64M", "--max-pool", "32M", "--charge-to", cgp]);
    let pid = run.server_pid("a");
    // The device's memory: its keeper's and its server's.
    let rss = || {
        zmem_host::shared_budget::rss_private_of(pid).expect("the keeper's RSS") + run.serving_pid("a").and_then(zmem_host::shared_budget::rss_of).unwrap_or(0)
    };
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while cg.get("memory.limit_in_bytes") == BUDGET {
        assert!(std::time::Instant::now() < end, "the limit never made room for the server");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (limit, held) = (cg.get("memory.limit_in_bytes"), rss());
    assert!(limit + held >= BUDGET - (2 << 20) && limit + held <= BUDGET + (2 << 20), "limit {limit} + server {held} against {BUDGET}");
    let out = run.zmem(&["swap", "on", "--name", "b", "--size", "64M", "--max-pool", "32M", "--charge-to", cgp]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("already counts"), "{stderr}");
    assert!(!run.device("b").exists());
    let unlimited = Cgroup::create(&format!("zmem-charge-test-free-{}", std::process::id()), u64::MAX / 2);
    unlimited.set("memory.limit_in_bytes", "-1");
    let out = run.zmem(&["swap", "on", "--name", "b", "--size", "64M", "--max-pool", "32M", "--charge-to", unlimited.0.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no memory limit"), "{stderr}");
    // Killed: the budget stays lent until `off`.
    let lo = run.loop_dev("a");
    run_ok(Command::new("kill").args(["-KILL", &pid.to_string()]), T);
    std::thread::sleep(Duration::from_millis(300));
    assert!(cg.get("memory.limit_in_bytes") < BUDGET);
    run.ok(&["swap", "off", "--name", "a"]);
    assert_gone(&run, "a", &lo, pid);
    assert_eq!(cg.get("memory.limit_in_bytes"), BUDGET, "off gives the budget back");
}

/// Rewrites and checks random pages of `argv[1]` MiB for `argv[2]` seconds,
/// then checks every page: prints `OK ops pages` or `BAD n`.
/// The reclaim workload. It leaves with `os._exit` once it has checked every
/// page and said so: the interpreter's own teardown frees each of its
/// 131,072 pages one by one, and `free()` reads the header of every one,
/// which swaps the whole heap back in at random, at the lowest limit of the
/// run (the pool at its peak), after the part this test measures. Both CI
/// failures of this test on record (`oom_kill 1`) came there, after `OK`,
/// from the kernel charging swap-in read-ahead pages to the full cgroup
/// (`mem_cgroup_swapin_charge_folio` under `swapin_readahead`, the kernel's
/// report in the failure message). The minute of churn and the final check
/// of every page are unchanged.
const CHURN: &str = r#"
import hashlib, os, sys, time, random
mib = int(sys.argv[1]); secs = float(sys.argv[2])
N = mib * 256
def page(i, v):
    b = (b"page %08d v%06d " % (i, v)) * 200
    return bytearray((b[:3900] + hashlib.sha256(b"%d %d" % (i, v)).digest() * 7)[:4096]) if i % 3 else bytearray(b[:4096])
ver = [0] * N
pages = [page(i, 0) for i in range(N)]
rng = random.Random(1)
t0 = time.time(); ops = 0; bad = 0
while time.time() - t0 < secs:
    for _ in range(2000):
        i = rng.randrange(N)
        if rng.random() < 0.3:
            ver[i] += 1; pages[i] = page(i, ver[i])
        elif pages[i] != page(i, ver[i]):
            bad += 1
        ops += 1
for i in range(N):
    if pages[i] != page(i, ver[i]): bad += 1
print(("OK %d %d" % (ops, N)) if bad == 0 else "BAD %d" % bad)
sys.stdout.flush()
os._exit(0 if bad == 0 else 1)
"#;

fn hung_tasks() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/hung_task_detect_count").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// Threads of `pid` in uninterruptible sleep.
fn threads_in_d(pid: u32) -> usize {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    rd.flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("stat")).ok().and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().starts_with('D'))).unwrap_or(false)
        })
        .count()
}

/// The reclaim-safety run: a process fills 512 MiB, rewrites and checks
/// pages of it at random for 15 s (ZMEM_RECLAIM_SECS: longer soaks), and
/// checks all of it again, in a budget of 192 MiB for itself and the
/// swap server together, swapping to zmem all along. The server's memory
/// counts against the budget (`--charge-to`: the cgroup's limit follows
/// the server's resident memory; the server itself stays outside, since
/// sharing the cgroup needs PR_SET_IO_FLUSHER, see
/// `the_server_refuses_to_share_a_cgroup_it_could_deadlock_in`). It must
/// end with every byte right, no OOM kill, no hung task, no server thread
/// stuck in uninterruptible sleep for 30 s, the pair within the budget (up
/// to what one 10 ms tick of the keeper lets through), and the budget the
/// cgroup's limit again after `off`. If the server does get stuck, the FUSE
/// connection is aborted so the machine recovers, and the test fails.
#[test]
fn reclaim_under_pressure() {
    if !usable_with_cgroups() {
        return;
    }
    let _turn = exclusive();
    let secs: u64 = std::env::var("ZMEM_RECLAIM_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let run = RunDir::new();
    const BUDGET: u64 = 192 << 20;
    let cg = Cgroup::create(&format!("zmem-reclaim-test-{}", std::process::id()), BUDGET);
    let cgp = cg.0.to_str().unwrap();
    // A pool cap of most of the budget is refused: it could starve the workload.
    let out = run.zmem(&["swap", "on", "--name", "r0", "--size", "2G", "--max-pool", "160M", "--charge-to", cgp]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--max-pool"), "{stderr}");
    run.ok(&["swap", "on", "--name", "r0", "--size", "2G", "--max-pool", "128M", "--priority", "32767", "--threads", "4", "--charge-to", cgp]);
    let pid = run.server_pid("r0");
    let hung_before = hung_tasks();
    let script = run.path().join("churn.py");
    std::fs::write(&script, CHURN).unwrap();
    let mut child = cg.python(&script, &format!("512 {secs}")).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let limit = Duration::from_secs(secs + 600);
    let start = std::time::Instant::now();
    let mut stuck = Duration::ZERO;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        std::thread::sleep(Duration::from_secs(1));
        stuck = if threads_in_d(pid) > 0 { stuck + Duration::from_secs(1) } else { Duration::ZERO };
        if stuck >= Duration::from_secs(30) || start.elapsed() > limit {
            break None;
        }
    };
    if status.is_none() {
        let stacks: String = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|rd| rd.flatten().map(|t| std::fs::read_to_string(t.path().join("stack")).unwrap_or_default()).collect())
            .unwrap_or_default();
        // Let the machine recover: fail every pending request of the image.
        if let Ok(rd) = std::fs::read_dir("/sys/fs/fuse/connections") {
            for c in rd.flatten() {
                let _ = std::fs::write(c.path().join("abort"), "1");
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the swap server was stuck (D state for 30 s) or the workload ran past {limit:?}; server stacks:\n{stacks}");
    }
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    let oom = std::fs::read_to_string(cg.0.join("memory.oom_control")).unwrap();
    let max_usage = cg.get("memory.max_usage_in_bytes");
    let stats = run.server_stats("r0");
    let shared = &stats["shared_budget"];
    eprintln!(
        "reclaim run: {secs} s, workload says {:?} in {:.0} s; cgroup max {} MiB; shared budget {shared}; pool mm_stat {}; io_stat {}",
        out.trim(),
        start.elapsed().as_secs_f64(),
        max_usage >> 20,
        stats["mm_stat"],
        stats["io_stat"]
    );
    let n = |k: &str| shared[k].as_u64().unwrap_or_else(|| panic!("shared_budget.{k} missing: {shared}"));
    assert_eq!(n("budget"), BUDGET);
    // The keeper counted the server's resident memory, which holds the
    // pool: its peak covers the pool's own peak (recompression, on by
    // default, keeps that peak well below the 512 MiB pushed through).
    let used_max = stats["stats"]["mem_used_max"].as_u64().unwrap();
    assert!(used_max > 8 << 20, "the pool held the workload's pages: {}", stats["stats"]);
    assert!(n("pool_peak") >= used_max, "the server's memory was counted: {shared}, pool peak {used_max}");
    assert!(n("limit_min") + n("pool_peak") <= BUDGET + (1 << 20), "the limit made room for the server: {shared}");
    assert!(n("peak_total") <= BUDGET + (16 << 20), "the workload and the server stayed within the budget: {shared}");
    assert_eq!(n("floor_ticks"), 0, "{shared}");
    // What the server holds beyond its pool's own books (binary, stacks,
    // buffers, malloc's slack) stays small: under mlockall, memory freed
    // into malloc's arenas could not be given back (see zmem-server's
    // malloc.rs).
    assert!(n("pool_peak") <= used_max + (32 << 20), "server RSS peak {} against a pool peak of {used_max}", n("pool_peak"));
    assert_eq!(stats["reclaim_safety"]["malloc_tuned"], true, "{}", stats["reclaim_safety"]);
    assert!(out.starts_with("OK"), "workload: {out} {err} (status {status:?})");
    assert!(oom.lines().any(|l| l == "oom_kill 0"), "{oom}\nthe workload exited with {status:?}; the kernel's report:\n{}", cg.oom_report());
    assert_eq!(hung_tasks(), hung_before, "the kernel reported hung tasks");
    assert_eq!(stats["stats"]["failed_writes"].as_u64(), Some(0));
    assert_eq!(stats["stats"]["failed_reads"].as_u64(), Some(0));
    assert!(stats["stats"]["stores"].as_u64().unwrap() > 32768, "{}", stats["stats"]);
    run.ok(&["swap", "off", "--name", "r0"]);
    assert_eq!(cg.get("memory.limit_in_bytes"), BUDGET, "off gives the cgroup its budget back");
    drop(cg);
}

/// Without PR_SET_IO_FLUSHER (CAP_SYS_RESOURCE), `--cgroup` is refused: a
/// server charged to its clients' cgroup deadlocks on its own swap-out
/// (seen here). With the capability it comes up.
#[test]
fn the_server_refuses_to_share_a_cgroup_it_could_deadlock_in() {
    if !usable_with_cgroups() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    let cg = Cgroup::create(&format!("zmem-share-test-{}", std::process::id()), 256 << 20);
    let out = run.zmem(&["swap", "on", "--name", "s0", "--size", "64M", "--cgroup", cg.0.to_str().unwrap()]);
    let has_cap = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("CapEff:"))
        .and_then(|l| u64::from_str_radix(l.split_whitespace().nth(1).unwrap(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if has_cap {
        assert!(out.status.success(), "{stderr}");
        let pid = run.server_pid("s0");
        let procs = std::fs::read_to_string(cg.0.join("cgroup.procs")).unwrap();
        assert!(procs.lines().any(|l| l == pid.to_string()), "the server joined the cgroup");
        run.ok(&["swap", "off", "--name", "s0"]);
    } else {
        assert!(!out.status.success());
        assert!(stderr.contains("PR_SET_IO_FLUSHER") && stderr.contains("deadlock"), "{stderr}");
        assert!(!run.device("s0").exists(), "a refused on leaves nothing behind");
    }
    drop(cg);
}

/// With a small pool (12 MiB) and a backing file, the shrinker writes the coldest
/// pages back while the kernel swaps (zswap's writeback under a swap storm),
/// and the workload still reads every byte back, some of it from the file.
#[test]
fn writeback_under_swap() {
    if !usable_with_cgroups() {
        return;
    }
    let _turn = exclusive();
    let run = RunDir::new();
    on_with_backing(&run, "w0", "1G", "12M", &[]);
    writeback_under_swap_on(&run, "w0", "the file");
}

/// The same swap storm with the cold pages on a Redis cluster (3 masters,
/// 3 replicas on loopback): every page the workload reads back that left
/// RAM came from the cluster, checked by the workload byte for byte. Then
/// the device outlives its server: a churn through a SIGKILL and a
/// restart, the records on the cluster taken over by each next server.
#[test]
fn writeback_under_swap_to_a_cluster() {
    if !usable_with_cgroups() {
        return;
    }
    if !zmem_testkit::redis_cluster::available() {
        zmem_testkit::ci::skip("redis-server and redis-cli are not installed (scripts/setup.sh installs them)");
        return;
    }
    let _turn = exclusive();
    let cluster = zmem_testkit::redis_cluster::LocalCluster::start(3, 1, 5000).expect("starting a 3+3 Redis cluster");
    let run = RunDir::new();
    let url = cluster.url();
    run.ok(&["swap", "on", "--name", "r0", "--size", "1G", "--max-pool", "12M", "--priority", "32767", "--remote", &url]);
    writeback_under_swap_on(&run, "r0", "the cluster");
    assert_eq!(cluster.keys().unwrap(), 0, "swap off left records on the cluster");

    // (A small pool: the churn's pages compress well, and a takeover must
    // find some of them on the cluster.)
    run.ok(&["swap", "on", "--name", "r1", "--size", "512M", "--max-pool", "4M", "--priority", "32767", "--remote", &url]);
    cold_pages_through_replacements(&run, "r1");
    assert_eq!(cluster.keys().unwrap(), 0, "swap off left records on the cluster");
}

/// A churn of 256 MiB in an 80 MiB cgroup over device `name` (up with a
/// 12 MiB pool and a cold store, `cold`), checked byte for byte; then off.
fn writeback_under_swap_on(run: &RunDir, name: &str, cold: &str) {
    // See Cgroup::run_riding_stalls: at 80 MiB the kernel's reclaim
    // stalled the churn in 3 runs of 8.
    let script = run.path().join("churn.py");
    std::fs::write(&script, CHURN).unwrap();
    let cg = Cgroup::create(&format!("zmem-wb-test-{}", std::process::id()), 80 << 20);
    let (o, raised) = cg.run_riding_stalls(cg.python(&script, "256 10").stderr(Stdio::piped()), T, 64 << 20);
    drop(cg);
    assert!(o.status.success(), "churn failed ({}, limit raised by {} MiB): {}", o.status, raised >> 20, String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let stats = run.server_stats(name);
    let st = &stats["stats"];
    eprintln!(
        "writeback under swap to {cold}: {:?}; written back {}, read back {}, promoted {}, max_pool hits {}",
        out.trim(),
        st["written_back_pages"],
        st["bd_reads"],
        st["promoted_pages"],
        st["pool_limit_hit"]
    );
    assert!(out.starts_with("OK"), "{out}");
    assert!(st["written_back_pages"].as_u64().unwrap() > 1000, "{st}");
    assert!(st["bd_reads"].as_u64().unwrap() > 0, "some swap-ins came from {cold}: {st}");
    assert_eq!(st["failed_writes"].as_u64(), Some(0));
    assert_eq!(st["failed_reads"].as_u64(), Some(0));
    assert!(st["pool_total_size"].as_u64().unwrap() <= 12 << 20, "{st}");
    run.ok(&["swap", "off", "--name", name]);
}

/// A `/proc/PID/status` field in KiB ("RssAnon:", "VmLck:").
fn status_kib(pid: u32, field: &str) -> u64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    zmem_host::proc_kb_field(&st, field.trim_end_matches(':')).unwrap_or_else(|| panic!("no {field} in kB in {st}")) >> 10
}
