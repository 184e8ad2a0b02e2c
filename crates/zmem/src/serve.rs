//! `zmem serve`: a compressed-RAM block device over NBD (zram, in userspace).
//!
//! One pool, one export, served on a Unix socket (default) or loopback TCP,
//! with a control socket (mode 0600) that answers `stats` with one JSON line
//! for `zmem stat`. SIGINT/SIGTERM stop accepting, let in-flight requests
//! finish, and remove the socket files.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use zmem_compress::Compressor;
use zmem_core::{Pool, PoolConfig};
use zmem_nbd::{Export, Listener, Server, ServerConfig};

use crate::util::{parse_on_off, parse_pool_limit, parse_size};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Size of the exported device (e.g. 1G); a multiple of 512 bytes.
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Unix socket to listen on [default: $XDG_RUNTIME_DIR/zmem.sock, or
    /// /run/zmem.sock as root, else /tmp/zmem.sock].
    #[arg(long, conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// Listen on TCP instead: PORT or HOST:PORT (host defaults to 127.0.0.1).
    /// NBD has no authentication here: only expose it on trusted networks.
    #[arg(long)]
    pub listen: Option<String>,
    /// Compressor: lz4, zstd[:LEVEL] or lzo.
    #[arg(long, default_value = "lz4")]
    pub compressor: String,
    /// Deduplicate identical pages: on or off.
    #[arg(long, default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub dedup: bool,
    /// Cap on the pool's memory (zram's mem_limit, e.g. 256M): compressed
    /// pages and every table the pool keeps (mem_used_total never exceeds
    /// it); writes that need memory past it fail with ENOSPC.
    #[arg(long, value_parser = parse_size)]
    pub mem_limit: Option<u64>,
    /// zswap's max_pool: a size (512M) or a share of RAM (20%). Without
    /// --backing, writes past it fail with ENOSPC until the pool is back
    /// under --accept-threshold; with it, the coldest pages are written back.
    #[arg(long, default_value = "20%", value_parser = parse_pool_limit)]
    pub max_pool: u64,
    /// zswap's accept_threshold_percent.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub accept_threshold: u8,
    /// Backing store for writeback: a regular file (created with mode 0600)
    /// or a block device; O_DIRECT where the file system allows. Cold pages
    /// go there compressed. An existing file or device that holds data other
    /// than a zmem store is refused unless --force is given.
    #[arg(long)]
    pub backing: Option<PathBuf>,
    /// Overwrite whatever the --backing file or device holds.
    #[arg(long, requires = "backing")]
    pub force: bool,
    /// Cap on the backing file's size (e.g. 4G).
    #[arg(long, value_parser = parse_size, requires = "backing")]
    pub backing_limit: Option<u64>,
    /// Name of the export ("" is the default export clients ask for).
    #[arg(long, default_value = "")]
    pub export_name: String,
    /// Control socket for `zmem stat` [default: zmem.ctl in the directory
    /// of the default socket]; `none` disables it.
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Worker threads per connection (for requests over 128 KiB).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=MAX_WORKERS as i64))]
    pub workers: u16,
    /// Let this group (a name or a gid) use the device: its socket is made
    /// mode 0660 and owned by the group. Without it the socket is 0600, for
    /// the server's user only.
    #[arg(long, value_parser = parse_group)]
    pub group: Option<u32>,
    /// Seconds a client has to finish the NBD handshake.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub handshake_timeout: u32,
    /// Seconds a request has to arrive whole once it has begun, and a reply
    /// to be taken by the client; past it the connection is dropped. Idle
    /// time between requests is not limited.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub io_timeout: u32,
    /// Connections at most (one still in its handshake is dropped to make
    /// room for a new one).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_connections: u32,
    /// Bytes of READ/WRITE data in flight over all connections (e.g. 256M).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub max_inflight: u64,
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

fn stop() -> &'static AtomicBool {
    crate::sys::stop_flag()
}

