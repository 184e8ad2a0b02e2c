//! The control socket every zmem server answers on (`zmem stat`, `zmem
//! writeback`, `zmem recompress`): one [`Request`] line in, one [`Reply`]
//! line out (see [`protocol`](crate::protocol)).
//!
//! One thread answers clients one at a time, each with a 2 s limit on
//! reading its request and writing its reply, so a client that connects
//! and says nothing holds the socket for at most that long.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zmem_export::Export;
use zmem_fuse::FuseStats;
use zmem_host::shared_budget::SharedBudget;
use zmem_nbd::Server;

use crate::protocol::{Answer, Connections, FuseReply, NbdReply, OriginReply, Reply, Request, StatsReply, MAX_REQUEST};
use crate::reclaim::ReclaimSafety;

/// What carries the device's requests.
pub enum Frontend {
    /// The NBD server, and the FUSE file's counters if `serve --fuse`
    /// serves the device that way too.
    Nbd { server: Arc<Server>, fuse: Option<Arc<FuseStats>> },
    /// The FUSE image's counters, what the server got of its protection
    /// from reclaim, and the budget it shares with a cgroup, if any.
    Fuse { stats: Arc<FuseStats>, safety: ReclaimSafety, budget: Option<Arc<SharedBudget>> },
}

/// Everything the control socket reports and acts on.
pub struct Info {
    /// The device's name (a swap device's, or `zmem serve`'s export's):
    /// the `device` label of its metrics.
    pub device: String,
    pub export: Arc<Export>,
    pub frontend: Frontend,
    pub algorithm: String,
    pub dedup: bool,
    pub endpoint: String,
    pub backing: Option<String>,
    /// A swap server under a keeper: what it took over.
    pub recovery: Option<crate::protocol::Recovery>,
}

impl Info {
    /// The [`StatsReply`] for now.
    pub fn stats(&self) -> StatsReply {
        let st = self.export.pool().stats();
        let origin = match (self.export.origin_stats(), self.export.origin_description()) {
            (Some(counters), Some(origin)) => Some(OriginReply { counters, origin, evicted_pages: st.evicted_pages }),
            _ => None,
        };
        let mut r = StatsReply {
            device: self.device.clone(),
            disksize: self.export.size(),
            algorithm: self.algorithm.clone(),
            dedup: self.dedup,
            endpoint: self.endpoint.clone(),
            backing: self.backing.clone(),
            mm_stat: st.mm_stat(),
            io_stat: st.io_stat(),
            stats: st,
            origin,
            server_memory: crate::memory::now(),
            recovery: self.recovery.clone(),
            ..StatsReply::default()
        };
        match &self.frontend {
            Frontend::Nbd { server, fuse } => {
                let ss = server.stats();
                r.nbd = Some(NbdReply {
                    export: server.info().name.clone(),
                    connections: Connections { active: ss.connections_active, total: ss.connections_total, dropped: ss.connections_dropped },
                    panics: ss.panics,
                    timeouts: ss.timeouts,
                    inflight_bytes: ss.inflight_bytes,
                    workers: ss.workers,
                    warnings_suppressed: ss.warnings_suppressed,
                    requests: ss.requests,
                    request_errors: ss.request_errors,
                    latency: server.latency(),
                });
                r.fuse = fuse.as_deref().map(fuse_reply);
            }
            Frontend::Fuse { stats, safety, budget } => {
                r.fuse = Some(fuse_reply(stats));
                r.reclaim_safety = Some(safety.clone());
                r.shared_budget = budget.as_ref().map(|b| b.stats());
            }
        }
        r
    }

    /// Do what `req` asks.
    pub fn answer(&self, req: Request) -> Result<Answer, String> {
        let pool = self.export.pool();
        match req {
            Request::Stats => Ok(Answer::Stats(Box::new(self.stats()))),
            Request::Ping => Ok(Answer::Pong),
            Request::Compact => Ok(Answer::Compacted { pages_compacted: pool.compact() }),
            Request::Writeback { mode, limit } => pool.writeback(mode, limit).map(|n| Answer::WrittenBack { written_back_pages: n }).map_err(|e| e.to_string()),
            Request::Recompress(r) => {
                let req = r.resolve(&pool.config().recomp_algorithms)?;
                pool.recompress(&req).map(Answer::Recompressed).map_err(|e| e.to_string())
            }
        }
    }
}

