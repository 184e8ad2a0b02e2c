//! Listening, connections, and the transmission loop.
//!
//! One thread per connection reads requests (header, then a WRITE's payload).
//! Small requests (up to 128 KiB: the 4 KiB I/O of filesystems, swap and
//! fio) are executed by that reader thread itself, with no hand-off: a
//! thread switch costs more than compressing or decompressing a page. Their
//! replies are appended to a batch while more requests are already in the
//! read buffer and written with one syscall before the reader would block
//! (or once 256 KiB are pending); a WRITE payload already in the read buffer
//! is used in place. Bigger requests go to a small pool of worker threads
//! over a bounded channel, so they run concurrently with each other and with
//! the small ones; so do small ones that may wait for a cache's origin (a
//! read that misses, a write, trim, zeroing or flush: milliseconds, where a
//! hit takes microseconds), so that the hits behind them are not held up.
//! Every reply is written whole under a mutex on the socket; replies
//! therefore go out in completion order, matched by handle, and a
//! WRITE is in the pool before its reply is encoded. Payload bytes in flight
//! at the workers per connection are capped, so a client cannot make the
//! server buffer unbounded data.
//!
//! A protocol violation we cannot answer (wrong magic, an oversized WRITE
//! whose payload we will not buffer, unknown client flags, a truncated
//! message) is logged as one line and drops that connection only.
//!
//! No client can starve the others: the handshake has a deadline, a
//! request must arrive whole and a reply be taken within `io_timeout` once
//! begun (idle time between requests is free), bytes in flight are capped
//! per connection and server-wide, worker threads come from one server-wide
//! pool, and at the connection limit a connection still in its handshake is
//! evicted for a new one. Every holder of the server-wide byte budget gives
//! it back within `io_timeout`, which is what makes waiting for it safe.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::negotiate::{negotiate, ExportInfo};
use crate::proto::*;
use zmem_export::Export;

/// A connected client, over a Unix socket or TCP.
#[derive(Debug)]
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        }
    }
}

/// A stream whose reads and writes must all finish by `deadline`: each
/// operation gets the time that is left as its socket timeout, so a client
/// that trickles one byte at a time cannot stretch a phase past it.
struct Deadline<'a> {
    s: &'a mut Stream,
    deadline: Instant,
    what: &'static str,
}

impl Deadline<'_> {
    fn left(&self) -> io::Result<Duration> {
        time_left(self.deadline, self.what)
    }
}

/// The time left until `deadline`, or a timeout error naming `what`.
fn time_left(deadline: Instant, what: &str) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{what} took too long")));
    }
    Ok(left)
}

impl Read for Deadline<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.s.set_read_timeout(Some(self.left()?))?;
        self.s.read(b).map_err(|e| timed_out(e, self.what))
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.s.set_write_timeout(Some(self.left()?))?;
        self.s.write(b).map_err(|e| timed_out(e, self.what))
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

/// Socket timeouts surface as WouldBlock; call them what they are.
fn timed_out(e: io::Error, what: &str) -> io::Error {
    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        io::Error::new(io::ErrorKind::TimedOut, format!("{what} took too long"))
    } else {
        e
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// A listening socket.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Unix(l) => l.accept().map(|(s, _)| Stream::Unix(s)),
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                let _ = s.set_nodelay(true);
                Ok(Stream::Tcp(s))
            }
        }
    }

    /// Its socket's file.
    pub fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Unix(l) => l.as_fd(),
            Listener::Tcp(l) => l.as_fd(),
        }
    }
}

