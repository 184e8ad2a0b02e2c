//! Strangers cannot starve the server: clients that never finish the
//! handshake, that stop reading replies, or that send a big WRITE header and
//! stall are dropped on time, hold bounded memory and threads, and real
//! clients keep being served meanwhile.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zmem_core::{Pool, PoolConfig};
use zmem_nbd::proto::*;
use zmem_nbd::{Export, Listener, Server, ServerConfig};

/// A server running on a Unix socket in a temporary directory; stopped and
/// joined on drop.
struct Running {
    srv: Arc<Server>,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(cfg: ServerConfig) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        let listener = Listener::Unix(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let pool = Arc::new(Pool::new(PoolConfig::default()).unwrap());
        let srv = Arc::new(Server::new(Arc::new(Export::new(pool, 64 << 20)), "", cfg));
        let stop = Arc::new(AtomicBool::new(false));
        let (srv2, stop2) = (Arc::clone(&srv), Arc::clone(&stop));
        let thread = Some(std::thread::spawn(move || srv2.run(&listener, &stop2)));
        Running { srv, path, stop, thread, _dir: dir }
    }

    fn raw(&self) -> UnixStream {
        let s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// A client through the handshake (NBD_OPT_EXPORT_NAME, no zeroes).
    fn client(&self) -> UnixStream {
        let mut s = self.raw();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        assert_eq!(&g[0..16], b"NBDMAGICIHAVEOPT");
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
        let mut o = IHAVEOPT.to_be_bytes().to_vec();
        o.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
        o.extend_from_slice(&0u32.to_be_bytes());
        s.write_all(&o).unwrap();
        let mut info = [0u8; 10];
        s.read_exact(&mut info).unwrap();
        assert_eq!(u64::from_be_bytes(info[..8].try_into().unwrap()), 64 << 20);
        s
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn request(typ: u16, handle: u64, offset: u64, len: u32) -> [u8; REQUEST_LEN] {
    Request { flags: 0, typ, handle, offset, len }.encode()
}

/// Write `data` at `offset` and read it back, with simple replies.
fn write_read(s: &mut UnixStream, offset: u64, data: &[u8]) {
    s.write_all(&request(CMD_WRITE, 1, offset, data.len() as u32)).unwrap();
    s.write_all(data).unwrap();
    let mut r = [0u8; 16];
    s.read_exact(&mut r).unwrap();
    assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 0, "write error");
    s.write_all(&request(CMD_READ, 2, offset, data.len() as u32)).unwrap();
    s.read_exact(&mut r).unwrap();
    assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 0, "read error");
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, data);
}

/// Wait up to `limit` for `cond`.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// 64 connections that never finished the handshake used to make the
/// server refuse every real client, for good.
#[test]
fn silent_connections_cannot_lock_real_clients_out() {
    let cfg = ServerConfig { max_connections: 8, handshake_timeout: Duration::from_secs(60), ..ServerConfig::default() };
    let r = Running::start(cfg);
    let idle: Vec<UnixStream> = (0..16).map(|_| r.raw()).collect();
    assert!(eventually(Duration::from_secs(5), || r.srv.stats().connections_total >= 8));
    // At the limit, a new client evicts the oldest silent one, at once.
    let start = Instant::now();
    let mut c = r.client();
    write_read(&mut c, 4096, &[7u8; 4096]);
    assert!(start.elapsed() < Duration::from_secs(5), "a real client waited {:?}", start.elapsed());
    assert!(r.srv.stats().timeouts >= 1, "{:?}", r.srv.stats());
    drop(idle);
}