/// A FUSE file's request counters.
fn fuse_reply(fs: &FuseStats) -> FuseReply {
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    FuseReply {
        reads: n(&fs.reads),
        writes: n(&fs.writes),
        bytes_read: n(&fs.bytes_read),
        bytes_written: n(&fs.bytes_written),
        discards: n(&fs.discards),
        errors: n(&fs.errors),
        reads_handed_off: n(&fs.reads_handed_off),
        resent: n(&fs.resent),
        latency: fs.latency.snapshot(),
    }
}

/// Answer control clients until `stop` is set.
pub fn control_loop(l: UnixListener, info: &Info, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match zmem_nbd::poll_readable(&l, 100) {
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
    BufReader::new(s.try_clone()?).take(MAX_REQUEST).read_line(&mut line)?;
    let reply = match serde_json::from_str::<Request>(line.trim()) {
        Ok(req) => match info.answer(req) {
            Ok(a) => Reply::Ok(a),
            Err(e) => Reply::Error(e),
        },
        Err(e) => Reply::Error(format!(
            "not a control request ({e}); send one JSON line such as {{\"cmd\":\"stats\"}} (commands: stats, ping, compact, writeback, recompress)"
        )),
    };
    let mut w = s;
    let mut out = serde_json::to_string(&reply).map_err(std::io::Error::other)?;
    out.push('\n');
    w.write_all(out.as_bytes())
}

/// Why a control socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket { path: PathBuf },
    #[error("{} is in use by a running server", path.display())]
    InUse { path: PathBuf },
    #[error("{what} {}: {source}", path.display())]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
}

/// Bind a Unix socket at `path`, replacing a stale socket file (nobody
/// listening) but refusing to touch a live one or a non-socket file. The
/// socket is created with `mode` whatever the umask (no window where it is
/// more open), and, with `group`, owned by that group.
pub fn bind_unix(path: &Path, mode: u32, group: Option<u32>) -> Result<UnixListener, BindError> {
    let io = |what, source| BindError::Io { what, path: path.to_path_buf(), source };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket { path: path.to_path_buf() });
        }
        if UnixStream::connect(path).is_ok() {
            return Err(BindError::InUse { path: path.to_path_buf() });
        }
        std::fs::remove_file(path).map_err(|e| io("removing the stale socket", e))?;
    }
    // Bind under a umask that leaves only the owner's bits (the group's
    // come after the chown), then set the final mode explicitly.
    let l = with_umask((!mode & 0o777) | 0o070, || UnixListener::bind(path)).map_err(|e| io("binding", e))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| io("giving the group its socket", e))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| io("setting the mode of", e))?;
    Ok(l)
}

/// Run `f` with the process umask set to `mask`, then restore it.
pub fn with_umask<R>(mask: u32, f: impl FnOnce() -> R) -> R {
    use rustix::fs::Mode;
    let old = rustix::process::umask(Mode::from_raw_mode(mask as rustix::fs::RawMode));
    let r = f();
    rustix::process::umask(old);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The umask is the process's: tests that set it take turns.
    static UMASK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn umask_now() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
        u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
    }

    #[test]
    fn umask_is_set_inside_and_restored_after() {
        let _turn = UMASK.lock().unwrap_or_else(|e| e.into_inner());
        let before = umask_now();
        let inside = with_umask(0o077, umask_now);
        assert_eq!(inside, 0o077);
        assert_eq!(umask_now(), before);
    }

    #[test]
    fn bind_refuses_non_sockets_and_replaces_stale() {
        let _turn = UMASK.lock().unwrap_or_else(|e| e.into_inner());
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert!(matches!(bind_unix(&f, 0o600, None), Err(BindError::NotASocket { .. })));
        let s = d.path().join("s");
        let l = bind_unix(&s, 0o600, None).unwrap();
        assert_eq!(std::fs::metadata(&s).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(matches!(bind_unix(&s, 0o600, None), Err(BindError::InUse { .. })), "live socket must not be replaced");
        drop(l);
        // Whatever the umask, the mode asked for.
        let l = with_umask(0, || bind_unix(&s, 0o600, None)).unwrap();
        assert_eq!(std::fs::metadata(&s).unwrap().permissions().mode() & 0o777, 0o600);
        drop(l);
        let gid = std::fs::metadata(d.path()).map(|m| std::os::unix::fs::MetadataExt::gid(&m)).unwrap();
        bind_unix(&s, 0o660, Some(gid)).unwrap();
        assert_eq!(std::fs::metadata(&s).unwrap().permissions().mode() & 0o777, 0o660);
    }
}
