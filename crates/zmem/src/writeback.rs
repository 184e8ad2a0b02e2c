//! `zmem writeback`: zram's explicit writeback, through a running server's
//! control socket.
//!
//! zram writes pages to its `backing_dev` when told to (`echo idle >
//! /sys/block/zram0/writeback`), under a page budget (`writeback_limit`).
//! Here: `zmem writeback --idle 3600 --limit 10000` asks `zmem serve
//! --backing FILE` to write back, compressed, up to 10000 pages not accessed
//! for an hour.

use std::path::PathBuf;

use anyhow::bail;

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["idle", "huge", "incompressible", "all"])))]
pub struct Args {
    /// Pages not accessed for at least this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub idle: Option<u32>,
    /// Pages stored raw because they compressed poorly (zram's huge pages).
    #[arg(long)]
    pub huge: bool,
    /// Pages the compressor could not shrink at all.
    #[arg(long)]
    pub incompressible: bool,
    /// Every page held in RAM.
    #[arg(long)]
    pub all: bool,
    /// At most this many pages (zram's writeback_limit).
    #[arg(long, value_name = "PAGES")]
    pub limit: Option<u64>,
    /// The server's control socket [default: as `zmem serve`].
    #[arg(long)]
    pub control: Option<PathBuf>,
}

/// The control-socket command for these arguments.
pub fn command(a: &Args) -> String {
    let mode = match (a.idle, a.huge, a.incompressible) {
        (Some(s), _, _) => format!("idle {s}"),
        (None, true, _) => "huge".into(),
        (None, false, true) => "incompressible".into(),
        _ => "all".into(),
    };
    match a.limit {
        Some(l) => format!("writeback {mode} {l}"),
        None => format!("writeback {mode}"),
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let path = a.control.clone().unwrap_or_else(crate::serve::default_control_path);
    let v = crate::stat::request(&path, &command(&a))?;
    if let Some(e) = v.get("error") {
        bail!("server: {}", e.as_str().unwrap_or("unknown error"));
    }
    println!("{} pages written back", v["written_back_pages"].as_u64().unwrap_or(0));
    Ok(())
}
