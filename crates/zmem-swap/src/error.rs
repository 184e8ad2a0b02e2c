//! How bringing a swap device up or down, or serving one, fails: one enum
//! for the crate, each variant saying what the operator can do.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use zmem_host::{human_size as human, HostError};

/// What went wrong with a zmem swap device.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// `on` and `off` change loop devices, mounts and swap areas.
    #[error("`zmem swap {0}` needs root (loop devices, mount, swapon): run it as root")]
    NotRoot(&'static str),
    #[error("--size must be a positive multiple of 4096 bytes, got {0}")]
    BadSize(u64),
    #[error("/dev/fuse is missing: this kernel has no FUSE (modprobe fuse, or a kernel with CONFIG_FUSE_FS)")]
    NoFuse,
    #[error("{name} is already on ({dev}); `zmem swap off --name {name}` first")]
    AlreadyOn { name: String, dev: String },
    /// Two devices moving one cgroup's limit would fight over it.
    #[error("--charge-to {}: device {other} already counts its memory against that cgroup; give each device a cgroup of its own", .cgroup.display())]
    CgroupTaken { cgroup: PathBuf, other: String },
    #[error(
        "--max-pool ({}) must be below 3/4 of the budget of --charge-to {} ({}), or the pool could leave its processes next to nothing; give a smaller --max-pool",
        human(*.max_pool),
        .cgroup.display(),
        human(*.budget)
    )]
    PoolTooLarge { max_pool: u64, cgroup: PathBuf, budget: u64 },
    /// The device has no command to start its server with (a caller's bug).
    #[error("no server command to start")]
    NoServer,
    /// The keeper could not do its part (its files, its socket, a server
    /// it cannot follow).
    #[error("swap keeper: {0}")]
    Keeper(String),
    #[error("cannot start the swap server: {0}")]
    Spawn(#[source] io::Error),
    #[error("the swap server exited ({status}) before it was ready; the end of its log:\n{log}")]
    ServerExited { status: ExitStatus, log: String },
    #[error("the swap server was not ready after 30 s; the end of its log:\n{log}")]
    ServerNotReady { log: String },
    /// A swapoff failed: the kernel could not take the pages back (no room
    /// for them), so the server must go on holding them.
    #[error("swapoff {dev} failed ({source}): its pages are still in zmem, so nothing more was undone; free memory (or add other swap) for them, then run `zmem swap off` again")]
    SwapoffFailed {
        dev: String,
        #[source]
        source: HostError,
    },
    #[error("{0} device(s) could not be stopped (the reasons are above)")]
    NotStopped(usize),
    /// Sharing a memory cgroup with the processes that swap to the server
    /// could deadlock it without `PR_SET_IO_FLUSHER`.
    #[error(
        "--cgroup {}: the server would share a memory cgroup with its clients without PR_SET_IO_FLUSHER ({why}), \
         and its own page faults at the cgroup's limit could wait on its own swap-out (a deadlock). \
         Give it CAP_SYS_RESOURCE, or use --charge-to {} to count its memory against that cgroup's limit from outside",
        .cgroup.display(),
        .cgroup.display()
    )]
    SharedCgroup { cgroup: PathBuf, why: String },
    /// A file of the device's (its directory, state, log) or the kernel's.
    #[error("cannot {op} {}: {source}", .path.display())]
    File {
        op: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot mount the FUSE image at {}: {source}", .mnt.display())]
    Mount {
        mnt: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot unmount the FUSE image: {0}")]
    Unmount(#[source] io::Error),
    /// Building the pool failed (its own error says how).
    #[error("cannot build the pool: {0}")]
    Pool(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    Kept(#[from] zmem_server::keeper::KeeperError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Lock(#[from] zmem_server::reclaim::LockError),
    #[error(transparent)]
    Bind(#[from] zmem_server::control::BindError),
    #[error(transparent)]
    Metrics(#[from] zmem_server::metrics::MetricsError),
}

impl SwapError {
    /// `op` on `path` failed with `source`.
    pub fn file(op: impl Into<String>, path: impl Into<PathBuf>, source: io::Error) -> SwapError {
        SwapError::File { op: op.into(), path: path.into(), source }
    }
}

/// A result of this crate.
pub type Result<T, E = SwapError> = std::result::Result<T, E>;
