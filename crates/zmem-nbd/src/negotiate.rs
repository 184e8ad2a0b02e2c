//! The fixed-newstyle handshake as an explicit state machine.
//!
//! [`Negotiation`] is pure: it is fed the client's flags and options and
//! returns the bytes to send plus what happens next ([`Step`]). The driver
//! [`negotiate`] does the I/O: it reads option headers, bounds and reads
//! their payloads, and writes the replies.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::proto::*;

/// What the server offers: one named export.
#[derive(Debug, Clone)]
pub struct ExportInfo {
    pub name: String,
    pub size: u64,
    pub description: Option<String>,
}

impl ExportInfo {
    /// Transmission flags for a session (DF only with structured replies).
    pub fn transmission_flags(&self, structured: bool) -> u16 {
        let mut f = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_CAN_MULTI_CONN;
        if structured {
            f |= FLAG_SEND_DF;
        }
        f
    }
}

/// Handshake phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HsState {
    /// Greeting sent; waiting for the client's 32-bit flags.
    AwaitClientFlags,
    /// Option haggling.
    Options,
    /// Transmission was entered, or the session ended.
    Done,
}

/// What follows an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Keep haggling.
    Continue,
    /// Enter transmission with this session.
    Transmission(Session),
    /// The client sent NBD_OPT_ABORT (already acknowledged): close.
    Abort,
}

/// Handshake state for one connection.
#[derive(Debug)]
pub struct Negotiation<'a> {
    export: &'a ExportInfo,
    state: HsState,
    client_flags: u32,
    structured: bool,
    base_allocation: bool,
    shutting_down: bool,
}

impl<'a> Negotiation<'a> {
    pub fn new(export: &'a ExportInfo) -> Self {
        Negotiation { export, state: HsState::AwaitClientFlags, client_flags: 0, structured: false, base_allocation: false, shutting_down: false }
    }

    pub fn state(&self) -> HsState {
        self.state
    }

    /// Answer further options (except ABORT) with NBD_REP_ERR_SHUTDOWN.
    pub fn set_shutting_down(&mut self) {
        self.shutting_down = true;
    }

