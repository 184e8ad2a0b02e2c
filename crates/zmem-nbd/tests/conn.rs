//! Whole connections against the server over socket pairs: handshake,
//! transmission, errors that keep the connection, errors that drop it, and
//! garbage that must never panic.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use zmem_core::{Pool, PoolConfig};
use zmem_nbd::proto::*;
use zmem_nbd::{Export, ProtoError, Server, ServerConfig, Stream};
use zmem_testkit::XorShift;

fn server(size: u64, mem_limit: Option<u64>) -> Arc<Server> {
    server_with(size, mem_limit, ServerConfig::default())
}

fn server_with(size: u64, mem_limit: Option<u64>, cfg: ServerConfig) -> Arc<Server> {
    let pool = Arc::new(Pool::new(PoolConfig { mem_limit, ..Default::default() }).unwrap());
    Arc::new(Server::new(Arc::new(Export::new(pool, size)), "", cfg))
}

/// Start serving one end of a socket pair; returns the client end and the
/// server thread (which yields the connection's result).
fn connect(srv: &Arc<Server>) -> (UnixStream, std::thread::JoinHandle<Result<(), String>>) {
    let (c, s) = UnixStream::pair().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let srv = srv.clone();
    let h = std::thread::spawn(move || {
        let stop = AtomicBool::new(false);
        srv.serve_connection(Stream::Unix(s), &stop).map_err(|e: ProtoError| e.to_string())
    });
    (c, h)
}

struct Client {
    s: UnixStream,
    structured: bool,
    size: u64,
    flags: u16,
}

fn opt(s: &mut UnixStream, option: u32, data: &[u8]) {
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
}

/// Read one option reply: (option, type, data).
fn opt_reply(s: &mut UnixStream) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u64::from_be_bytes(h[0..8].try_into().unwrap()), OPT_REPLY_MAGIC);
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut d = vec![0u8; len];
    s.read_exact(&mut d).unwrap();
    (u32::from_be_bytes(h[8..12].try_into().unwrap()), u32::from_be_bytes(h[12..16].try_into().unwrap()), d)
}

fn greet(s: &mut UnixStream) {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(&g[0..16], b"NBDMAGICIHAVEOPT");
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
}