/// Wait up to `timeout_ms` for `fd` to become readable (a listener: to have
/// a connection waiting). An interrupted wait counts as "not ready".
pub fn poll_readable(fd: impl AsFd, timeout_ms: i32) -> io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let ms = i64::from(timeout_ms.max(0));
    let timeout = Timespec { tv_sec: ms / 1000, tv_nsec: (ms % 1000) * 1_000_000 };
    match poll(&mut fds, if timeout_ms < 0 { None } else { Some(&timeout) }) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Tunables of the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Worker threads per connection, for requests over 128 KiB (smaller
    /// ones are executed by the connection's reader thread).
    pub workers_per_conn: usize,
    /// Requests queued per connection beyond those being executed.
    pub queue_depth: usize,
    /// Cap on READ/WRITE bytes in flight per connection (a single request
    /// larger than this still proceeds, alone).
    pub max_inflight_bytes: u64,
    /// Connections beyond this are closed at once, unless one of those open
    /// is still in its handshake: the oldest such is dropped to make room.
    pub max_connections: usize,
    /// A client must finish the handshake within this.
    pub handshake_timeout: Duration,
    /// Once a request has begun to arrive, all of it (header and payload)
    /// must arrive within this; a reply the client does not read within
    /// this drops the connection. A connection may sit idle between
    /// requests for as long as it likes (swap and filesystems do).
    pub io_timeout: Duration,
    /// READ/WRITE bytes in flight at the workers over all connections.
    pub max_server_inflight_bytes: u64,
    /// Worker threads over all connections: a connection gets
    /// `workers_per_conn` of them while they last, and runs every request
    /// in its reader thread when none are left.
    pub max_workers: usize,
    /// On shutdown, how long to wait for connections to drain before
    /// cutting them off.
    pub drain_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers_per_conn: 4,
            queue_depth: 16,
            max_inflight_bytes: 64 << 20,
            max_connections: 64,
            handshake_timeout: Duration::from_secs(10),
            io_timeout: Duration::from_secs(30),
            max_server_inflight_bytes: 256 << 20,
            max_workers: 256,
            drain_timeout: Duration::from_secs(5),
        }
    }
}

/// Counting semaphore over bytes in flight.
struct Budget {
    max: u64,
    used: Mutex<u64>,
    cv: Condvar,
}

impl Budget {
    fn acquire(&self, n: u64) {
        let mut u = self.used.lock();
        while *u > 0 && *u + n > self.max {
            self.cv.wait(&mut u);
        }
        *u += n;
    }
    fn release(&self, n: u64) {
        let mut u = self.used.lock();
        *u -= n;
        self.cv.notify_all();
    }
    fn new(max: u64) -> Budget {
        Budget { max, used: Mutex::new(0), cv: Condvar::new() }
    }
    fn in_use(&self) -> u64 {
        *self.used.lock()
    }
}

/// Gives bytes back to a budget when dropped.
struct GiveBack<'a>(&'a Budget, u64);

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        if self.1 > 0 {
            self.0.release(self.1);
        }
    }
}

/// Gives worker threads back to the server's pool when dropped.
struct GiveBackWorkers<'a>(&'a AtomicU64, u64);

impl Drop for GiveBackWorkers<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// The reader's socket timeout: io_timeout while waiting for a request (a
/// timeout there just means idle), the time left while a request arrives.
struct RequestClock {
    io_timeout: Duration,
    /// The socket's timeout is currently shorter than io_timeout.
    short: bool,
}

