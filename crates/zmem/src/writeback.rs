//! `zmem writeback`: zram's explicit writeback, through a running server's
//! control socket.
//!
//! zram writes pages to its `backing_dev` when told to (`echo idle >
//! /sys/block/zram0/writeback`), under a page budget (`writeback_limit`).
//! Here: `zmem writeback --idle 3600 --limit 10000` asks `zmem serve
//! --backing FILE` to write back, compressed, up to 10000 pages not accessed
//! for an hour.

use std::path::PathBuf;

use zmem_core::WritebackMode;
use zmem_server::protocol::{self, Answer, Request};

use crate::util::LONG_REQUEST;

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

/// The control request for these arguments.
pub fn request(a: &Args) -> Request {
    let mode = match (a.idle, a.huge, a.incompressible) {
        (Some(s), _, _) => WritebackMode::Idle(s),
        (None, true, _) => WritebackMode::Huge,
        (None, false, true) => WritebackMode::Incompressible,
        _ => WritebackMode::All,
    };
    Request::Writeback { mode, limit: a.limit }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let path = a.control.clone().unwrap_or_else(crate::serve::default_control_path);
    let req = request(&a);
    match protocol::request(&path, &req, LONG_REQUEST)? {
        Answer::WrittenBack { written_back_pages } => println!("{written_back_pages} pages written back"),
        other => protocol::expect(&path, &req, &other)?,
    }
    Ok(())
}
