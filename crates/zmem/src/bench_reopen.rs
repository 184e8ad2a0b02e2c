//! `zmem bench reopen`: arguments and printing; the driver is
//! `zmem_bench::reopen` (see its doc for what is timed and how).

use std::path::PathBuf;

use zmem_bench::reopen::{self, Config};

use crate::util::parse_size;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Files or directories whose pages are stored (default /usr/lib/x86_64-linux-gnu).
    pub paths: Vec<PathBuf>,
    /// The device's size: pages stored, the files' pages repeated.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Read at most this much of the files.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Compressor: lz4, zstd[:LEVEL] or lzo.
    #[arg(long, default_value = "lz4")]
    pub compressor: String,
    /// Fill each pool this many times; the best time counts.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let paths = if a.paths.is_empty() { vec![PathBuf::from("/usr/lib/x86_64-linux-gnu")] } else { a.paths.clone() };
    let r = reopen::run(&Config { paths, data_bytes: a.max_bytes, size: a.size, compressor: a.compressor.parse()?, repeat: a.repeat })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!("zmem bench reopen: {} pages ({:.0} MiB) from {} sources, {}, best of {}", r.pages, mib(r.pages * 4096), r.sources, a.compressor, a.repeat);
    println!(
        "  store MB/s:       plain {:.0}, with a ledger {:.0} ({:.3} x)",
        r.store_mb_s_plain,
        r.store_mb_s_ledger,
        r.store_mb_s_ledger / r.store_mb_s_plain
    );
    println!(
        "  mem_used_total:   plain {:.1} MiB, with a ledger {:.1} MiB ({:.4} x; the ledger {:.1} MiB)",
        mib(r.mem_used_total_plain),
        mib(r.mem_used_total_ledger),
        r.mem_used_total_ledger as f64 / r.mem_used_total_plain as f64,
        mib(r.ledger_bytes)
    );
    println!(
        "  Pool::open:       {:.1} ms for {} pages ({} strays freed, {} lost); every page read back right in {:.0} ms",
        r.open_ms, r.opened_pages, r.strays_freed, r.lost, r.verify_ms
    );
    Ok(())
}
