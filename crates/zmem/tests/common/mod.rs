//! Shared helpers for the real-client tests: a `zmem serve` child that is
//! always stopped, commands with hard time limits, tool detection, and
//! guards that undo kernel setup (mounts, loop devices, swap, cgroups) even
//! when a test fails.

#![allow(dead_code)]

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

pub const ZMEM: &str = env!("CARGO_BIN_EXE_zmem");

/// Loop devices whose backing file lies under `dir`, by name.
pub fn loops_under(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    let mut loops: Vec<String> = rd
        .flatten()
        .filter_map(|e| {
            let bf = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            bf.starts_with(&*dir.to_string_lossy()).then(|| format!("/dev/{}", e.file_name().to_string_lossy()))
        })
        .collect();
    loops.sort();
    loops
}

/// Whether `tool` is on PATH (or an absolute path that exists).
pub fn have(tool: &str) -> bool {
    if tool.contains('/') {
        return Path::new(tool).exists();
    }
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false)
}

/// Print why a test is skipped and return from it.
#[macro_export]
macro_rules! skip {
    ($($t:tt)*) => {{
        // Fails instead under CI as root, where nothing may be missing.
        zmem_testkit::ci::skip(&format!($($t)*));
        return;
    }};
}

/// Return (skipping) unless every tool exists.
#[macro_export]
macro_rules! require_tools {
    ($($tool:expr),+) => {
        for t in [$($tool),+] {
            if !common::have(t) {
                skip!("`{}` is not installed (scripts/setup.sh installs it)", t);
            }
        }
    };
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Run `cmd` to completion with a hard time limit; the child is killed
/// (SIGKILL) when the limit passes. Output is captured.
pub fn run_timeout(cmd: &mut Command, limit: Duration) -> Output {
    let desc = format!("{cmd:?}");
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("spawning {desc}: {e}"));
    // Drain pipes on threads so a chatty child cannot block on a full pipe.
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let te = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let status = wait_timeout(&mut child, limit).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("timed out after {limit:?}: {desc}");
    });
    Output { status, stdout: to.join().unwrap(), stderr: te.join().unwrap() }
}

