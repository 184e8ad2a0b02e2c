//! `zmem`: compressed memory for Linux, in userspace.
//!
//! Subcommands:
//! * `zmem bench store` — the engine against the raw compressor and kernel zram.
//! * `zmem bench blockdev` — `zmem serve` under fio vs nbdkit memory and zram.
//! * `zmem bench swap` — a build (or `--workload kv`, a key-value store's
//!   heap) under memory pressure: disk swap, zswap, zram and zmem swap,
//!   side by side; `zmem bench kv` runs that second workload on its own.
//! * `zmem serve` — a compressed-RAM block device over NBD.
//! * `zmem stat` — what a running `zmem serve` holds, like zramctl.
//! * `zmem writeback` — zram's explicit writeback, for `zmem serve --backing`.
//! * `zmem recompress` — zram's recompression with a stronger algorithm.
//! * `zmem swap on|off|status|restart` — zmem as a swap device (FUSE image + loop).
//! * `zmem man DIR`, `zmem completions SHELL` — the manual pages and shell
//!   completions, generated from these very definitions (`docs.rs`).

mod bench_blockdev;
mod bench_cache;
mod bench_remote;
mod bench_reopen;
mod bench_restart;
mod bench_store;
mod bench_swap;
mod docs;
mod pool_args;
mod recompress;
mod serve;
mod stat;
mod swap;
mod sys;
mod util;
mod writeback;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "zmem", version, about = "Compressed memory for Linux, in userspace")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Benchmarks that report numbers (never pass/fail).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Serve a compressed-RAM block device over NBD (zram in userspace).
    Serve(serve::Args),
    /// Show what a running `zmem serve` holds (like zramctl).
    Stat(stat::Args),
    /// Write pages of a running `zmem serve --backing FILE` back to its file
    /// (zram's writeback: idle, huge, incompressible or all, with a budget).
    Writeback(writeback::Args),
    /// Rewrite pages of a running server with a stronger algorithm (zram's
    /// recompress: idle, huge or large pages, kept only where smaller).
    Recompress(recompress::Args),
    /// zmem as swap (zswap's job): `on`, `off`, `status`.
    #[command(subcommand)]
    Swap(swap::SwapCmd),
    /// Write the manual pages (zmem.1 and one per subcommand) into DIR.
    Man(docs::ManArgs),
    /// Print a shell's completion script for zmem.
    Completions(docs::CompletionArgs),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Store pages in a pool, load them back, verify; compare with the raw
    /// compressor and, as root, with kernel zram on the same pages.
    Store(bench_store::Args),
    /// The NBD block device under fio, against nbdkit's compressed memory
    /// plugin and (as root) kernel zram.
    Blockdev(bench_blockdev::Args),
    /// The seed experiment: a build under a memory limit swapping to a
    /// disk, kernel zswap, kernel zram and zmem, on a real and a throttled
    /// disk, with equal memory; table, ratios, --json and a PNG plot.
    Swap(Box<bench_swap::Args>),
    /// zcache's iozone experiment: fio over a real data set on a throttled
    /// disk, with and without `zmem serve --origin` in the path, zmem's
    /// memory counted in the reader's budget (root).
    Cache(bench_cache::Args),
    /// The writeback tier's cold store on a throttled disk (root) against
    /// a Redis Cluster on loopback: store, writeback and load throughput,
    /// read latency of a written-back page, bytes per page written back.
    Remote(bench_remote::Args),
    /// The swap bench's second workload on its own: a key-value store's
    /// heap, filled, then read and updated at random by several clients,
    /// every read checked (`zmem bench swap --workload kv` runs it).
    Kv(bench_swap::KvArgs),
    /// A pool that outlives its process: the store throughput and memory
    /// of a pool with a ledger against a plain one, and how long opening
    /// it again takes, every page checked.
    Reopen(bench_reopen::Args),
    /// A swap device under a workload whose server is killed, then
    /// restarted, again and again: how long each takeover takes, the
    /// workload's longest pause, and that it saw no error and no wrong page.
    Restart(bench_restart::Args),
}

/// Colour in log lines only for a terminal that can show it: never in a
/// file or a pipe, nor with `TERM=dumb` or `NO_COLOR` set.
fn log_colours(stderr_is_terminal: bool, term: Option<&str>, no_color: bool) -> bool {
    stderr_is_terminal && !no_color && term.is_some_and(|t| !t.is_empty() && t != "dumb")
}

/// A keeper's end: as a server's error would end, but with the server's
/// exit code where the server failed.
fn keeper_exit(r: Result<(), zmem_server::keeper::KeeperError>) -> anyhow::Result<()> {
    if let Err(e) = r {
        eprintln!("zmem: error: {e}");
        std::process::exit(e.exit_code());
    }
    Ok(())
}

fn main() {
    use std::io::IsTerminal;
    let term = std::env::var("TERM").ok();
    let ansi = log_colours(std::io::stderr().is_terminal(), term.as_deref(), std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()));
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("ZMEM_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")))
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Bench(BenchCmd::Store(a)) => bench_store::run(a),
        Cmd::Bench(BenchCmd::Blockdev(a)) => bench_blockdev::run(a),
        Cmd::Bench(BenchCmd::Swap(a)) => bench_swap::run(*a),
        Cmd::Bench(BenchCmd::Cache(a)) => bench_cache::run(a),
        Cmd::Bench(BenchCmd::Remote(a)) => bench_remote::run(a),
        Cmd::Bench(BenchCmd::Kv(a)) => bench_swap::run_kv(a),
        Cmd::Bench(BenchCmd::Reopen(a)) => bench_reopen::run(a),
        Cmd::Bench(BenchCmd::Restart(a)) => bench_restart::run(a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Swap(c) => swap::run(c),
        Cmd::Stat(a) => stat::run(a),
        Cmd::Writeback(a) => writeback::run(a),
        Cmd::Recompress(a) => recompress::run(a),
        Cmd::Man(a) => docs::man(&Cli::command(), &a),
        Cmd::Completions(a) => docs::completions(Cli::command(), &a),
    };
    if let Err(e) = res {
        eprintln!("zmem: error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn colours_only_on_a_capable_terminal() {
        use super::log_colours;
        assert!(log_colours(true, Some("xterm-256color"), false));
        assert!(!log_colours(false, Some("xterm-256color"), false), "file or pipe");
        assert!(!log_colours(true, Some("dumb"), false));
        assert!(!log_colours(true, None, false));
        assert!(!log_colours(true, Some("xterm"), true), "NO_COLOR");
    }
}