/// And nothing waits forever for a handshake: past the timeout it is dropped.
#[test]
fn a_handshake_has_a_deadline() {
    let cfg = ServerConfig { handshake_timeout: Duration::from_millis(300), ..ServerConfig::default() };
    let r = Running::start(cfg);
    let mut s = r.raw();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    // Trickle the client flags a byte at a time, too slowly.
    let start = Instant::now();
    let mut closed = false;
    for b in (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes() {
        std::thread::sleep(Duration::from_millis(150));
        if s.write_all(&[b]).is_err() {
            closed = true;
            break;
        }
    }
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(closed || start.elapsed() < Duration::from_secs(5), "still open after {:?}", start.elapsed());
    assert!(eventually(Duration::from_secs(5), || r.srv.stats().timeouts >= 1), "{:?}", r.srv.stats());
    // An idle connection in transmission is not a stalled one: it stays.
    let mut c = r.client();
    std::thread::sleep(Duration::from_millis(700));
    write_read(&mut c, 0, &[1u8; 512]);
}

/// A client that stops reading replies used to block its connection's
/// writer forever. Now the reply write times out and the connection goes,
/// while others are served.
#[test]
fn a_client_that_stops_reading_is_dropped() {
    let cfg = ServerConfig { io_timeout: Duration::from_millis(500), ..ServerConfig::default() };
    let r = Running::start(cfg);
    let mut greedy = r.client();
    for h in 0..64u64 {
        greedy.write_all(&request(CMD_READ, h, 0, 1 << 20)).unwrap();
    }
    let mut other = r.client();
    for i in 0..20u64 {
        write_read(&mut other, i * 4096, &[i as u8; 4096]);
    }
    assert!(eventually(Duration::from_secs(10), || r.srv.stats().timeouts >= 1), "{:?}", r.srv.stats());
    assert!(eventually(Duration::from_secs(10), || r.srv.stats().inflight_bytes == 0), "{:?}", r.srv.stats());
    write_read(&mut other, 0, &[9u8; 8192]);
}

/// 50 clients that each sent a 32 MiB WRITE header and stalled used to grow
/// the server to 1.65 GB. Now bytes in flight are capped server-wide, the
/// stalled ones are dropped after the I/O timeout, and a real client's
/// requests go through meanwhile.
#[test]
fn stalled_writes_hold_bounded_memory() {
    let cap = 16u64 << 20;
    let cfg = ServerConfig { io_timeout: Duration::from_secs(1), max_server_inflight_bytes: cap, ..ServerConfig::default() };
    let r = Running::start(cfg);
    let stalled: Vec<UnixStream> = (0..20)
        .map(|i| {
            let mut s = r.client();
            s.write_all(&request(CMD_WRITE, i, 0, 8 << 20)).unwrap();
            s.write_all(&[0u8; 1024]).unwrap();
            s
        })
        .collect();
    let mut peak = 0;
    let mut real = r.client();
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        peak = peak.max(r.srv.stats().inflight_bytes);
        write_read(&mut real, 8192, &[3u8; 4096]);
    }
    assert!(peak <= cap, "{peak} bytes in flight, cap {cap}");
    assert!(eventually(Duration::from_secs(15), || r.srv.stats().timeouts >= 20), "{:?}", r.srv.stats());
    assert_eq!(r.srv.stats().inflight_bytes, 0);
    // A big write now has the whole budget.
    let big = vec![5u8; 4 << 20];
    write_read(&mut real, 0, &big);
    drop(stalled);
}

/// Worker threads come from one pool for the whole server; a connection
/// that gets none runs its big requests in its reader thread.
#[test]
fn worker_threads_are_capped_server_wide() {
    let cfg = ServerConfig { workers_per_conn: 4, max_workers: 6, ..ServerConfig::default() };
    let r = Running::start(cfg);
    let mut cs: Vec<UnixStream> = (0..3).map(|_| r.client()).collect();
    assert!(eventually(Duration::from_secs(5), || r.srv.stats().workers == 6), "{:?}", r.srv.stats());
    let big = vec![6u8; 2 << 20];
    for (i, c) in cs.iter_mut().enumerate() {
        write_read(c, (i as u64) << 22, &big);
    }
    drop(cs);
    assert!(eventually(Duration::from_secs(5), || r.srv.stats().workers == 0), "{:?}", r.srv.stats());
}
