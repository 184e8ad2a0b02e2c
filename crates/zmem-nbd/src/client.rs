//! An NBD client, as much of one as an origin needs: another NBD server
//! (a remote disk, `nbdkit`, another zmem) behind `zmem serve --origin
//! nbd://…`.
//!
//! It speaks fixed newstyle with `NBD_OPT_GO` and simple replies, one
//! request at a time per connection. It opens four connections when the
//! server says they are coherent (`CAN_MULTI_CONN`), else one; a request
//! takes a free one. A connection that fails mid-request (its state on the
//! wire is then unknown) is closed and opened again by the next request
//! that picks it. Every socket read and write has a deadline, so an origin
//! that stops answering fails requests instead of hanging them.
//! The handshake is a short sequence of states ([`ClientState`]); each
//! error says which one failed.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use zmem_export::Origin;

use crate::proto::*;
use crate::server::Stream;

/// Requests are cut into pieces of at most this many bytes (servers must
/// take 32 MiB; some refuse more).
const MAX_REQUEST: usize = 8 << 20;
/// Connections opened to a server that allows several.
const MULTI_CONN: usize = 4;
/// An option reply longer than this is refused (ours are a few bytes).
const MAX_OPTION_REPLY: u32 = 64 << 10;
/// How long a socket read or write may wait.
const IO_DEADLINE: Duration = Duration::from_secs(60);

/// Where a handshake or a request was when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientState {
    Connecting,
    /// Reading the server's greeting (NBDMAGIC, IHAVEOPT, flags).
    Greeting,
    /// Sending NBD_OPT_GO and reading its replies.
    Go,
    /// Sending a request or reading its reply.
    Transmission,
}

/// Why a connection to the origin failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad NBD URI `{uri}`: {why} (expected nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)")]
    BadUri { uri: String, why: &'static str },
    #[error("{uri}: {state:?}: {source}")]
    Io { uri: String, state: ClientState, source: io::Error },
    #[error("{uri}: {state:?}: {why}")]
    Protocol { uri: String, state: ClientState, why: String },
}

impl From<ClientError> for io::Error {
    fn from(e: ClientError) -> io::Error {
        match e {
            ClientError::Io { ref source, .. } => io::Error::new(source.kind(), e.to_string()),
            e => io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Unix(PathBuf),
    Tcp(String),
}

/// `nbd://HOST[:PORT]/EXPORT` or `nbd+unix:///EXPORT?socket=PATH`.
fn parse_uri(uri: &str) -> Result<(Target, String), ClientError> {
    let bad = |why| ClientError::BadUri { uri: uri.to_string(), why };
    if let Some(rest) = uri.strip_prefix("nbd+unix://") {
        let (path, query) = rest.split_once('?').ok_or_else(|| bad("no ?socket=PATH"))?;
        let export = path.strip_prefix('/').unwrap_or(path);
        let socket = query.split('&').find_map(|kv| kv.strip_prefix("socket=")).filter(|s| !s.is_empty()).ok_or_else(|| bad("no ?socket=PATH"))?;
        return Ok((Target::Unix(PathBuf::from(socket)), export.to_string()));
    }
    if let Some(rest) = uri.strip_prefix("nbd://") {
        let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let has_port = host.rsplit_once(':').is_some_and(|(h, p)| !h.ends_with(':') && !p.contains(']'));
        let addr = if has_port { host.to_string() } else { format!("{host}:10809") };
        return Ok((Target::Tcp(addr), export.to_string()));
    }
    Err(bad("unknown scheme"))
}

/// A server's export as the handshake found it.
#[derive(Clone, Copy, Debug)]
struct Found {
    size: u64,
    flags: u16,
}

/// One connection, past its handshake.
struct Conn {
    s: Stream,
    next_handle: u64,
}

/// Another NBD server's export, used as an [`Origin`].
pub struct NbdOrigin {
    uri: String,
    target: Target,
    export: String,
    found: Found,
    conns: Vec<Mutex<Option<Conn>>>,
    next: AtomicUsize,
    reconnects: AtomicU64,
}

impl NbdOrigin {
    /// Connect to `uri` and agree on its export (which must be writable).
    pub fn connect(uri: &str) -> Result<NbdOrigin, ClientError> {
        let (target, export) = parse_uri(uri)?;
        let mut o = NbdOrigin {
            uri: uri.to_string(),
            target,
            export,
            found: Found { size: 0, flags: 0 },
            conns: Vec::new(),
            next: AtomicUsize::new(0),
            reconnects: AtomicU64::new(0),
        };
        let (first, found) = o.open()?;
        if found.flags & FLAG_READ_ONLY != 0 {
            return Err(o.proto(ClientState::Go, "the export is read-only; an origin takes the cache's writes".into()));
        }
        o.found = found;
        let n = if found.flags & FLAG_CAN_MULTI_CONN != 0 { MULTI_CONN } else { 1 };
        o.conns.push(Mutex::new(Some(first)));
        for _ in 1..n {
            let (c, _) = o.open()?;
            o.conns.push(Mutex::new(Some(c)));
        }
        Ok(o)
    }

    /// Connections opened again after a failure.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Relaxed)
    }

    fn proto(&self, state: ClientState, why: String) -> ClientError {
        ClientError::Protocol { uri: self.uri.clone(), state, why }
    }

    fn io(&self, state: ClientState) -> impl Fn(io::Error) -> ClientError + '_ {
        move |source| ClientError::Io { uri: self.uri.clone(), state, source }
    }

