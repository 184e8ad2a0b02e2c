//! NBD wire format: constants, parsing with typed errors, reply encoding.
//!
//! Everything here is pure (no I/O) so that it can be tested byte for byte.
//! Numbers follow `doc/proto.md` of the NetworkBlockDevice/nbd repository
//! (and libnbd's `nbd-protocol.h` for the option numbers that the document
//! once assigned differently). All integers are big-endian on the wire.

use thiserror::Error;

// ---- magics ---------------------------------------------------------------

/// `NBDMAGIC`, first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle magic, also prefixes every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply (fixed newstyle).
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a (compact) transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---- handshake flags --------------------------------------------------------

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---- transmission flags -----------------------------------------------------

pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---- options ----------------------------------------------------------------

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// ---- option replies ---------------------------------------------------------

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) | 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
pub const REP_ERR_PLATFORM: u32 = (1 << 31) | 4;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) | 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = (1 << 31) | 8;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) | 9;

// ---- NBD_REP_INFO types -----------------------------------------------------

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---- commands -----------------------------------------------------------------

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ---- structured replies -------------------------------------------------------

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// ---- base:allocation ----------------------------------------------------------

pub const META_BASE_ALLOCATION: &str = "base:allocation";
/// The id we give `base:allocation` when a client selects it.
pub const META_BASE_ALLOCATION_ID: u32 = 1;
pub use zmem_export::{STATE_HOLE, STATE_ZERO};

// ---- error values -------------------------------------------------------------

// NBD's error values are Linux's errno values; the export's failures
// already carry them.
pub use zmem_export::{EINVAL, EIO, ENOSPC};
pub const EPERM: u32 = 1;
pub const ENOMEM: u32 = 12;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// ---- limits -------------------------------------------------------------------

/// Block size constraints we advertise (NBD_INFO_BLOCK_SIZE).
pub const MIN_BLOCK: u32 = 1;
pub const PREFERRED_BLOCK: u32 = 4096;
/// Largest READ/WRITE payload we accept (and advertise): 32 MiB.
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option payload we parse. Names are at most 4096 bytes by the spec;
/// the largest legitimate option (a meta-context query list) fits easily.
pub const MAX_OPTION_DATA: u32 = 64 << 10;
/// Option payloads up to this size that are too big to parse are read and
/// discarded (answered with `NBD_REP_ERR_TOO_BIG`); larger ones drop the
/// connection (the spec allows a hard disconnect for denial of service).
pub const MAX_OPTION_SKIP: u32 = 16 << 20;
/// Strings (export names, queries) longer than this are invalid.
pub const MAX_STRING: usize = 4096;

/// Size of a request header on the wire.
pub const REQUEST_LEN: usize = 28;
/// Size of an option header on the wire.
pub const OPTION_HEADER_LEN: usize = 16;

/// Errors that end a connection: the peer broke a MUST of the protocol in a
/// way we cannot answer, or the transport failed.
#[derive(Debug, Error)]
pub enum ProtoError {
    #[error("client flags {0:#x} contain bits we did not advertise")]
    BadClientFlags(u32),
    #[error("option header has magic {0:#018x}, expected IHAVEOPT")]
    BadOptionMagic(u64),
    #[error("option {option} carries {len} bytes of data, more than the {max} we accept")]
    OptionTooLong { option: u32, len: u32, max: u32 },
    #[error("request has magic {0:#010x}, expected {REQUEST_MAGIC:#010x}")]
    BadRequestMagic(u32),
    #[error("write of {len} bytes exceeds the maximum payload of {MAX_PAYLOAD} bytes")]
    PayloadTooLarge { len: u32 },
    #[error("client asked for export {0:?} with NBD_OPT_EXPORT_NAME, which does not exist")]
    UnknownExport(String),
    #[error("client closed the connection during {0}")]
    Eof(&'static str),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Why an option's payload could not be parsed (answered with NBD_REP_ERR_INVALID).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OptParseError {
    #[error("option data is truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("option data has {0} trailing bytes")]
    Trailing(usize),
    #[error("string of {0} bytes is longer than {MAX_STRING}")]
    StringTooLong(usize),
    #[error("string is not valid UTF-8 or contains NUL")]
    BadString,
    #[error("option takes no data, got {0} bytes")]
    UnexpectedData(usize),
}

/// Header of one client option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

/// Parse `IHAVEOPT, option, length`.
pub fn parse_option_header(b: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, ProtoError> {
    let magic = be_u64(&b[0..8]);
    if magic != IHAVEOPT {
        return Err(ProtoError::BadOptionMagic(magic));
    }
    Ok(OptionHeader { option: be_u32(&b[8..12]), len: be_u32(&b[12..16]) })
}

/// A transmission request header, as sent (not yet validated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub typ: u16,
    pub handle: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    /// Bytes of payload that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.typ == CMD_WRITE {
            self.len
        } else {
            0
        }
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.typ.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// Parse a request header; only the magic can make this fail (a wrong magic
/// means we lost framing, and the connection must go).
pub fn parse_request(b: &[u8; REQUEST_LEN]) -> Result<Request, ProtoError> {
    let magic = be_u32(&b[0..4]);
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadRequestMagic(magic));
    }
    Ok(Request { flags: be_u16(&b[4..6]), typ: be_u16(&b[6..8]), handle: be_u64(&b[8..16]), offset: be_u64(&b[16..24]), len: be_u32(&b[24..28]) })
}