/// Handshake with NBD_OPT_GO, optionally with structured replies and base:allocation.
fn handshake(mut s: UnixStream, structured: bool) -> Client {
    greet(&mut s);
    if structured {
        opt(&mut s, OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(opt_reply(&mut s).1, REP_ACK);
        let mut q = 0u32.to_be_bytes().to_vec();
        q.extend_from_slice(&1u32.to_be_bytes());
        q.extend_from_slice(&(META_BASE_ALLOCATION.len() as u32).to_be_bytes());
        q.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
        opt(&mut s, OPT_SET_META_CONTEXT, &q);
        assert_eq!(opt_reply(&mut s).1, REP_META_CONTEXT);
        assert_eq!(opt_reply(&mut s).1, REP_ACK);
    }
    let mut go = 0u32.to_be_bytes().to_vec();
    go.extend_from_slice(&0u16.to_be_bytes());
    opt(&mut s, OPT_GO, &go);
    let (mut size, mut flags) = (0, 0);
    loop {
        let (_, t, d) = opt_reply(&mut s);
        match t {
            REP_INFO if u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT => {
                size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                flags = u16::from_be_bytes([d[10], d[11]]);
            }
            REP_INFO => {}
            REP_ACK => break,
            t => panic!("unexpected reply {t:#x}"),
        }
    }
    Client { s, structured, size, flags }
}

#[derive(Debug, PartialEq)]
enum Reply {
    Ok(Vec<u8>),
    Err(u32),
    Extents(Vec<(u32, u32)>),
}

impl Client {
    fn send(&mut self, typ: u16, flags: u16, handle: u64, offset: u64, len: u32, payload: &[u8]) {
        let r = Request { flags, typ, handle, offset, len };
        let mut b = r.encode().to_vec();
        b.extend_from_slice(payload);
        self.s.write_all(&b).unwrap();
    }

    /// Read one complete reply. `read_len` gives the expected data length of
    /// a simple READ reply (simple replies are not self-describing).
    fn recv(&mut self, read_len: impl Fn(u64) -> usize) -> (u64, Reply) {
        let mut m = [0u8; 4];
        self.s.read_exact(&mut m).unwrap();
        match u32::from_be_bytes(m) {
            SIMPLE_REPLY_MAGIC => {
                let mut h = [0u8; 12];
                self.s.read_exact(&mut h).unwrap();
                let err = u32::from_be_bytes(h[0..4].try_into().unwrap());
                let handle = u64::from_be_bytes(h[4..12].try_into().unwrap());
                if err != 0 {
                    return (handle, Reply::Err(err));
                }
                let mut d = vec![0u8; read_len(handle)];
                self.s.read_exact(&mut d).unwrap();
                (handle, Reply::Ok(d))
            }
            STRUCTURED_REPLY_MAGIC => {
                let mut h = [0u8; 16];
                self.s.read_exact(&mut h).unwrap();
                let flags = u16::from_be_bytes([h[0], h[1]]);
                let typ = u16::from_be_bytes([h[2], h[3]]);
                let handle = u64::from_be_bytes(h[4..12].try_into().unwrap());
                let len = u32::from_be_bytes(h[12..16].try_into().unwrap()) as usize;
                let mut d = vec![0u8; len];
                self.s.read_exact(&mut d).unwrap();
                assert_ne!(flags & REPLY_FLAG_DONE, 0, "we always send one chunk");
                match typ {
                    REPLY_TYPE_OFFSET_DATA => (handle, Reply::Ok(d[8..].to_vec())),
                    REPLY_TYPE_NONE => (handle, Reply::Ok(vec![])),
                    REPLY_TYPE_ERROR => {
                        let msg_len = u16::from_be_bytes([d[4], d[5]]) as usize;
                        assert_eq!(msg_len + 6, len);
                        (handle, Reply::Err(u32::from_be_bytes(d[0..4].try_into().unwrap())))
                    }
                    REPLY_TYPE_BLOCK_STATUS => {
                        assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), META_BASE_ALLOCATION_ID);
                        let ext = d[4..]
                            .chunks(8)
                            .map(|c| (u32::from_be_bytes(c[0..4].try_into().unwrap()), u32::from_be_bytes(c[4..8].try_into().unwrap())))
                            .collect();
                        (handle, Reply::Extents(ext))
                    }
                    t => panic!("unexpected chunk type {t}"),
                }
            }
            m => panic!("bad reply magic {m:#x}"),
        }
    }

    fn call(&mut self, typ: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> Reply {
        self.send(typ, flags, 42, offset, len, payload);
        let n = if typ == CMD_READ { len as usize } else { 0 };
        let (h, r) = self.recv(|_| n);
        assert_eq!(h, 42);
        r
    }

    fn read(&mut self, offset: u64, len: u32) -> Reply {
        self.call(CMD_READ, 0, offset, len, &[])
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Reply {
        self.call(CMD_WRITE, 0, offset, data.len() as u32, data)
    }

    fn disconnect(mut self) {
        self.send(CMD_DISC, 0, 0, 0, 0, &[]);
        let mut b = [0u8; 1];
        assert_eq!(self.s.read(&mut b).unwrap(), 0, "server closes after NBD_CMD_DISC");
    }
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed) ^ (i >> 10) as u8).collect()
}

fn ok(v: Vec<u8>) -> Reply {
    Reply::Ok(v)
}