impl RequestClock {
    /// Wait until the next request's first byte is buffered. Returns false
    /// at end of stream, or once the connection is dead.
    fn wait_for_request(&mut self, r: &mut BufReader<Stream>, dead: &AtomicBool) -> Result<bool, ProtoError> {
        if self.short {
            r.get_ref().set_read_timeout(Some(self.io_timeout))?;
            self.short = false;
        }
        loop {
            match r.fill_buf() {
                Ok([]) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if dead.load(Ordering::Relaxed) {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Fill `buf` from the reader by `deadline` (set to io_timeout from now
    /// by the first read of the request that has to wait). Bytes already
    /// buffered cost no system call; a read that must wait gets the time
    /// left as its timeout.
    fn read_by(&mut self, r: &mut BufReader<Stream>, buf: &mut [u8], deadline: &mut Option<Instant>, what: &'static str) -> Result<(), ProtoError> {
        let mut got = 0;
        while got < buf.len() {
            if r.buffer().is_empty() {
                let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.io_timeout);
                r.get_ref().set_read_timeout(Some(time_left(deadline, what)?))?;
                self.short = true;
            }
            match r.read(&mut buf[got..]) {
                Ok(0) => return Err(ProtoError::Eof(what)),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(timed_out(e, what).into()),
            }
        }
        Ok(())
    }
}

/// The reader side of one connection in transmission: what the phases of
/// [`Server::read_loop`] share.
struct Reader<'a> {
    server: &'a Server,
    r: &'a mut BufReader<Stream>,
    clock: RequestClock,
    tx: &'a crossbeam_channel::Sender<Job>,
    recycled: &'a crossbeam_channel::Receiver<Vec<u8>>,
    /// The connection's bytes in flight at the workers.
    budget: &'a Budget,
    dead: &'a AtomicBool,
    writer: &'a Mutex<Stream>,
    session: &'a Session,
    /// Replies of inline requests not yet sent.
    batch: &'a mut Vec<u8>,
    /// The payload of an inline WRITE not wholly in the read buffer.
    payload_buf: &'a mut Vec<u8>,
    /// Requests up to this length run inline (`u32::MAX` without workers).
    inline_max: u32,
}

impl Reader<'_> {
    /// Writes the batched replies.
    fn flush(&mut self) {
        self.server.flush_batch(self.batch, self.writer, self.dead);
    }

    /// Waits, as long as the client likes, for a request to begin (replies sent first); false once the connection ends.
    fn await_request(&mut self) -> Result<bool, ProtoError> {
        if self.dead.load(Ordering::Relaxed) {
            return Ok(false);
        }
        // About to block for the next request: send the replies first.
        if self.r.buffer().len() < REQUEST_LEN || self.batch.len() >= BATCH_MAX {
            self.flush();
        }
        // Between requests a client may be idle as long as it likes.
        if self.r.buffer().is_empty() && !self.clock.wait_for_request(self.r, self.dead)? {
            return Ok(false);
        }
        Ok(true)
    }

    /// Reads a request header by `deadline`; `None` if the client closed, or the connection had already failed.
    fn read_header(&mut self, deadline: &mut Option<Instant>) -> Result<Option<[u8; REQUEST_LEN]>, ProtoError> {
        let mut hb = [0u8; REQUEST_LEN];
        match self.clock.read_by(self.r, &mut hb, deadline, "a request header") {
            Ok(()) => Ok(Some(hb)),
            // A client may simply close instead of sending NBD_CMD_DISC.
            Err(ProtoError::Eof(_)) => Ok(None),
            Err(e) if self.dead.load(Ordering::Relaxed) => {
                tracing::debug!("nbd: read after connection failure: {e}");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the reader runs `req` itself: small, and not one that may wait for an origin while workers exist.
    fn runs_inline(&self, req: &Request) -> bool {
        req.len <= self.inline_max && !(self.inline_max < u32::MAX && self.server.may_wait(req))
    }

    /// Runs a request on the reader thread, its reply into the batch; false if it panicked (the connection is then dead).
    fn run_inline(&mut self, req: &Request, plen: u32, deadline: &mut Option<Instant>) -> Result<bool, ProtoError> {
        let server = self.server;
        let plen = plen as usize;
        // Only a connection without workers runs big requests here:
        // their buffers count against the server's budget.
        let cost = if req.len > INLINE_MAX { req.len.min(MAX_PAYLOAD) as u64 } else { 0 };
        if cost > 0 {
            server.inflight.acquire(cost);
        }
        let _give_back = GiveBack(&server.inflight, cost);
        // A payload already in the read buffer is used in place.
        let in_place = self.r.buffer().len() >= plen;
        if !in_place {
            self.flush();
            self.payload_buf.resize(plen, 0);
            self.clock.read_by(self.r, self.payload_buf, deadline, "a WRITE payload")?;
        }
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let payload = if in_place { &self.r.buffer()[..plen] } else { &self.payload_buf[..] };
            server.execute(req, payload, self.session, self.batch)
        }));
        if in_place {
            self.r.consume(plen);
        }
        if ran.is_err() {
            server.panics.fetch_add(1, Ordering::Relaxed);
            tracing::error!("nbd: internal error (panic) executing {req:?}; dropping this connection");
            self.batch.clear();
            self.dead.store(true, Ordering::Relaxed);
            let _ = self.writer.lock().shutdown(Shutdown::Both);
            return Ok(false);
        }
        Ok(true)
    }

    /// Admits a request to the byte budgets, reads its payload and queues it for the workers; false once they are gone.
    fn queue_for_workers(&mut self, req: Request, plen: u32, deadline: &mut Option<Instant>) -> Result<bool, ProtoError> {
        let (server, budget) = (self.server, self.budget);
        // A big request: to the workers. Waiting for budget or queue
        // room may take a while; send what we have first.
        self.flush();
        let cost = match req.typ {
            CMD_READ => req.len.min(MAX_PAYLOAD) as u64,
            _ => plen as u64,
        };
        // The connection's budget first, then the server's: every holder
        // of the server's budget gives it back within io_timeout (a
        // payload that does not arrive, a reply nobody reads, both drop
        // their connection), so waiting here is bounded.
        // The request's clock runs while it waits for budget, too: a
        // client that stalls mid-payload cannot hold its place longer.
        deadline.get_or_insert_with(|| Instant::now() + server.cfg.io_timeout);
        budget.acquire(cost);
        server.inflight.acquire(cost);
        let release = || {
            budget.release(cost);
            server.inflight.release(cost);
        };
        let mut payload = Vec::new();
        if plen > 0 {
            payload = self.recycled.try_recv().unwrap_or_default();
            payload.resize(plen as usize, 0);
        }
        if let Err(e) = self.clock.read_by(self.r, &mut payload, deadline, "a WRITE payload") {
            release();
            return Err(e);
        }
        if self.tx.send(Job { req, payload, cost }).is_err() {
            release();
            return Ok(false);
        }
        Ok(true)
    }
}

/// Buffers up to this capacity are kept for reuse; larger ones are freed.
const KEEP_BUFFER: usize = 4 << 20;
/// Requests whose length is at most this are executed by the connection's
/// reader thread itself, without a hand-off to a worker.
const INLINE_MAX: u32 = 128 << 10;
/// Replies held back (while more requests are already buffered) before they
/// are written anyway.
const BATCH_MAX: usize = 256 << 10;

struct Job {
    req: Request,
    payload: Vec<u8>,
    cost: u64,
}

/// Counters the server keeps (for `zmem stat`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServerStats {
    pub connections_active: u64,
    pub connections_total: u64,
    pub requests: u64,
    pub request_errors: u64,
    pub connections_dropped: u64,
    /// Panics caught in connection threads or request execution (each a
    /// bug: the connection was dropped). Tests assert this stays 0.
    pub panics: u64,
    /// Warnings (bad clients, failed accepts) not logged: at most one is
    /// logged per 10 s, so a flood of garbage connections cannot fill a disk.
    pub warnings_suppressed: u64,
    /// Connections dropped for a handshake, request or reply that took too
    /// long, or evicted while still in the handshake to make room.
    pub timeouts: u64,
    /// READ/WRITE bytes in flight at the workers now, over all connections.
    pub inflight_bytes: u64,
    /// Worker threads running now, over all connections.
    pub workers: u64,
}

/// An NBD server for one export.
pub struct Server {
    export: Arc<Export>,
    info: ExportInfo,
    cfg: ServerConfig,
    conns: Mutex<HashMap<u64, Conn>>,
    /// Bytes in flight at the workers, over all connections.
    inflight: Budget,
    /// Worker threads running, over all connections.
    workers: AtomicU64,
    timeouts: AtomicU64,
    next_id: AtomicU64,
    total: AtomicU64,
    requests: AtomicU64,
    /// How long requests take to run.
    latency: zmem_core::LatencyHistogram,
    request_errors: AtomicU64,
    dropped: AtomicU64,
    panics: AtomicU64,
    warn: zmem_core::RateLimited,
}

/// A registered connection: its socket (to shut it down) and, while it is
/// in the handshake, when that began.
struct Conn {
    stream: Stream,
    handshake_since: Option<Instant>,
}

/// Removes a connection from the registry when it ends, however it ends.
struct Registered<'a> {
    server: &'a Server,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.server.conns.lock().remove(&self.id);
    }
}

