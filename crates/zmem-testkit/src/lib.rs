//! Test-only helpers shared by zmem's crates (their tests, examples and
//! benchmarks). This crate depends on no other workspace crate, so any of
//! them can use it without a dependency cycle.
//!
//! * [`XorShift`] — the one deterministic generator of test data
//!   (xorshift64): tests must not depend on a global or seeded-from-time RNG,
//!   and the same seed gives the same bytes on every run and machine.
//! * [`ports`] — loopback ports for a test's servers, outside the
//!   kernel's ephemeral range.
//! * [`ci`] — skipping a test where a feature is missing, and failing
//!   instead under CI as root, where nothing may be missing.

pub mod ci;
pub mod ports;
pub mod redis_cluster;
mod xorshift;

pub use xorshift::XorShift;