#[test]
fn structured_session_full_command_set() {
    let srv = server(1 << 20, None);
    let (c, h) = connect(&srv);
    let mut c = handshake(c, true);
    assert_eq!(c.size, 1 << 20);
    assert_ne!(c.flags & FLAG_CAN_MULTI_CONN, 0);
    assert_ne!(c.flags & FLAG_SEND_WRITE_ZEROES, 0);

    // Unaligned write across three pages, read back, neighbours still zero.
    let d = data(9000, 3);
    assert_eq!(c.write(1000, &d), ok(vec![]));
    assert_eq!(c.read(1000, 9000), ok(d.clone()));
    assert_eq!(c.read(0, 1000), ok(vec![0; 1000]));
    assert_eq!(c.read(1, 1), ok(vec![0]));
    assert_eq!(c.read(1000, 1), ok(vec![d[0]]));

    let hz = STATE_HOLE | STATE_ZERO;
    assert_eq!(c.call(CMD_BLOCK_STATUS, 0, 0, 5 * 4096, &[]), Reply::Extents(vec![(3 * 4096, 0), (2 * 4096, hz)]));
    assert_eq!(c.call(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 3 * 4096, 8192, &[]), Reply::Extents(vec![(8192, hz)]));

    // FUA write and flush.
    assert_eq!(c.call(CMD_WRITE, CMD_FLAG_FUA, 65536, 4096, &[9u8; 4096]), ok(vec![]));
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]), ok(vec![]));

    // Trim frees the page (pool shrinks), reads as zero.
    let pages = || srv.export().pool().stats().orig_data_size / 4096;
    let before = pages();
    assert_eq!(c.call(CMD_TRIM, 0, 65536, 4096, &[]), ok(vec![]));
    assert_eq!(pages(), before - 1);
    assert_eq!(c.read(65536, 4096), ok(vec![0; 4096]));

    // WRITE_ZEROES with and without NO_HOLE.
    assert_eq!(c.call(CMD_WRITE_ZEROES, 0, 0, 8192, &[]), ok(vec![]));
    assert_eq!(c.read(0, 8192), ok(vec![0; 8192]));
    assert_eq!(c.call(CMD_BLOCK_STATUS, 0, 0, 8192, &[]), Reply::Extents(vec![(8192, hz)]));
    assert_eq!(c.call(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 8192, &[]), ok(vec![]));
    assert_eq!(c.call(CMD_BLOCK_STATUS, 0, 0, 8192, &[]), Reply::Extents(vec![(8192, 0)]));

    // Errors that keep the connection up.
    assert_eq!(c.read(1 << 20, 1), Reply::Err(EINVAL));
    assert_eq!(c.write((1 << 20) - 1, &[1, 2]), Reply::Err(ENOSPC));
    assert_eq!(c.call(99, 0, 0, 0, &[]), Reply::Err(EINVAL));
    assert_eq!(c.call(CMD_CACHE, 0, 0, 4096, &[]), Reply::Err(EINVAL));
    assert_eq!(c.call(CMD_READ, CMD_FLAG_NO_HOLE, 0, 4096, &[]), Reply::Err(EINVAL));
    assert_eq!(c.call(CMD_READ, 0, 0, MAX_PAYLOAD + 1, &[]), Reply::Err(EINVAL));
    assert_eq!(c.call(CMD_TRIM, 0, u64::MAX, 4096, &[]), Reply::Err(EINVAL));
    // ... and it still works.
    assert_eq!(
        c.read(1000, 9000),
        ok({
            let mut v = vec![0u8; 9000];
            v[..7192].copy_from_slice(&[0u8; 7192]);
            v[7192..].copy_from_slice(&d[7192..]);
            v
        })
    );
    c.disconnect();
    h.join().unwrap().unwrap();
}

#[test]
fn simple_replies_and_export_name() {
    let srv = server(64 << 10, None);
    let (mut s, h) = connect(&srv);
    greet(&mut s);
    opt(&mut s, OPT_EXPORT_NAME, b"");
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(u64::from_be_bytes(r[0..8].try_into().unwrap()), 64 << 10);
    let mut c = Client { s, structured: false, size: 64 << 10, flags: u16::from_be_bytes([r[8], r[9]]) };
    assert!(!c.structured);
    assert_eq!(c.flags & FLAG_SEND_DF, 0);
    assert_eq!(c.write(4095, &[1, 2, 3]), ok(vec![]));
    assert_eq!(c.read(4094, 5), ok(vec![0, 1, 2, 3, 0]));
    // A failed simple READ carries no payload; the stream stays in sync.
    assert_eq!(c.read(64 << 10, 512), Reply::Err(EINVAL));
    // BLOCK_STATUS without a negotiated context.
    assert_eq!(c.call(CMD_BLOCK_STATUS, 0, 0, 512, &[]), Reply::Err(EINVAL));
    assert_eq!(c.read(4096, 2), ok(vec![2, 3]));
    c.disconnect();
    h.join().unwrap().unwrap();
}

#[test]
fn many_requests_in_flight_replied_by_handle() {
    pipelined(server(16 << 20, None));
}

/// A tiny in-flight byte budget and queue: the reader must block and resume
/// (backpressure), never deadlock or drop a request.
#[test]
fn backpressure_with_tiny_budget() {
    let cfg = ServerConfig { workers_per_conn: 2, queue_depth: 1, max_inflight_bytes: 8192, ..Default::default() };
    pipelined(server_with(16 << 20, None, cfg));
}

