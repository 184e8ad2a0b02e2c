//! The control protocol: one request in, one reply out, each one line of
//! JSON, typed on both ends by the structs below (the server serialises
//! what the client deserialises, so a renamed field fails to parse
//! instead of reading as 0).
//!
//! A request is `{"cmd": "stats"}`, `{"cmd": "writeback", "mode": "huge",
//! "limit": 100}` and so on ([`Request`]); a reply is `{"ok": …}` or
//! `{"error": "…"}` ([`Reply`]). The server reads at most
//! [`MAX_REQUEST`] bytes of a request and answers a line it cannot parse
//! with an error naming what it expected.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use zmem_core::{Compressor, Recompress, RecompressReport, Stats, WritebackMode};
use zmem_export::OriginStats;
use zmem_host::shared_budget::BudgetStats;

use crate::memory::ServerMemory;
use crate::reclaim::ReclaimSafety;

/// Longest request line the server reads.
pub const MAX_REQUEST: u64 = 4096;

/// What a client asks of a server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Everything the server reports ([`StatsReply`]).
    Stats,
    /// Is it there?
    Ping,
    /// Compact the allocator now.
    Compact,
    /// zram's explicit writeback: pages of `mode`, at most `limit`.
    Writeback { mode: WritebackMode, limit: Option<u64> },
    /// zram's recompression with the server's `--recomp-algo` algorithms.
    Recompress(RecompressRequest),
}

/// A recompression as the client says it: the algorithm by name, which the
/// server looks up among its own (see [`RecompressRequest::resolve`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecompressRequest {
    /// Not accessed for at least this many seconds.
    pub idle_secs: Option<u32>,
    /// Stored raw (zram's huge pages).
    pub huge: bool,
    /// Compressed size at least this many bytes.
    pub threshold: Option<u32>,
    /// Only this one of the server's algorithms (e.g. `zstd:9`).
    pub algo: Option<String>,
    /// At most this many pages rewritten.
    pub limit: Option<u64>,
}

impl RecompressRequest {
    /// The pool's request, with `algo` found among the server's
    /// recompression algorithms `algos` (its priority is its place + 1).
    pub fn resolve(&self, algos: &[Compressor]) -> Result<Recompress, String> {
        let prio = match &self.algo {
            None => None,
            Some(name) => {
                let want: Compressor = name.parse().map_err(|e| format!("{e}"))?;
                let i = algos.iter().position(|c| *c == want).ok_or_else(|| {
                    let have: Vec<String> = algos.iter().map(|c| c.to_string()).collect();
                    format!(
                        "{want} is not one of this server's recompression algorithms ({}); start it with --recomp-algo {want}",
                        if have.is_empty() { "none".into() } else { have.join(", ") }
                    )
                })?;
                Some(i as u8 + 1)
            }
        };
        Ok(Recompress { idle_secs: self.idle_secs, huge: self.huge, min_size: self.threshold, prio, limit: self.limit })
    }
}

/// A server's answer: what the request asked for, or why not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Ok(Answer),
    Error(String),
}

/// What a request that succeeded gives back, one variant per [`Request`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Stats(Box<StatsReply>),
    Pong,
    Compacted { pages_compacted: u64 },
    WrittenBack { written_back_pages: u64 },
    Recompressed(RecompressReport),
}

/// Everything a server reports (`zmem stat`, `zmem stat --json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsReply {
    /// The device's name (its metrics' `device` label).
    #[serde(default)]
    pub device: String,
    /// The device's size in bytes.
    pub disksize: u64,
    pub algorithm: String,
    pub dedup: bool,
    /// Where clients reach it: an NBD address, or the FUSE image's path.
    pub endpoint: String,
    /// The backing file, if any.
    pub backing: Option<String>,
    /// zram's `mm_stat` and `io_stat` lines.
    pub mm_stat: String,
    pub io_stat: String,
    /// The pool's counters.
    pub stats: Stats,
    /// A caching device's origin and cache counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<OriginReply>,
    /// The NBD server's counters, when NBD serves the device.
    #[serde(flatten)]
    pub nbd: Option<NbdReply>,
    /// The FUSE file's counters, when FUSE serves the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuse: Option<FuseReply>,
    /// What a swap server got of its protection from reclaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_safety: Option<ReclaimSafety>,
    /// The budget a swap server shares with a memory cgroup, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_budget: Option<BudgetStats>,
    /// The server process's resident memory, its pool included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_memory: Option<ServerMemory>,
    /// A swap server under a keeper: the servers before it, and what it
    /// found when it took the device over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
}

