//! `zmem bench restart`: a swap device's server killed and replaced under
//! a workload, which must see neither an error nor a wrong page.
//!
//! A zmem swap device (its pages in RAM, or with [`Cold`] most of them in
//! its backing file or on a Redis cluster the bench starts on loopback,
//! and any other `swap on` options, [`Config::extra`]) takes
//! the pages of the `kv` workload (`kv.rs`: a heap of records read and
//! updated at random, every read checked) run in a memory cgroup far
//! smaller than its heap, so that most of it lives on the device. Once
//! the device holds at least [`Config::min_swapped`], the server is
//! replaced `events` times at random intervals (5.5 to 8 s: a server that
//! dies sooner after its start counts toward the keeper's crash loop), in
//! one of two phases, each
//! a run of its own: `crashes` (SIGKILL of the server at a random instant:
//! the keeper starts another) and `restarts` (`zmem swap restart`: the
//! server leaves, the binary on disk takes over). Each phase reports how
//! long each replacement took (from the kill, or the command, to the next
//! server's `ready`), and the workload's longest pause (the longest a
//! client went without finishing an operation, `kv::Outcome::
//! longest_pause`): what a swap-in waited, at worst. The workload's exit
//! says the rest: 0 is every read right; a wrong page ends it with an
//! error, a lost device with SIGBUS.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use zmem_host::MemCgroup;

const NAME: &str = "bench-restart";
const CGROUP: &str = "zmem-bench-restart";

/// What a run does.
#[derive(Clone, Debug)]
pub struct Config {
    /// The zmem binary whose device is measured (and which runs `kv`).
    pub zmem: PathBuf,
    /// The workload's heap.
    pub heap: u64,
    /// Its memory cgroup's limit.
    pub resident: u64,
    /// Replacements per phase.
    pub events: u32,
    /// The replacements start once the device holds this much.
    pub min_swapped: u64,
    /// Operations per record of the workload (its length).
    pub passes: u32,
    /// Where the device lives while the bench runs.
    pub scratch: PathBuf,
    /// Where the pages past the pool's cap go.
    pub cold: Cold,
    /// More options for `zmem swap on` (a dictionary, a compressor).
    pub extra: Vec<String>,
}

/// Where a device's cold pages go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cold {
    /// Nowhere: every page in RAM (the pool's cap is the heap).
    Ram,
    /// A pool of this cap and a backing file (in `scratch`) for the rest.
    Backing(u64),
    /// A pool of this cap and a Redis cluster (3 masters, 3 replicas on
    /// loopback, started by the bench) for the rest.
    Remote(u64),
}

/// One phase's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phase {
    /// `crashes` or `restarts`.
    pub kind: String,
    /// Replacements done (fewer than asked if the workload ended first).
    pub events: u32,
    /// Milliseconds from each kill or command to the next server's ready.
    pub takeover_ms: Vec<f64>,
    /// What the device held when the first replacement came.
    pub swapped_bytes: u64,
    /// The workload's exit ("exit status: 0" is every read right).
    pub workload: String,
    pub workload_ok: bool,
    /// Its longest pause, seconds.
    pub longest_pause_s: f64,
    /// Its line (records, reads, updates, times).
    pub kv: String,
    /// The last server's `recovery` and FUSE counters.
    pub recovery: serde_json::Value,
    pub fuse: serde_json::Value,
}

/// The device, undone on drop.
struct Device<'a> {
    cfg: &'a Config,
    run_dir: PathBuf,
}

impl Device<'_> {
    fn zmem(&self, args: &[&str]) -> anyhow::Result<String> {
        Ok(zmem_host::run_tool(Command::new(&self.cfg.zmem).args(args).arg("--run-dir").arg(&self.run_dir))?)
    }

    fn dir(&self) -> PathBuf {
        self.run_dir.join(NAME)
    }

    /// The serving server's pid, once one is ready.
    fn server(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir().join("ready")).ok()?.trim().parse().ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// Wait (at most a minute) for a server other than `old`.
    fn next_server(&self, old: u32) -> anyhow::Result<u32> {
        let t = Instant::now();
        loop {
            if let Some(p) = self.server().filter(|&p| p != old) {
                return Ok(p);
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!("no server took over from {old} within 60 s (see {})", self.dir().join("server.log").display());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn swapped(&self) -> u64 {
        let out = self.zmem(&["swap", "status", "--json"]).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v.get(0).and_then(|d| d["swap_used"].as_u64()).unwrap_or(0)
    }

    fn stats(&self) -> serde_json::Value {
        let out =
            zmem_host::run_tool(Command::new(&self.cfg.zmem).args(["stat", "--json", "--control"]).arg(self.dir().join("control.sock"))).unwrap_or_default();
        serde_json::from_str(&out).unwrap_or_default()
    }
}

impl Drop for Device<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.zmem(&["swap", "off", "--all"]) {
            eprintln!("zmem: `zmem swap off` failed: {e:#}; finish it by hand: zmem swap off --all --run-dir {}", self.run_dir.display());
        }
    }
}

/// The workload, killed if the bench ends before it does.
struct Workload(Option<std::process::Child>);

impl Workload {
    fn ended(&mut self) -> anyhow::Result<bool> {
        Ok(match self.0.as_mut() {
            Some(c) => c.try_wait()?.is_some(),
            None => true,
        })
    }