/// What a transmission session negotiated; decides which commands and
/// flags are valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected with NBD_OPT_SET_META_CONTEXT (its id).
    pub base_allocation: Option<u32>,
    /// Transmission flags sent to the client.
    pub flags: u16,
    /// Export size in bytes.
    pub size: u64,
}

/// A validated command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read { offset: u64, len: u32 },
    Write { offset: u64, len: u32, fua: bool },
    Flush,
    Trim { offset: u64, len: u32 },
    WriteZeroes { offset: u64, len: u32, no_hole: bool },
    BlockStatus { offset: u64, len: u32, req_one: bool },
    Disconnect,
}

/// A request we answer with an error value (the connection stays up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub errno: u32,
    pub msg: String,
}

fn reject(errno: u32, msg: impl Into<String>) -> Reject {
    Reject { errno, msg: msg.into() }
}

impl Request {
    /// Check a request against what was negotiated and the export's size.
    pub fn validate(&self, s: &Session) -> Result<Command, Reject> {
        // FUA is valid on every command once NBD_FLAG_SEND_FUA is advertised.
        let allowed = CMD_FLAG_FUA
            | match self.typ {
                CMD_READ if s.flags & FLAG_SEND_DF != 0 => CMD_FLAG_DF,
                CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE,
                CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
                CMD_DISC => u16::MAX,
                _ => 0,
            };
        let cmd_name = match self.typ {
            CMD_READ => "READ",
            CMD_WRITE => "WRITE",
            CMD_DISC => "DISC",
            CMD_FLUSH => "FLUSH",
            CMD_TRIM => "TRIM",
            CMD_WRITE_ZEROES => "WRITE_ZEROES",
            CMD_BLOCK_STATUS => "BLOCK_STATUS",
            t => return Err(reject(EINVAL, format!("unknown or unsupported command {t}"))),
        };
        if self.flags & !allowed != 0 {
            return Err(reject(EINVAL, format!("flags {:#x} are not valid for {cmd_name}", self.flags)));
        }
        let (offset, len) = (self.offset, self.len);
        let in_range = offset.checked_add(len as u64).is_some_and(|end| end <= s.size);
        let range_err = |errno| reject(errno, format!("{cmd_name} of {len} bytes at {offset} is outside the export ({} bytes)", s.size));
        match self.typ {
            CMD_DISC => Ok(Command::Disconnect),
            CMD_FLUSH => {
                if offset != 0 || len != 0 {
                    return Err(reject(EINVAL, "FLUSH must have offset and length 0"));
                }
                Ok(Command::Flush)
            }
            _ if len == 0 => Err(reject(EINVAL, format!("{cmd_name} of length 0"))),
            CMD_READ | CMD_WRITE if len > MAX_PAYLOAD => Err(reject(EINVAL, format!("{cmd_name} of {len} bytes exceeds the maximum block size {MAX_PAYLOAD}"))),
            CMD_WRITE | CMD_WRITE_ZEROES if !in_range => Err(range_err(ENOSPC)),
            _ if !in_range => Err(range_err(EINVAL)),
            CMD_READ => Ok(Command::Read { offset, len }),
            CMD_WRITE => Ok(Command::Write { offset, len, fua: self.flags & CMD_FLAG_FUA != 0 }),
            CMD_TRIM => Ok(Command::Trim { offset, len }),
            CMD_WRITE_ZEROES => Ok(Command::WriteZeroes { offset, len, no_hole: self.flags & CMD_FLAG_NO_HOLE != 0 }),
            CMD_BLOCK_STATUS => {
                if s.base_allocation.is_none() {
                    return Err(reject(EINVAL, "BLOCK_STATUS without a selected metadata context"));
                }
                Ok(Command::BlockStatus { offset, len, req_one: self.flags & CMD_FLAG_REQ_ONE != 0 })
            }
            _ => Err(reject(EINVAL, format!("unsupported command {}", self.typ))),
        }
    }
}