/// Run and require success; returns stdout.
pub fn run_ok(cmd: &mut Command, limit: Duration) -> String {
    let desc = format!("{cmd:?}");
    let o = run_timeout(cmd, limit);
    assert!(
        o.status.success(),
        "{desc} failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn sh(script: &str, limit: Duration) -> String {
    run_ok(Command::new("sh").arg("-c").arg(script), limit)
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `zmem serve`; stopped (SIGTERM, then SIGKILL) on drop.
pub struct ZmemServer {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub control: PathBuf,
    pub log: PathBuf,
}

impl ZmemServer {
    /// Start `zmem serve --size SIZE` on a fresh Unix socket plus `extra` args.
    pub fn start(size: &str, extra: &[&str]) -> ZmemServer {
        let mut args = vec!["--size", size];
        args.extend_from_slice(extra);
        ZmemServer::start_with(&args)
    }

    /// Start `zmem serve ARGS` on a fresh Unix socket (give --size or --origin).
    pub fn start_with(args: &[&str]) -> ZmemServer {
        let dir = tempfile::Builder::new().prefix("zmem-test-").tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        let control = dir.path().join("ctl.sock");
        let log = dir.path().join("serve.log");
        let mut cmd = Command::new(ZMEM);
        cmd.args(["serve", "--socket"])
            .arg(&socket)
            .arg("--control")
            .arg(&control)
            .args(args)
            .env("ZMEM_LOG", "info")
            // A colour terminal, yet the log is a file: no colour codes.
            .env("TERM", "xterm-256color")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("spawning zmem serve");
        let mut s = ZmemServer { child: Some(child), dir, socket, control, log };
        s.wait_ready();
        s
    }

    fn wait_ready(&mut self) {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            // Ready once both sockets answer and the server's line saying
            // what it serves is whole in its log (it is written after the
            // sockets are bound: a test that reads the log must not catch
            // it half written).
            let announced = || self.log_text().lines().any(|l| l.starts_with("zmem: serving export")) && self.log_text().ends_with('\n');
            if UnixStream::connect(&self.socket).is_ok() && UnixStream::connect(&self.control).is_ok() && announced() {
                return;
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("zmem serve exited early ({st}): {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("zmem serve did not come up: {}", self.log_text());
    }

    /// The keeper's pid: the process this test started.
    pub fn keeper_pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The server serving the device now: the keeper's child, once it has
    /// one.
    pub fn serving_pid(&self) -> Option<u32> {
        let k = self.keeper_pid();
        std::fs::read_to_string(format!("/proc/{k}/task/{k}/children")).ok()?.split_whitespace().next()?.parse().ok()
    }

    /// Wait (at most a minute) for a server other than `old` to serve the
    /// device (its control socket answers); its pid.
    pub fn next_server(&self, old: u32) -> u32 {
        let t = Instant::now();
        loop {
            if let Some(p) = self.serving_pid().filter(|&p| p != old) {
                let st = run_timeout(Command::new(ZMEM).arg("stat").arg("--control").arg(&self.control).arg("--json"), Duration::from_secs(10));
                if st.status.success() {
                    return p;
                }
            }
            assert!(t.elapsed() < Duration::from_secs(60), "no server took over from {old} in 60 s: {}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kill the server (SIGKILL, `kill`) or ask its keeper for a restart
    /// (SIGHUP), and wait for the next one; its pid.
    pub fn replace_server(&self, kill: bool) -> u32 {
        use rustix::process::{kill_process, Pid, Signal};
        let old = self.serving_pid().expect("a server");
        let (to, sig) = if kill { (old, Signal::KILL) } else { (self.keeper_pid(), Signal::HUP) };
        kill_process(Pid::from_raw(to as i32).expect("a pid"), sig).expect("signalling");
        self.next_server(old)
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `zmem stat --json` parsed.
    pub fn stats(&self) -> serde_json::Value {
        let out = run_ok(Command::new(ZMEM).arg("stat").arg("--control").arg(&self.control).arg("--json"), Duration::from_secs(10));
        serde_json::from_str(&out).expect("stat --json output is JSON")
    }

    pub fn stat_u64(&self, key: &str) -> u64 {
        self.stats()["stats"][key].as_u64().unwrap_or_else(|| panic!("no stats.{key}"))
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let _ = rustix::process::kill_process(rustix::process::Pid::from_child(&c), rustix::process::Signal::TERM);
        match wait_timeout(&mut c, Duration::from_secs(10)) {
            Some(s) => Some(s),
            None => {
                let _ = c.kill();
                let _ = c.wait();
                panic!("zmem serve did not stop within 10 s of SIGTERM: {}", self.log_text());
            }
        }
    }
}

impl Drop for ZmemServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = rustix::process::kill_process(rustix::process::Pid::from_child(&c), rustix::process::Signal::TERM);
            if wait_timeout(&mut c, Duration::from_secs(5)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Runs a cleanup command on drop (best effort, time-limited, errors ignored).
pub struct Undo {
    desc: String,
    argv: Vec<String>,
    armed: bool,
}

impl Undo {
    pub fn new(argv: &[&str]) -> Undo {
        Undo { desc: argv.join(" "), argv: argv.iter().map(|s| s.to_string()).collect(), armed: true }
    }

    /// Run the cleanup now (and not again on drop); panics if it fails.
    pub fn now(mut self) {
        self.armed = false;
        run_ok(Command::new(&self.argv[0]).args(&self.argv[1..]), Duration::from_secs(60));
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let r = Command::new(&self.argv[0]).args(&self.argv[1..]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().map(|mut c| {
            if wait_timeout(&mut c, Duration::from_secs(30)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        });
        if r.is_err() {
            eprintln!("cleanup `{}` could not run", self.desc);
        }
    }
}

/// Deterministic pseudo-random bytes that compress somewhat (text-like mix).
pub fn test_data(n: usize, seed: u64) -> Vec<u8> {
    let mut r = zmem_testkit::XorShift::from_state(seed | 1);
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let x = r.next_u64();
        match (x >> 60) as u8 {
            0..=5 => v.extend_from_slice(b"the quick brown fox jumps over the lazy dog "),
            6..=9 => v.extend(std::iter::repeat_n(0u8, (x % 300) as usize)),
            _ => v.extend_from_slice(&x.to_le_bytes()),
        }
    }
    v.truncate(n);
    v
}

pub fn sha256(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path), Duration::from_secs(60));
    out.split_whitespace().next().unwrap().to_string()
}

/// nbdfuse serving `uri` as `<dir>/nbd`; unmounted (which ends nbdfuse) on drop.
pub struct Fuse {
    child: Option<Child>,
    pub dir: std::path::PathBuf,
}

impl Fuse {
    pub fn mount(dir: &Path, socket: &Path) -> Fuse {
        std::fs::create_dir_all(dir).unwrap();
        let pidfile = dir.with_extension("pid");
        let child = Command::new("nbdfuse")
            .arg("-P")
            .arg(&pidfile)
            .arg(dir)
            .arg("--unix")
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning nbdfuse");
        let mut f = Fuse { child: Some(child), dir: dir.to_path_buf() };
        let end = Instant::now() + Duration::from_secs(20);
        while !(pidfile.exists() && dir.join("nbd").exists()) {
            if let Some(Ok(Some(st))) = f.child.as_mut().map(|c| c.try_wait()) {
                panic!("nbdfuse exited: {st}");
            }
            assert!(Instant::now() < end, "nbdfuse did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        f
    }

    pub fn file(&self) -> std::path::PathBuf {
        self.dir.join("nbd")
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        // Root can unmount FUSE directly; nbdfuse then exits by itself.
        let _ = Command::new("umount").arg(&self.dir).stderr(Stdio::null()).status();
        if let Some(mut c) = self.child.take() {
            if wait_timeout(&mut c, Duration::from_secs(10)).is_none() {
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Attach `file` to a free loop device; detached on drop.
pub struct Loop {
    pub dev: String,
    _undo: Undo,
}

impl Loop {
    pub fn attach(file: &Path) -> Loop {
        let dev = run_ok(Command::new("losetup").args(["--show", "-f"]).arg(file), Duration::from_secs(60)).trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        let undo = Undo::new(&["losetup", "-d", &dev]);
        Loop { dev, _undo: undo }
    }
}

pub const CGROUP_V1: &str = "/sys/fs/cgroup/memory";

/// How long a workload may stall at its cgroup's limit once
/// [`Cgroup::run_riding_stalls`] has raised it as far as it may.
pub const STALL_PAST_BOUND: Duration = Duration::from_secs(3);

/// Sets its flag when dropped, also by a panic's unwinding: the flag that
/// stops a thread of a `std::thread::scope`, which joins its threads before
/// a panic in its body leaves it (a thread that waits for a flag the panic
/// skipped would hang the test for good).
pub struct SetOnDrop<'a>(pub &'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

/// A memory cgroup (v1) removed on drop (after its tasks have exited).
pub struct Cgroup(pub PathBuf);

impl Cgroup {
    pub fn create(name: &str, limit: u64) -> Cgroup {
        let p = Path::new(CGROUP_V1).join(name);
        if p.exists() {
            let _ = std::fs::remove_dir(&p); // stale from a killed run
        }
        std::fs::create_dir(&p).expect("creating the memory cgroup");
        let cg = Cgroup(p);
        cg.set("memory.limit_in_bytes", &limit.to_string());
        let _ = std::fs::write(cg.0.join("memory.swappiness"), "100");
        cg
    }
    pub fn set(&self, file: &str, v: &str) {
        std::fs::write(self.0.join(file), v).unwrap_or_else(|e| panic!("writing {file}: {e}"));
    }
    /// `python3 SCRIPT ARGS` run in this cgroup: a shell joins it, then
    /// becomes python, so only the workload is limited.
    pub fn python(&self, script: &Path, args: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!("echo $$ > '{}/cgroup.procs' && exec python3 '{}' {args}", self.0.display(), script.display()));
        c
    }
    /// Run `cmd` (a [`Cgroup::python`] of this cgroup) within `limit`,
    /// with the cgroup's OOM killer off. The kernel's memcg (v1) reclaim
    /// gives up on a cgroup whose pages are all under writeback or in the
    /// swap cache while swap-outs wait on a FUSE device: its OOM killer
    /// then ends a workload that swap would have carried (a 160 MiB
    /// workload in 64 MiB, once; a churn in 80 MiB, 3 runs in 8), and with
    /// the OOM killer off the cgroup can wait at its limit for good. So a
    /// watcher gives a cgroup that stalls at its limit 8 MiB more (the
    /// kernel then wakes it), up to `max_raise`, and says so. A stall past
    /// that bound that lasts [`STALL_PAST_BOUND`] turns the OOM killer
    /// back on, which ends the workload at once (a failure that says so,
    /// not a wait for the time limit: a waiter is woken only by memory
    /// freed in the cgroup or a new limit, so it would wait for good).
    /// Returns the output and how much the limit was raised; the watcher
    /// stops also when the run panics (a scope joins its threads before a
    /// panic leaves it).
    pub fn run_riding_stalls(&self, cmd: &mut Command, limit: Duration, max_raise: u64) -> (Output, u64) {
        let base = self.get("memory.limit_in_bytes");
        self.set("memory.oom_control", "1");
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                let mut raised = 0u64;
                let mut past_bound: Option<Instant> = None;
                while !done.load(Relaxed) {
                    let oom = std::fs::read_to_string(self.0.join("memory.oom_control")).unwrap_or_default();
                    let stalled = oom.lines().any(|l| l.trim() == "under_oom 1");
                    if stalled && raised < max_raise {
                        raised += 8 << 20;
                        self.set("memory.limit_in_bytes", &(base + raised).to_string());
                        eprintln!("{}: the workload stalled at its cgroup's limit; limit raised by {} MiB", self.0.display(), raised >> 20);
                    } else if stalled {
                        let since = *past_bound.get_or_insert_with(Instant::now);
                        if since.elapsed() >= STALL_PAST_BOUND && oom.lines().any(|l| l.trim() == "oom_kill_disable 1") {
                            eprintln!(
                                "{}: the workload stalled at its limit past the bound ({} MiB raised); the OOM killer ends it",
                                self.0.display(),
                                raised >> 20
                            );
                            self.set("memory.oom_control", "0");
                        }
                    } else {
                        past_bound = None;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                raised
            });
            let stop = SetOnDrop(&done);
            let out = run_timeout(cmd, limit);
            drop(stop);
            (out, watcher.join().unwrap())
        })
    }
    /// [`Cgroup::run_riding_stalls`] of `python3 SCRIPT ARGS`, which must
    /// succeed: its stdout, and how much the limit was raised.
    pub fn python_ok_riding_stalls(&self, script: &Path, args: &str, limit: Duration, max_raise: u64) -> (String, u64) {
        let (o, raised) = self.run_riding_stalls(self.python(script, args).stderr(Stdio::piped()), limit, max_raise);
        assert!(o.status.success(), "the workload failed ({}, limit raised by {} MiB): {}", o.status, raised >> 20, String::from_utf8_lossy(&o.stderr));
        (String::from_utf8_lossy(&o.stdout).into_owned(), raised)
    }
    pub fn get(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.0.join(file)).unwrap().trim().parse().unwrap()
    }
    /// The kernel's last OOM report about this cgroup (`dmesg`: the
    /// faulting task's stack, the cgroup's usage and `memory.stat`, the
    /// victim), for a failure message; empty if the log has none.
    pub fn oom_report(&self) -> String {
        let name = self.0.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let victim = format!("/{name},");
        let log = Command::new("dmesg").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        // The report runs from "invoked oom-killer" to the kill naming this cgroup.
        let Some(end) = lines.iter().rposition(|l| l.contains("oom-kill:") && l.contains(&victim)) else { return String::new() };
        let start = lines[..end].iter().rposition(|l| l.contains("invoked oom-killer")).unwrap_or(end);
        lines[start..(end + 2).min(lines.len())].join("\n")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let end = Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.0).is_err() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Touches `N` MiB (argv[1], default 160) of pages, a third of them
/// incompressible, and checks every byte by hash: prints OK or MISMATCH.
pub const WORKLOAD: &str = r#"
import hashlib, os, sys
N = (int(sys.argv[1]) if len(sys.argv) > 1 else 160) * 256
pages, h1 = [], hashlib.sha256()
for i in range(N):
    b = (b"page %08d " % i) * 256
    b = (b[:4000] + os.urandom(96)) if i % 3 == 0 else b[:4096]
    pages.append(bytearray(b))
    h1.update(b)
h2 = hashlib.sha256()
for p in pages:
    h2.update(p)
print("OK" if h1.digest() == h2.digest() else "MISMATCH")
"#;

/// Generate a tree of files: varied sizes, compressible text, noise,
/// zero-filled files and duplicates.
pub fn make_tree(root: &Path) {
    for d in 0..6 {
        let dir = root.join(format!("d{d}"));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for i in 0..40u64 {
            let n = [100usize, 4096, 5000, 65536, 300_000, 1 << 20][(i % 6) as usize] + i as usize;
            let data = match i % 7 {
                0 => vec![0u8; n],
                1 => test_data(n, 7), // duplicates across directories
                _ => test_data(n, d * 1000 + i),
            };
            let p = if i % 3 == 0 { dir.join("sub").join(format!("f{i}")) } else { dir.join(format!("f{i}")) };
            std::fs::write(p, data).unwrap();
        }
    }
}

/// `sha256sum` of every file under `root`, as sorted "hash  relative/path" lines.
pub fn checksums(root: &Path) -> String {
    sh(&format!("cd '{}' && find . -type f -print0 | sort -z | xargs -0 sha256sum", root.display()), Duration::from_secs(120))
}

/// Write `bytes` of test data (seed `seed`) to `s`'s device with
/// nbdcopy; returns the source image (in `dir`).
pub fn fill_device(s: &ZmemServer, dir: &Path, bytes: usize, seed: u64) -> PathBuf {
    let src = dir.join("src.img");
    std::fs::write(&src, test_data(bytes, seed)).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(s.uri()), Duration::from_secs(120));
    src
}

/// Read `s`'s whole device back with nbdcopy and compare it with `src`.
pub fn assert_reads_back(s: &ZmemServer, src: &Path, dir: &Path) {
    let back = dir.join("back.img");
    run_ok(Command::new("nbdcopy").arg(s.uri()).arg(&back), Duration::from_secs(120));
    assert_eq!(sha256(src), sha256(&back), "data read back differs");
}

// ---- metrics ----------------------------------------------------------

use std::collections::HashMap;

/// A free loopback port outside the kernel's ephemeral range, so no
/// outgoing connection takes it before the server binds it.
#[allow(unused_imports)] // not every test binary serves on a port
pub use zmem_testkit::ports::free_port;

pub fn scrape(url: &str) -> (String, String) {
    let mut resp = ureq::get(url).call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    (ct, resp.body_mut().read_to_string().unwrap())
}

/// The samples of `text`, by metric name, for `device`.
pub fn samples(text: &str, device: &str) -> HashMap<String, f64> {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the text parses as Prometheus metrics");
    let mut out = HashMap::new();
    for s in scrape.samples {
        assert_eq!(s.labels.get("device"), Some(device), "{}: device label", s.metric);
        let v = match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
            // A histogram: its count (the +Inf bucket), its buckets in order.
            prometheus_parse::Value::Histogram(b) => {
                assert!(b.windows(2).all(|w| w[0].less_than < w[1].less_than && w[0].count <= w[1].count), "{}: buckets {b:?}", s.metric);
                b.last().map_or(0.0, |h| h.count)
            }
            other => panic!("{}: unexpected {other:?}", s.metric),
        };
        assert!(out.insert(s.metric.clone(), v).is_none(), "{} appears twice", s.metric);
    }
    out
}

/// Every number and flag of a stats reply's `stats` is in the scrape
/// `got` under its metric name; where `zmem stat` read the same value
/// before (`before`) and after (`after`) the scrape, the scrape has it
/// too (a field that moved meanwhile is only looked for). Returns how
/// many fields had their value checked.
pub fn every_field_is_there(before: &serde_json::Value, got: &HashMap<String, f64>, after: &serde_json::Value) -> usize {
    let num = |v: &serde_json::Value| match v {
        serde_json::Value::Number(x) => x.as_f64(),
        serde_json::Value::Bool(b) => Some(*b as u8 as f64),
        _ => None,
    };
    let mut n = 0;
    for (field, v) in before.as_object().unwrap() {
        let Some(want) = num(v) else { continue };
        let (name, scale) = zmem_server::metrics::metric_name(field);
        let have = *got.get(&name).unwrap_or_else(|| panic!("`{field}` of zmem stat is not in the scrape as {name}"));
        if after.get(field).and_then(num) == Some(want) {
            assert!((have - want * scale).abs() <= 1e-9 * (want * scale).abs().max(1.0), "{name}: {have}, zmem stat says {want}");
            n += 1;
        }
    }
    n
}
