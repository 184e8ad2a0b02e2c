//! Skipping tests honestly.
//!
//! Tests that use kernel features (zram, loop devices, FUSE, swap, cgroups)
//! or the machine's own files skip where those are missing, so `cargo test`
//! works anywhere. In CI, which runs as root on a machine that has all of
//! them, a skip would hide a broken test as a pass: there, [`skip`] fails.

use std::fs;

/// The process's effective uid, from `/proc/self/status`.
pub fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_ascii_whitespace().nth(2)?.parse().ok()
}

/// Running under CI (`CI` set and not empty) as root.
pub fn under_ci_as_root() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty()) && effective_uid() == Some(0)
}

/// Report that a test skips, and why. Under CI as root this panics instead:
/// CI has every feature, so a skip there is a failure.
pub fn skip(reason: &str) {
    if under_ci_as_root() {
        panic!("a test skipped under CI as root ({reason}); CI must have what it needs");
    }
    eprintln!("SKIPPED: {reason}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn uid_is_readable() {
        assert!(super::effective_uid().is_some());
    }
}