    /// A new connection, through the handshake.
    fn open(&self) -> Result<(Conn, Found), ClientError> {
        let s = match &self.target {
            Target::Unix(p) => UnixStream::connect(p).map(Stream::Unix),
            Target::Tcp(a) => TcpStream::connect(a).map(|t| {
                let _ = t.set_nodelay(true);
                Stream::Tcp(t)
            }),
        }
        .map_err(self.io(ClientState::Connecting))?;
        s.set_read_timeout(Some(IO_DEADLINE)).map_err(self.io(ClientState::Connecting))?;
        s.set_write_timeout(Some(IO_DEADLINE)).map_err(self.io(ClientState::Connecting))?;
        let mut c = Conn { s, next_handle: 1 };
        let found = self.handshake(&mut c.s)?;
        Ok((c, found))
    }

    fn handshake(&self, s: &mut Stream) -> Result<Found, ClientError> {
        // Greeting.
        let st = ClientState::Greeting;
        let mut g = [0u8; 18];
        s.read_exact(&mut g).map_err(self.io(st))?;
        if be_u64(&g) != NBDMAGIC {
            return Err(self.proto(st, "not an NBD server (no NBDMAGIC)".into()));
        }
        if be_u64(&g[8..]) != IHAVEOPT {
            return Err(self.proto(st, "an oldstyle server: only newstyle is supported".into()));
        }
        let hflags = be_u16(&g[16..]);
        if hflags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(self.proto(st, "the server is not fixed-newstyle".into()));
        }
        let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
        let cflags = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
        // NBD_OPT_GO with the export's name and no information requests.
        let st = ClientState::Go;
        let name = self.export.as_bytes();
        let mut m = Vec::with_capacity(32 + name.len());
        m.extend_from_slice(&cflags.to_be_bytes());
        m.extend_from_slice(&IHAVEOPT.to_be_bytes());
        m.extend_from_slice(&OPT_GO.to_be_bytes());
        m.extend_from_slice(&(4 + name.len() as u32 + 2).to_be_bytes());
        m.extend_from_slice(&(name.len() as u32).to_be_bytes());
        m.extend_from_slice(name);
        m.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&m).map_err(self.io(st))?;
        let mut found = None;
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h).map_err(self.io(st))?;
            let (magic, opt, typ, len) = (be_u64(&h), be_u32(&h[8..]), be_u32(&h[12..]), be_u32(&h[16..]));
            if magic != OPT_REPLY_MAGIC || opt != OPT_GO {
                return Err(self.proto(st, format!("bad option reply (magic {magic:#x}, option {opt})")));
            }
            if len > MAX_OPTION_REPLY {
                return Err(self.proto(st, format!("an option reply of {len} bytes")));
            }
            let mut data = vec![0u8; len as usize];
            s.read_exact(&mut data).map_err(self.io(st))?;
            match typ {
                REP_ACK => break,
                REP_INFO if data.len() >= 12 && be_u16(&data) == INFO_EXPORT => {
                    found = Some(Found { size: be_u64(&data[2..]), flags: be_u16(&data[10..]) });
                }
                REP_INFO => {}
                t if t & (1 << 31) != 0 => {
                    let msg = String::from_utf8_lossy(&data);
                    return Err(self.proto(st, format!("the server refused export {:?} (error {:#x}): {msg}", self.export, t)));
                }
                t => return Err(self.proto(st, format!("unexpected option reply type {t}"))),
            }
        }
        found.ok_or_else(|| self.proto(st, "the server acknowledged NBD_OPT_GO without the export's size".into()))
    }

    /// Run one command on a free connection (reconnecting it first if an
    /// earlier request broke it).
    fn request(&self, typ: u16, flags: u16, offset: u64, len: u32, payload: &[u8], read_into: Option<&mut [u8]>) -> io::Result<()> {
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Relaxed);
        let mut slot = (0..n).find_map(|i| self.conns[(start + i) % n].try_lock()).unwrap_or_else(|| self.conns[start % n].lock());
        if slot.is_none() {
            self.reconnects.fetch_add(1, Relaxed);
            *slot = Some(self.open()?.0);
        }
        let c = slot.as_mut().expect("connected above");
        let r = self.exchange(c, typ, flags, offset, len, payload, read_into);
        if let Err(e) = &r {
            // A server's error reply leaves the connection in step; anything
            // else (a short read, a timeout) does not.
            if e.kind() != io::ErrorKind::Other {
                *slot = None;
            }
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn exchange(&self, c: &mut Conn, typ: u16, flags: u16, offset: u64, len: u32, payload: &[u8], read_into: Option<&mut [u8]>) -> io::Result<()> {
        let st = ClientState::Transmission;
        let handle = c.next_handle;
        c.next_handle += 1;
        let h = Request { flags, typ, handle, offset, len }.encode();
        c.s.write_all(&h).map_err(self.io(st))?;
        if !payload.is_empty() {
            c.s.write_all(payload).map_err(self.io(st))?;
        }
        let mut r = [0u8; 16];
        c.s.read_exact(&mut r).map_err(self.io(st))?;
        if be_u32(&r) != SIMPLE_REPLY_MAGIC || be_u64(&r[8..]) != handle {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                self.proto(st, format!("bad reply (magic {:#x}, handle {} for {handle})", be_u32(&r), be_u64(&r[8..]))).to_string(),
            ));
        }
        let errno = be_u32(&r[4..]);
        if errno != 0 {
            let os = io::Error::from_raw_os_error(errno as i32);
            return Err(io::Error::other(format!("{}: the server failed command {typ} at {offset}+{len}: {os}", self.uri)));
        }
        if let Some(buf) = read_into {
            c.s.read_exact(buf).map_err(self.io(st))?;
        }
        Ok(())
    }

    fn has(&self, flag: u16) -> bool {
        self.found.flags & flag != 0
    }
}

