//! `zmem serve`'s server: one export over NBD (a Unix socket or loopback
//! TCP), optionally also as a FUSE file, with a control socket and the
//! policy threads, until the stop flag is set.
//!
//! The phases, in order: mount the FUSE file (first, so that a refused
//! mount leaves no socket behind), bind the NBD listener and the control
//! socket, serve until `stop`, then unmount and remove the socket files.
//! In-flight requests finish before [`serve`] returns.
//!
//! Under a keeper ([`crate::keeper`]) the first server hands it what it
//! made (the FUSE files, the listener, the pool's arena), and a later one
//! takes them instead of mounting and binding: the FUSE connection's
//! unanswered requests are sent again, and clients that wait in the
//! listener's backlog are accepted. A server asked to leave for the next
//! one finishes what it took and leaves the mount and the socket file in
//! place ([`Served::Left`]).

use std::net::TcpListener;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zmem_export::Export;
use zmem_fuse::{FuseConfig, Mounted};
use zmem_nbd::{Listener, Server, ServerConfig};

use crate::control::{bind_unix, BindError, Frontend, Info};
use crate::keeper::{HandOver, Kept, Served};
use crate::metrics::{MetricsAddr, MetricsError, MetricsServer};
use crate::policy::Policies;
use crate::protocol::Recovery;
use crate::side::SideThreads;

/// Where NBD clients connect.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// A Unix socket, mode 0600, or 0660 and owned by `group`.
    Unix { path: PathBuf, group: Option<u32> },
    /// A TCP address (`HOST:PORT`).
    Tcp(String),
}

/// What [`serve`] serves, and how.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// The export's name ("" is the default export).
    pub export_name: String,
    pub endpoint: Endpoint,
    /// The control socket (mode 0600), if any.
    pub control: Option<PathBuf>,
    /// The NBD server's limits.
    pub nbd: ServerConfig,
    /// Also serve the device as a FUSE file mounted on this directory.
    pub fuse: Option<(PathBuf, FuseConfig)>,
    /// What the control socket reports of the pool.
    pub algorithm: String,
    pub dedup: bool,
    pub backing: Option<String>,
    /// The policy threads beside the pool.
    pub policies: Policies,
    /// Serve Prometheus metrics here (off: `None`).
    pub metrics: Option<MetricsAddr>,
}

/// Why a device could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("mounting the FUSE file at {}: {source}", dir.display())]
    Mount { dir: PathBuf, source: std::io::Error },
    #[error("listening on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("serving: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Keeper(#[from] crate::keeper::KeeperError),
    #[error("the keeper kept a FUSE connection, but this server has no --fuse: start it with the options the device was made with")]
    FuseMismatch,
}

/// A server started by a keeper: what it was handed, and what it hands.
pub struct Keeping {
    pub kept: Kept,
    /// Whether the next server can take this one's place: its pool is kept
    /// (the export's pool has an arena, handed over with `backing`), or
    /// holds nothing that must outlive it (a cache of clean pages).
    pub followable: bool,
    /// The pool's backing file, for the keeper to hold.
    pub backing: Option<OwnedFd>,
    /// What this start found (for `zmem stat`).
    pub recovery: Recovery,
}

/// Serve `export` as `cfg` says until `stop` is set (see the module notes);
/// under a keeper, `leave` set with `stop` leaves the device to the next
/// server.
pub fn serve(export: Arc<Export>, cfg: &DeviceConfig, mut keeping: Option<Keeping>, stop: &AtomicBool, leave: &AtomicBool) -> Result<Served, ServeError> {
    let server = Arc::new(Server::new(export, cfg.export_name.clone(), cfg.nbd.clone()));
    let (kept_fuse, kept_listen) = match keeping {
        Some(Keeping { ref mut kept, .. }) => (std::mem::take(&mut kept.fuse), kept.listen.take()),
        None => (Vec::new(), None),
    };
    let fuse = mount_fuse(&server, cfg, kept_fuse)?;
    let mut cleanup: Vec<PathBuf> = Vec::new();
    let r = bind_and_run(&server, fuse.as_ref(), cfg, kept_listen, keeping.as_ref(), &mut cleanup, (stop, leave));
    if r.is_ok() && leave.load(Ordering::SeqCst) {
        // The side threads are stopped; what the FUSE workers are answering
        // is finished, the rest left to the next server, and the NBD
        // clients were told to go (they reconnect to the listener the
        // keeper holds).
        let drained = fuse.is_none_or(|m| m.leave(Duration::from_secs(2)));
        server.export().pool().leave();
        if let Some(c) = &cfg.control {
            let _ = std::fs::remove_file(c);
        }
        eprintln!(
            "zmem: server {} leaves the device to the next one ({})",
            std::process::id(),
            if drained { "every request taken answered" } else { "some FUSE requests left to be sent again" }
        );
        return Ok(Served::Left);
    }
    if let Some(m) = fuse {
        if let Err(e) = m.unmount() {
            eprintln!("zmem: unmounting the FUSE file failed: {e}");
        }
    }
    for p in &cleanup {
        let _ = std::fs::remove_file(p);
    }
    let st = server.export().pool().stats();
    eprintln!("zmem: stopped; mm_stat {}", st.mm_stat().split_whitespace().collect::<Vec<_>>().join(" "));
    r.map(|()| Served::Stopped)
}