    /// The client's flags. Unknown bits end the connection (spec: MUST).
    pub fn client_flags(&mut self, flags: u32) -> Result<(), ProtoError> {
        if self.state != HsState::AwaitClientFlags {
            return Err(ProtoError::Io(std::io::Error::other("client flags received twice")));
        }
        if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            self.state = HsState::Done;
            return Err(ProtoError::BadClientFlags(flags));
        }
        self.client_flags = flags;
        self.state = HsState::Options;
        Ok(())
    }

    fn session(&self) -> Session {
        Session {
            structured: self.structured,
            base_allocation: (self.structured && self.base_allocation).then_some(META_BASE_ALLOCATION_ID),
            flags: self.export.transmission_flags(self.structured),
            size: self.export.size,
        }
    }

    /// Handle one option; replies are appended to `out`.
    pub fn option(&mut self, opt: u32, data: &[u8], out: &mut Vec<u8>) -> Result<Step, ProtoError> {
        if self.state != HsState::Options {
            return Err(ProtoError::Io(std::io::Error::other("option outside option haggling")));
        }
        if self.shutting_down && opt != OPT_ABORT {
            return self.refuse_shutting_down(opt, out);
        }
        match opt {
            OPT_EXPORT_NAME => self.export_name(data, out),
            OPT_ABORT => self.abort(out),
            OPT_LIST => self.list(data, out),
            OPT_STRUCTURED_REPLY => self.structured_reply(data, out),
            OPT_INFO | OPT_GO => self.info_or_go(opt, data, out),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(opt, data, out),
            OPT_STARTTLS => option_error(out, opt, REP_ERR_UNSUP, "TLS is not supported by this server"),
            _ => option_error(out, opt, REP_ERR_UNSUP, &format!("option {opt} is not supported")),
        }
    }

    /// While shutting down: EXPORT_NAME (which cannot be answered with an error) ends the session, anything else gets NBD_REP_ERR_SHUTDOWN.
    fn refuse_shutting_down(&mut self, opt: u32, out: &mut Vec<u8>) -> Result<Step, ProtoError> {
        if opt == OPT_EXPORT_NAME {
            self.state = HsState::Done;
            return Err(ProtoError::Io(std::io::Error::other("server is shutting down")));
        }
        option_error(out, opt, REP_ERR_SHUTDOWN, "server is shutting down")
    }

    /// NBD_OPT_EXPORT_NAME: the old way into transmission (size, flags, and 124 zeroes unless NO_ZEROES).
    fn export_name(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<Step, ProtoError> {
        // No way to answer an error here: an unknown name ends the session.
        let name = parse_string(data).unwrap_or_else(|_| String::from_utf8_lossy(data).into_owned());
        if name != self.export.name {
            self.state = HsState::Done;
            return Err(ProtoError::UnknownExport(name));
        }
        let s = self.session();
        out.extend_from_slice(&s.size.to_be_bytes());
        out.extend_from_slice(&s.flags.to_be_bytes());
        if self.client_flags & FLAG_C_NO_ZEROES == 0 {
            out.extend_from_slice(&[0u8; 124]);
        }
        self.state = HsState::Done;
        Ok(Step::Transmission(s))
    }

    /// NBD_OPT_ABORT: acknowledged, and the session ends.
    fn abort(&mut self, out: &mut Vec<u8>) -> Result<Step, ProtoError> {
        put_option_reply(out, OPT_ABORT, REP_ACK, &[]);
        self.state = HsState::Done;
        Ok(Step::Abort)
    }

    /// NBD_OPT_LIST: the one export's name, then an ACK.
    fn list(&self, data: &[u8], out: &mut Vec<u8>) -> Result<Step, ProtoError> {
        if !data.is_empty() {
            return option_error(out, OPT_LIST, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
        }
        let mut d = (self.export.name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(self.export.name.as_bytes());
        put_option_reply(out, OPT_LIST, REP_SERVER, &d);
        put_option_reply(out, OPT_LIST, REP_ACK, &[]);
        Ok(Step::Continue)
    }

    /// NBD_OPT_STRUCTURED_REPLY: structured replies from now on.
    fn structured_reply(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<Step, ProtoError> {
        if !data.is_empty() {
            return option_error(out, OPT_STRUCTURED_REPLY, REP_ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data");
        }
        self.structured = true;
        put_option_reply(out, OPT_STRUCTURED_REPLY, REP_ACK, &[]);
        Ok(Step::Continue)
    }

    /// NBD_OPT_INFO and NBD_OPT_GO: the export's details; GO then enters transmission.
    fn info_or_go(&mut self, opt: u32, data: &[u8], out: &mut Vec<u8>) -> Result<Step, ProtoError> {
        let req = match parse_info_request(data) {
            Ok(r) => r,
            Err(e) => return option_error(out, opt, REP_ERR_INVALID, &format!("malformed INFO/GO: {e}")),
        };
        if req.name != self.export.name {
            return option_error(out, opt, REP_ERR_UNKNOWN, &format!("no export named {:?}", req.name));
        }
        let s = self.session();
        self.put_info(opt, &req.requests, &s, out);
        put_option_reply(out, opt, REP_ACK, &[]);
        if opt == OPT_GO {
            self.state = HsState::Done;
            Ok(Step::Transmission(s))
        } else {
            Ok(Step::Continue)
        }
    }

    /// The NBD_REP_INFO replies: export and block size always, name and description when asked for.
    fn put_info(&self, opt: u32, requests: &[u16], s: &Session, out: &mut Vec<u8>) {
        let mut d = INFO_EXPORT.to_be_bytes().to_vec();
        d.extend_from_slice(&s.size.to_be_bytes());
        d.extend_from_slice(&s.flags.to_be_bytes());
        put_option_reply(out, opt, REP_INFO, &d);
        let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [MIN_BLOCK, PREFERRED_BLOCK, MAX_PAYLOAD] {
            d.extend_from_slice(&v.to_be_bytes());
        }
        put_option_reply(out, opt, REP_INFO, &d);
        if requests.contains(&INFO_NAME) {
            let mut d = INFO_NAME.to_be_bytes().to_vec();
            d.extend_from_slice(self.export.name.as_bytes());
            put_option_reply(out, opt, REP_INFO, &d);
        }
        if let (true, Some(desc)) = (requests.contains(&INFO_DESCRIPTION), &self.export.description) {
            let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
            d.extend_from_slice(truncate_utf8(desc, MAX_STRING).as_bytes());
            put_option_reply(out, opt, REP_INFO, &d);
        }
    }

    /// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT: `base:allocation`, after structured replies; SET selects it.
    fn meta_context(&mut self, opt: u32, data: &[u8], out: &mut Vec<u8>) -> Result<Step, ProtoError> {
        if !self.structured {
            return option_error(out, opt, REP_ERR_INVALID, "negotiate NBD_OPT_STRUCTURED_REPLY first");
        }
        let q = match parse_meta_query(data) {
            Ok(q) => q,
            Err(e) => return option_error(out, opt, REP_ERR_INVALID, &format!("malformed meta context query: {e}")),
        };
        if q.export != self.export.name {
            return option_error(out, opt, REP_ERR_UNKNOWN, &format!("no export named {:?}", q.export));
        }
        let matched = if opt == OPT_LIST_META_CONTEXT {
            q.queries.is_empty() || q.queries.iter().any(|s| s == "base:" || s == META_BASE_ALLOCATION)
        } else {
            q.queries.iter().any(|s| s == META_BASE_ALLOCATION)
        };
        if opt == OPT_SET_META_CONTEXT {
            self.base_allocation = matched;
        }
        if matched {
            let id = if opt == OPT_SET_META_CONTEXT { META_BASE_ALLOCATION_ID } else { 0 };
            let mut d = id.to_be_bytes().to_vec();
            d.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
            put_option_reply(out, opt, REP_META_CONTEXT, &d);
        }
        put_option_reply(out, opt, REP_ACK, &[]);
        Ok(Step::Continue)
    }
}

/// An error reply to option `opt` (its message cut to 1024 bytes); haggling goes on.
fn option_error(out: &mut Vec<u8>, opt: u32, code: u32, msg: &str) -> Result<Step, ProtoError> {
    put_option_reply(out, opt, code, truncate_utf8(msg, 1024).as_bytes());
    Ok(Step::Continue)
}

/// Run the handshake on `s`. Returns the session for transmission, or `None`
/// if the client aborted.
pub fn negotiate<S: Read + Write>(s: &mut S, export: &ExportInfo, shutdown: &AtomicBool) -> Result<Option<Session>, ProtoError> {
    let mut n = Negotiation::new(export);
    s.write_all(&greeting())?;
    s.flush()?;
    let mut fl = [0u8; 4];
    read_exact_or(s, &mut fl, "client flags")?;
    n.client_flags(u32::from_be_bytes(fl))?;
    let mut out = Vec::with_capacity(256);
    loop {
        let mut hb = [0u8; OPTION_HEADER_LEN];
        read_exact_or(s, &mut hb, "option haggling")?;
        let h = parse_option_header(&hb)?;
        if shutdown.load(Ordering::Relaxed) {
            n.set_shutting_down();
        }
        out.clear();
        if h.len > MAX_OPTION_DATA {
            if h.len > MAX_OPTION_SKIP || h.option == OPT_EXPORT_NAME {
                return Err(ProtoError::OptionTooLong { option: h.option, len: h.len, max: MAX_OPTION_DATA });
            }
            skip(s, h.len as u64)?;
            put_option_reply(&mut out, h.option, REP_ERR_TOO_BIG, b"option data too large");
            s.write_all(&out)?;
            s.flush()?;
            continue;
        }
        let mut data = vec![0u8; h.len as usize];
        read_exact_or(s, &mut data, "option data")?;
        let step = n.option(h.option, &data, &mut out)?;
        s.write_all(&out)?;
        s.flush()?;
        match step {
            Step::Continue => {}
            Step::Transmission(sess) => return Ok(Some(sess)),
            Step::Abort => return Ok(None),
        }
    }
}

/// `read_exact`, turning a clean EOF into [`ProtoError::Eof`].
pub(crate) fn read_exact_or<R: Read>(r: &mut R, buf: &mut [u8], what: &'static str) -> Result<(), ProtoError> {
    r.read_exact(buf).map_err(|e| if e.kind() == std::io::ErrorKind::UnexpectedEof { ProtoError::Eof(what) } else { ProtoError::Io(e) })
}

/// Read and discard `n` bytes.
pub(crate) fn skip<R: Read>(r: &mut R, n: u64) -> Result<(), ProtoError> {
    let copied = std::io::copy(&mut r.take(n), &mut std::io::sink())?;
    if copied != n {
        return Err(ProtoError::Eof("skipping data"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export() -> ExportInfo {
        ExportInfo { name: "disk".into(), size: 1 << 20, description: Some("zmem".into()) }
    }

    /// Parse option replies from `b`: (option, type, data).
    fn replies(mut b: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            assert_eq!(be_u64(&b[0..8]), OPT_REPLY_MAGIC);
            let len = be_u32(&b[16..20]) as usize;
            v.push((be_u32(&b[8..12]), be_u32(&b[12..16]), b[20..20 + len].to_vec()));
            b = &b[20 + len..];
        }
        v
    }

    fn info_data(name: &str, reqs: &[u16]) -> Vec<u8> {
        let mut b = (name.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
        for r in reqs {
            b.extend_from_slice(&r.to_be_bytes());
        }
        b
    }

    fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
        let mut b = (name.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            b.extend_from_slice(&(q.len() as u32).to_be_bytes());
            b.extend_from_slice(q.as_bytes());
        }
        b
    }

    #[test]
    fn client_flags_checked() {
        let e = export();
        let mut n = Negotiation::new(&e);
        assert!(matches!(n.client_flags(1 << 5), Err(ProtoError::BadClientFlags(_))));
        assert_eq!(n.state(), HsState::Done);
        let mut n = Negotiation::new(&e);
        n.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).unwrap();
        assert_eq!(n.state(), HsState::Options);
        assert!(n.client_flags(1).is_err());
    }

    #[test]
    fn options_before_flags_rejected() {
        let e = export();
        let mut n = Negotiation::new(&e);
        assert!(n.option(OPT_LIST, &[], &mut Vec::new()).is_err());
    }

    #[test]
    fn go_info_list_structured_meta() {
        let e = export();
        let mut n = Negotiation::new(&e);
        n.client_flags(FLAG_C_FIXED_NEWSTYLE).unwrap();
        let mut out = Vec::new();

        assert_eq!(n.option(OPT_LIST, &[], &mut out).unwrap(), Step::Continue);
        let r = replies(&out);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].1, REP_SERVER);
        assert_eq!(&r[0].2[4..], b"disk");
        assert_eq!(r[1].1, REP_ACK);

        out.clear();
        n.option(OPT_LIST, &[1], &mut out).unwrap();
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);

        // Meta context before structured replies: invalid.
        out.clear();
        n.option(OPT_SET_META_CONTEXT, &meta_data("disk", &[META_BASE_ALLOCATION]), &mut out).unwrap();
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);

        out.clear();
        n.option(OPT_STRUCTURED_REPLY, &[], &mut out).unwrap();
        assert_eq!(replies(&out)[0].1, REP_ACK);

        out.clear();
        n.option(OPT_LIST_META_CONTEXT, &meta_data("disk", &[]), &mut out).unwrap();
        let r = replies(&out);
        assert_eq!(r[0].1, REP_META_CONTEXT);
        assert_eq!(&r[0].2[4..], META_BASE_ALLOCATION.as_bytes());
        assert_eq!(r[1].1, REP_ACK);

        out.clear();
        n.option(OPT_SET_META_CONTEXT, &meta_data("other", &[META_BASE_ALLOCATION]), &mut out).unwrap();
        assert_eq!(replies(&out)[0].1, REP_ERR_UNKNOWN);

        out.clear();
        n.option(OPT_SET_META_CONTEXT, &meta_data("disk", &[META_BASE_ALLOCATION, "x-foo:bar"]), &mut out).unwrap();
        let r = replies(&out);
        assert_eq!(r.len(), 2);
        assert_eq!(be_u32(&r[0].2[0..4]), META_BASE_ALLOCATION_ID);

        out.clear();
        n.option(OPT_SET_META_CONTEXT, &[0, 0], &mut out).unwrap();
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);

        // INFO on an unknown export, then malformed, then a good one.
        out.clear();
        n.option(OPT_INFO, &info_data("nope", &[]), &mut out).unwrap();
        assert_eq!(replies(&out)[0].1, REP_ERR_UNKNOWN);
        out.clear();
        n.option(OPT_INFO, &[0, 0, 0, 9, b'x'], &mut out).unwrap();
        assert_eq!(replies(&out)[0].1, REP_ERR_INVALID);
        out.clear();
        assert_eq!(n.option(OPT_INFO, &info_data("disk", &[INFO_NAME, INFO_DESCRIPTION]), &mut out).unwrap(), Step::Continue);
        let r = replies(&out);
        let types: Vec<u16> = r.iter().filter(|x| x.1 == REP_INFO).map(|x| be_u16(&x.2)).collect();
        assert_eq!(types, vec![INFO_EXPORT, INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION]);
        assert_eq!(be_u64(&r[0].2[2..10]), 1 << 20);
        let flags = be_u16(&r[0].2[10..12]);
        assert_ne!(flags & FLAG_CAN_MULTI_CONN, 0);
        assert_ne!(flags & FLAG_SEND_DF, 0);
        assert_eq!(be_u32(&r[1].2[2..6]), 1);
        assert_eq!(be_u32(&r[1].2[6..10]), 4096);
        assert_eq!(be_u32(&r[1].2[10..14]), 32 << 20);
        assert_eq!(r.last().unwrap().1, REP_ACK);

        // Unknown options and STARTTLS.
        for o in [OPT_STARTTLS, OPT_EXTENDED_HEADERS, 4, 12345] {
            out.clear();
            n.option(o, &[1, 2, 3], &mut out).unwrap();
            assert_eq!(replies(&out), vec![(o, REP_ERR_UNSUP, replies(&out)[0].2.clone())]);
        }

        out.clear();
        match n.option(OPT_GO, &info_data("disk", &[]), &mut out).unwrap() {
            Step::Transmission(s) => {
                assert!(s.structured);
                assert_eq!(s.base_allocation, Some(META_BASE_ALLOCATION_ID));
                assert_eq!(s.size, 1 << 20);
            }
            s => panic!("unexpected {s:?}"),
        }
        assert_eq!(n.state(), HsState::Done);
    }

    #[test]
    fn export_name_paths() {
        let e = export();
        let mut n = Negotiation::new(&e);
        n.client_flags(FLAG_C_FIXED_NEWSTYLE).unwrap();
        let mut out = Vec::new();
        assert!(matches!(n.option(OPT_EXPORT_NAME, b"nope", &mut out), Err(ProtoError::UnknownExport(_))));

        let mut n = Negotiation::new(&e);
        n.client_flags(FLAG_C_FIXED_NEWSTYLE).unwrap();
        let mut out = Vec::new();
        let s = n.option(OPT_EXPORT_NAME, b"disk", &mut out).unwrap();
        assert!(matches!(s, Step::Transmission(Session { structured: false, .. })));
        assert_eq!(out.len(), 8 + 2 + 124);

        let mut n = Negotiation::new(&e);
        n.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).unwrap();
        let mut out = Vec::new();
        n.option(OPT_EXPORT_NAME, b"disk", &mut out).unwrap();
        assert_eq!(out.len(), 10);
        assert_eq!(be_u16(&out[8..10]) & FLAG_SEND_DF, 0);
    }

    #[test]
    fn abort_and_shutdown() {
        let e = export();
        let mut n = Negotiation::new(&e);
        n.client_flags(1).unwrap();
        n.set_shutting_down();
        let mut out = Vec::new();
        n.option(OPT_GO, &info_data("disk", &[]), &mut out).unwrap();
        assert_eq!(replies(&out)[0].1, REP_ERR_SHUTDOWN);
        out.clear();
        assert_eq!(n.option(OPT_ABORT, &[], &mut out).unwrap(), Step::Abort);
        assert_eq!(replies(&out)[0].1, REP_ACK);
    }

    /// A scripted client over an in-memory pipe pair.
    struct Duplex {
        input: std::io::Cursor<Vec<u8>>,
        output: Vec<u8>,
    }
    impl Read for Duplex {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.input.read(b)
        }
    }
    impl Write for Duplex {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.output.write(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn opt_bytes(opt: u32, data: &[u8]) -> Vec<u8> {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        b
    }

    fn run(input: Vec<u8>) -> (Result<Option<Session>, ProtoError>, Vec<u8>) {
        let e = export();
        let mut d = Duplex { input: std::io::Cursor::new(input), output: Vec::new() };
        let r = negotiate(&mut d, &e, &AtomicBool::new(false));
        (r, d.output)
    }

    #[test]
    fn driver_go() {
        let mut inp = 1u32.to_be_bytes().to_vec();
        inp.extend(opt_bytes(OPT_STRUCTURED_REPLY, &[]));
        inp.extend(opt_bytes(OPT_GO, &info_data("disk", &[])));
        let (r, out) = run(inp);
        assert!(r.unwrap().unwrap().structured);
        assert_eq!(&out[0..8], b"NBDMAGIC");
    }

    #[test]
    fn driver_malformed_inputs_never_panic() {
        // Truncated at every point of a valid exchange: always an error or a session.
        let mut inp = 3u32.to_be_bytes().to_vec();
        inp.extend(opt_bytes(OPT_LIST, &[]));
        inp.extend(opt_bytes(OPT_GO, &info_data("disk", &[INFO_NAME])));
        for cut in 0..inp.len() {
            let (r, _) = run(inp[..cut].to_vec());
            assert!(r.is_err(), "cut {cut}");
        }
        assert!(run(inp).0.unwrap().is_some());

        // Bad option magic.
        let mut bad = 1u32.to_be_bytes().to_vec();
        bad.extend_from_slice(&[0u8; 16]);
        assert!(matches!(run(bad).0, Err(ProtoError::BadOptionMagic(0))));

        // Too-long option: skipped and refused if skippable, else dropped.
        let mut big = 1u32.to_be_bytes().to_vec();
        big.extend(opt_bytes(999, &vec![0u8; MAX_OPTION_DATA as usize + 1]));
        big.extend(opt_bytes(OPT_ABORT, &[]));
        let (r, out) = run(big);
        assert_eq!(r.unwrap(), None);
        let reps = replies(&out[18..]);
        assert_eq!(reps[0].1, REP_ERR_TOO_BIG);
        assert_eq!(reps[1].1, REP_ACK);
        let mut huge = 1u32.to_be_bytes().to_vec();
        huge.extend_from_slice(&IHAVEOPT.to_be_bytes());
        huge.extend_from_slice(&OPT_GO.to_be_bytes());
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(run(huge).0, Err(ProtoError::OptionTooLong { .. })));

        // Pseudo-random garbage after valid client flags.
        let mut r = zmem_testkit::XorShift::from_state(0x9E37_79B9_7F4A_7C15);
        for _ in 0..2000 {
            let mut inp = 1u32.to_be_bytes().to_vec();
            let x = r.state();
            let len = (x % 64) as usize;
            let mut prefix = opt_bytes((x >> 8) as u32 % 16, &[]);
            prefix.truncate(12);
            inp.extend(prefix);
            let start = inp.len();
            inp.resize(start + len, 0);
            r.fill(&mut inp[start..]);
            let _ = run(inp);
        }
    }
}