// ---- option payloads ------------------------------------------------------------

/// Cursor over an option's payload; every read is bounds-checked.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(b: &'a [u8]) -> Self {
        Cursor { b, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], OptParseError> {
        let have = self.b.len() - self.pos;
        if n > have {
            return Err(OptParseError::Truncated { need: self.pos.saturating_add(n), have: self.b.len() });
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, OptParseError> {
        self.take(2).map(be_u16)
    }
    fn u32(&mut self) -> Result<u32, OptParseError> {
        self.take(4).map(be_u32)
    }
    /// A string prefixed by a 32-bit length.
    fn string32(&mut self) -> Result<String, OptParseError> {
        let n = self.u32()? as usize;
        if n > MAX_STRING {
            return Err(OptParseError::StringTooLong(n));
        }
        parse_string(self.take(n)?)
    }
    fn finish(&self) -> Result<(), OptParseError> {
        match self.b.len() - self.pos {
            0 => Ok(()),
            n => Err(OptParseError::Trailing(n)),
        }
    }
}

/// A protocol string: UTF-8, no NUL, at most [`MAX_STRING`] bytes.
pub fn parse_string(b: &[u8]) -> Result<String, OptParseError> {
    if b.len() > MAX_STRING {
        return Err(OptParseError::StringTooLong(b.len()));
    }
    match std::str::from_utf8(b) {
        Ok(s) if !s.contains('\0') => Ok(s.to_owned()),
        _ => Err(OptParseError::BadString),
    }
}

/// Payload of NBD_OPT_INFO / NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Parse `u32 name length, name, u16 count, count x u16 info type`.
pub fn parse_info_request(b: &[u8]) -> Result<InfoRequest, OptParseError> {
    let mut c = Cursor::new(b);
    let name = c.string32()?;
    let n = c.u16()? as usize;
    let mut requests = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        requests.push(c.u16()?);
    }
    c.finish()?;
    Ok(InfoRequest { name, requests })
}

/// Payload of NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaQuery {
    pub export: String,
    pub queries: Vec<String>,
}

/// Parse `u32 export name length, name, u32 count, count x (u32 length, query)`.
pub fn parse_meta_query(b: &[u8]) -> Result<MetaQuery, OptParseError> {
    let mut c = Cursor::new(b);
    let export = c.string32()?;
    let n = c.u32()? as usize;
    let mut queries = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        queries.push(c.string32()?);
    }
    c.finish()?;
    Ok(MetaQuery { export, queries })
}

// ---- encoding -------------------------------------------------------------------

/// The server's first message: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut b = [0u8; 18];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    b
}

/// Append one option reply.
pub fn put_option_reply(out: &mut Vec<u8>, option: u32, reply: u32, data: &[u8]) {
    out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// Append a simple reply header (no data).
pub fn put_simple_reply(out: &mut Vec<u8>, errno: u32, handle: u64) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
}