/// The FUSE file, if asked for: on the connection a keeper kept (`kept`),
/// or mounted now (a mount made is undone when it drops).
fn mount_fuse(server: &Server, cfg: &DeviceConfig, kept: Vec<OwnedFd>) -> Result<Option<Mounted>, ServeError> {
    let Some((dir, fc)) = &cfg.fuse else {
        return if kept.is_empty() { Ok(None) } else { Err(ServeError::FuseMismatch) };
    };
    let err = |source| ServeError::Mount { dir: dir.clone(), source };
    let m = if kept.is_empty() {
        zmem_fuse::mount(Arc::clone(server.export()), dir, fc).map_err(err)?
    } else {
        let channel = zmem_fuse::Channel::from_fds(kept).map_err(err)?;
        zmem_fuse::serve(Arc::clone(server.export()), dir, channel, fc, zmem_fuse::Start::TakeOver).map_err(err)?
    };
    eprintln!("zmem: also serving the device as {}", dir.join(&fc.file_name).display());
    Ok(Some(m))
}

/// Bind the listener (or take the kept one) and the control socket (their
/// paths go to `cleanup` as they are made), hand the keeper what it needs
/// if this is its first server, then serve until `stop`.
fn bind_and_run(
    server: &Arc<Server>,
    fuse: Option<&Mounted>,
    cfg: &DeviceConfig,
    kept_listen: Option<OwnedFd>,
    keeping: Option<&Keeping>,
    cleanup: &mut Vec<PathBuf>,
    (stop, leave): (&AtomicBool, &AtomicBool),
) -> Result<(), ServeError> {
    let (listener, endpoint) = listen(cfg, kept_listen, cleanup)?;
    let control = match &cfg.control {
        Some(p) => {
            let l = bind_unix(p, 0o600, None)?;
            cleanup.push(p.clone());
            Some(l)
        }
        None => None,
    };
    let metrics = cfg.metrics.as_ref().map(MetricsServer::bind).transpose()?;
    if let Some(k) = keeping.filter(|k| k.followable && k.kept.restarts == 0) {
        let pool = server.export().pool().arena().map(|a| (a, k.backing.as_ref().map(|b| b.as_fd())));
        let fuse = fuse.map(|m| m.fds().collect()).unwrap_or_default();
        k.kept.hand_over(&HandOver { pool, fuse, listen: Some(listener.fd()) })?;
    }
    let info = Info {
        device: if cfg.export_name.is_empty() { "serve".into() } else { cfg.export_name.clone() },
        export: Arc::clone(server.export()),
        frontend: Frontend::Nbd { server: Arc::clone(server), fuse: fuse.map(|m| Arc::clone(m.stats())) },
        algorithm: cfg.algorithm.clone(),
        dedup: cfg.dedup,
        endpoint: endpoint.clone(),
        backing: cfg.backing.clone(),
        recovery: keeping.map(|k| k.recovery.clone()),
    };
    // Formatted first: stderr is unbuffered, and a line formatted in place
    // reaches a log file piece by piece.
    let line = format!(
        "zmem: serving export {:?} ({} bytes, {}{}{}) at {endpoint}{}\n",
        cfg.export_name,
        server.export().size(),
        cfg.algorithm,
        if cfg.dedup { ", dedup" } else { "" },
        server.export().origin_description().map(|d| format!(", caching {d}")).unwrap_or_default(),
        cfg.control.as_ref().map(|p| format!(", control {}", p.display())).unwrap_or_default()
    );
    let side = SideThreads { control, metrics, policies: cfg.policies.clone(), jobs: Vec::new() };
    side.run(
        &info,
        || {
            eprint!("{line}");
            crate::notify::ready(&format!("serving {} bytes at {endpoint}", server.export().size()));
        },
        || {
            let r = server.run(&listener, stop);
            stop.store(true, Ordering::SeqCst);
            if !leave.load(Ordering::SeqCst) {
                crate::notify::stopping();
            }
            r
        },
    )
    .map_err(ServeError::Serve)
}

/// The NBD listener (the one a keeper kept, or bound now) and the URI
/// clients use to reach it.
fn listen(cfg: &DeviceConfig, kept: Option<OwnedFd>, cleanup: &mut Vec<PathBuf>) -> Result<(Listener, String), ServeError> {
    match &cfg.endpoint {
        Endpoint::Tcp(addr) => {
            let err = |source| ServeError::Listen { addr: addr.clone(), source };
            let t = match kept {
                Some(fd) => TcpListener::from(fd),
                None => TcpListener::bind(addr).map_err(err)?,
            };
            let local = t.local_addr().map_err(err)?;
            if !local.ip().is_loopback() {
                eprintln!("zmem: warning: NBD on {local} has no authentication or encryption");
            }
            Ok((Listener::Tcp(t), format!("nbd://{local}/{}", cfg.export_name)))
        }
        Endpoint::Unix { path, group } => {
            let mode = if group.is_some() { 0o660 } else { 0o600 };
            let u = match kept {
                Some(fd) => UnixListener::from(fd),
                None => bind_unix(path, mode, *group)?,
            };
            cleanup.push(path.clone());
            Ok((Listener::Unix(u), format!("nbd+unix:///{}?socket={}", cfg.export_name, path.display())))
        }
    }
}
