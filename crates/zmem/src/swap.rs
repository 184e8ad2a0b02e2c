//! `zmem swap on | off | status`: the arguments of zmem as a swap device
//! (zswap's job), and its config file; `zmem-swap` does the work (see its
//! crate doc for how a device is made and undone).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use zmem_swap::{Device, ServerConfig};

use crate::pool_args::{Defaults, ExclusiveLoads, PoolArgs, PoolSize, RecompressIdle, EXPERT};
use crate::util::parse_size;

/// A swap device's pool options unless given, where they differ from
/// `zmem serve`'s (docs/USAGE.md, "Defaults of `zmem serve` and `zmem swap
/// on`"; the measurements behind each are in docs/experiments/):
/// - `--exclusive-loads auto`: the kernel's own rule, on while the
///   system's swap is more than half full (exclusive-loads.md);
/// - `--promote-loads off`: a page read from the backing file stays
///   there, the kernel holding it now, so the pool's RAM holds pages not
///   read since they were stored (promote-loads.md);
/// - `--pool-size auto`: the pool's cap follows the workload's work
///   (pool-size-auto.md);
/// - idle recompression, `--recompress-idle 1s --recomp-algo zstd:3`:
///   pages a second untouched are rewritten with zstd on half the CPU the
///   machine leaves idle, so the cap holds more of them
///   (idle-recompression.md).
pub(crate) const DEFAULTS: Defaults = Defaults {
    exclusive_loads: ExclusiveLoads::Auto,
    promote_loads: false,
    pool_size: PoolSize::Auto,
    recompress_idle: RecompressIdle::After(1),
    recomp_algo: "zstd:3",
};

#[derive(clap::Subcommand, Debug)]
pub enum SwapCmd {
    /// Start a zmem swap device: server, FUSE image, loop device, mkswap, swapon.
    On(OnArgs),
    /// Undo everything `on` did (also after a crash), in reverse order.
    Off(OffArgs),
    /// One line per zmem swap device, like zramctl.
    Status(StatusArgs),
    /// Replace a device's server with a new one (the binary on disk now:
    /// after an upgrade) while swap stays on; requests pause, none fails.
    Restart(OffArgs),
    /// The server behind a swap device (started by `zmem swap on`).
    #[command(hide = true)]
    Serve(ServeArgs),
}

#[derive(clap::Args, Debug)]
pub struct OnArgs {
    /// Bring up every device described in this file instead (one section
    /// per device, `key = value` lines named like these options; see
    /// contrib/systemd/swap.conf).
    #[arg(long, conflicts_with = "size")]
    pub config: Option<PathBuf>,
    /// Device name: its directory under --run-dir (zmem0, zmem1, ...).
    #[arg(long, default_value = "zmem0", value_parser = zmem_swap::parse_name)]
    pub name: String,
    /// Size of the swap device (e.g. 8G); a multiple of 4096 bytes.
    #[arg(long, value_parser = parse_size, required_unless_present = "config")]
    pub size: Option<u64>,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// swapon priority, -1 to 32767 (zram-generator uses 100).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i32).range(-1..=32767), allow_negative_numbers = true)]
    pub priority: i32,
    /// Swap areas to cut the device into, at descending priorities from
    /// --priority (a loop device each, over one image and one pool). The
    /// kernel frees a slot without telling a loop device, and fills one
    /// area's free clusters before it reuses its freed slots; across areas
    /// it fills the first before the next, so the slots in use gather in
    /// the first areas, whose freed slots are soon written again (and
    /// leave the pool), while the later ones drain and are discarded.
    /// `auto`: one per 256 MiB, at most 16 and at most 24 less the swap
    /// areas already on (the kernel has 24 swap types at least); 1 to 24.
    #[arg(long, default_value = "auto", value_parser = parse_areas, help_heading = EXPERT)]
    pub areas: u32,
    /// Threads serving the FUSE image.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64), help_heading = EXPERT)]
    pub threads: u16,
    /// Threads that read the pages written back to the backing file (or
    /// the remote tier), so that the threads serving the image go on to
    /// the pages in RAM meanwhile and the disk gets that many reads at
    /// once; 0 reads them on the serving threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(0..=64), help_heading = EXPERT)]
    pub read_threads: u16,
    /// Where devices keep their runtime state.
    #[arg(long, default_value = zmem_swap::DEFAULT_RUN_DIR, help_heading = EXPERT)]
    pub run_dir: PathBuf,
    /// Run the server in this cgroup (a directory with `cgroup.procs`, v1
    /// or v2), so that its pool is charged to the same memory budget as the
    /// processes that swap to it. It joins before it allocates anything.
    #[arg(long, conflicts_with = "charge_to")]
    pub cgroup: Option<PathBuf>,
    /// Count the server's memory against this memory cgroup's limit (v1):
    /// its limit now is the budget for its processes and the pool
    /// together, and becomes budget − the server's resident memory, kept
    /// up to date every 10 ms; `off` gives the budget back. The server
    /// stays outside the cgroup (its own reclaim would otherwise wait on
    /// its own swap-out). Needs a --max-pool below 3/4 of the budget.
    #[arg(long)]
    pub charge_to: Option<PathBuf>,
    /// Serve Prometheus metrics (every counter `zmem stat` shows) at
    /// http://ADDR/metrics (127.0.0.1:9940) or on a unix socket
    /// (unix:PATH); off unless given. Bind loopback or a socket unless the
    /// metrics are meant for other machines.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<zmem_server::metrics::MetricsAddr>,
}

