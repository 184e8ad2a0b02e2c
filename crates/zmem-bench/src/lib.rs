//! Benchmark support for zmem: where benchmark pages come from, the kernel
//! yardstick, the machine as a benchmark changes it, and the drivers of
//! `zmem bench` (the `zmem` binary only parses their arguments and prints
//! their reports).
//!
//! * [`pages`] — where benchmark pages come from: files and directories,
//!   the anonymous memory of a live process, or a built-in default process.
//! * [`kernel_zram`] — the kernel yardstick: push the same pages through a
//!   real `/dev/zramN` device and report what the kernel achieved.
//! * [`store`] — `zmem bench store`: the engine's pool against the raw
//!   compressor and kernel zram, on the same pages.
//! * [`store_dict`] — `zmem bench store --dict`: the same pages in every
//!   encoding, with and without a dictionary the pool trained itself.
//! * [`blockdev`] — `zmem bench blockdev`: `zmem serve` under fio against
//!   nbdkit's memory plugin and kernel zram.
//! * [`cache`] — `zmem bench cache`: zcache's iozone experiment, fio over
//!   a real data set on a throttled disk, with and without `zmem serve
//!   --origin` in the path, zmem's memory counted in the reader's budget.
//! * [`remote`] — `zmem bench remote`: the writeback tier's cold store on
//!   a throttled disk against a Redis Cluster on loopback.
//! * [`swap`] — `zmem bench swap`, the seed experiment: a workload under a
//!   memory limit swapping to disk, zswap, zram and zmem; [`plot`] draws it;
//!   [`kv`] is its second built-in workload (a key-value store's heap).
//!
//! The machine as a benchmark changes it (cgroups, loop disks, throttles,
//! swap, zswap's parameters, every change undone on drop) is `zmem-host`,
//! which the swap server uses too.

#![deny(unsafe_code)]

pub mod blockdev;
pub mod cache;
pub mod kernel_zram;
pub mod kv;
pub mod pages;
pub mod plot;
pub mod remote;
pub mod reopen;
pub mod restart;
pub mod store;
pub mod store_dict;
pub mod swap;

use anyhow::Context;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub use kernel_zram::{Unavailable, ZramResult};
pub use pages::{PageSet, PAGE_SIZE};

/// splitmix64's finaliser: spreads every bit of `x` over the result. The
/// bench's one mixing function (the cache bench's path order, the kv
/// workload's generator).
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What `zmem serve` answers on its control socket at `ctl` (`zmem stat
/// --json`); an error if it does not answer within 10 s.
pub fn zmem_stats(zmem: &Path, ctl: &Path) -> anyhow::Result<serde_json::Value> {
    let out = zmem_host::run_limited(Command::new(zmem).args(["stat", "--json", "--control"]).arg(ctl), Duration::from_secs(10))?;
    serde_json::from_str(&out).context("parsing `zmem stat --json`")
}
