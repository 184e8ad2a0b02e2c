//! `zmem swap on | off | status` for real (root: FUSE, loop devices,
//! swapon, memory cgroups). Each test runs in its own --run-dir, and a guard
//! runs `zmem swap off --all` there (then detaches by hand whatever is left)
//! even when an assertion fails.

mod common;

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
        assert!(
            out.status.success(),
            "zmem {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    fn device(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }
    /// The loop device `on` attached for `name`, from its state file.
    fn loop_dev(&self, name: &str) -> String {
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(self.device(name).join("state.json")).unwrap()).unwrap();
        st["loop_dev"].as_str().unwrap().to_string()
    }
    fn server_pid(&self, name: &str) -> u32 {
        let st: serde_json::Value = serde_json::from_slice(&std::fs::read(self.device(name).join("state.json")).unwrap()).unwrap();
        st["pid"].as_u64().unwrap() as u32
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = self.zmem(&["swap", "off", "--all"]);
        // If that failed, do it by hand: nothing may outlive the test.
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        for lo in leftover_loops(self.path()) {
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

/// Loop devices whose backing file lies under `dir`.
fn leftover_loops(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| {
            let bf = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            bf.starts_with(&*dir.to_string_lossy()).then(|| format!("/dev/{}", e.file_name().to_string_lossy()))
        })
        .collect()
}

fn swap_active(dev: &str) -> bool {
    std::fs::read_to_string("/proc/swaps").unwrap().lines().skip(1).any(|l| l.split_whitespace().next() == Some(dev))
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| !r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

fn usable() -> bool {
    if !is_root() {
        zmem_bench::ci::skip("zmem swap needs root (loop devices, mount, swapon)");
        return false;
    }
    for t in ["losetup", "mkswap", "swapon", "swapoff", "umount", "python3"] {
        if !have(t) {
            zmem_bench::ci::skip(&format!("`{t}` is not installed"));
            return false;
        }
    }
    if !Path::new("/dev/fuse").exists() {
        zmem_bench::ci::skip("/dev/fuse is missing");
        return false;
    }
    true
}

/// Everything `on` made is gone: swap, loop device, mount, server, directory.
fn assert_gone(run: &RunDir, name: &str, lo: &str, pid: u32) {
    assert!(!swap_active(lo), "{lo} is still swapped on");
    assert!(leftover_loops(run.path()).is_empty(), "a loop device is still attached");
    assert!(!alive(pid), "server {pid} still runs");
    assert!(!run.device(name).exists(), "{} is still there", run.device(name).display());
}

/// A process in a 64 MiB memory cgroup touches 160 MiB and verifies every
/// byte; what does not fit goes to zmem swap. Discards free the slots when
/// it exits. Then `off` undoes everything.
#[test]
fn swap_on_a_workload_then_off() {
    if !usable() {
        return;
    }
    if !Path::new(CGROUP_V1).join("memory.limit_in_bytes").exists() {
        zmem_bench::ci::skip(&format!("memory cgroup v1 is not mounted at {CGROUP_V1}"));
        return;
    }
    let run = RunDir::new();
    let out = run.ok(&["swap", "on", "--name", "t0", "--size", "512M", "--max-pool", "256M", "--priority", "32767"]);
    assert!(out.contains("t0") && out.contains("swap"), "{out}");
    let lo = run.loop_dev("t0");
    let pid = run.server_pid("t0");
    assert!(swap_active(&lo));
    let status = run.ok(&["swap", "status"]);
    assert!(status.lines().nth(1).is_some_and(|l| l.starts_with("t0") && l.contains(&lo)), "{status}");

    let cg = Cgroup::create(&format!("zmem-swap-test-{}", std::process::id()), 64 << 20);
    let script = run.path().join("w.py");
    std::fs::write(&script, WORKLOAD).unwrap();
    let out = run_ok(
        Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > '{}/cgroup.procs' && exec python3 '{}' 160", cg.0.display(), script.display()))
            .stderr(Stdio::piped()),
        T,
    );
    assert_eq!(out.trim(), "OK", "workload output: {out}");
    assert!(cg.get("memory.max_usage_in_bytes") <= 64 << 20);
    drop(cg);

    let control = run.device("t0").join("control.sock");
    let stats: serde_json::Value = serde_json::from_str(&run_ok(Command::new(ZMEM).args(["stat", "--json", "--control"]).arg(&control), T)).unwrap();
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
    let vmlck = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(vmlck.lines().any(|l| l.starts_with("VmLck:") && !l.ends_with(" 0 kB")), "the server's memory is locked");

    let out = run.zmem(&["swap", "off", "--name", "t0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_gone(&run, "t0", &lo, pid);
    // Off again: nothing to do, and that is not an error.
    run.ok(&["swap", "off", "--name", "t0"]);
}

/// `on` twice is refused; `off` cleans up after a server killed with
/// SIGKILL, and after an `on` that stopped half way; a stray SIGTERM to the
/// server of an active device does not stop it.
#[test]
fn off_undoes_crashes_and_half_done_ons() {
    if !usable() {
        return;
    }
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

    // SIGKILL: the image is gone; off must still undo swap, loop and mount.
    run_ok(Command::new("kill").args(["-KILL", &pid.to_string()]), T);
    std::thread::sleep(Duration::from_millis(300));
    let status = run.ok(&["swap", "status"]);
    assert!(status.contains("server down"), "{status}");
    run.ok(&["swap", "off", "--name", "c0"]);
    assert_gone(&run, "c0", &lo, pid);

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

/// The shipped example config brings a device up (`on --config`), and a
/// config with two devices brings up both; `off --all` takes them down.
#[test]
fn a_config_file_brings_devices_up() {
    if !usable() {
        return;
    }
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
