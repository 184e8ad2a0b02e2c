//! Process-wide state the subcommands share: the effective user, and the
//! stop flag that SIGINT and SIGTERM set (signal-hook: its handler only
//! stores to an atomic).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

/// Effective user id.
pub fn geteuid() -> u32 {
    rustix::process::geteuid().as_raw()
}

static STOP: OnceLock<Arc<AtomicBool>> = OnceLock::new();

fn stop_arc() -> &'static Arc<AtomicBool> {
    STOP.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Make SIGINT and SIGTERM set the returned flag instead of killing the
/// process.
pub fn stop_on_signals() -> std::io::Result<&'static Arc<AtomicBool>> {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(stop_arc()))?;
    }
    Ok(stop_arc())
}

/// A flag that signal `sig` sets (signal-hook).
pub fn flag_on(sig: i32) -> std::io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(sig, Arc::clone(&flag))?;
    Ok(flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn euid_matches_proc() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let euid: u32 = status.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2)).unwrap().parse().unwrap();
        assert_eq!(geteuid(), euid);
    }
}