/// Bind a Unix socket at `path`, replacing a stale socket file (nobody
/// listening) but refusing to touch a live one or a non-socket file. The
/// socket is created with `mode` whatever the umask (no window where it is
/// more open), and, with `group`, owned by that group.
fn bind_unix(path: &Path, mode: u32, group: Option<u32>) -> anyhow::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            );
        }
        if UnixStream::connect(path).is_ok() {
            bail!("{} is in use by a running server", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    // Bind under a umask that leaves only the owner's bits (the group's
    // come after the chown), then set the final mode explicitly.
    let r = crate::sys::with_umask((!mode & 0o777) | 0o070, || UnixListener::bind(path));
    let l = r.with_context(|| format!("binding {}", path.display()))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("giving {} to group {gid}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(l)
}

fn parse_listen(s: &str) -> anyhow::Result<String> {
    if s.parse::<u16>().is_ok() {
        return Ok(format!("127.0.0.1:{s}"));
    }
    if s.rsplit_once(':')
        .is_none_or(|(_, p)| p.parse::<u16>().is_err())
    {
        bail!("bad --listen `{s}`: expected PORT or HOST:PORT");
    }
    Ok(s.to_string())
}

/// Everything the control socket reports.
pub struct Info {
    pub server: Arc<Server>,
    pub algorithm: String,
    pub dedup: bool,
    pub endpoint: String,
    pub backing: Option<String>,
}

impl Info {
    pub fn json(&self) -> serde_json::Value {
        let pool = self.server.export().pool();
        let st = pool.stats();
        let ss = self.server.stats();
        serde_json::json!({
            "export": self.server.info().name,
            "disksize": self.server.export().size(),
            "algorithm": self.algorithm,
            "dedup": self.dedup,
            "endpoint": self.endpoint,
            "backing": self.backing,
            "connections": {
                "active": ss.connections_active,
                "total": ss.connections_total,
                "dropped": ss.connections_dropped,
            },
            "panics": ss.panics,
            "timeouts": ss.timeouts,
            "inflight_bytes": ss.inflight_bytes,
            "workers": ss.workers,
            "warnings_suppressed": ss.warnings_suppressed,
            "requests": ss.requests,
            "request_errors": ss.request_errors,
            "mm_stat": st.mm_stat(),
            "io_stat": st.io_stat(),
            "stats": st,
        })
    }
}

fn control_loop(l: UnixListener, info: &Info) {
    use std::os::fd::AsRawFd;
    while !stop().load(Ordering::Relaxed) {
        match zmem_nbd::poll_readable(l.as_raw_fd(), 100) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!("control: poll failed: {e}");
                return;
            }
        }
        let Ok((s, _)) = l.accept() else { continue };
        if let Err(e) = control_client(s, info) {
            tracing::debug!("control: client error: {e}");
        }
    }
}

fn control_client(s: UnixStream, info: &Info) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    BufReader::new(s.try_clone()?)
        .take(256)
        .read_line(&mut line)?;
    let mut w = s;
    let reply = match line.trim() {
        "stats" => info.json(),
        "ping" => serde_json::json!({"ok": true}),
        "compact" => {
            let pages = info.server.export().pool().compact();
            serde_json::json!({"ok": true, "pages_compacted": pages})
        }
        cmd if cmd.starts_with("writeback") => match parse_writeback(cmd) {
            Ok((mode, limit)) => match info.server.export().pool().writeback(mode, limit) {
                Ok(n) => serde_json::json!({"ok": true, "written_back_pages": n}),
                Err(e) => serde_json::json!({"error": e.to_string()}),
            },
            Err(e) => serde_json::json!({"error": e}),
        },
        other => serde_json::json!({
            "error": format!("unknown command {other:?}; try stats, compact, writeback MODE [LIMIT]")
        }),
    };
    writeln!(w, "{reply}")?;
    Ok(())
}