fn pipelined(srv: Arc<Server>) {
    let (c, h) = connect(&srv);
    let mut c = handshake(c, false);
    // Pipeline 200 unaligned writes without waiting, then collect replies.
    let n = 200u64;
    let mut w = c.s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..n {
            let d = vec![i as u8 ^ 0x5a; 3000];
            let r = Request { flags: 0, typ: CMD_WRITE, handle: 1000 + i, offset: i * 3000 + 17, len: 3000 };
            let mut b = r.encode().to_vec();
            b.extend_from_slice(&d);
            w.write_all(&b).unwrap();
        }
    });
    let mut seen = std::collections::HashSet::new();
    for _ in 0..n {
        let (handle, r) = c.recv(|_| 0);
        assert_eq!(r, ok(vec![]));
        assert!(seen.insert(handle));
    }
    writer.join().unwrap();
    assert_eq!(seen.len() as u64, n);
    // Pipelined reads, replies in any order.
    for i in 0..n {
        c.send(CMD_READ, 0, i, i * 3000 + 17, 3000, &[]);
    }
    for _ in 0..n {
        let (handle, r) = c.recv(|_| 3000);
        assert_eq!(r, ok(vec![handle as u8 ^ 0x5a; 3000]), "handle {handle}");
    }
    c.disconnect();
    h.join().unwrap().unwrap();
}

#[test]
fn pool_full_is_enospc_and_connection_survives() {
    let srv = server(64 << 20, Some(512 << 10));
    let (c, h) = connect(&srv);
    let mut c = handshake(c, true);
    let mut rng = XorShift::from_state(7);
    let mut hit = None;
    let mut page = vec![0u8; 4096];
    for k in 0..4096u64 {
        rng.fill(&mut page);
        match c.write(k * 4096, &page) {
            Reply::Ok(_) => {}
            Reply::Err(e) => {
                hit = Some(e);
                break;
            }
            r => panic!("{r:?}"),
        }
    }
    assert_eq!(hit, Some(ENOSPC));
    assert_eq!(c.call(CMD_TRIM, 0, 0, 64 << 20, &[]), ok(vec![]));
    assert_eq!(c.write(0, &[5u8; 4096]), ok(vec![]));
    assert_eq!(c.read(0, 4096), ok(vec![5u8; 4096]));
    c.disconnect();
    h.join().unwrap().unwrap();
}

fn expect_dropped(mut s: UnixStream, h: std::thread::JoinHandle<Result<(), String>>, what: &str) {
    let mut b = Vec::new();
    let _ = s.read_to_end(&mut b);
    let err = h.join().unwrap().expect_err("connection must be dropped");
    assert!(err.contains(what), "{err}");
}

#[test]
fn unanswerable_input_drops_only_that_connection() {
    let srv = server(1 << 20, None);
    // A good connection stays up through the others' failures.
    let (good, gh) = connect(&srv);
    let mut good = handshake(good, true);

    let (c, h) = connect(&srv);
    let mut c = handshake(c, true);
    c.s.write_all(&[0u8; 28]).unwrap();
    expect_dropped(c.s, h, "magic");

    let (c, h) = connect(&srv);
    let mut c = handshake(c, false);
    c.send(CMD_WRITE, 0, 1, 0, MAX_PAYLOAD + 1, &[]);
    expect_dropped(c.s, h, "exceeds the maximum payload");

    let (mut s, h) = connect(&srv);
    greet(&mut s);
    opt(&mut s, OPT_EXPORT_NAME, b"no-such-export");
    expect_dropped(s, h, "does not exist");

    let (mut s, h) = connect(&srv);
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&0xffff_ffffu32.to_be_bytes()).unwrap();
    expect_dropped(s, h, "client flags");

    // Truncated write payload then EOF: the connection ends without a panic.
    let (c, h) = connect(&srv);
    let mut c = handshake(c, false);
    c.send(CMD_WRITE, 0, 1, 0, 4096, &[1u8; 100]);
    c.s.shutdown(std::net::Shutdown::Write).unwrap();
    let _ = h.join().unwrap();

    assert_eq!(good.write(0, &[1u8; 10]), ok(vec![]));
    assert_eq!(good.read(0, 10), ok(vec![1u8; 10]));
    good.disconnect();
    gh.join().unwrap().unwrap();
    assert!(srv.stats().connections_dropped >= 4);
}

