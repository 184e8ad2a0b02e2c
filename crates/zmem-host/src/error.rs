//! How a change to the machine fails: one enum for the crate, each variant
//! naming what failed and, where the machine can be fixed, how.

use std::io;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::Duration;

/// A tool, a kernel file or a facility of the machine that did not do what
/// zmem asked of it.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A tool zmem runs is not installed.
    #[error("`{0}` is missing: install it (bash scripts/setup.sh installs every tool zmem uses)")]
    MissingTool(String),
    /// A tool could not be started, or waited for.
    #[error("cannot run {cmd}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: io::Error,
    },
    /// A tool ran and failed; what it printed on stderr says why.
    #[error("{cmd} failed ({status}): {stderr}")]
    ToolFailed { cmd: String, status: ExitStatus, stderr: String },
    /// A tool ran past its time limit and was killed.
    #[error("{cmd} did not finish within {limit:?} and was killed")]
    TimedOut { cmd: String, limit: Duration },
    /// A file (a kernel attribute, a cgroup's, a scratch file) could not be
    /// read, written, made or removed.
    #[error("cannot {op} {}: {source}{}", .path.display(), permission_hint(.source))]
    File {
        op: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A kernel file held something other than the number it should.
    #[error("{}: not a number: {text:?}", .path.display())]
    NotANumber { path: PathBuf, text: String },
    /// The kernel (or its configuration) lacks a facility zmem needs.
    #[error("this machine has no {what} at {path}: {needs}")]
    Unsupported { what: &'static str, path: &'static str, needs: &'static str },
    /// A process zmem started to serve something exited before it did.
    #[error("{what} exited early ({status}){}", .log.as_ref().map(|l| format!(": its log is {}", l.display())).unwrap_or_default())]
    Exited { what: String, status: ExitStatus, log: Option<PathBuf> },
    /// A process zmem started did not become ready in time.
    #[error("{what} within {within:?}")]
    NotReady { what: String, within: Duration },
    /// A memory cgroup to share a budget with has no limit to share.
    #[error("{} has no memory limit: write the budget for its processes and the pool together to {} first", .cgroup.display(), .file.display())]
    NoBudget { cgroup: PathBuf, file: PathBuf },
    /// A budget keeper asked to keep a floor at or above its budget.
    #[error("the floor ({floor} bytes) must be below the budget ({budget} bytes)")]
    BadFloor { floor: u64, budget: u64 },
    /// A thread could not be started.
    #[error("cannot start the {name} thread: {source}")]
    Thread {
        name: &'static str,
        #[source]
        source: io::Error,
    },
}

/// What to do about an error the kernel gave for lack of rights.
fn permission_hint(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::PermissionDenied {
        " (run as root)"
    } else {
        ""
    }
}

impl HostError {
    /// `op` on `path` failed with `source`.
    pub fn file(op: impl Into<String>, path: impl Into<PathBuf>, source: io::Error) -> HostError {
        HostError::File { op: op.into(), path: path.into(), source }
    }

    /// `cmd` could not be started: [`MissingTool`](Self::MissingTool) when
    /// its program is not there.
    pub fn spawn(cmd: &Command, source: io::Error) -> HostError {
        if source.kind() == io::ErrorKind::NotFound {
            return HostError::MissingTool(cmd.get_program().to_string_lossy().into_owned());
        }
        HostError::Spawn { cmd: format!("{cmd:?}"), source }
    }
}

/// A result of this crate.
pub type Result<T, E = HostError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_to_do() {
        let e = HostError::file("write \"3\" to", "/proc/sys/vm/drop_caches", io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(e.to_string().starts_with("cannot write \"3\" to /proc/sys/vm/drop_caches: ") && e.to_string().ends_with("(run as root)"), "{e}");
        let e = HostError::spawn(&Command::new("no-such-tool-zmem"), io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(e.to_string(), "`no-such-tool-zmem` is missing: install it (bash scripts/setup.sh installs every tool zmem uses)");
        let e = HostError::NoBudget { cgroup: "/sys/fs/cgroup/memory/x".into(), file: "/sys/fs/cgroup/memory/x/memory.limit_in_bytes".into() };
        assert!(e.to_string().contains("write the budget"), "{e}");
    }

    #[test]
    fn a_missing_tool_is_named_by_running_it() {
        let e = crate::run_tool(&mut Command::new("no-such-tool-zmem")).unwrap_err();
        assert!(matches!(&e, HostError::MissingTool(t) if t == "no-such-tool-zmem"), "{e:?}");
        let e = crate::run_tool(Command::new("sh").args(["-c", "echo nope >&2; exit 3"])).unwrap_err();
        assert!(matches!(&e, HostError::ToolFailed { stderr, .. } if stderr == "nope"), "{e:?}");
    }
}