impl Server {
    pub fn new(export: Arc<Export>, name: impl Into<String>, cfg: ServerConfig) -> Server {
        let info = ExportInfo { name: name.into(), size: export.size(), description: Some("zmem compressed memory".into()) };
        Server {
            export,
            info,
            conns: Mutex::new(HashMap::new()),
            inflight: Budget::new(cfg.max_server_inflight_bytes.max(1)),
            workers: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            total: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            latency: zmem_core::LatencyHistogram::default(),
            request_errors: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            warn: zmem_core::RateLimited::default(),
            cfg,
        }
    }

    pub fn export(&self) -> &Arc<Export> {
        &self.export
    }

    pub fn info(&self) -> &ExportInfo {
        &self.info
    }

    /// How long requests took to run, as a histogram.
    pub fn latency(&self) -> zmem_core::Latencies {
        self.latency.snapshot()
    }

    pub fn stats(&self) -> ServerStats {
        ServerStats {
            connections_active: self.conns.lock().len() as u64,
            connections_total: self.total.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            request_errors: self.request_errors.load(Ordering::Relaxed),
            connections_dropped: self.dropped.load(Ordering::Relaxed),
            panics: self.panics.load(Ordering::Relaxed),
            warnings_suppressed: self.warn.suppressed_total(),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            inflight_bytes: self.inflight.in_use(),
            workers: self.workers.load(Ordering::Relaxed),
        }
    }