/// What a server under a keeper took over (`keeper.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovery {
    /// Servers the keeper started before this one (crashes and restarts).
    pub restarts: u64,
    /// How long opening the pool the last one left took (0 for the first).
    pub took_ns: u64,
    /// Pages found whole in it.
    pub pages: u64,
    /// Objects the last server had allocated and not published, freed.
    pub strays_freed: u64,
    /// Pages that could not be proven right: their reads fail.
    pub lost_pages: u64,
    /// The version of the state its pool leaves for the next server
    /// (`zmem_core::STATE_VERSION`); 0: its pool is not handed over (a
    /// pool with dedup), and a restart would lose it.
    #[serde(default)]
    pub state_version: u64,
}

/// A caching device's counters and its origin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginReply {
    #[serde(flatten)]
    pub counters: OriginStats,
    /// What the origin is (a path, an NBD address).
    pub origin: String,
    /// Cached pages dropped to make room.
    pub evicted_pages: u64,
}

/// The NBD server's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NbdReply {
    /// The export's name.
    pub export: String,
    pub connections: Connections,
    pub panics: u64,
    pub timeouts: u64,
    pub inflight_bytes: u64,
    pub workers: u64,
    pub warnings_suppressed: u64,
    pub requests: u64,
    pub request_errors: u64,
    /// How long requests took to run.
    #[serde(default)]
    pub latency: zmem_core::Latencies,
}

/// NBD connections: open now, ever, and dropped for misbehaving.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connections {
    pub active: u64,
    pub total: u64,
    pub dropped: u64,
}

/// A FUSE file's request counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseReply {
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub discards: u64,
    pub errors: u64,
    /// Reads served by the read threads (`--read-threads`).
    #[serde(default)]
    pub reads_handed_off: u64,
    /// Requests sent again by the kernel: a server before this one had
    /// read them and died or was replaced before it answered.
    #[serde(default)]
    pub resent: u64,
    /// How long reads and writes took to run.
    #[serde(default)]
    pub latency: zmem_core::Latencies,
}

/// How a control request failed, on the client's side.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {} (is the server running, and is this its control socket?): {source}", path.display())]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("talking to {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{} answered something that is not a zmem reply ({source}); is the server the same version as this zmem?", path.display())]
    BadReply { path: PathBuf, source: serde_json::Error },
    #[error("server: {0}")]
    Server(String),
    #[error("{} answered {got} to a {asked} request", path.display())]
    WrongAnswer { path: PathBuf, asked: &'static str, got: &'static str },
}

impl Request {
    fn name(&self) -> &'static str {
        match self {
            Request::Stats => "stats",
            Request::Ping => "ping",
            Request::Compact => "compact",
            Request::Writeback { .. } => "writeback",
            Request::Recompress(_) => "recompress",
        }
    }
}

impl Answer {
    fn name(&self) -> &'static str {
        match self {
            Answer::Stats(_) => "stats",
            Answer::Pong => "pong",
            Answer::Compacted { .. } => "compacted",
            Answer::WrittenBack { .. } => "written_back",
            Answer::Recompressed(_) => "recompressed",
        }
    }
}

/// Send `req` to the control socket at `path` and return the answer. A
/// writeback or recompression of a large pool can take minutes, so the
/// reply may take up to `timeout`.
pub fn request(path: &Path, req: &Request, timeout: Duration) -> Result<Answer, ClientError> {
    let io = |source| ClientError::Io { path: path.to_path_buf(), source };
    let mut s = UnixStream::connect(path).map_err(|source| ClientError::Connect { path: path.to_path_buf(), source })?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(Duration::from_secs(5))).map_err(io)?;
    let mut line = serde_json::to_string(req).expect("a request always serialises");
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(io)?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).map_err(io)?;
    match serde_json::from_str(reply.trim()).map_err(|source| ClientError::BadReply { path: path.to_path_buf(), source })? {
        Reply::Error(e) => Err(ClientError::Server(e)),
        Reply::Ok(a) => Ok(a),
    }
}