#[test]
fn abort_during_haggling() {
    let srv = server(1 << 20, None);
    let (mut s, h) = connect(&srv);
    greet(&mut s);
    opt(&mut s, OPT_ABORT, &[]);
    assert_eq!(opt_reply(&mut s).1, REP_ACK);
    h.join().unwrap().unwrap();
}

/// Random requests (valid-looking headers, random types, flags, offsets,
/// lengths) never panic the server; each connection ends on its own.
#[test]
fn random_transmission_garbage_never_panics() {
    let srv = server(1 << 20, None);
    let mut rng = XorShift::from_state(0x1234_5678_9abc_def0);
    let mut next = move || rng.next_u64();
    for round in 0..40 {
        let (c, h) = connect(&srv);
        let c = handshake(c, round % 2 == 0);
        let mut bytes = Vec::new();
        for _ in 0..50 {
            let typ = (next() % 10) as u16;
            let r = Request {
                flags: (next() % 64) as u16,
                typ,
                handle: next(),
                offset: if next() % 3 == 0 { next() } else { next() % (1 << 20) },
                len: if next() % 4 == 0 { next() as u32 } else { (next() % 70000) as u32 },
            };
            if typ == CMD_DISC {
                continue;
            }
            bytes.extend_from_slice(&r.encode());
            if typ == CMD_WRITE && r.len <= MAX_PAYLOAD {
                bytes.extend(std::iter::repeat_n(0xabu8, r.len as usize));
            }
            if next() % 20 == 0 {
                bytes.extend((0..(next() % 40)).map(|_| next() as u8));
            }
        }
        let mut w = c.s.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(&bytes);
            let _ = w.shutdown(std::net::Shutdown::Write);
        });
        // Drain replies until the server closes.
        let mut r = c.s;
        let mut sink = Vec::new();
        let _ = r.read_to_end(&mut sink);
        writer.join().unwrap();
        let _ = h.join().expect("connection thread must not panic");
    }
    // The server catches panics in request execution (so a bug costs one
    // connection, not the server); count them, so this test can see one.
    let st = srv.stats();
    assert_eq!(st.panics, 0, "panics caught while serving garbage: {st:?}");
    assert!(st.requests > 0, "the garbage reached request execution: {st:?}");
}

#[test]
fn run_accepts_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nbd.sock");
    let listener = zmem_nbd::Listener::Unix(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let srv = server(1 << 20, None);
    let stop = Arc::new(AtomicBool::new(false));
    let (srv2, stop2) = (srv.clone(), stop.clone());
    let t = std::thread::spawn(move || srv2.run(&listener, &stop2));
    let mut a = handshake(UnixStream::connect(&path).unwrap(), true);
    let mut b = handshake(UnixStream::connect(&path).unwrap(), false);
    // Multi-conn: a write acknowledged on one connection is visible on the other.
    assert_eq!(a.write(12345, &[7u8; 100]), ok(vec![]));
    assert_eq!(b.read(12345, 100), ok(vec![7u8; 100]));
    // An idle connection stuck in the handshake must not block shutdown.
    let _idle = UnixStream::connect(&path).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    t.join().unwrap().unwrap();
    // Both clients see the connection end.
    let mut buf = [0u8; 1];
    a.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(a.s.read(&mut buf).unwrap_or(0), 0);
    assert_eq!(srv.stats().connections_active, 0);
}

