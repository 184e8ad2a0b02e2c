//! Replacing a swap device's server: which process serves it now (its
//! `ready` file), and a restart asked of its keeper
//! (`zmem_server::keeper`), waited for until the new server serves.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Result, SwapError};

/// The pid of the server serving the device in `dir` now (its `ready`
/// file), if it is running.
pub(crate) fn server_pid(dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("ready")).ok()?.trim().parse().ok()?;
    crate::is_our_server(pid, dir).then_some(pid)
}

/// Replace the server of the device in `dir` (whose keeper is `keeper`)
/// with a new one, from the binary on disk now, and wait until it serves
/// (at most `limit`); returns the old server's pid and the new one's.
pub(crate) fn restart(dir: &Path, keeper: u32, limit: Duration) -> Result<(Option<u32>, u32)> {
    use rustix::process::{kill_process, Pid, Signal};
    let old = server_pid(dir);
    let pid = Pid::from_raw(keeper as i32).ok_or_else(|| SwapError::Keeper(format!("bad keeper pid {keeper}")))?;
    kill_process(pid, Signal::HUP).map_err(|e| SwapError::Keeper(format!("signalling keeper {keeper}: {e}")))?;
    let end = Instant::now() + limit;
    loop {
        if let Some(new) = server_pid(dir).filter(|&p| Some(p) != old) {
            return Ok((old, new));
        }
        if !crate::is_our_server(keeper, dir) {
            return Err(SwapError::Keeper(format!("keeper {keeper} exited during the restart; see {}", dir.join("server.log").display())));
        }
        if Instant::now() > end {
            return Err(SwapError::Keeper(format!("no new server after {} s; see {}", limit.as_secs(), dir.join("server.log").display())));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
