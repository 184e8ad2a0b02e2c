//! A mutation fuzzer for everything a client controls: the handshake state
//! machine, the request parser and validator, and whole connections through
//! the server (requests executed against a real pool).
//!
//! Stable Rust here has no coverage-guided fuzzer (cargo fuzz needs
//! nightly), so this is a structured generator with mutation, seeded from
//! real client traffic: `fuzz-corpus/` holds what qemu-io, nbdinfo and
//! nbdcopy sent to `zmem serve` (captured through a recording proxy). Each
//! input is a corpus entry mutated by a random stack of byte flips,
//! interesting integers, splices, duplications, truncations and request
//! headers with chosen fields. Every input must end (never hang) with an
//! `Ok` or a typed error, and never panic, also not inside the server (which
//! catches panics and counts them: the count must stay 0).
//!
//! CI runs a few thousand inputs per target. The long run:
//! `FUZZ_INPUTS=10000000 cargo test --release -p zmem-nbd --test fuzz -- --nocapture`
//! (`FUZZ_E2E_INPUTS` sets the end-to-end count separately).

use std::io::{Cursor, Read, Write};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zmem_core::{Pool, PoolConfig};
use zmem_nbd::proto::*;
use zmem_nbd::{negotiate, Export, ExportInfo, Server, ServerConfig, Session, Stream};
use zmem_testkit::XorShift;

/// An input that takes longer than this is a hang.
const HANG: Duration = Duration::from_secs(5);

fn corpus() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus");
    let mut v: Vec<Vec<u8>> =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| std::fs::read(e.unwrap().path()).unwrap()).collect();
    v.sort();
    assert!(v.len() >= 5, "the corpus is missing");
    v
}

fn inputs(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The shared generator, with `below` in `usize` (indices and lengths).
struct Rng(XorShift);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }
}

const INTERESTING: [u64; 14] =
    [0, 1, 0x7f, 0xff, 0xffff, 0x1_0000, 4096, 32 << 20, (32 << 20) + 1, 0x7fff_ffff, 0xffff_ffff, 0x1_0000_0000, i64::MAX as u64, u64::MAX];

/// One mutated input from the corpus.
fn mutate(r: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut d = corpus[r.below(corpus.len())].clone();
    for _ in 0..1 + r.below(6) {
        let at = r.below(d.len() + 1);
        match r.below(9) {
            0 if !d.is_empty() => {
                let i = r.below(d.len());
                d[i] ^= 1 << r.below(8);
            }
            1 if !d.is_empty() => {
                let i = r.below(d.len());
                d[i] = r.next() as u8;
            }
            2 => {
                // An interesting integer, big-endian as on the wire.
                let v = INTERESTING[r.below(INTERESTING.len())];
                let w = [2usize, 4, 8][r.below(3)];
                let bytes = &v.to_be_bytes()[8 - w..];
                if at + w <= d.len() {
                    d[at..at + w].copy_from_slice(bytes);
                } else {
                    d.extend_from_slice(bytes);
                }
            }
            3 => d.truncate(at),
            4 if !d.is_empty() => {
                // Duplicate a chunk (a request repeated, an option twice).
                let a = r.below(d.len());
                let n = r.below(256).min(d.len() - a);
                let chunk = d[a..a + n].to_vec();
                d.splice(at..at, chunk);
            }
            5 => {
                // Splice in a piece of another capture.
                let o = &corpus[r.below(corpus.len())];
                let a = r.below(o.len());
                let n = r.below(512).min(o.len() - a);
                d.splice(at..at, o[a..a + n].iter().copied());
            }
            6 => {
                // A request header with chosen fields.
                let req = Request {
                    flags: INTERESTING[r.below(INTERESTING.len())] as u16 | r.next() as u16 & 0x3f,
                    typ: r.below(12) as u16,
                    handle: r.next(),
                    offset: if r.below(2) == 0 { INTERESTING[r.below(INTERESTING.len())] } else { r.next() % (80 << 20) },
                    len: if r.below(2) == 0 { INTERESTING[r.below(INTERESTING.len())] as u32 } else { r.below(70_000) as u32 },
                };
                d.splice(at..at, req.encode());
            }
            7 if at < d.len() => {
                let n = r.below(64).min(d.len() - at);
                d.drain(at..at + n);
            }
            _ => {
                let n = r.below(64);
                d.splice(at..at, (0..n).map(|_| r.next() as u8));
            }
        }
    }
    d
}

/// The client's bytes in, the server's bytes out (discarded).
struct Duplex {
    input: Cursor<Vec<u8>>,
    sent: u64,
}

impl Read for Duplex {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(b)
    }
}