/// [`request`] for the stats.
pub fn stats(path: &Path) -> Result<StatsReply, ClientError> {
    match request(path, &Request::Stats, Duration::from_secs(10))? {
        Answer::Stats(s) => Ok(*s),
        a => Err(ClientError::WrongAnswer { path: path.to_path_buf(), asked: Request::Stats.name(), got: a.name() }),
    }
}

/// Check that `answer` is the kind `req` asks for.
pub fn expect(path: &Path, req: &Request, answer: &Answer) -> Result<(), ClientError> {
    let fits = matches!(
        (req, answer),
        (Request::Stats, Answer::Stats(_))
            | (Request::Ping, Answer::Pong)
            | (Request::Compact, Answer::Compacted { .. })
            | (Request::Writeback { .. }, Answer::WrittenBack { .. })
            | (Request::Recompress(_), Answer::Recompressed(_))
    );
    if fits {
        Ok(())
    } else {
        Err(ClientError::WrongAnswer { path: path.to_path_buf(), asked: req.name(), got: answer.name() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        for r in [
            Request::Stats,
            Request::Ping,
            Request::Compact,
            Request::Writeback { mode: WritebackMode::Idle(60), limit: Some(5) },
            Request::Writeback { mode: WritebackMode::Huge, limit: None },
            Request::Recompress(RecompressRequest { idle_secs: Some(300), huge: true, threshold: Some(3000), algo: Some("zstd:19".into()), limit: Some(5) }),
        ] {
            let line = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r, "{line}");
        }
        assert_eq!(serde_json::to_string(&Request::Stats).unwrap(), r#"{"cmd":"stats"}"#);
        for bad in ["bogus", "{}", r#"{"cmd":"explode"}"#, r#"{"cmd":"writeback","mode":"some"}"#, r#"{"cmd":"writeback","mode":"all","limit":1,"x":1}"#] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn recompress_algorithms_resolve_by_name_and_bad_ones_say_why() {
        let algos: Vec<Compressor> = vec!["zstd:3".parse().unwrap(), "zstd:19".parse().unwrap()];
        let r = RecompressRequest { idle_secs: Some(300), huge: true, threshold: Some(3000), algo: Some("zstd:19".into()), limit: Some(5) };
        assert_eq!(r.resolve(&algos).unwrap(), Recompress { idle_secs: Some(300), huge: true, min_size: Some(3000), prio: Some(2), limit: Some(5) });
        assert_eq!(RecompressRequest::default().resolve(&algos).unwrap(), Recompress::default());
        let e = RecompressRequest { algo: Some("zstd:9".into()), ..Default::default() }.resolve(&algos).unwrap_err();
        assert!(e.contains("zstd:3, zstd:19") && e.contains("--recomp-algo zstd:9"), "{e}");
        assert!(RecompressRequest { algo: Some("brotli".into()), ..Default::default() }.resolve(&algos).is_err());
    }

    #[test]
    fn stats_keep_their_shape_both_ways() {
        let mut s = StatsReply { disksize: 1 << 30, algorithm: "lz4".into(), ..Default::default() };
        s.stats.orig_data_size = 8192;
        s.nbd = Some(NbdReply { export: "e".into(), connections: Connections { active: 2, total: 3, dropped: 0 }, ..Default::default() });
        s.fuse = Some(FuseReply { reads: 7, ..Default::default() });
        let v = serde_json::to_value(&s).unwrap();
        // The shape `zmem stat --json` has always had.
        assert_eq!(v["stats"]["orig_data_size"], 8192);
        assert_eq!(v["connections"]["active"], 2);
        assert_eq!(v["export"], "e");
        assert_eq!(v["fuse"]["reads"], 7);
        assert!(v.get("origin").is_none() && v.get("shared_budget").is_none());
        let back: StatsReply = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
        // Without NBD, no NBD fields, and none invented on the way back.
        let s = StatsReply { fuse: Some(FuseReply::default()), ..Default::default() };
        let v = serde_json::to_value(&s).unwrap();
        assert!(v.get("connections").is_none());
        assert_eq!(serde_json::from_value::<StatsReply>(v).unwrap().nbd, None);
    }

    #[test]
    fn replies_round_trip() {
        for r in [
            Reply::Ok(Answer::Pong),
            Reply::Ok(Answer::WrittenBack { written_back_pages: 3 }),
            Reply::Error("no".into()),
            Reply::Ok(Answer::Stats(Box::default())),
        ] {
            let line = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Reply>(&line).unwrap(), r, "{line}");
        }
    }
}
