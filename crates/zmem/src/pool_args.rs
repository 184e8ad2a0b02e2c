//! The pool options every command that builds a pool shares (`zmem serve`,
//! `zmem swap on`), and building the pool from them.

use std::path::PathBuf;

use anyhow::Context;
use zmem_compress::Compressor;
use zmem_core::{Pool, PoolConfig};

use crate::util::{parse_on_off, parse_pool_limit, parse_size};

#[derive(clap::Args, Debug, Clone)]
pub struct PoolArgs {
    /// Compressor: lz4, zstd[:LEVEL] or lzo.
    #[arg(long, default_value = "lz4")]
    pub compressor: String,
    /// Deduplicate identical pages: on or off.
    #[arg(long, default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub dedup: bool,
    /// Cap on the pool's memory (zram's mem_limit, e.g. 256M): compressed
    /// pages and every table the pool keeps (mem_used_total never exceeds
    /// it); writes that need memory past it fail with ENOSPC.
    #[arg(long, value_parser = parse_size)]
    pub mem_limit: Option<u64>,
    /// zswap's max_pool: a size (512M) or a share of RAM (20%), for the
    /// compressed pages and the tables that grow with them. Without
    /// --backing, writes past it fail with ENOSPC until the pool is back
    /// under --accept-threshold; with it, the coldest pages are written back.
    #[arg(long, default_value = "20%", value_parser = parse_pool_limit)]
    pub max_pool: u64,
    /// zswap's accept_threshold_percent.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub accept_threshold: u8,
    /// Backing store for writeback: a regular file (created with mode 0600)
    /// or a block device; O_DIRECT where the file system allows. Cold pages
    /// go there compressed. An existing file or device that holds data other
    /// than a zmem store is refused unless --force is given.
    #[arg(long)]
    pub backing: Option<PathBuf>,
    /// Overwrite whatever the --backing file or device holds.
    #[arg(long, requires = "backing")]
    pub force: bool,
    /// Cap on the backing file's size (e.g. 4G).
    #[arg(long, value_parser = parse_size, requires = "backing")]
    pub backing_limit: Option<u64>,
    /// zswap's exclusive loads, on or off: a page read from the pool is
    /// taken to be held by the kernel's swap or page cache from then on,
    /// so its compressed copy is the first written back (never dropped)
    /// and a written-back page read from the file stays there. Off by
    /// default: under swap, most loads are read faults whose slot the
    /// kernel keeps, and it reads the page again after it evicts it clean.
    #[arg(long, value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub exclusive_loads: Option<bool>,
}

impl PoolArgs {
    /// The pool these options describe (opening the backing store, if
    /// any), and its compressor.
    /// `exclusive_loads` is the command's default for --exclusive-loads.
    pub fn build(&self, exclusive_loads: bool) -> anyhow::Result<(Pool, Compressor)> {
        let comp: Compressor = self.compressor.parse()?;
        let cfg = PoolConfig {
            exclusive_loads: self.exclusive_loads.unwrap_or(exclusive_loads),
            compressor: comp,
            dedup: self.dedup,
            mem_limit: self.mem_limit,
            max_pool: Some(self.max_pool),
            accept_threshold_percent: self.accept_threshold,
            ..Default::default()
        };
        let pool = match &self.backing {
            Some(path) => {
                let existing = if self.force { zmem_core::Existing::Overwrite } else { zmem_core::Existing::Refuse };
                let (store, why) = zmem_core::BackingStore::open(path, self.backing_limit, existing)
                    .with_context(|| format!("opening backing file {}", path.display()))?;
                if let Some(why) = why {
                    eprintln!("zmem: {why}");
                }
                Pool::with_backing(cfg, store)?
            }
            None => Pool::new(cfg)?,
        };
        Ok((pool, comp))
    }

    /// The same options as command-line words (for a child server process).
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--compressor".to_string(),
            self.compressor.clone(),
            "--dedup".into(),
            if self.dedup { "on" } else { "off" }.into(),
            "--max-pool".into(),
            self.max_pool.to_string(),
            "--accept-threshold".into(),
            self.accept_threshold.to_string(),
        ];
        if let Some(l) = self.mem_limit {
            v.extend(["--mem-limit".into(), l.to_string()]);
        }
        if let Some(x) = self.exclusive_loads {
            v.extend(["--exclusive-loads".into(), if x { "on" } else { "off" }.into()]);
        }
        if let Some(b) = &self.backing {
            v.extend(["--backing".into(), b.display().to_string()]);
            if self.force {
                v.push("--force".into());
            }
            if let Some(l) = self.backing_limit {
                v.extend(["--backing-limit".into(), l.to_string()]);
            }
        }
        v
    }
}