impl Write for Duplex {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.sent += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn info() -> ExportInfo {
    ExportInfo { name: String::new(), size: 64 << 20, description: Some("fuzz".into()) }
}

/// The handshake state machine, then every complete request header after it
/// through the parser and validator; all in memory.
fn run_in_memory(data: Vec<u8>, info: &ExportInfo) {
    let stop = AtomicBool::new(false);
    let mut d = Duplex { input: Cursor::new(data), sent: 0 };
    let session = match negotiate(&mut d, info, &stop) {
        Ok(Some(s)) => s,
        // Requests after a failed handshake still go through the parser,
        // against the most permissive session.
        Ok(None) | Err(_) => Session { structured: true, base_allocation: Some(1), flags: u16::MAX, size: info.size },
    };
    let mut hb = [0u8; REQUEST_LEN];
    while d.input.read_exact(&mut hb).is_ok() {
        let Ok(req) = parse_request(&hb) else { continue };
        let _ = req.validate(&session);
        let skip = req.payload_len().min(MAX_PAYLOAD) as u64;
        d.input.set_position(d.input.position() + skip);
    }
}

#[test]
fn handshake_and_request_parser_never_panic_or_hang() {
    let corpus = corpus();
    let n = inputs("FUZZ_INPUTS", 20_000);
    let info = info();
    let mut r = Rng(XorShift::from_state(0x9E37_79B9_7F4A_7C15 ^ n));
    let (mut panics, mut slowest) = (0u64, Duration::ZERO);
    let start = Instant::now();
    for e in &corpus {
        run_in_memory(e.clone(), &info);
    }
    for _ in 0..n {
        let data = mutate(&mut r, &corpus);
        let t = Instant::now();
        if catch_unwind(AssertUnwindSafe(|| run_in_memory(data.clone(), &info))).is_err() {
            panics += 1;
            let _ = std::fs::write(format!("/tmp/zmem-fuzz-crash-{panics}.bin"), &data);
        }
        slowest = slowest.max(t.elapsed());
    }
    println!("fuzz in memory: {n} inputs in {:.1} s, {panics} panics, slowest input {slowest:?}", start.elapsed().as_secs_f64());
    assert_eq!(panics, 0, "inputs that panicked are in /tmp/zmem-fuzz-crash-*.bin");
    assert!(slowest < HANG, "an input took {slowest:?}");
}

/// Whole connections: the bytes go down a socket to `serve_connection`,
/// which negotiates and executes requests against a real pool.
#[test]
fn whole_connections_never_panic_or_hang() {
    let corpus = corpus();
    let n = inputs("FUZZ_E2E_INPUTS", inputs("FUZZ_INPUTS", 2_000) / 10).max(corpus.len() as u64);
    let pool = Arc::new(Pool::new(PoolConfig { mem_limit: Some(32 << 20), ..PoolConfig::default() }).unwrap());
    let cfg = ServerConfig {
        max_workers: 2,
        workers_per_conn: 1,
        handshake_timeout: Duration::from_secs(2),
        io_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    };
    let srv = Server::new(Arc::new(Export::new(pool, 64 << 20)), "", cfg);
    let mut r = Rng(XorShift::from_state(0x2545_F491_4F6C_DD1D ^ n));
    let (mut slowest, mut bad) = (Duration::ZERO, 0u64);
    let start = Instant::now();
    for i in 0..n {
        let data = if (i as usize) < corpus.len() {
            corpus[i as usize].clone()
        } else if r.below(3) > 0 {
            // Keep a real handshake whole, so the mutations reach requests.
            let whole = &corpus[r.below(corpus.len())];
            let split = whole.windows(4).position(|w| w == REQUEST_MAGIC.to_be_bytes()).unwrap_or(whole.len());
            let mut d = whole[..split].to_vec();
            let rest = mutate(&mut r, std::slice::from_ref(&whole[split..].to_vec()));
            // Well-formed requests with odd fields first, then the mutated rest.
            for _ in 0..r.below(6) {
                let typ = [CMD_READ, CMD_WRITE, CMD_FLUSH, CMD_TRIM, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS][r.below(6)];
                let len = [0, 1, 511, 4096, 4097, 65536, 200_000][r.below(7)];
                let offset = [0, 511, 4096, (64 << 20) - 4096, 64 << 20, u64::MAX - 1][r.below(6)];
                let flags = [0u16, CMD_FLAG_FUA, CMD_FLAG_NO_HOLE, CMD_FLAG_REQ_ONE, CMD_FLAG_DF, 0xffff][r.below(6)];
                d.extend(Request { flags, typ, handle: r.next(), offset, len }.encode());
                if typ == CMD_WRITE {
                    d.extend((0..len).map(|i| (i as u8) ^ (len as u8)));
                }
            }
            d.extend(rest);
            d
        } else {
            mutate(&mut r, &corpus)
        };
        let (c, s) = UnixStream::pair().unwrap();
        let t = Instant::now();
        let mut w = c.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(&data);
            let _ = w.shutdown(std::net::Shutdown::Write);
        });
        let mut rd = c;
        let reader = std::thread::spawn(move || {
            let mut sink = [0u8; 64 << 10];
            while matches!(rd.read(&mut sink), Ok(n) if n > 0) {}
        });
        let stop = AtomicBool::new(false);
        if catch_unwind(AssertUnwindSafe(|| srv.serve_connection(Stream::Unix(s), &stop))).is_err() {
            bad += 1;
        }
        writer.join().unwrap();
        reader.join().unwrap();
        slowest = slowest.max(t.elapsed());
    }
    let st = srv.stats();
    println!(
        "fuzz end to end: {n} connections in {:.1} s, {} requests, {} panics caught by the server, slowest {slowest:?}",
        start.elapsed().as_secs_f64(),
        st.requests,
        st.panics
    );
    assert_eq!((bad, st.panics), (0, 0), "{st:?}");
    assert!(st.requests > n / 2, "the inputs reached request execution: {st:?}");
    assert!(slowest < HANG, "a connection took {slowest:?}");
}
