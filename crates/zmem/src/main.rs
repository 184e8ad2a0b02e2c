//! `zmem`: compressed memory for Linux, in userspace.
//!
//! Subcommands:
//! * `zmem bench store` — the engine against the raw compressor and kernel zram.

mod bench_store;
mod util;

use clap::{Parser, Subcommand};

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
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Store pages in a pool, load them back, verify; compare with the raw
    /// compressor and, as root, with kernel zram on the same pages.
    Store(bench_store::Args),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ZMEM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Bench(BenchCmd::Store(a)) => bench_store::run(a),
    };
    if let Err(e) = res {
        eprintln!("zmem: error: {e:#}");
        std::process::exit(1);
    }
}