/// Which devices `off` and `restart` act on.
#[derive(clap::Args, Debug)]
pub struct OffArgs {
    /// The device.
    #[arg(long, default_value = "zmem0", value_parser = zmem_swap::parse_name, conflicts_with = "all")]
    pub name: String,
    /// Every zmem swap device (`off`: and anything left of crashed ones).
    #[arg(long)]
    pub all: bool,
    #[arg(long, default_value = zmem_swap::DEFAULT_RUN_DIR)]
    pub run_dir: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[arg(long, default_value = zmem_swap::DEFAULT_RUN_DIR)]
    pub run_dir: PathBuf,
    /// JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    #[command(flatten)]
    pub pool: PoolArgs,
    #[arg(long, default_value_t = 2)]
    pub threads: u16,
    #[arg(long, default_value_t = 0)]
    pub read_threads: u16,
    /// The device's directory (mountpoint, control socket, ready file).
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, conflicts_with = "charge_to")]
    pub cgroup: Option<PathBuf>,
    #[arg(long)]
    pub charge_to: Option<PathBuf>,
    #[arg(long)]
    pub metrics: Option<zmem_server::metrics::MetricsAddr>,
}

/// `--areas`: `auto` (0) or 1 to [`zmem_swap::AREAS_MAX`].
fn parse_areas(s: &str) -> Result<u32, String> {
    match s {
        "auto" => Ok(0),
        _ => match s.parse::<u32>() {
            Ok(n) if (1..=zmem_swap::AREAS_MAX).contains(&n) => Ok(n),
            _ => Err(format!("`{s}`: use auto or 1 to {}", zmem_swap::AREAS_MAX)),
        },
    }
}

pub fn run(cmd: SwapCmd) -> anyhow::Result<()> {
    match cmd {
        SwapCmd::On(a) => on(a),
        SwapCmd::Off(a) => Ok(zmem_swap::off(&a.run_dir, (!a.all).then_some(a.name.as_str()))?),
        SwapCmd::Status(a) => status(a),
        SwapCmd::Restart(a) => restart(a),
        SwapCmd::Serve(a) => serve(a),
    }
}

