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

use anyhow::bail;
use zmem_core::{Compressor, Recompress};

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

/// The control-socket command for these arguments.
pub fn command(a: &Args) -> String {
    let mut words = vec!["recompress".to_string()];
    if let Some(s) = a.idle {
        words.push(format!("idle {s}"));
    }
    if a.huge {
        words.push("huge".into());
    }
    if let Some(t) = a.threshold {
        words.push(format!("threshold {t}"));
    }
    if let Some(c) = &a.algo {
        words.push(format!("algo {c}"));
    }
    if let Some(l) = a.limit {
        words.push(format!("limit {l}"));
    }
    words.join(" ")
}

const USAGE: &str = "usage: recompress [idle SECONDS] [huge] [threshold BYTES] [algo NAME] [limit PAGES]";

/// Parse a control-socket `recompress ...` line against the pool's
/// recompression algorithms (`algo` names one of them).
pub fn parse_command(cmd: &str, algos: &[Compressor]) -> Result<Recompress, String> {
    let mut words = cmd.split_whitespace();
    if words.next() != Some("recompress") {
        return Err(USAGE.into());
    }
    let mut req = Recompress::default();
    let num = |w: Option<&str>| -> Result<u64, String> {
        let w = w.ok_or_else(|| format!("a number is missing; {USAGE}"))?;
        w.parse().map_err(|_| format!("`{w}` is not a number; {USAGE}"))
    };
    while let Some(w) = words.next() {
        match w {
            "idle" => req.idle_secs = Some(num(words.next())?.min(u32::MAX as u64) as u32),
            "huge" => req.huge = true,
            "threshold" => req.min_size = Some(num(words.next())?.min(u32::MAX as u64) as u32),
            "limit" => req.limit = Some(num(words.next())?),
            "algo" => {
                let name = words.next().ok_or_else(|| format!("algo needs a name; {USAGE}"))?;
                let want: Compressor = name.parse().map_err(|e| format!("{e}"))?;
                let i = algos.iter().position(|c| *c == want).ok_or_else(|| {
                    let have: Vec<String> = algos.iter().map(|c| c.to_string()).collect();
                    format!(
                        "{want} is not one of this server's recompression algorithms ({}); start it with --recomp-algo {want}",
                        if have.is_empty() { "none".into() } else { have.join(", ") }
                    )
                })?;
                req.prio = Some(i as u8 + 1);
            }
            other => return Err(format!("unknown word `{other}`; {USAGE}")),
        }
    }
    Ok(req)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let path = a.control.clone().unwrap_or_else(crate::serve::default_control_path);
    let v = crate::stat::request(&path, &command(&a))?;
    if let Some(e) = v.get("error") {
        bail!("server: {}", e.as_str().unwrap_or("unknown error"));
    }
    let g = |k: &str| v["report"][k].as_u64().unwrap_or(0);
    println!(
        "{} pages recompressed, {} bytes saved; {} could not shrink (marked), {} changed meanwhile; {} picked",
        g("recompressed"),
        g("saved_bytes"),
        g("marked"),
        g("skipped"),
        g("candidates")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_and_bad_ones_say_why() {
        let algos: Vec<Compressor> = vec!["zstd:3".parse().unwrap(), "zstd:19".parse().unwrap()];
        let a = Args { idle: Some(300), huge: true, threshold: Some(3000), algo: Some("zstd:19".into()), limit: Some(5), control: None };
        let req = parse_command(&command(&a), &algos).unwrap();
        assert_eq!(req, Recompress { idle_secs: Some(300), huge: true, min_size: Some(3000), prio: Some(2), limit: Some(5) });
        assert_eq!(parse_command("recompress", &algos).unwrap(), Recompress::default());
        let e = parse_command("recompress algo zstd:9", &algos).unwrap_err();
        assert!(e.contains("zstd:3, zstd:19") && e.contains("--recomp-algo zstd:9"), "{e}");
        for bad in ["recompress idle", "recompress idle x", "recompress limit", "recompress sometimes", "recompress algo", "recompress algo brotli"] {
            assert!(parse_command(bad, &algos).is_err(), "{bad}");
        }
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