    /// Accept and serve connections until `stop` is set; then stop reading
    /// new requests, let in-flight ones finish (up to `drain_timeout`), and
    /// return once every connection thread has ended.
    pub fn run(&self, listener: &Listener, stop: &AtomicBool) -> io::Result<()> {
        std::thread::scope(|s| {
            let mut handles = Vec::new();
            let res = loop {
                if stop.load(Ordering::Relaxed) {
                    break Ok(());
                }
                handles.retain(|h: &std::thread::ScopedJoinHandle<'_, ()>| !h.is_finished());
                match poll_readable(listener.fd(), 100) {
                    Ok(false) => continue,
                    Ok(true) => {}
                    Err(e) => break Err(e),
                }
                let stream = match listener.accept() {
                    Ok(st) => st,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => {
                        // e.g. EMFILE: back off instead of spinning.
                        self.warn.warn(|| format!("nbd: accept failed: {e}"));
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                if handles.len() >= self.cfg.max_connections && !self.evict_a_handshake() {
                    let open = handles.len();
                    self.warn.warn(|| format!("nbd: refusing connection: {open} connections already open"));
                    continue;
                }
                let h = std::thread::Builder::new().name("zmem-nbd-conn".into()).spawn_scoped(s, move || {
                    // A bug (ours or the engine's) must cost one
                    // connection, not the server.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let _ = self.serve_connection(stream, stop);
                    }));
                    if r.is_err() {
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                        self.panics.fetch_add(1, Ordering::Relaxed);
                        tracing::error!("nbd: internal error (panic) in a connection; it was dropped");
                    }
                });
                match h {
                    Ok(h) => handles.push(h),
                    Err(e) => self.warn.warn(|| format!("nbd: cannot start a connection thread: {e}")),
                }
            };
            // Stop reading requests: readers see EOF, workers drain, replies go out.
            self.shutdown_connections(Shutdown::Read);
            let deadline = Instant::now() + self.cfg.drain_timeout;
            while handles.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            // Anyone still there is stuck writing to a client that does not read.
            self.shutdown_connections(Shutdown::Both);
            res
        })
    }

    fn shutdown_connections(&self, how: Shutdown) {
        for c in self.conns.lock().values() {
            let _ = c.stream.shutdown(how);
        }
    }

    /// At the connection limit: drop the connection that has been in its
    /// handshake longest, so clients that connect and say nothing cannot
    /// lock real ones out. Returns whether there was one.
    fn evict_a_handshake(&self) -> bool {
        let conns = self.conns.lock();
        let oldest = conns.values().filter_map(|c| c.handshake_since.map(|t| (t, c))).min_by_key(|(t, _)| *t);
        match oldest {
            Some((_, c)) => {
                let _ = c.stream.shutdown(Shutdown::Both);
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Serve one client from handshake to disconnect. Errors have already
    /// been logged (one line) when this returns; the stream is closed.
    pub fn serve_connection(&self, stream: Stream, stop: &AtomicBool) -> Result<(), ProtoError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        let res = self.connection(id, stream, stop);
        match &res {
            Ok(()) => tracing::debug!("nbd: connection {id} closed"),
            Err(ProtoError::Eof(what)) => {
                tracing::debug!("nbd: connection {id}: client went away during {what}")
            }
            Err(ProtoError::Io(e)) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
                tracing::debug!("nbd: connection {id}: client went away: {e}")
            }
            Err(ProtoError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                self.warn.warn(|| format!("nbd: connection {id}: {e}; dropping this connection"));
            }
            Err(e) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                self.warn.warn(|| format!("nbd: connection {id}: {e}; dropping this connection"));
            }
        }
        res
    }