/// Append a structured reply chunk header for a payload of `len` bytes.
pub fn put_chunk_header(out: &mut Vec<u8>, flags: u16, typ: u16, handle: u64, len: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&typ.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Append a final NBD_REPLY_TYPE_ERROR chunk with a human-readable message.
pub fn put_error_chunk(out: &mut Vec<u8>, handle: u64, errno: u32, msg: &str) {
    let msg = truncate_utf8(msg, 1024);
    put_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, handle, 6 + msg.len() as u32);
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg.as_bytes());
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub(crate) fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
pub(crate) fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
pub(crate) fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(size: u64) -> Session {
        Session { structured: true, base_allocation: Some(META_BASE_ALLOCATION_ID), flags: FLAG_HAS_FLAGS | FLAG_SEND_FUA | FLAG_SEND_DF, size }
    }

    fn req(typ: u16, flags: u16, offset: u64, len: u32) -> Request {
        Request { flags, typ, handle: 7, offset, len }
    }

    #[test]
    fn request_roundtrip_and_bad_magic() {
        let r = req(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
        let b = r.encode();
        assert_eq!(parse_request(&b).unwrap(), r);
        assert_eq!(r.payload_len(), 512);
        assert_eq!(req(CMD_READ, 0, 0, 512).payload_len(), 0);
        let mut bad = b;
        bad[0] ^= 1;
        assert!(matches!(parse_request(&bad), Err(ProtoError::BadRequestMagic(_))));
    }

    #[test]
    fn option_header() {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        b[12..16].copy_from_slice(&6u32.to_be_bytes());
        assert_eq!(parse_option_header(&b).unwrap(), OptionHeader { option: OPT_GO, len: 6 });
        b[0] = 0;
        assert!(matches!(parse_option_header(&b), Err(ProtoError::BadOptionMagic(_))));
    }

    #[test]
    fn validate_commands() {
        let s = session(1 << 20);
        assert_eq!(req(CMD_READ, 0, 0, 4096).validate(&s), Ok(Command::Read { offset: 0, len: 4096 }));
        assert_eq!(req(CMD_READ, CMD_FLAG_DF, 1, 1).validate(&s), Ok(Command::Read { offset: 1, len: 1 }));
        assert_eq!(req(CMD_WRITE, CMD_FLAG_FUA, 100, 10).validate(&s), Ok(Command::Write { offset: 100, len: 10, fua: true }));
        assert_eq!(req(CMD_FLUSH, 0, 0, 0).validate(&s), Ok(Command::Flush));
        assert_eq!(req(CMD_FLUSH, 0, 1, 0).validate(&s).unwrap_err().errno, EINVAL);
        assert_eq!(req(CMD_DISC, 0, 0, 0).validate(&s), Ok(Command::Disconnect));
        assert_eq!(req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 8192).validate(&s), Ok(Command::WriteZeroes { offset: 0, len: 8192, no_hole: true }));
        assert_eq!(req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20).validate(&s), Ok(Command::BlockStatus { offset: 0, len: 1 << 20, req_one: true }));
        // Unknown command, unsupported (not advertised) commands and flags.
        assert_eq!(req(99, 0, 0, 1).validate(&s).unwrap_err().errno, EINVAL);
        assert_eq!(req(CMD_CACHE, 0, 0, 1).validate(&s).unwrap_err().errno, EINVAL);
        assert_eq!(req(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1).validate(&s).unwrap_err().errno, EINVAL);
        assert_eq!(req(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 1).validate(&s).unwrap_err().errno, EINVAL);
        assert_eq!(req(CMD_WRITE, 1 << 15, 0, 1).validate(&s).unwrap_err().errno, EINVAL);
        // DF only when advertised.
        let mut s2 = s;
        s2.flags &= !FLAG_SEND_DF;
        assert_eq!(req(CMD_READ, CMD_FLAG_DF, 0, 1).validate(&s2).unwrap_err().errno, EINVAL);
        // BLOCK_STATUS needs a context.
        s2.base_allocation = None;
        assert_eq!(req(CMD_BLOCK_STATUS, 0, 0, 1).validate(&s2).unwrap_err().errno, EINVAL);
    }

    #[test]
    fn validate_ranges() {
        let s = session(1 << 20);
        // Exactly to the end is fine, one past is not.
        assert!(req(CMD_READ, 0, (1 << 20) - 1, 1).validate(&s).is_ok());
        assert_eq!(req(CMD_READ, 0, 1 << 20, 1).validate(&s).unwrap_err().errno, EINVAL);
        assert_eq!(req(CMD_WRITE, 0, 1 << 20, 1).validate(&s).unwrap_err().errno, ENOSPC);
        assert_eq!(req(CMD_WRITE_ZEROES, 0, 1 << 20, 1).validate(&s).unwrap_err().errno, ENOSPC);
        assert_eq!(req(CMD_TRIM, 0, 1 << 20, 1).validate(&s).unwrap_err().errno, EINVAL);
        assert_eq!(req(CMD_BLOCK_STATUS, 0, 1 << 20, 1).validate(&s).unwrap_err().errno, EINVAL);
        // Offset + length overflowing u64 must not wrap around.
        assert_eq!(req(CMD_READ, 0, u64::MAX, 4096).validate(&s).unwrap_err().errno, EINVAL);
        assert_eq!(req(CMD_WRITE, 0, u64::MAX - 1, 4096).validate(&s).unwrap_err().errno, ENOSPC);
        // Zero length and oversized payloads.
        assert_eq!(req(CMD_READ, 0, 0, 0).validate(&s).unwrap_err().errno, EINVAL);
        let big = session(1 << 40);
        assert_eq!(req(CMD_READ, 0, 0, MAX_PAYLOAD + 1).validate(&big).unwrap_err().errno, EINVAL);
        assert!(req(CMD_READ, 0, 0, MAX_PAYLOAD).validate(&big).is_ok());
        // Trim and zeroing are not payload-bound.
        assert!(req(CMD_TRIM, 0, 0, u32::MAX).validate(&big).is_ok());
        assert!(req(CMD_WRITE_ZEROES, 0, 0, u32::MAX).validate(&big).is_ok());
    }

    fn info_bytes(name: &[u8], reqs: &[u16]) -> Vec<u8> {
        let mut b = (name.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(name);
        b.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
        for r in reqs {
            b.extend_from_slice(&r.to_be_bytes());
        }
        b
    }

    #[test]
    fn info_request_parsing() {
        let b = info_bytes(b"disk", &[INFO_BLOCK_SIZE, INFO_NAME]);
        assert_eq!(parse_info_request(&b).unwrap(), InfoRequest { name: "disk".into(), requests: vec![INFO_BLOCK_SIZE, INFO_NAME] });
        assert_eq!(parse_info_request(&info_bytes(b"", &[])).unwrap().name, "");
        // Every truncation of a valid payload is an error, never a panic.
        for cut in 0..b.len() {
            assert!(matches!(parse_info_request(&b[..cut]), Err(OptParseError::Truncated { .. })), "cut {cut}");
        }
        let mut trailing = b.clone();
        trailing.push(0);
        assert_eq!(parse_info_request(&trailing), Err(OptParseError::Trailing(1)));
        // Name length pointing far past the end.
        let mut huge = b.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(parse_info_request(&huge), Err(OptParseError::StringTooLong(_))));
        let mut past = b.clone();
        past[0..4].copy_from_slice(&100u32.to_be_bytes());
        assert!(matches!(parse_info_request(&past), Err(OptParseError::Truncated { .. })));
        // Count claiming more requests than present.
        let mut count = info_bytes(b"x", &[1]);
        count[5..7].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(parse_info_request(&count), Err(OptParseError::Truncated { .. })));
        assert_eq!(parse_info_request(&info_bytes(b"a\0b", &[])), Err(OptParseError::BadString));
        assert_eq!(parse_info_request(&info_bytes(&[0xff, 0xfe], &[])), Err(OptParseError::BadString));
    }

    #[test]
    fn meta_query_parsing() {
        let mut b = 0u32.to_be_bytes().to_vec();
        b.extend_from_slice(&2u32.to_be_bytes());
        for q in ["base:allocation", "qemu:dirty-bitmap:x"] {
            b.extend_from_slice(&(q.len() as u32).to_be_bytes());
            b.extend_from_slice(q.as_bytes());
        }
        let m = parse_meta_query(&b).unwrap();
        assert_eq!(m.export, "");
        assert_eq!(m.queries, vec!["base:allocation".to_string(), "qemu:dirty-bitmap:x".into()]);
        for cut in 0..b.len() {
            assert!(parse_meta_query(&b[..cut]).is_err(), "cut {cut}");
        }
        let mut many = 0u32.to_be_bytes().to_vec();
        many.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(parse_meta_query(&many), Err(OptParseError::Truncated { .. })));
    }

    #[test]
    fn encoders() {
        let g = greeting();
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(be_u16(&g[16..18]), 3);
        let mut v = Vec::new();
        put_option_reply(&mut v, OPT_GO, REP_ACK, &[]);
        assert_eq!(v.len(), 20);
        assert_eq!(be_u64(&v[0..8]), OPT_REPLY_MAGIC);
        let mut e = Vec::new();
        put_error_chunk(&mut e, 9, EINVAL, "bad");
        assert_eq!(e.len(), 20 + 6 + 3);
        assert_eq!(be_u32(&e[16..20]), 9);
        assert_eq!(truncate_utf8("héllo", 2), "h");
    }
}
