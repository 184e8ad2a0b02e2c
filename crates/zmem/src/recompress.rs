//! `zmem recompress`: zram's recompression, through a running server's
//! control socket.
//!
//! zram rewrites pages with a stronger algorithm when told to (`echo
//! "type=idle threshold=3000" > /sys/block/zram0/recompress`). Here:
//! `zmem recompress --idle 300 --limit 10000` asks `zmem serve` (or a
//! `zmem swap` server) to rewrite up to 10000 pages idle for 5 minutes
//! with its `--recomp-algo` algorithms (zstd:9 unless told otherwise),
//! keeping each only where it comes out smaller.

use std::path::PathBuf;

use zmem_server::protocol::{self, Answer, RecompressRequest, Request};

use crate::util::LONG_REQUEST;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Pages not accessed for at least this long (300, 300s, 5m, 1h).
    #[arg(long, value_name = "DURATION", value_parser = crate::util::parse_secs)]
    pub idle: Option<u32>,
    /// Pages stored raw because the pool's compressor could not shrink
    /// them below the huge threshold (zram's huge pages).
    #[arg(long)]
    pub huge: bool,
    /// Pages whose compressed size is at least this many bytes.
    #[arg(long, value_name = "BYTES")]
    pub threshold: Option<u32>,
    /// Only this one of the server's --recomp-algo algorithms (as given
    /// there, e.g. zstd:9); by default each above a page's own, in order.
    #[arg(long)]
    pub algo: Option<String>,
    /// At most this many pages rewritten.
    #[arg(long, value_name = "PAGES")]
    pub limit: Option<u64>,
    /// The server's control socket [default: as `zmem serve`].
    #[arg(long)]
    pub control: Option<PathBuf>,
}

/// The control request for these arguments.
pub fn request(a: &Args) -> Request {
    Request::Recompress(RecompressRequest { idle_secs: a.idle, huge: a.huge, threshold: a.threshold, algo: a.algo.clone(), limit: a.limit })
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let path = a.control.clone().unwrap_or_else(crate::serve::default_control_path);
    let req = request(&a);
    match protocol::request(&path, &req, LONG_REQUEST)? {
        Answer::Recompressed(r) => println!(
            "{} pages recompressed, {} bytes saved; {} could not shrink (marked), {} changed meanwhile; {} picked",
            r.recompressed, r.saved_bytes, r.marked, r.skipped, r.candidates
        ),
        other => protocol::expect(&path, &req, &other)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_become_the_request() {
        let a = Args { idle: Some(300), huge: true, threshold: Some(3000), algo: Some("zstd:19".into()), limit: Some(5), control: None };
        let want = RecompressRequest { idle_secs: Some(300), huge: true, threshold: Some(3000), algo: Some("zstd:19".into()), limit: Some(5) };
        assert_eq!(request(&a), Request::Recompress(want));
    }

    #[test]
    fn durations() {
        use crate::util::parse_secs;
        assert_eq!(parse_secs("300").unwrap(), 300);
        assert_eq!(parse_secs("300s").unwrap(), 300);
        assert_eq!(parse_secs("5m").unwrap(), 300);
        assert_eq!(parse_secs("2h").unwrap(), 7200);
        assert_eq!(parse_secs("1d").unwrap(), 86400);
        for bad in ["", "s", "5x", "-1", "1.5m", "99999999999"] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
    }
}