    fn connection(&self, id: u64, mut stream: Stream, stop: &AtomicBool) -> Result<(), ProtoError> {
        let since = Instant::now();
        let conn = Conn { stream: stream.try_clone()?, handshake_since: Some(since) };
        self.conns.lock().insert(id, conn);
        let _reg = Registered { server: self, id };
        if stop.load(Ordering::Relaxed) {
            // Registered too late to be shut down by `run`; still answer politely.
            let _ = stream.shutdown(Shutdown::Read);
        }
        let mut hs = Deadline { s: &mut stream, deadline: since + self.cfg.handshake_timeout, what: "the handshake" };
        let Some(session) = negotiate(&mut hs, &self.info, stop)? else {
            return Ok(()); // NBD_OPT_ABORT
        };
        if let Some(c) = self.conns.lock().get_mut(&id) {
            c.handshake_since = None;
        }
        // Idle between requests is fine (the reader waits in slices of
        // io_timeout); a reply the client does not take within it is not.
        stream.set_write_timeout(Some(self.cfg.io_timeout))?;
        stream.set_read_timeout(Some(self.cfg.io_timeout))?;
        tracing::debug!("nbd: connection {id}: transmission, {session:?}");
        self.transmission(stream, session)
    }

    /// Take up to `workers_per_conn` worker threads from the server's pool.
    fn take_workers(&self) -> usize {
        let want = self.cfg.workers_per_conn as u64;
        let max = self.cfg.max_workers as u64;
        let mut got = 0;
        let _ = self.workers.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            got = want.min(max.saturating_sub(w));
            Some(w + got)
        });
        got as usize
    }

    fn transmission(&self, stream: Stream, session: Session) -> Result<(), ProtoError> {
        let writer = Mutex::new(stream.try_clone()?);
        let mut reader = BufReader::with_capacity(128 << 10, stream);
        let budget = Budget::new(self.cfg.max_inflight_bytes);
        let dead = AtomicBool::new(false);
        let (tx, rx) = crossbeam_channel::bounded::<Job>(self.cfg.queue_depth.max(1));
        // WRITE payload buffers go back to the reader for reuse: large
        // fresh allocations are mmap'd and page-faulted on every request.
        let (recycle_tx, recycle_rx) = crossbeam_channel::bounded::<Vec<u8>>(self.cfg.queue_depth + self.cfg.workers_per_conn + 1);
        let granted = self.take_workers();
        std::thread::scope(|s| {
            let mut workers = 0;
            for _ in 0..granted {
                let rx = rx.clone();
                let recycle = recycle_tx.clone();
                let (writer, budget, dead, session) = (&writer, &budget, &dead, &session);
                let spawned = std::thread::Builder::new().name("zmem-nbd-worker".into()).spawn_scoped(s, move || {
                    let mut out = Vec::new();
                    for mut job in rx {
                        let cost = job.cost;
                        if !dead.load(Ordering::Relaxed) {
                            out.clear();
                            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.execute(&job.req, &job.payload, session, &mut out)));
                            let mut w = writer.lock();
                            if ran.is_err() {
                                // Never leave a request unanswered with the
                                // connection up: end this connection.
                                self.panics.fetch_add(1, Ordering::Relaxed);
                                tracing::error!("nbd: internal error (panic) executing {:?}; dropping this connection", job.req);
                                dead.store(true, Ordering::Relaxed);
                                let _ = w.shutdown(Shutdown::Both);
                            } else if let Err(e) = w.write_all(&out) {
                                if !dead.swap(true, Ordering::Relaxed) {
                                    self.reply_failed(&e);
                                }
                                let _ = w.shutdown(Shutdown::Both);
                            }
                        }
                        budget.release(cost);
                        self.inflight.release(cost);
                        if out.capacity() > KEEP_BUFFER {
                            out = Vec::new();
                        }
                        if job.payload.capacity() > 0 && job.payload.capacity() <= KEEP_BUFFER {
                            job.payload.clear();
                            let _ = recycle.try_send(std::mem::take(&mut job.payload));
                        }
                    }
                });
                match spawned {
                    Ok(_) => workers += 1,
                    Err(e) => self.warn.warn(|| format!("nbd: cannot start a worker thread: {e}")),
                }
            }
            drop(rx);
            // Threads granted but not started go back to the pool now.
            self.workers.fetch_sub((granted - workers) as u64, Ordering::Relaxed);
            let _give_back = GiveBackWorkers(&self.workers, workers as u64);
            // Without workers, the reader runs every request itself.
            let inline_max = if workers == 0 { u32::MAX } else { INLINE_MAX };
            drop(recycle_tx);
            let mut batch: Vec<u8> = Vec::with_capacity(BATCH_MAX + INLINE_MAX as usize + 64);
            let res = self.read_loop(&mut reader, &tx, &recycle_rx, &budget, &dead, &writer, &session, &mut batch, &mut Vec::new(), inline_max);
            // Whatever ended the loop, the replies already computed go out.
            self.flush_batch(&mut batch, &writer, &dead);
            drop(tx); // workers drain the queue and exit; the scope joins them
            res
        })
    }

    /// A reply could not be written: the client went away, or did not take
    /// it within io_timeout (it stopped reading). Either way the connection
    /// ends; the second is counted and logged.
    fn reply_failed(&self, e: &io::Error) {
        if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            self.timeouts.fetch_add(1, Ordering::Relaxed);
            let t = self.cfg.io_timeout;
            self.warn.warn(|| format!("nbd: a client did not read its replies for {t:?}; dropping this connection"));
        } else {
            tracing::debug!("nbd: reply write failed: {e}");
        }
    }

    /// Write the batched replies (one syscall) under the writer lock.
    fn flush_batch(&self, batch: &mut Vec<u8>, writer: &Mutex<Stream>, dead: &AtomicBool) {
        if batch.is_empty() {
            return;
        }
        if !dead.load(Ordering::Relaxed) {
            let mut w = writer.lock();
            if let Err(e) = w.write_all(batch) {
                if !dead.swap(true, Ordering::Relaxed) {
                    self.reply_failed(&e);
                }
                let _ = w.shutdown(Shutdown::Both);
            }
        }
        batch.clear();
    }

    /// The reader loop. Small requests (the 4 KiB I/O of a filesystem or
    /// fio) are executed right here: a hand-off to a worker costs two
    /// context switches, more than decompressing or compressing a page.
    /// Their replies are batched while further requests are already
    /// buffered, and written with one syscall before the reader would block
    /// (or when the batch is large). Big requests go to the workers, so they
    /// proceed concurrently with each other and with the small ones.
    /// `batch` collects replies not yet sent; the caller flushes it after.
    /// Each turn: [`Reader::await_request`], [`Reader::read_header`],
    /// [`Server::check_request`], then [`Reader::run_inline`] or
    /// [`Reader::queue_for_workers`].
    #[allow(clippy::too_many_arguments)]
    fn read_loop(
        &self,
        r: &mut BufReader<Stream>,
        tx: &crossbeam_channel::Sender<Job>,
        recycled: &crossbeam_channel::Receiver<Vec<u8>>,
        budget: &Budget,
        dead: &AtomicBool,
        writer: &Mutex<Stream>,
        session: &Session,
        batch: &mut Vec<u8>,
        payload_buf: &mut Vec<u8>,
        inline_max: u32,
    ) -> Result<(), ProtoError> {
        let clock = RequestClock { io_timeout: self.cfg.io_timeout, short: false };
        let mut rd = Reader { server: self, r, clock, tx, recycled, budget, dead, writer, session, batch, payload_buf, inline_max };
        loop {
            if !rd.await_request()? {
                return Ok(());
            }
            // Once a request begins, all of it must arrive in io_timeout
            // (the clock starts at the first read that has to wait).
            let mut deadline = None;
            let Some(header) = rd.read_header(&mut deadline)? else {
                return Ok(());
            };
            let Some((req, plen)) = self.check_request(&header)? else {
                return Ok(());
            };
            let carry_on = if rd.runs_inline(&req) { rd.run_inline(&req, plen, &mut deadline)? } else { rd.queue_for_workers(req, plen, &mut deadline)? };
            if !carry_on {
                return Ok(());
            }
        }
    }

    /// Parses a request header and counts the request: `None` for NBD_CMD_DISC, an error for a WRITE over MAX_PAYLOAD.
    fn check_request(&self, header: &[u8; REQUEST_LEN]) -> Result<Option<(Request, u32)>, ProtoError> {
        let req = parse_request(header)?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        if req.typ == CMD_DISC {
            return Ok(None);
        }
        let plen = req.payload_len();
        if plen > MAX_PAYLOAD {
            return Err(ProtoError::PayloadTooLarge { len: plen });
        }
        Ok(Some((req, plen)))
    }

    /// Whether a request may wait for a cache's origin (a read that
    /// misses, any write, trim, zeroing or flush): such a request goes to
    /// the workers even if small, so the reader goes on to the next.
    fn may_wait(&self, req: &Request) -> bool {
        let e = &self.export;
        match req.typ {
            CMD_READ => e.read_may_wait(req.offset, req.len.into()),
            CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_WRITE_ZEROES => e.has_origin(),
            _ => false,
        }
    }

    /// Run one request and encode its complete reply, timed (the server's
    /// share of the request's latency: from its header read to its reply
    /// encoded). The reply is appended to `out` (which may already hold
    /// earlier replies of a batch).
    fn execute(&self, req: &Request, payload: &[u8], s: &Session, out: &mut Vec<u8>) {
        let t = std::time::Instant::now();
        self.execute_untimed(req, payload, s, out);
        self.latency.observe(t.elapsed());
    }

    fn execute_untimed(&self, req: &Request, payload: &[u8], s: &Session, out: &mut Vec<u8>) {
        let h = req.handle;
        let base = out.len();
        let fail = |out: &mut Vec<u8>, errno: u32, msg: &str| {
            out.truncate(base);
            if s.structured {
                put_error_chunk(out, h, errno, msg);
            } else {
                put_simple_reply(out, errno, h);
            }
        };
        let cmd = match req.validate(s) {
            Ok(c) => c,
            Err(rej) => {
                self.request_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("nbd: rejecting request: {}", rej.msg);
                fail(out, rej.errno, &rej.msg);
                return;
            }
        };
        let e = &self.export;
        let res = match cmd {
            Command::Read { offset, len } => {
                let start = if s.structured {
                    out.reserve(28 + len as usize);
                    put_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, h, 8 + len);
                    out.extend_from_slice(&offset.to_be_bytes());
                    out.len()
                } else {
                    out.reserve(16 + len as usize);
                    put_simple_reply(out, 0, h);
                    out.len()
                };
                out.resize(start + len as usize, 0);
                match e.read(offset, &mut out[start..]) {
                    Ok(()) => return,
                    Err(err) => Err(err),
                }
            }
            Command::Write { offset, fua, .. } => e.write_fua(offset, payload, fua),
            Command::Flush => e.flush(),
            Command::Disconnect => Ok(()),
            Command::Trim { offset, len } => e.trim(offset, len as u64).map(|_| ()),
            Command::WriteZeroes { offset, len, no_hole } => e.write_zeroes(offset, len as u64, no_hole),
            Command::BlockStatus { offset, len, req_one } => match e.block_status(offset, len as u64, req_one) {
                Ok(ext) => {
                    let ctx = s.base_allocation.unwrap_or(META_BASE_ALLOCATION_ID);
                    put_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, h, 4 + 8 * ext.len() as u32);
                    out.extend_from_slice(&ctx.to_be_bytes());
                    for (l, f) in ext {
                        out.extend_from_slice(&l.to_be_bytes());
                        out.extend_from_slice(&f.to_be_bytes());
                    }
                    return;
                }
                Err(err) => Err(err),
            },
        };
        match res {
            Ok(()) => put_simple_reply(out, 0, h),
            Err(err) => {
                self.request_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("nbd: request failed: {err}");
                fail(out, err.errno(), &err.to_string());
            }
        }
    }
}