fn on(a: OnArgs) -> anyhow::Result<()> {
    let Some(path) = &a.config else {
        print!("{}", zmem_swap::on(&device(&a)?)?);
        return Ok(());
    };
    let devices = read_config(path, &a.run_dir)?;
    if devices.is_empty() {
        bail!("{} describes no device (one [name] section per device)", path.display());
    }
    let mut failed = 0;
    for d in devices {
        match device(&d).and_then(|d| Ok(zmem_swap::on(&d)?)) {
            Ok(table) => print!("{table}"),
            Err(e) => {
                eprintln!("zmem: {}: {e:#}", d.name);
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} device(s) of {} did not come up", path.display());
    }
    Ok(())
}

/// The device these arguments describe, and the command line of its
/// server (this binary's hidden `swap serve`).
fn device(a: &OnArgs) -> anyhow::Result<Device> {
    let exe = std::env::current_exe().context("finding the zmem binary")?;
    let size = a.size.unwrap_or(0);
    let mut server: Vec<std::ffi::OsString> = vec![exe.into()];
    server.extend(["swap", "serve", "--size", &size.to_string(), "--threads", &a.threads.to_string()].map(Into::into));
    server.extend(["--read-threads".into(), a.read_threads.to_string().into()]);
    server.extend(a.pool.to_args().into_iter().map(Into::into));
    for (flag, path) in [("--cgroup", &a.cgroup), ("--charge-to", &a.charge_to)] {
        if let Some(p) = path {
            server.extend([flag.into(), p.clone().into_os_string()]);
        }
    }
    if let Some(m) = &a.metrics {
        server.extend(["--metrics".into(), m.to_string().into()]);
    }
    Ok(Device {
        name: a.name.clone(),
        size,
        priority: a.priority,
        areas: a.areas,
        run_dir: a.run_dir.clone(),
        charge_to: a.charge_to.clone(),
        max_pool: a.pool.max_pool,
        compressor: a.pool.compressor.clone(),
        server,
        server_env: a.pool.to_env(),
    })
}

fn restart(a: OffArgs) -> anyhow::Result<()> {
    let names = if a.all { zmem_swap::status(&a.run_dir).into_iter().map(|s| s.name).collect() } else { vec![a.name.clone()] };
    if names.is_empty() {
        bail!("no zmem swap device under {}", a.run_dir.display());
    }
    for n in names {
        print!("{}", zmem_swap::restart(&a.run_dir, &n)?);
    }
    Ok(())
}

fn status(a: StatusArgs) -> anyhow::Result<()> {
    let rows = zmem_swap::status(&a.run_dir);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else if !rows.is_empty() {
        print!("{}", zmem_swap::render_status(&rows));
    }
    Ok(())
}

fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let cfg = ServerConfig {
        size: a.size,
        threads: a.threads,
        read_threads: a.read_threads,
        dir: a.dir.clone(),
        cgroup: a.cgroup.clone(),
        charge_to: a.charge_to.clone(),
        max_pool: a.pool.max_pool,
        dedup: a.pool.dedup,
        backing: a.pool.cold_store(&device_name(&a.dir)),
        policies: swap_policies(&a),
        metrics: a.metrics.clone(),
    };
    let stop = crate::sys::stop_on_signals().context("installing signal handlers")?;
    let Some(kept) = zmem_swap::Kept::take()? else {
        // Started by `swap on`: this process is the device's keeper, and
        // runs the server as its child (the same command line).
        let restart = crate::sys::flag_on(signal_hook::consts::SIGHUP).context("installing signal handlers")?;
        let exe = std::env::current_exe().context("finding the zmem binary")?;
        let mut server = vec![exe.into_os_string()];
        server.extend(std::env::args_os().skip(1));
        let keeper = zmem_swap::KeeperConfig { mount: Some((a.dir.join("mnt"), a.threads.into())), server };
        return crate::keeper_exit(zmem_swap::keep(&keeper, stop, &restart));
    };
    let leave = crate::sys::flag_on(signal_hook::consts::SIGUSR1).context("installing signal handlers")?;
    let name = device_name(&a.dir);
    let build = |left: Option<zmem_swap::PoolFiles>| a.pool.build_kept(&DEFAULTS, &name, a.size / 4096, left.map(|h| (h.arena, h.backing))).map_err(Into::into);
    match zmem_swap::serve(&cfg, Some(kept), build, stop, &leave)? {
        zmem_swap::Served::Stopped => Ok(()),
        zmem_swap::Served::Left => std::process::exit(zmem_swap::EXIT_LEFT),
    }
}

/// The server's policy threads: `--pool-size auto` counts the work of
/// the device's cgroup (`--charge-to`, else `--cgroup`) unless
/// `--workload-cgroup` names another.
fn swap_policies(a: &ServeArgs) -> zmem_server::policy::Policies {
    let mut p = a.pool.policies(&DEFAULTS);
    if let (Some(s), None) = (p.size_pool.as_mut(), &a.pool.workload_cgroup) {
        if let Some(cg) = a.charge_to.as_ref().or(a.cgroup.as_ref()) {
            s.work = zmem_server::sizing::Work::Cgroup(cg.clone());
        }
    }
    p
}