/// Small requests (executed by the reader, replies batched) interleaved with
/// big ones (workers) and failing ones, all sent in one burst: every request
/// gets exactly one reply, by handle, and an error reply in the middle of a
/// batch does not disturb the replies batched before it.
#[test]
fn burst_of_small_big_and_failing_requests() {
    let size = 16u64 << 20;
    let srv = server(size, None);
    let (c, h) = connect(&srv);
    let mut c = handshake(c, true);
    let (a, big, b) = (data(4096, 1), data(1 << 20, 2), data(4096, 3));
    let burst = |c: &mut Client, reqs: &[(u64, u16, u64, u32, &[u8])]| {
        let mut buf = Vec::new();
        for &(handle, typ, offset, len, payload) in reqs {
            let r = Request { flags: 0, typ, handle, offset, len };
            buf.extend_from_slice(&r.encode());
            buf.extend_from_slice(payload);
        }
        c.s.write_all(&buf).unwrap();
        let mut got = std::collections::HashMap::new();
        for _ in reqs {
            // Simple replies (writes, flush) carry no data.
            let (handle, r) = c.recv(|_| 0);
            assert!(got.insert(handle, r).is_none(), "two replies for {handle}");
        }
        got
    };
    let got = burst(
        &mut c,
        &[
            (1, CMD_WRITE, 0, 4096, &a),
            (2, CMD_WRITE, 1 << 20, 1 << 20, &big),
            (3, CMD_READ, size, 4096, &[]),
            (4, CMD_WRITE, 8192, 4096, &b),
            (5, CMD_FLUSH, 0, 0, &[]),
            (6, CMD_WRITE, size - 100, 4096, &b),
        ],
    );
    assert_eq!(got[&1], ok(vec![]));
    assert_eq!(got[&2], ok(vec![]));
    assert_eq!(got[&3], Reply::Err(EINVAL));
    assert_eq!(got[&4], ok(vec![]));
    assert_eq!(got[&5], ok(vec![]));
    assert_eq!(got[&6], Reply::Err(ENOSPC));
    let got = burst(
        &mut c,
        &[
            (10, CMD_READ, 0, 4096, &[]),
            (11, CMD_READ, 1 << 20, 1 << 20, &[]),
            (12, CMD_READ, 8192, 4096, &[]),
            (13, CMD_READ, size - 1, 2, &[]),
            (14, CMD_BLOCK_STATUS, 0, 16384, &[]),
            (15, CMD_READ, 100, 3996, &[]),
        ],
    );
    assert_eq!(got[&10], ok(a.clone()));
    assert_eq!(got[&11], ok(big));
    assert_eq!(got[&12], ok(b));
    assert_eq!(got[&13], Reply::Err(EINVAL));
    let hz = STATE_HOLE | STATE_ZERO;
    assert_eq!(got[&14], Reply::Extents(vec![(4096, 0), (4096, hz), (4096, 0), (4096, hz)]));
    assert_eq!(got[&15], ok(a[100..].to_vec()));
    c.disconnect();
    h.join().unwrap().unwrap();
}

/// The origin's bytes and its gate: reads of page 100 wait until it opens.
struct Gate {
    data: Vec<u8>,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

struct GatedOrigin(Arc<Gate>);

impl zmem_export::Origin for GatedOrigin {
    fn size(&self) -> u64 {
        self.0.data.len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let g = &self.0;
        if (offset..offset + buf.len() as u64).contains(&(100 * 4096)) {
            let mut open = g.open.lock().unwrap();
            while !*open {
                open = g.opened.wait(open).unwrap();
            }
        }
        buf.copy_from_slice(&g.data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, _: &[u8], _: u64, _: bool) -> std::io::Result<()> {
        Err(std::io::Error::other("read-only"))
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn trim(&self, _: u64, _: u64) -> std::io::Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, _: u64, _: u64) -> std::io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "gated".into()
    }
}

/// A small read that misses a cache waits for the origin on a worker: the
/// hits sent after it on the same connection are answered meanwhile (run
/// on the reader thread, the miss held them all up).
#[test]
fn a_cache_miss_does_not_hold_up_the_hits_behind_it() {
    let origin = Arc::new(Gate { data: data(1 << 20, 9), open: std::sync::Mutex::new(false), opened: std::sync::Condvar::new() });
    let pool = Arc::new(Pool::new(PoolConfig::default()).unwrap());
    let export = Export::with_origin(pool, Box::new(GatedOrigin(Arc::clone(&origin))));
    let srv = Arc::new(Server::new(Arc::new(export), "", ServerConfig::default()));
    let (c, h) = connect(&srv);
    let mut c = handshake(c, false);
    let page = |k: usize| origin.data[k * 4096..(k + 1) * 4096].to_vec();
    assert_eq!(c.read(0, 4096), ok(page(0)), "page 0 fetched and kept");
    c.send(CMD_READ, 0, 1, 100 * 4096, 4096, &[]);
    for i in 0..3 {
        c.send(CMD_READ, 0, 2 + i, 0, 4096, &[]);
        let (handle, r) = c.recv(|_| 4096);
        assert_eq!((handle, r), (2 + i, ok(page(0))), "the hit was answered while the miss waits");
    }
    *origin.open.lock().unwrap() = true;
    origin.opened.notify_all();
    let (handle, r) = c.recv(|_| 4096);
    assert_eq!((handle, r), (1, ok(page(100))));
    c.disconnect();
    h.join().unwrap().unwrap();
}
