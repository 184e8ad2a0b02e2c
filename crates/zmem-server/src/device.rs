//! `zmem serve`'s server: one export over NBD (a Unix socket or loopback
//! TCP), optionally also as a FUSE file, with a control socket and the
//! policy threads, until the stop flag is set.
//!
//! The phases, in order: mount the FUSE file (first, so that a refused
//! mount leaves no socket behind), bind the NBD listener and the control
//! socket, serve until `stop`, then unmount and remove the socket files.
//! In-flight requests finish before [`serve`] returns.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use zmem_export::Export;
use zmem_fuse::{FuseConfig, Mounted};
use zmem_nbd::{Listener, Server, ServerConfig};

use crate::control::{bind_unix, BindError, Frontend, Info};
use crate::metrics::{MetricsAddr, MetricsError, MetricsServer};
use crate::policy::Policies;
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
}

/// Serve `export` as `cfg` says until `stop` is set (see the module notes).
pub fn serve(export: Arc<Export>, cfg: &DeviceConfig, stop: &AtomicBool) -> Result<(), ServeError> {
    let server = Arc::new(Server::new(export, cfg.export_name.clone(), cfg.nbd.clone()));
    let fuse = mount_fuse(&server, cfg)?;
    let mut cleanup: Vec<PathBuf> = Vec::new();
    let r = bind_and_run(&server, fuse.as_ref(), cfg, &mut cleanup, stop);
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
    r
}

/// The FUSE file, if asked for (a mount made is undone when it drops).
fn mount_fuse(server: &Server, cfg: &DeviceConfig) -> Result<Option<Mounted>, ServeError> {
    let Some((dir, fc)) = &cfg.fuse else { return Ok(None) };
    let m = zmem_fuse::mount(Arc::clone(server.export()), dir, fc).map_err(|source| ServeError::Mount { dir: dir.clone(), source })?;
    eprintln!("zmem: also serving the device as {}", dir.join(&fc.file_name).display());
    Ok(Some(m))
}

/// Bind the listener and the control socket (their paths go to `cleanup`
/// as they are made), then serve until `stop`.
fn bind_and_run(server: &Arc<Server>, fuse: Option<&Mounted>, cfg: &DeviceConfig, cleanup: &mut Vec<PathBuf>, stop: &AtomicBool) -> Result<(), ServeError> {
    let (listener, endpoint) = listen(cfg, cleanup)?;
    let control = match &cfg.control {
        Some(p) => {
            let l = bind_unix(p, 0o600, None)?;
            cleanup.push(p.clone());
            Some(l)
        }
        None => None,
    };
    let metrics = cfg.metrics.as_ref().map(MetricsServer::bind).transpose()?;
    let info = Info {
        device: if cfg.export_name.is_empty() { "serve".into() } else { cfg.export_name.clone() },
        export: Arc::clone(server.export()),
        frontend: Frontend::Nbd { server: Arc::clone(server), fuse: fuse.map(|m| Arc::clone(m.stats())) },
        algorithm: cfg.algorithm.clone(),
        dedup: cfg.dedup,
        endpoint: endpoint.clone(),
        backing: cfg.backing.clone(),
        recovery: None,
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
            r
        },
    )
    .map_err(ServeError::Serve)
}

/// The NBD listener and the URI clients use to reach it.
fn listen(cfg: &DeviceConfig, cleanup: &mut Vec<PathBuf>) -> Result<(Listener, String), ServeError> {
    match &cfg.endpoint {
        Endpoint::Tcp(addr) => {
            let err = |source| ServeError::Listen { addr: addr.clone(), source };
            let t = TcpListener::bind(addr).map_err(err)?;
            let local = t.local_addr().map_err(err)?;
            if !local.ip().is_loopback() {
                eprintln!("zmem: warning: NBD on {local} has no authentication or encryption");
            }
            Ok((Listener::Tcp(t), format!("nbd://{local}/{}", cfg.export_name)))
        }
        Endpoint::Unix { path, group } => {
            let mode = if group.is_some() { 0o660 } else { 0o600 };
            let u = bind_unix(path, mode, *group)?;
            cleanup.push(path.clone());
            Ok((Listener::Unix(u), format!("nbd+unix:///{}?socket={}", cfg.export_name, path.display())))
        }
    }
}