impl Origin for NbdOrigin {
    fn size(&self) -> u64 {
        self.found.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        for (i, chunk) in buf.chunks_mut(MAX_REQUEST).enumerate() {
            let off = offset + (i * MAX_REQUEST) as u64;
            self.request(CMD_READ, 0, off, chunk.len() as u32, &[], Some(chunk))?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let flags = if fua && self.has(FLAG_SEND_FUA) { CMD_FLAG_FUA } else { 0 };
        for (i, chunk) in buf.chunks(MAX_REQUEST).enumerate() {
            let off = offset + (i * MAX_REQUEST) as u64;
            self.request(CMD_WRITE, flags, off, chunk.len() as u32, chunk, None)?;
        }
        if fua && !self.has(FLAG_SEND_FUA) {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if self.has(FLAG_SEND_FLUSH) {
            self.request(CMD_FLUSH, 0, 0, 0, &[], None)?;
        }
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.has(FLAG_SEND_TRIM) {
            return Ok(()); // a hint
        }
        self.ranged(CMD_TRIM, offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.has(FLAG_SEND_WRITE_ZEROES) {
            return self.ranged(CMD_WRITE_ZEROES, offset, len);
        }
        zmem_export::origin::write_zero_buffers(self, offset, len)
    }

    fn describe(&self) -> String {
        format!("{} ({} connection{})", self.uri, self.conns.len(), if self.conns.len() == 1 { "" } else { "s" })
    }
}

impl NbdOrigin {
    /// A command without payload over a range, in pieces a u32 length holds.
    fn ranged(&self, typ: u16, offset: u64, len: u64) -> io::Result<()> {
        let (mut pos, end) = (offset, offset + len);
        while pos < end {
            let n = (end - pos).min(1 << 30);
            self.request(typ, 0, pos, n as u32, &[], None)?;
            pos += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        assert_eq!(parse_uri("nbd+unix:///?socket=/run/a.sock").unwrap(), (Target::Unix("/run/a.sock".into()), String::new()));
        assert_eq!(parse_uri("nbd+unix:///disk?socket=/s").unwrap(), (Target::Unix("/s".into()), "disk".into()));
        assert_eq!(parse_uri("nbd://10.0.0.1/disk").unwrap(), (Target::Tcp("10.0.0.1:10809".into()), "disk".into()));
        assert_eq!(parse_uri("nbd://host:999").unwrap(), (Target::Tcp("host:999".into()), String::new()));
        assert_eq!(parse_uri("nbd://[::1]:5/x").unwrap(), (Target::Tcp("[::1]:5".into()), "x".into()));
        for bad in ["nbd+unix:///disk", "nbd+unix:///?socket=", "nbd:///x", "http://x/y"] {
            let e = parse_uri(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("expected"), "{e}");
        }
    }
}