/// A swap server's device name: its directory's (zmem0, …).
fn device_name(dir: &std::path::Path) -> String {
    dir.file_name().map_or_else(|| "zmem".to_string(), |n| n.to_string_lossy().into_owned())
}

/// The devices of a config file: `[name]` sections of `key = value` lines,
/// each key one of `zmem swap on`'s long options (`size = 8G`,
/// `max-pool = 25%`, `backing = /var/tmp/zmem0.img`, `dedup = on`, ...);
/// `#` and `;` start comments. Each section is checked like a command line,
/// and an error names the file, the line and the option.
fn read_config(path: &Path, run_dir: &Path) -> anyhow::Result<Vec<OnArgs>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_config(&text, run_dir).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn parse_config(text: &str, run_dir: &Path) -> Result<Vec<OnArgs>, String> {
    #[derive(clap::Parser)]
    #[command(name = "config", no_binary_name = true)]
    struct Section {
        #[command(flatten)]
        on: OnArgs,
    }
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split(['#', ';']).next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = zmem_swap::parse_name(name.trim()).map_err(|e| format!("line {}: {e}", n + 1))?;
            if sections.iter().any(|(s, _)| *s == name) {
                return Err(format!("line {}: device [{name}] appears twice", n + 1));
            }
            sections.push((name, Vec::new()));
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("line {}: expected `key = value` or `[name]`, got `{line}`", n + 1));
        };
        let (k, v) = (k.trim(), v.trim());
        let Some((_, args)) = sections.last_mut() else {
            return Err(format!("line {}: `{k}` comes before any [name] section", n + 1));
        };
        if matches!(k, "name" | "config" | "run-dir") || k.is_empty() || k.starts_with('-') {
            return Err(format!("line {}: `{k}` cannot be set here", n + 1));
        }
        args.push(format!("--{k}"));
        if !(k == "force" && v == "true") {
            args.push(v.to_string());
        }
    }
    sections
        .into_iter()
        .map(|(name, mut args)| {
            args.extend(["--name".into(), name.clone(), "--run-dir".into(), run_dir.display().to_string()]);
            <Section as clap::Parser>::try_parse_from(&args)
                .map(|s| s.on)
                .map_err(|e| format!("[{name}]: {}", e.to_string().lines().next().unwrap_or("invalid")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_files_are_checked_like_command_lines() {
        let run = Path::new("/run/x");
        let text = "# devices\n[zmem0]\nsize = 8G ; eight\nmax-pool = 25%\ncompressor = zstd:3\n\n[fast]\nsize=1G\ndedup = on\npriority = 5\n";
        let d = parse_config(text, run).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].name.as_str(), d[0].size, d[0].pool.compressor.as_str()), ("zmem0", Some(8 << 30), "zstd:3"));
        assert_eq!((d[1].name.as_str(), d[1].size, d[1].pool.dedup, d[1].priority), ("fast", Some(1 << 30), true, 5));
        assert!(d.iter().all(|a| a.run_dir == run && a.config.is_none()));
        for (bad, why) in [
            ("size = 1G\n", "before any"),
            ("[a]\nsize 1G\n", "key = value"),
            ("[a]\nsize = 1G\n[a]\nsize = 2G\n", "twice"),
            ("[a/b]\nsize = 1G\n", "bad device name"),
            ("[a]\nsize = lots\n", "[a]"),
            ("[a]\nmax-pool = 1G\n", "[a]"),
            ("[a]\nsize = 1G\nbogus = 1\n", "[a]"),
            ("[a]\nsize = 1G\nname = b\n", "cannot be set"),
        ] {
            let e = parse_config(bad, run).err().unwrap_or_else(|| panic!("accepted {bad:?}"));
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    /// Random INI-like text, 100,000 files of it: the parser never panics,
    /// and every refusal says where (a line, or the device's section).
    #[test]
    fn random_config_text_is_parsed_or_refused_never_panicked_on() {
        const KEYS: &[&str] = &[
            "size",
            "max-pool",
            "compressor",
            "dedup",
            "priority",
            "backing",
            "force",
            "remote",
            "remote-replicas",
            "remote-timeout",
            "exclusive-loads",
            "dict",
            "threads",
            "read-threads",
            "recompress-idle",
            "name",
            "config",
            "bogus",
            "",
            "-x",
            "size ",
            "\u{e9}t\u{e9}",
        ];
        const VALUES: &[&str] = &[
            "1G",
            "0",
            "-1",
            "25%",
            "1/8",
            "lz4",
            "zstd:99",
            "on",
            "off",
            "true",
            "auto",
            "",
            "18446744073709551616",
            "1e9",
            "redis://h:1",
            "redis://",
            "/tmp/x",
            "5m",
            "0ms",
            "\u{0}",
            "=",
            "[a]",
            "\u{2603}",
            "99999999999999999999999G",
        ];
        let run = Path::new("/run/x");
        let mut rng = zmem_testkit::XorShift::new(26);
        let pick = |n: usize, rng: &mut zmem_testkit::XorShift| rng.below(n as u64) as usize;
        let (mut ok, mut refused, mut devices, mut by_clap) = (0, 0, 0, 0);
        const GOOD: &[(&str, &[&str])] = &[
            ("size", &["1G", "64M", "8G"]),
            ("max-pool", &["25%", "64M"]),
            ("compressor", &["lz4", "zstd:3", "lzo"]),
            ("dedup", &["on", "off"]),
            ("priority", &["5", "100"]),
        ];
        for case in 0..100_000 {
            let mut text = String::new();
            if pick(5, &mut rng) > 0 {
                text += &format!("[d{}]\n", pick(3, &mut rng));
            }
            for _ in 0..pick(8, &mut rng) {
                match pick(16, &mut rng) {
                    6..=15 => {
                        let (k, vs) = GOOD[pick(GOOD.len(), &mut rng)];
                        text += &format!("{k} = {}", vs[pick(vs.len(), &mut rng)]);
                    }
                    0 => text += &format!("[{}]", ["zmem0", "a", "a/b", "", "x y", "dev-1", "averyveryveryveryverylongdevicename123"][pick(7, &mut rng)]),
                    1 => text += "# a comment; with = signs",
                    2 => text += "   ",
                    3 => text += &format!("{} {}", KEYS[pick(KEYS.len(), &mut rng)], VALUES[pick(VALUES.len(), &mut rng)]),
                    4 => {
                        let mut junk = [0u8; 12];
                        rng.fill(&mut junk);
                        text += &String::from_utf8_lossy(&junk);
                    }
                    _ => text += &format!("{} = {}", KEYS[pick(KEYS.len(), &mut rng)], VALUES[pick(VALUES.len(), &mut rng)]),
                }
                text.push(if pick(9, &mut rng) == 0 { '\r' } else { '\n' });
            }
            match parse_config(&text, run) {
                Ok(d) => {
                    ok += 1;
                    devices += d.len();
                }
                Err(e) => {
                    refused += 1;
                    by_clap += e.starts_with('[') as usize;
                    assert!(e.starts_with("line ") || e.starts_with('['), "case {case}: a refusal that does not say where: {e:?} for {text:?}");
                }
            }
        }
        eprintln!("{ok} parsed ({devices} devices), {refused} refused ({by_clap} by the option parser)");
        assert!(
            devices > 1000 && by_clap > 1000 && refused - by_clap > 1000,
            "the cases exercise every end: {ok} parsed ({devices} devices), {refused} refused ({by_clap} by the option parser)"
        );
    }

    #[test]
    fn a_config_file_s_refusal_names_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("zmem-swap.conf");
        std::fs::write(&p, "[a]\nsize = lots\n").unwrap();
        let e = format!("{:#}", read_config(&p, Path::new("/run/x")).err().unwrap());
        assert!(e.contains("zmem-swap.conf") && e.contains("[a]"), "{e}");
        let e = format!("{:#}", read_config(&d.path().join("missing.conf"), Path::new("/run/x")).err().unwrap());
        assert!(e.contains("missing.conf"), "{e}");
    }
}
