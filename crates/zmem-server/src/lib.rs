//! What every zmem server runs beside its frontend: the control socket and
//! its typed protocol, Prometheus metrics, the policy threads, and a swap
//! server's protection from reclaim.
//!
//! * [`protocol`] — the control requests and replies, one JSON line each
//!   way, typed on both ends (the server and `zmem stat`, `zmem
//!   writeback`, `zmem recompress`), and the client call.
//! * [`control`] — the socket: binding it safely, the loop that answers it,
//!   and what a server reports ([`control::Info`]).
//! * [`device`] — `zmem serve`'s server: an export over NBD, optionally
//!   also as a FUSE file, with its control socket and policy threads.
//! * [`notify`] — `sd_notify`: READY, STATUS and STOPPING for `Type=notify`
//!   units.
//! * [`metrics`] — what `zmem stat` shows as Prometheus metrics, served
//!   over HTTP (`--metrics`) or rendered once (`zmem stat --prometheus`).
//! * [`policy`] — threads that follow the system's swap fullness and
//!   recompress idle pages.
//! * [`sizing`] — `--pool-size auto`: a swap pool's cap moved to where the
//!   machine gets the most work done.
//! * [`side`] — starting those threads beside a frontend's main loop, and
//!   stopping them when it returns: one start-up and one stop rule for
//!   every server.
//! * [`reclaim`] — `mlockall`, `PR_SET_IO_FLUSHER`, `oom_score_adj`,
//!   malloc's tuning under `mlockall`, and giving back the start-up code's
//!   locked pages (with `inherit.rs`, the crate's only `unsafe`, in
//!   `malloc.rs` and `pageout.rs`).
//! * [`keeper`] — the process that outlives its server: it holds the
//!   device's files (FUSE connection, NBD listener, the pool's arena and
//!   backing file) and starts a new server on them when one dies or a
//!   restart is asked for (`inherit.rs` takes the files a server was
//!   started with).
//! * [`memory`] — the server process's resident memory beside its pool
//!   (code, buffers, stacks, malloc's free memory), in every stats reply.
//!
//! The frontends themselves are crates of their own (`zmem-nbd`,
//! `zmem-fuse`, `zmem-swap`); this crate links no benchmark code.

pub mod control;
pub mod device;
mod inherit;
pub mod keeper;
mod malloc;
pub mod memory;
pub mod metrics;
pub mod notify;
mod pageout;
pub mod policy;
pub mod protocol;
pub mod reclaim;
pub mod side;
pub mod sizing;