/// `writeback idle SECONDS [LIMIT]`, `writeback huge|incompressible|all [LIMIT]`.
pub fn parse_writeback(cmd: &str) -> Result<(zmem_core::WritebackMode, Option<u64>), String> {
    use zmem_core::WritebackMode;
    let words: Vec<&str> = cmd.split_whitespace().collect();
    let usage = "usage: writeback idle SECONDS [LIMIT] | writeback huge|incompressible|all [LIMIT]";
    let num = |w: &str| w.parse::<u64>().map_err(|_| format!("`{w}` is not a number; {usage}"));
    let (mode, rest) = match words.get(1..) {
        Some(["idle", secs, rest @ ..]) => {
            let secs = num(secs)?.min(u32::MAX as u64) as u32;
            (WritebackMode::Idle(secs), rest)
        }
        Some(["huge", rest @ ..]) => (WritebackMode::Huge, rest),
        Some(["incompressible", rest @ ..]) => (WritebackMode::Incompressible, rest),
        Some(["all", rest @ ..]) => (WritebackMode::All, rest),
        _ => return Err(usage.to_string()),
    };
    let limit = match rest {
        [] => None,
        [l] => Some(num(l)?),
        _ => return Err(usage.to_string()),
    };
    Ok((mode, limit))
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.size == 0 || !a.size.is_multiple_of(512) {
        bail!(
            "--size must be a positive multiple of 512 bytes, got {}",
            a.size
        );
    }
    if a.size > MAX_SIZE {
        bail!("--size must be at most {MAX_SIZE} bytes (8 EiB): NBD clients read the size as a signed 64-bit number");
    }
    if a.export_name.len() > 4096 || a.export_name.contains('\0') {
        bail!("--export-name must be at most 4096 bytes without NUL");
    }
    let comp: Compressor = a.compressor.parse()?;
    let cfg = PoolConfig {
        compressor: comp,
        dedup: a.dedup,
        mem_limit: a.mem_limit,
        max_pool: Some(a.max_pool),
        accept_threshold_percent: a.accept_threshold,
        ..Default::default()
    };
    let pool = match &a.backing {
        Some(path) => {
            let existing = if a.force { zmem_core::Existing::Overwrite } else { zmem_core::Existing::Refuse };
            let (store, why) = zmem_core::BackingStore::open(path, a.backing_limit, existing)
                .with_context(|| format!("opening backing file {}", path.display()))?;
            if let Some(why) = why {
                eprintln!("zmem: {why}");
            }
            Pool::with_backing(cfg, store)?
        }
        None => Pool::new(cfg)?,
    };
    let export = Arc::new(Export::new(Arc::new(pool), a.size));
    if a.max_inflight < 1 << 20 {
        bail!("--max-inflight must be at least 1M, got {}", a.max_inflight);
    }
    let cfg = ServerConfig {
        workers_per_conn: a.workers.into(),
        max_connections: a.max_connections as usize,
        handshake_timeout: Duration::from_secs(a.handshake_timeout.into()),
        io_timeout: Duration::from_secs(a.io_timeout.into()),
        max_server_inflight_bytes: a.max_inflight,
        max_inflight_bytes: a.max_inflight.min(64 << 20),
        ..Default::default()
    };
    let server = Arc::new(Server::new(export, a.export_name.clone(), cfg));

    let mut cleanup: Vec<PathBuf> = Vec::new();
    let (listener, endpoint) = match &a.listen {
        Some(l) => {
            let addr = parse_listen(l)?;
            let t = TcpListener::bind(&addr).with_context(|| format!("listening on {addr}"))?;
            let local = t.local_addr()?;
            if !local.ip().is_loopback() {
                eprintln!("zmem: warning: NBD on {local} has no authentication or encryption");
            }
            (Listener::Tcp(t), format!("nbd://{local}/{}", a.export_name))
        }
        None => {
            let path = a
                .socket
                .clone()
                .unwrap_or_else(|| runtime_dir().join("zmem.sock"));
            let mode = if a.group.is_some() { 0o660 } else { 0o600 };
            let u = bind_unix(&path, mode, a.group)?;
            cleanup.push(path.clone());
            (
                Listener::Unix(u),
                format!("nbd+unix:///{}?socket={}", a.export_name, path.display()),
            )
        }
    };
    let control_path = match &a.control {
        Some(p) if p.as_os_str() == "none" => None,
        Some(p) => Some(p.clone()),
        None => Some(default_control_path()),
    };
    let control = match &control_path {
        Some(p) => {
            let l = bind_unix(p, 0o600, None)?;
            cleanup.push(p.clone());
            Some(l)
        }
        None => None,
    };
    crate::sys::stop_on_signals().context("installing signal handlers")?;

    let info = Info {
        server: server.clone(),
        algorithm: comp.to_string(),
        dedup: a.dedup,
        endpoint: endpoint.clone(),
        backing: a.backing.as_ref().map(|p| p.display().to_string()),
    };
    eprintln!(
        "zmem: serving export {:?} ({} bytes, {}{}) at {endpoint}{}",
        a.export_name,
        a.size,
        comp,
        if a.dedup { ", dedup" } else { "" },
        control_path
            .as_ref()
            .map(|p| format!(", control {}", p.display()))
            .unwrap_or_default()
    );
    let res = std::thread::scope(|s| {
        if let Some(l) = control {
            let info = &info;
            s.spawn(move || control_loop(l, info));
        }
        let r = server.run(&listener, stop());
        stop().store(true, Ordering::SeqCst); // also ends the control thread on error
        r
    });
    for p in &cleanup {
        let _ = std::fs::remove_file(p);
    }
    let st = server.export().pool().stats();
    eprintln!(
        "zmem: stopped; mm_stat {}",
        st.mm_stat()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    );
    res.context("serving")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writeback_commands() {
        use zmem_core::WritebackMode::*;
        assert_eq!(parse_writeback("writeback idle 60").unwrap(), (Idle(60), None));
        assert_eq!(parse_writeback("writeback huge 100").unwrap(), (Huge, Some(100)));
        assert_eq!(parse_writeback("writeback incompressible").unwrap(), (Incompressible, None));
        assert_eq!(parse_writeback("writeback all 5").unwrap(), (All, Some(5)));
        for bad in ["writeback", "writeback idle", "writeback idle x", "writeback all 1 2", "writeback some"] {
            assert!(parse_writeback(bad).is_err(), "{bad}");
        }
    }

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

    #[test]
    fn bind_refuses_non_sockets_and_replaces_stale() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert!(bind_unix(&f, 0o600, None).is_err());
        let s = d.path().join("s");
        let l = bind_unix(&s, 0o600, None).unwrap();
        assert_eq!(
            std::fs::metadata(&s).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(
            bind_unix(&s, 0o600, None).is_err(),
            "live socket must not be replaced"
        );
        drop(l);
        // Whatever the umask, the mode asked for.
        let l = crate::sys::with_umask(0, || bind_unix(&s, 0o600, None)).unwrap();
        assert_eq!(std::fs::metadata(&s).unwrap().permissions().mode() & 0o777, 0o600);
        drop(l);
        let gid = std::fs::metadata(d.path()).map(|m| std::os::unix::fs::MetadataExt::gid(&m)).unwrap();
        bind_unix(&s, 0o660, Some(gid)).unwrap();
        assert_eq!(std::fs::metadata(&s).unwrap().permissions().mode() & 0o777, 0o660);
    }
}
