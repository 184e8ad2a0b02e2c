//! `zmem serve`: a compressed-RAM block device over NBD (zram, in userspace),
//! or with `--origin`, a compressed read cache in front of a slower device
//! (zcache's role): misses come from the origin, writes go through to it.
//!
//! One pool, one export, served on a Unix socket (default) or loopback TCP,
//! with a control socket (mode 0600) for `zmem stat`. SIGINT/SIGTERM stop
//! accepting, let in-flight requests finish, and remove the socket files.
//! This file turns the arguments into the export and a
//! `zmem_server::device::DeviceConfig`; that crate serves it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use zmem_nbd::{Export, ServerConfig};
use zmem_server::device::{DeviceConfig, Endpoint};

use crate::pool_args::{Defaults, PoolArgs, EXPERT};

/// The help heading of the NBD server's limits and names.
const NBD: &str = "NBD server";
use crate::util::parse_size;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Size of the exported device (e.g. 1G); a multiple of 512 bytes.
    #[arg(long, value_parser = parse_size, required_unless_present = "origin", conflicts_with = "origin")]
    pub size: Option<u64>,
    /// Cache this device instead of holding the data: a file or block
    /// device (opened O_DIRECT where its file system allows), or an NBD
    /// URI (nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH).
    /// The export is its size in whole pages. Reads that miss are fetched
    /// from it and kept compressed within --max-pool, whose coldest pages
    /// are dropped (never written back); writes, TRIM, WRITE_ZEROES and
    /// FLUSH go through to it before they are answered.
    #[arg(long, value_name = "FILE|URI")]
    pub origin: Option<String>,
    /// With --origin: pages that compress to more than this many bytes are
    /// not kept. The default keeps every page that compresses at all:
    /// zcache kept only pages below half a page (2048), since the page
    /// cache held the others at the same cost, but this cache is inclusive
    /// and takes most of the page cache's memory (`zmem bench cache`
    /// measures both). 4096 keeps every page, one that does not compress
    /// as it is.
    #[arg(long, default_value_t = 4095, value_parser = clap::value_parser!(u16).range(64..=4096), requires = "origin", help_heading = EXPERT)]
    pub cache_max_compressed: u16,
    /// Unix socket to listen on [default: $XDG_RUNTIME_DIR/zmem.sock, or
    /// /run/zmem.sock as root, else /tmp/zmem.sock].
    #[arg(long, conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// Listen on TCP instead: PORT or HOST:PORT (host defaults to 127.0.0.1).
    /// NBD has no authentication here: only expose it on trusted networks.
    #[arg(long)]
    pub listen: Option<String>,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Name of the export ("" is the default export clients ask for).
    #[arg(long, default_value = "", help_heading = NBD)]
    pub export_name: String,
    /// Serve Prometheus metrics (every counter `zmem stat` shows) at
    /// http://ADDR/metrics (127.0.0.1:9940) or on a unix socket
    /// (unix:PATH); off unless given. Bind loopback or a socket unless the
    /// metrics are meant for other machines.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<zmem_server::metrics::MetricsAddr>,
    /// Control socket for `zmem stat` [default: zmem.ctl in the directory
    /// of the default socket]; `none` disables it.
    #[arg(long, help_heading = NBD)]
    pub control: Option<PathBuf>,
    /// Worker threads per connection (for requests over 128 KiB).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=MAX_WORKERS as i64), help_heading = NBD)]
    pub workers: u16,
    /// Let this group (a name or a gid) use the device: its socket is made
    /// mode 0660 and owned by the group. Without it the socket is 0600, for
    /// the server's user only.
    #[arg(long, value_parser = parse_group, help_heading = NBD)]
    pub group: Option<u32>,
    /// Seconds a client has to finish the NBD handshake.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=3600), help_heading = NBD)]
    pub handshake_timeout: u32,
    /// Seconds a request has to arrive whole once it has begun, and a reply
    /// to be taken by the client; past it the connection is dropped. Idle
    /// time between requests is not limited.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3600), help_heading = NBD)]
    pub io_timeout: u32,
    /// Connections at most (one still in its handshake is dropped to make
    /// room for a new one).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096), help_heading = NBD)]
    pub max_connections: u32,
    /// Bytes of READ/WRITE data in flight over all connections (e.g. 256M).
    #[arg(long, default_value = "256M", value_parser = parse_size, help_heading = NBD)]
    pub max_inflight: u64,
    /// Also serve the device as the file DIR/image in a FUSE filesystem
    /// mounted on DIR (an existing empty directory): `losetup --direct-io=on
    /// --find --show DIR/image` makes it a block device with one process
    /// on the path instead of two (nbdfuse and this one) where the kernel
    /// has no nbd driver. Unmounted when the server stops (detach the loop
    /// device first: a file system still on it would get I/O errors).
    #[arg(long, value_name = "DIR")]
    pub fuse: Option<PathBuf>,
    /// Threads serving the FUSE file.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64), requires = "fuse", help_heading = EXPERT)]
    pub fuse_threads: u16,
    /// Threads that read the pages the FUSE file's reads must fetch from a
    /// disk (written back, or from `--origin`), off the threads serving
    /// it (as `zmem swap on --read-threads`); 0 reads them there.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=64), requires = "fuse", help_heading = EXPERT)]
    pub fuse_read_threads: u16,
}