    fn wait(mut self) -> anyhow::Result<std::process::Output> {
        let c = self.0.take().context("the workload was waited for already")?;
        c.wait_with_output().context("waiting for the workload")
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Both phases: crashes, then restarts.
pub fn run(cfg: &Config) -> anyhow::Result<Vec<Phase>> {
    if !rustix::process::geteuid().is_root() {
        bail!("zmem bench restart needs root (a swap device, a memory cgroup)");
    }
    if cfg.resident >= cfg.heap {
        bail!("--resident must be below --heap, or nothing is swapped");
    }
    let cluster = match cfg.cold {
        Cold::Remote(_) => {
            if !zmem_rig::redis_cluster::available() {
                bail!("a remote pool needs redis-server and redis-cli (scripts/setup.sh installs them)");
            }
            Some(zmem_rig::redis_cluster::LocalCluster::start(3, 1, 5000).map_err(|e| anyhow::anyhow!("starting a Redis cluster: {e}"))?)
        }
        _ => None,
    };
    let url = cluster.as_ref().map(|c| c.url());
    ["crashes", "restarts"].iter().map(|k| phase(cfg, k, url.as_deref())).collect()
}

/// A small deterministic generator for the intervals.
fn next(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    crate::mix64(*x)
}

/// One phase; `url` is the cluster's, for [`Cold::Remote`].
fn phase(cfg: &Config, kind: &str, url: Option<&str>) -> anyhow::Result<Phase> {
    let run_dir = cfg.scratch.join("run");
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let size = (cfg.heap * 2).next_multiple_of(1 << 20).to_string();
    let dev = Device { cfg, run_dir };
    let backing = cfg.scratch.join("backing.img");
    let _ = std::fs::remove_file(&backing);
    let mut on = vec!["swap".to_string(), "on".into(), "--name".into(), NAME.into(), "--size".into(), size, "--priority".into(), "32767".into()];
    match (cfg.cold, url) {
        (Cold::Backing(cap), _) => on.extend(["--max-pool".into(), cap.to_string(), "--backing".into(), backing.display().to_string()]),
        (Cold::Remote(cap), Some(url)) => {
            on.extend(["--max-pool".into(), cap.to_string(), "--remote".into(), url.into(), "--remote-replicas".into(), "1".into()])
        }
        (Cold::Remote(_), None) => bail!("a remote pool needs the cluster's URL"),
        (Cold::Ram, _) => on.extend(["--max-pool".into(), cfg.heap.to_string()]),
    }
    on.extend(cfg.extra.iter().cloned());
    dev.zmem(&on.iter().map(String::as_str).collect::<Vec<_>>()).context("zmem swap on")?;
    let cg = MemCgroup::create(CGROUP, Some(cfg.resident), 60)?;
    let kv = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1/cgroup.procs" || exit 125; shift; exec "$@""#)
        .arg("sh")
        .arg(cg.path())
        .arg(&cfg.zmem)
        .args(["bench", "kv", "--size", &cfg.heap.to_string(), "--threads", "2", "--passes", &cfg.passes.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the kv workload")?;
    let mut kv = Workload(Some(kv));
    let mut p = Phase { kind: kind.into(), ..Phase::default() };
    let t = Instant::now();
    while dev.swapped() < cfg.min_swapped {
        if kv.ended()? {
            bail!("the workload ended before the device held {} MiB: give a larger --heap or a smaller --resident", cfg.min_swapped >> 20);
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("the device held less than {} MiB after 10 minutes", cfg.min_swapped >> 20);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    p.swapped_bytes = dev.swapped();
    let mut seed = 0x5eed_u64 ^ kind.len() as u64;
    for _ in 0..cfg.events {
        // Past the keeper's QUICK_DEATH: a server killed sooner after its
        // start counts toward a crash loop, which these kills are not.
        std::thread::sleep(Duration::from_millis(5500 + next(&mut seed) % 2500));
        if kv.ended()? {
            break;
        }
        let Some(old) = dev.server() else { bail!("no server serves the device") };
        let at = Instant::now();
        if kind == "crashes" {
            let pid = rustix::process::Pid::from_raw(old as i32).context("a server pid")?;
            rustix::process::kill_process(pid, rustix::process::Signal::KILL).context("killing the server")?;
        } else {
            dev.zmem(&["swap", "restart", "--name", NAME]).context("zmem swap restart")?;
        }
        dev.next_server(old)?;
        p.takeover_ms.push(at.elapsed().as_secs_f64() * 1e3);
        p.events += 1;
    }
    let out = kv.wait()?;
    p.workload = out.status.to_string();
    p.workload_ok = out.status.success();
    let stdout = String::from_utf8_lossy(&out.stdout);
    p.kv = stdout.lines().find(|l| l.starts_with("kv:")).unwrap_or("").to_string();
    if !p.workload_ok {
        p.kv = format!("{}{}", stdout.trim(), String::from_utf8_lossy(&out.stderr).trim());
    }
    p.longest_pause_s = p.kv.rsplit_once("longest pause ").and_then(|(_, s)| s.trim_end_matches(" s").parse().ok()).unwrap_or(f64::NAN);
    let stats = dev.stats();
    p.recovery = stats["recovery"].clone();
    p.fuse = stats["fuse"].clone();
    drop(cg);
    drop(dev);
    Ok(p)
}
