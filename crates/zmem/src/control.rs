//! The control socket every zmem server answers on (`zmem stat`, `zmem
//! writeback`): one command line in, one JSON line out.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use zmem_export::Export;
use zmem_nbd::Server;

/// What carries the device's requests.
pub enum Frontend {
    /// The NBD server, and the FUSE file's counters if `serve --fuse`
    /// serves the device that way too.
    Nbd { server: Arc<Server>, fuse: Option<Arc<zmem_fuse::FuseStats>> },
    /// The FUSE image's counters, what the server got of its protection
    /// from reclaim, and the budget it shares with a cgroup, if any.
    Fuse { stats: Arc<zmem_fuse::FuseStats>, safety: serde_json::Value, budget: Option<Arc<zmem_host::shared_budget::SharedBudget>> },
}

/// Everything the control socket reports.
pub struct Info {
    pub export: Arc<Export>,
    pub frontend: Frontend,
    pub algorithm: String,
    pub dedup: bool,
    pub endpoint: String,
    pub backing: Option<String>,
}

impl Info {
    pub fn json(&self) -> serde_json::Value {
        let st = self.export.pool().stats();
        let mut v = serde_json::json!({
            "disksize": self.export.size(),
            "algorithm": self.algorithm,
            "dedup": self.dedup,
            "endpoint": self.endpoint,
            "backing": self.backing,
            "mm_stat": st.mm_stat(),
            "io_stat": st.io_stat(),
            "stats": st,
        });
        if let (Some(o), Some(desc)) = (self.export.origin_stats(), self.export.origin_description()) {
            let mut ov = serde_json::to_value(o).unwrap_or_default();
            ov["origin"] = desc.into();
            ov["evicted_pages"] = st.evicted_pages.into();
            v["origin"] = ov;
        }
        let extra = match &self.frontend {
            Frontend::Nbd { server, fuse } => {
                let ss = server.stats();
                let mut j = serde_json::json!({
                    "export": server.info().name,
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
                });
                if let Some(fs) = fuse {
                    j["fuse"] = fuse_json(fs);
                }
                j
            }
            Frontend::Fuse { stats: fs, safety, budget } => {
                serde_json::json!({
                    "fuse": fuse_json(fs),
                    "reclaim_safety": safety,
                    "shared_budget": budget.as_ref().map(|b| b.stats()),
                })
            }
        };
        if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
            v.extend(extra);
        }
        v
    }
}

/// A FUSE file's request counters.
fn fuse_json(fs: &zmem_fuse::FuseStats) -> serde_json::Value {
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    serde_json::json!({
        "reads": n(&fs.reads),
        "writes": n(&fs.writes),
        "bytes_read": n(&fs.bytes_read),
        "bytes_written": n(&fs.bytes_written),
        "discards": n(&fs.discards),
        "errors": n(&fs.errors),
        "uring_requests": n(&fs.uring_requests),
    })
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
    BufReader::new(s.try_clone()?).take(256).read_line(&mut line)?;
    let mut w = s;
    let reply = match line.trim() {
        "stats" => info.json(),
        "ping" => serde_json::json!({"ok": true}),
        "compact" => {
            let pages = info.export.pool().compact();
            serde_json::json!({"ok": true, "pages_compacted": pages})
        }
        cmd if cmd.starts_with("writeback") => match parse_writeback(cmd) {
            Ok((mode, limit)) => match info.export.pool().writeback(mode, limit) {
                Ok(n) => serde_json::json!({"ok": true, "written_back_pages": n}),
                Err(e) => serde_json::json!({"error": e.to_string()}),
            },
            Err(e) => serde_json::json!({"error": e}),
        },
        cmd if cmd.starts_with("recompress") => {
            let pool = info.export.pool();
            match crate::recompress::parse_command(cmd, &pool.config().recomp_algorithms) {
                Ok(req) => match pool.recompress(&req) {
                    Ok(r) => serde_json::json!({"ok": true, "report": r}),
                    Err(e) => serde_json::json!({"error": e.to_string()}),
                },
                Err(e) => serde_json::json!({"error": e}),
            }
        }
        other => serde_json::json!({
            "error": format!("unknown command {other:?}; try stats, compact, writeback MODE [LIMIT], recompress [FILTERS]")
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

/// Bind a Unix socket at `path`, replacing a stale socket file (nobody
/// listening) but refusing to touch a live one or a non-socket file. The
/// socket is created with `mode` whatever the umask (no window where it is
/// more open), and, with `group`, owned by that group.
pub fn bind_unix(path: &Path, mode: u32, group: Option<u32>) -> anyhow::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!("{} exists and is not a socket; refusing to replace it", path.display());
        }
        if UnixStream::connect(path).is_ok() {
            bail!("{} is in use by a running server", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    // Bind under a umask that leaves only the owner's bits (the group's
    // come after the chown), then set the final mode explicitly.
    let r = crate::sys::with_umask((!mode & 0o777) | 0o070, || UnixListener::bind(path));
    let l = r.with_context(|| format!("binding {}", path.display()))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).with_context(|| format!("giving {} to group {gid}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(l)
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
    fn bind_refuses_non_sockets_and_replaces_stale() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert!(bind_unix(&f, 0o600, None).is_err());
        let s = d.path().join("s");
        let l = bind_unix(&s, 0o600, None).unwrap();
        assert_eq!(std::fs::metadata(&s).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(bind_unix(&s, 0o600, None).is_err(), "live socket must not be replaced");
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
