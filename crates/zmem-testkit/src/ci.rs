//! Skipping tests honestly.
//!
//! Tests that use kernel features (zram, loop devices, FUSE, swap, cgroups)
//! or the machine's own files skip where those are missing, so `cargo test`
//! works anywhere. In CI, which runs as root on a machine that has all of
//! them, a skip would hide a broken test as a pass: there, [`skip`] fails.

pub use zmem_rig::effective_uid;

/// Running under CI (`CI` set and not empty) as root.
pub fn under_ci_as_root() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty()) && effective_uid() == Some(0)
}

/// Whether the tests run in full: `scripts/test.sh` (and so CI) sets
/// `ZMEM_THOROUGH`; a plain `cargo test` runs the long fuzz loops on a
/// sample, to stay quick.
pub fn thorough() -> bool {
    std::env::var_os("ZMEM_THOROUGH").is_some_and(|v| !v.is_empty()) || std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// Report that a test skips, and why. Under CI as root this panics instead:
/// CI has every feature, so a skip there is a failure.
///
/// The line goes straight to the process's stderr, past the test harness's
/// capture (which takes only what the print macros write), so `cargo test`
/// shows every skip with its test's name (libtest names each test's thread
/// after it), not only the output of a test that failed.
pub fn skip(reason: &str) {
    if under_ci_as_root() {
        panic!("a test skipped under CI as root ({reason}); CI must have what it needs");
    }
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
}