/// Upper bound for --workers: each connection may run this many threads.
pub const MAX_WORKERS: u16 = 64;

/// The largest device: NBD clients read the size as a signed 64-bit number.
pub const MAX_SIZE: u64 = (i64::MAX as u64) & !511;

/// A group name (looked up in /etc/group) or a numeric gid.
fn parse_group(s: &str) -> Result<u32, String> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").map_err(|e| format!("reading /etc/group: {e}"))?;
    groups
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            Some((f.next()?, f.nth(1)?))
        })
        .find(|(name, _)| *name == s)
        .and_then(|(_, gid)| gid.parse().ok())
        .ok_or_else(|| format!("no group named `{s}` in /etc/group (give a name from it, or a numeric gid)"))
}

/// Where sockets go by default.
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if crate::sys::geteuid() == 0 {
        PathBuf::from("/run")
    } else {
        PathBuf::from("/tmp")
    }
}

pub fn default_control_path() -> PathBuf {
    runtime_dir().join("zmem.ctl")
}

fn parse_listen(s: &str) -> anyhow::Result<String> {
    if s.parse::<u16>().is_ok() {
        return Ok(format!("127.0.0.1:{s}"));
    }
    if s.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err()) {
        bail!("bad --listen `{s}`: expected PORT or HOST:PORT");
    }
    Ok(s.to_string())
}

/// The origin `--origin` names: an NBD URI, or else a file or block device.
pub fn open_origin(spec: &str) -> anyhow::Result<Box<dyn zmem_export::Origin>> {
    if spec.starts_with("nbd://") || spec.starts_with("nbd+unix://") {
        let o = zmem_nbd::NbdOrigin::connect(spec).with_context(|| format!("--origin {spec}"))?;
        return Ok(Box::new(o));
    }
    Ok(Box::new(zmem_export::FileOrigin::open(std::path::Path::new(spec))?))
}

/// The largest device whose pool is kept across a server's crash or
/// restart: its ledger has a key a page (16 TiB: 2^32 pages).
const MAX_KEPT_SIZE: u64 = 1 << 44;

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(size) = a.size {
        if size == 0 || !size.is_multiple_of(512) {
            bail!("--size must be a positive multiple of 512 bytes, got {size}");
        }
        if size > MAX_SIZE {
            bail!("--size must be at most {MAX_SIZE} bytes (8 EiB): NBD clients read the size as a signed 64-bit number");
        }
    }
    if a.export_name.len() > 4096 || a.export_name.contains('\0') {
        bail!("--export-name must be at most 4096 bytes without NUL");
    }
    if a.max_inflight < 1 << 20 {
        bail!("--max-inflight must be at least 1M, got {}", a.max_inflight);
    }
    let endpoint = match &a.listen {
        Some(l) => Endpoint::Tcp(parse_listen(l)?),
        None => Endpoint::Unix { path: a.socket.clone().unwrap_or_else(|| runtime_dir().join("zmem.sock")), group: a.group },
    };
    let stop = crate::sys::stop_on_signals().context("installing signal handlers")?;
    let Some(mut kept) = zmem_server::keeper::Kept::take()? else {
        // This process is the device's keeper: it runs the server as its
        // child (the same command line) and starts another when it dies,
        // or on SIGHUP.
        let restart = crate::sys::flag_on(signal_hook::consts::SIGHUP).context("installing signal handlers")?;
        let exe = std::env::current_exe().context("finding the zmem binary")?;
        let server = std::iter::once(exe.into_os_string()).chain(std::env::args_os().skip(1)).collect();
        return crate::keeper_exit(zmem_server::keeper::keep(&zmem_server::keeper::KeeperConfig { mount: None, server }, stop, &restart));
    };
    // SIGUSR1 (from the keeper): leave the device to the next server.
    let leave = crate::sys::flag_on(signal_hook::consts::SIGUSR1).context("installing signal handlers")?;
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, std::sync::Arc::clone(stop)).context("installing signal handlers")?;
    let left = kept.left.take();
    let (export, comp, followable, backing, recovery) = match (&a.origin, a.size) {
        (Some(spec), _) => {
            if left.is_some() {
                bail!("the keeper holds a pool, and a cache (--origin) keeps none: start it with the options the device was made with");
            }
            let origin = open_origin(spec)?;
            if origin.size() % 4096 != 0 {
                eprintln!("zmem: the origin's last {} bytes are not a whole page and are not served", origin.size() % 4096);
            }
            let (pool, comp) = a.pool.build_clean_cache(a.cache_max_compressed.into())?;
            // A cache of clean pages: the next server starts empty.
            (Export::with_origin(Arc::new(pool), origin), comp, true, None, zmem_server::protocol::Recovery { restarts: kept.restarts, ..Default::default() })
        }
        (None, Some(size)) => {
            if kept.restarts > 0 && left.is_none() {
                bail!("the keeper holds no pool for this device to open (it was made with other options): start it with the options the device was made with");
            }
            let name = serve_device(&a.export_name);
            let built = if size <= MAX_KEPT_SIZE {
                a.pool.build_kept(&Defaults::SERVE, &name, size.div_ceil(4096), left.map(|p| (p.arena, p.backing)))?
            } else {
                eprintln!("zmem: warning: a device past 16 TiB keeps no ledger: its pages do not outlive its server");
                let (pool, comp) = a.pool.build(&Defaults::SERVE, &name)?;
                zmem_server::keeper::Built { pool, comp, reopened: None, backing: None }
            };
            let (followable, recovery) = (built.pool.arena().is_some(), built.recovery(kept.restarts));
            (Export::new(Arc::new(built.pool), size), built.comp, followable, built.backing, recovery)
        }
        (None, None) => bail!("give --size (a RAM device) or --origin (a cache of a device)"),
    };
    let export = Arc::new(export);
    let nbd = ServerConfig {
        workers_per_conn: a.workers.into(),
        max_connections: a.max_connections as usize,
        handshake_timeout: Duration::from_secs(a.handshake_timeout.into()),
        io_timeout: Duration::from_secs(a.io_timeout.into()),
        max_server_inflight_bytes: a.max_inflight,
        max_inflight_bytes: a.max_inflight.min(64 << 20),
        ..Default::default()
    };
    let cfg = DeviceConfig {
        export_name: a.export_name.clone(),
        endpoint,
        control: match &a.control {
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) => Some(p.clone()),
            None => Some(default_control_path()),
        },
        nbd,
        // The file is `image`, as for `zmem swap`.
        fuse: a
            .fuse
            .clone()
            .map(|dir| (dir, zmem_fuse::FuseConfig { threads: a.fuse_threads.into(), read_threads: a.fuse_read_threads.into(), ..Default::default() })),
        algorithm: comp.to_string(),
        dedup: a.pool.dedup,
        backing: a.pool.cold_store(&serve_device(&a.export_name)),
        policies: a.pool.policies(&Defaults::SERVE),
        metrics: a.metrics.clone(),
    };
    let keeping = zmem_server::device::Keeping { kept, followable, backing, recovery };
    match zmem_server::device::serve(export, &cfg, Some(keeping), stop, &leave)? {
        zmem_server::keeper::Served::Stopped => Ok(()),
        zmem_server::keeper::Served::Left => std::process::exit(zmem_server::keeper::EXIT_LEFT),
    }
}

/// The device name of `zmem serve`'s export, for the remote namespace.
fn serve_device(export_name: &str) -> String {
    if export_name.is_empty() {
        "serve".to_string()
    } else {
        format!("serve-{export_name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_name_or_number() {
        assert_eq!(parse_group("0"), Ok(0));
        assert_eq!(parse_group("root"), Ok(0));
        let e = parse_group("no-such-group-zmem").unwrap_err();
        assert!(e.contains("/etc/group"), "{e}");
    }

    #[test]
    fn listen_forms() {
        assert_eq!(parse_listen("10809").unwrap(), "127.0.0.1:10809");
        assert_eq!(parse_listen("0.0.0.0:1").unwrap(), "0.0.0.0:1");
        assert_eq!(parse_listen("[::1]:10809").unwrap(), "[::1]:10809");
        assert!(parse_listen("host").is_err());
        assert!(parse_listen("host:99999").is_err());
    }
}
