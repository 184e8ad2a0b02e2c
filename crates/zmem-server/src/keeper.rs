//! The keeper: what lets a device outlive its server.
//!
//! # Why
//! A device's pages live in its server. A kernel module never dies alone;
//! a process can (a bug, the OOM killer, an upgrade), and when its files
//! go with it, every process with a page on a swap device dies of SIGBUS
//! at its next swap-in, and every client of a block device loses its
//! data. Three things must outlive the server: the FUSE connection, the
//! NBD listening socket, and the pool.
//!
//! # How
//! The keeper is the process the user started (`zmem swap serve`, which
//! `zmem swap on` runs, or `zmem serve`). It starts the server, the same
//! binary with the same arguments, with the files it holds inherited and
//! their numbers in [`ENV`]. The swap keeper mounts the FUSE filesystem
//! itself ([`KeeperConfig::mount`]) and makes a clone of the connection's
//! file for each worker; `zmem serve`'s first server mounts and binds its
//! own. A server whose device can be followed hands the keeper, once, over
//! a socket pair and in one `SCM_RIGHTS` message ([`Kept::hand_over`]):
//! its pool's arena (the memfd holding every object and the ledger:
//! `zmem_core::PoolConfig::ledger_keys`) and backing file, the FUSE files
//! and the NBD listener it made. A cache of clean pages (`zmem serve
//! --origin`) hands no pool: the next server starts on an empty one and
//! fetches again. The keeper does no I/O and holds no page itself: it
//! waits.
//!
//! When the server dies (any signal, any exit but a clean stop), the
//! keeper starts a new one with the files. The new server opens the pool
//! where the old one left it (`zmem_core::Pool::open`: every published
//! page whole, what was half done freed or marked lost), takes the FUSE
//! connection over (the kernel sends again the requests the old one had
//! read and not answered: `zmem_fuse::Start::TakeOver`) and accepts on the
//! listener (clients that connected meanwhile wait in its backlog; those
//! that were connected reconnect, as `nbd-client -persist` does). A
//! restart asked for (SIGHUP to the keeper: `zmem swap restart`,
//! `systemctl reload`) is the same with the server stopped on purpose
//! (SIGUSR1: it finishes what it took and exits with [`EXIT_LEFT`]), by the
//! binary now on disk: an upgrade.
//!
//! A server that keeps dying at once is not started again and again: past
//! [`CRASH_LIMIT`] deaths in a row of servers that ran less than
//! [`QUICK_DEATH`] each, the keeper stops trying, says so, and holds the
//! pages and the files (the waiting processes wait) until a restart is
//! asked for or the device is stopped. A server that died before it
//! handed over (it failed to start, or its pool keeps no ledger: dedup)
//! cannot be followed: the keeper exits with its status, and the device fails as it did before the keeper.
//!
//! # Costs
//! The keeper is a second process, small and idle: it wakes every
//! [`TICK`] to look at its child, and its lock thread every
//! [`LOCK_EVERY`] (at most 1 % of a CPU) to lock the pool's new pages (`Locker`: it maps the
//! pool's pages, which the server's memory counts already). Its memory is
//! locked as the server's is ([`crate::reclaim::protect`]).

use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};

/// The environment variable that tells a server it was started by a
/// keeper, and which files it holds:
/// `[fuse=A,B,C;][listen=L;]link=K[;arena=M[;backing=B]];restarts=N`.
pub const ENV: &str = "ZMEM_KEPT";
/// Quick deaths in a row ([`QUICK_DEATH`]) past which the keeper stops
/// starting servers: a crash loop.
pub const CRASH_LIMIT: usize = 5;
/// A server that dies sooner than this after it was started died at once
/// (its start, or the first requests it was sent, kill it); one that ran
/// longer served, and ends a run of quick deaths.
pub const QUICK_DEATH: Duration = Duration::from_secs(5);
/// The exit code of a server that left the device to the next one (a
/// restart asked for: [`Served::Left`]); EX_TEMPFAIL.
pub const EXIT_LEFT: i32 = 75;
/// How often the keeper looks at its server.
const TICK: Duration = Duration::from_millis(10);
/// How often the keeper locks the pool's pages the server touched since
/// (see `Locker`), at most: a refresh goes over every page of the pool, so
/// a large pool's come less often ([`LOCK_SHARE`]).
const LOCK_EVERY: Duration = Duration::from_secs(1);
/// The share of a CPU the lock thread may spend: the wait after a refresh
/// is at least this many times the refresh's own time.
const LOCK_SHARE: u32 = 100;
/// A server asked to stop for a restart that has not exited by then is
/// killed (the new one takes over what it left, as after a crash).
const RESTART_GRACE: Duration = Duration::from_secs(5);
/// The most FUSE files a hand-over carries (the mount's and 64 clones).
const MAX_FUSE: usize = 65;
/// The most files a hand-over carries in all.
const MAX_FILES: usize = MAX_FUSE + 3;

/// Why the keeper, or a server's part in it, failed.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    #[error("{ENV}={0}: names files this server does not hold (it is set by a zmem keeper for the server it starts; unset it)")]
    BadEnv(String),
    #[error("handing the device's files to the keeper: {0}")]
    HandOver(#[source] rustix::io::Errno),
    #[error("passing the device's files to the next server: {0}")]
    Inherit(#[source] std::io::Error),
    #[error("making the keeper's socket: {0}")]
    Socket(#[source] rustix::io::Errno),
    #[error("cannot mount the FUSE filesystem at {}: {source}", .mnt.display())]
    Mount {
        mnt: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no server command to start")]
    NoServer,
    #[error("cannot start the server: {0}")]
    Spawn(#[source] std::io::Error),
    /// The server exited before it handed over: nothing to start another
    /// on (its own log says why).
    #[error(
        "the server exited ({status}) and had handed nothing over: it failed to start (its messages above say why), \
         or it served a pool that is not kept (dedup), whose pages are lost"
    )]
    ServerExited { status: ExitStatus },
    #[error("stopped after a crash loop: the device's pages are lost")]
    StoppedInCrashLoop,
    #[error(transparent)]
    Lock(#[from] crate::reclaim::LockError),
}

impl KeeperError {
    /// The exit code the keeper's process should end with: the server's,
    /// where it died of its own failure, so that a caller sees it.
    pub fn exit_code(&self) -> i32 {
        match self {
            KeeperError::ServerExited { status } => status.code().filter(|&c| c != 0).unwrap_or(1),
            _ => 1,
        }
    }
}

type Result<T, E = KeeperError> = std::result::Result<T, E>;

/// How a server ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// Stopped: the device is off.
    Stopped,
    /// Left the device to the next server (a restart): exit with
    /// [`EXIT_LEFT`].
    Left,
}

/// A server's pool, as its builder made it: new, or opened from the
/// [`PoolFiles`] the server before it left.
pub struct Built {
    pub pool: zmem_core::Pool,
    pub comp: zmem_core::Compressor,
    /// What opening the pool the last server left found.
    pub reopened: Option<zmem_core::Reopened>,
    /// The pool's backing file, for the keeper to hold (a new pool's).
    pub backing: Option<OwnedFd>,
}

impl Built {
    /// What `zmem stat` says of this start ([`crate::protocol::Recovery`]),
    /// for a server the keeper started after `restarts` others.
    pub fn recovery(&self, restarts: u64) -> crate::protocol::Recovery {
        let r = self.reopened.as_ref();
        crate::protocol::Recovery {
            restarts,
            took_ns: r.map_or(0, |r| r.took.as_nanos() as u64),
            pages: r.map_or(0, |r| r.pages),
            strays_freed: r.map_or(0, |r| r.strays_freed),
            lost_pages: r.map_or(0, |r| r.lost),
            state_version: if self.pool.arena().is_some() { zmem_core::STATE_VERSION } else { 0 },
        }
    }
}

/// A pool's files: its arena (objects and ledger) and its backing file.
#[derive(Debug)]
pub struct PoolFiles {
    pub arena: OwnedFd,
    pub backing: Option<OwnedFd>,
}

/// What a server started by a keeper was handed.
pub struct Kept {
    /// The FUSE connection's files (the mount's first), if the device has
    /// one and it was mounted before this server.
    pub fuse: Vec<OwnedFd>,
    /// The NBD listening socket a server before this one bound.
    pub listen: Option<OwnedFd>,
    /// The socket to the keeper.
    link: OwnedFd,
    /// The pool a server before this one left, if one did.
    pub left: Option<PoolFiles>,
    /// Servers the keeper started before this one.
    pub restarts: u64,
}

/// What a server hands its keeper, once, when it serves: what the next
/// server needs that this one made.
#[derive(Default)]
pub struct HandOver<'a> {
    /// The pool's arena and backing file (none for a cache of clean pages,
    /// which the next server starts empty).
    pub pool: Option<(BorrowedFd<'a>, Option<BorrowedFd<'a>>)>,
    /// The FUSE connection's files, if this server mounted it.
    pub fuse: Vec<BorrowedFd<'a>>,
    /// The NBD listener, if this server bound it.
    pub listen: Option<BorrowedFd<'a>>,
}

static TAKEN: AtomicBool = AtomicBool::new(false);

impl Kept {
    /// The hand-over, if this process was started by a keeper (once a
    /// process; `None` after). A hand-over that names files this process
    /// does not hold is an error.
    pub fn take() -> Result<Option<Kept>> {
        let Some(v) = std::env::var_os(ENV) else { return Ok(None) };
        if TAKEN.swap(true, Ordering::SeqCst) {
            return Ok(None);
        }
        let v = v.to_string_lossy().into_owned();
        Kept::parse(&v).ok_or(KeeperError::BadEnv(v)).map(Some)
    }

    fn parse(v: &str) -> Option<Kept> {
        let (mut fuse, mut listen, mut link, mut arena, mut backing, mut restarts) = (Vec::new(), None, None, None, None, 0);
        for part in v.split(';') {
            let (k, val) = part.split_once('=')?;
            match k {
                "fuse" => {
                    for n in val.split(',') {
                        fuse.push(crate::inherit::take(n.parse().ok()?, "/dev/fuse")?);
                    }
                }
                "listen" => listen = Some(crate::inherit::take(val.parse().ok()?, "socket:")?),
                "link" => link = Some(crate::inherit::take(val.parse().ok()?, "socket:")?),
                "arena" => arena = Some(crate::inherit::take(val.parse().ok()?, "/memfd:")?),
                "backing" => backing = Some(crate::inherit::take(val.parse().ok()?, "/")?),
                "restarts" => restarts = val.parse().ok()?,
                _ => return None,
            }
        }
        if backing.is_some() && arena.is_none() {
            return None;
        }
        Some(Kept { fuse, listen, link: link?, left: arena.map(|arena| PoolFiles { arena, backing }), restarts })
    }

    /// Give the keeper what the next server needs (see [`HandOver`]), so
    /// that it can start one when this one dies. A server hands over once,
    /// and only what makes its device one that can be followed.
    pub fn hand_over(&self, h: &HandOver<'_>) -> Result<()> {
        let mut kinds = Vec::new();
        let mut fds: Vec<BorrowedFd> = Vec::new();
        if let Some((arena, backing)) = h.pool {
            kinds.push(b'a');
            fds.push(arena);
            if let Some(b) = backing {
                kinds.push(b'b');
                fds.push(b);
            }
        }
        for f in h.fuse.iter().take(MAX_FUSE) {
            kinds.push(b'f');
            fds.push(*f);
        }
        if let Some(l) = h.listen {
            kinds.push(b'l');
            fds.push(l);
        }
        let mut payload = b"hand:".to_vec();
        payload.extend_from_slice(&kinds);
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FILES))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            control.push(SendAncillaryMessage::ScmRights(&fds));
        }
        rustix::net::sendmsg(&self.link, &[IoSlice::new(&payload)], &mut control, SendFlags::empty()).map_err(KeeperError::HandOver)?;
        Ok(())
    }
}

/// What a server handed its keeper: the device can be followed.
#[derive(Debug, Default)]
struct Handed {
    pool: Option<PoolFiles>,
    fuse: Vec<OwnedFd>,
    listen: Option<OwnedFd>,
}

/// What the server sent on `link`, if it did (non-blocking), and if it is
/// a hand-over of the form [`Kept::hand_over`] sends.
fn receive_handed(link: &OwnedFd) -> Option<Handed> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FILES))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut buf = [0u8; 8 + MAX_FILES];
    let msg = rustix::net::recvmsg(link, &mut [IoSliceMut::new(&mut buf)], &mut control, RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC).ok()?;
    let mut got = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            got.extend(fds);
        }
    }
    let kinds = buf[..msg.bytes.min(buf.len())].strip_prefix(b"hand:")?;
    parse_handed(kinds, got)
}

/// A hand-over from the kinds its message names (one byte a file: `a`
/// arena, `b` backing, `f` FUSE, `l` listener) and its files; `None` if
/// they do not match one another or the form.
fn parse_handed(kinds: &[u8], fds: Vec<OwnedFd>) -> Option<Handed> {
    if kinds.len() != fds.len() {
        return None;
    }
    let mut h = Handed::default();
    let mut backing = None;
    for (k, fd) in kinds.iter().zip(fds) {
        match k {
            b'a' if h.pool.is_none() => h.pool = Some(PoolFiles { arena: fd, backing: None }),
            b'b' if backing.is_none() => backing = Some(fd),
            b'f' if h.fuse.len() < MAX_FUSE => h.fuse.push(fd),
            b'l' if h.listen.is_none() => h.listen = Some(fd),
            _ => return None,
        }
    }
    match (&mut h.pool, backing) {
        (Some(p), b) => p.backing = b,
        (None, Some(_)) => return None,
        (None, None) => {}
    }
    Some(h)
}

/// What a keeper runs.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    /// A FUSE filesystem the keeper mounts here before the first server,
    /// with a file of the connection for each of this many workers (the
    /// swap device's); `None`: the first server mounts its own, if any,
    /// and hands it over.
    pub mount: Option<(PathBuf, usize)>,
    /// The server's program and arguments.
    pub server: Vec<OsString>,
}

/// The files the keeper holds and passes on.
#[derive(Default)]
struct Held {
    fuse: Vec<OwnedFd>,
    listen: Option<OwnedFd>,
    /// What the server handed over: `Some` once the device can be followed.
    handed: Option<Option<PoolFiles>>,
}

impl Held {
    /// Take what the server handed over on `link`, if it has and nothing
    /// was taken yet; the lock thread started on its arena.
    fn take_handed(&mut self, link: &OwnedFd, locker: &mut Option<Locker>) {
        if self.handed.is_none() {
            if let Some(h) = receive_handed(link) {
                if self.fuse.is_empty() {
                    self.fuse = h.fuse;
                }
                if self.listen.is_none() {
                    self.listen = h.listen;
                }
                self.handed = Some(h.pool);
            }
        }
        if locker.is_none() {
            *locker = self.handed.as_ref().and_then(|p| p.as_ref()).map(|p| Locker::start(&p.arena));
        }
    }
}

/// Run the keeper until its server stops cleanly (the device is off), or
/// cannot be followed. SIGTERM or SIGINT (`stop`) is passed on to the
/// server; `restart` (SIGHUP) replaces it.
pub fn keep(cfg: &KeeperConfig, stop: &AtomicBool, restart: &AtomicBool) -> Result<()> {
    crate::reclaim::protect()?;
    let mut startup_code = crate::reclaim::StartupCode::new();
    let mut held = Held::default();
    if let Some((mnt, workers)) = &cfg.mount {
        std::fs::create_dir_all(mnt).map_err(|source| KeeperError::Mount { mnt: mnt.clone(), source })?;
        let channel = zmem_fuse::Channel::mount(mnt, *workers, false).map_err(|source| KeeperError::Mount { mnt: mnt.clone(), source })?;
        for fd in channel.fds() {
            held.fuse.push(fd.try_clone_to_owned().map_err(KeeperError::Inherit)?);
        }
    }
    let mut deaths = Deaths::default();
    let mut restarts = 0u64;
    // Holds the pool's pages in RAM from the hand-over on (see `Locker`).
    let mut locker: Option<Locker> = None;
    loop {
        let started = Instant::now();
        let (mut child, link) = spawn(cfg, &held, restarts)?;
        eprintln!("zmem: keeper {}: started server {} ({})", std::process::id(), child.id(), if restarts == 0 { "new pool" } else { "taking over" });
        let (status, asked) = wait(&mut child, &link, &mut held, &mut locker, stop, restart, &mut startup_code);
        if let Some(l) = &locker {
            // What the dead server touched last is locked by no one now.
            l.nudge();
        }
        let asked = asked || status.code() == Some(EXIT_LEFT);
        if status.success() && !asked {
            eprintln!("zmem: keeper {}: the server stopped; the device is off", std::process::id());
            return Ok(());
        }
        if held.handed.is_none() {
            // Nothing to start a new server on: let the files go.
            return Err(KeeperError::ServerExited { status });
        }
        restarts += 1;
        if asked {
            eprintln!("zmem: keeper {}: restarting the server, as asked ({status})", std::process::id());
            continue;
        }
        eprintln!("zmem: keeper {}: the server died ({status}); starting another on the same pool", std::process::id());
        if deaths.died(started.elapsed()) {
            eprintln!(
                "zmem: keeper {}: {} servers in a row died within {} s of their start; not starting another. The pages are held; a restart (SIGHUP to the keeper: `zmem swap restart`, `systemctl reload`) tries again, SIGTERM ends the device",
                std::process::id(),
                CRASH_LIMIT + 1,
                QUICK_DEATH.as_secs()
            );
            loop {
                if restart.swap(false, Ordering::SeqCst) {
                    deaths = Deaths::default();
                    break;
                }
                if stop.swap(false, Ordering::SeqCst) {
                    return Err(KeeperError::StoppedInCrashLoop);
                }
                std::thread::sleep(TICK);
            }
        }
    }
}

/// The keeper's thread that holds the pool's pages in RAM
/// (`zmem_core::ArenaLock`), refreshed every [`LOCK_EVERY`] (or less
/// often, so as to spend at most 1/[`LOCK_SHARE`] of a CPU) and when
/// nudged (a server died). A server locks the pages it touches
/// (`mlockall(MCL_ONFAULT)`), a dead one none: without this, a page of the
/// arena that no live server had touched could be reclaimed onto the very
/// device it belongs to, and the next server, which must read it to open
/// the pool, would wait on itself. The thread, not the keeper's loop, waits
/// should a page already be out (it comes back through the server).
/// (One that could not start says so once and is a no-op.)
struct Locker {
    nudge: Option<std::sync::mpsc::Sender<()>>,
}

impl Locker {
    fn start(arena: &OwnedFd) -> Locker {
        let fd = match arena.try_clone() {
            Ok(f) => f,
            Err(e) => {
                eprintln!("zmem: keeper: could not lock the pool's pages ({e}): pages no server touches may be swapped out");
                return Locker { nudge: None };
            }
        };
        let (nudge, nudged) = std::sync::mpsc::channel::<()>();
        let run = move || {
            let mut lock = match zmem_core::ArenaLock::take(fd.as_fd()) {
                Ok(l) => l,
                Err(e) => return eprintln!("zmem: keeper: could not lock the pool's pages ({e}): pages no server touches may be swapped out"),
            };
            let (mut said, mut every) = (false, LOCK_EVERY);
            while !matches!(nudged.recv_timeout(every), Err(std::sync::mpsc::RecvTimeoutError::Disconnected)) {
                let t = Instant::now();
                if let Err(e) = lock.refresh(fd.as_fd()) {
                    if !std::mem::replace(&mut said, true) {
                        eprintln!("zmem: keeper: could not lock the pool's new pages ({e}); trying again");
                    }
                }
                every = LOCK_EVERY.max(t.elapsed() * LOCK_SHARE);
            }
        };
        match std::thread::Builder::new().name("zmem-keeper-lock".into()).spawn(run) {
            Ok(_) => Locker { nudge: Some(nudge) },
            Err(e) => {
                eprintln!("zmem: keeper: could not start its lock thread ({e}): pages no server touches may be swapped out");
                Locker { nudge: None }
            }
        }
    }

    fn nudge(&self) {
        if let Some(n) = &self.nudge {
            let _ = n.send(());
        }
    }
}

/// The servers' quick deaths in a row: a crash loop is more than
/// [`CRASH_LIMIT`] of them.
#[derive(Default)]
struct Deaths(usize);

impl Deaths {
    /// Count the death of a server that ran for `ran`; whether that makes
    /// a crash loop.
    fn died(&mut self, ran: Duration) -> bool {
        self.0 = if ran < QUICK_DEATH { self.0 + 1 } else { 0 };
        self.0 > CRASH_LIMIT
    }
}

/// Start a server on the held files.
fn spawn(cfg: &KeeperConfig, held: &Held, restarts: u64) -> Result<(Child, OwnedFd)> {
    let (mine, theirs) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).map_err(KeeperError::Socket)?;
    let pass = |fd: BorrowedFd<'_>| zmem_fuse::inheritable(fd).map(|()| fd.as_raw_fd().to_string()).map_err(KeeperError::Inherit);
    let mut env = Vec::new();
    if !held.fuse.is_empty() {
        let fuse = held.fuse.iter().map(|f| pass(f.as_fd())).collect::<Result<Vec<_>>>()?;
        env.push(format!("fuse={}", fuse.join(",")));
    }
    if let Some(l) = &held.listen {
        env.push(format!("listen={}", pass(l.as_fd())?));
    }
    env.push(format!("link={}", pass(theirs.as_fd())?));
    if let Some(Some(p)) = &held.handed {
        env.push(format!("arena={}", pass(p.arena.as_fd())?));
        if let Some(b) = &p.backing {
            env.push(format!("backing={}", pass(b.as_fd())?));
        }
    }
    env.push(format!("restarts={restarts}"));
    let (exe, args) = cfg.server.split_first().ok_or(KeeperError::NoServer)?;
    let child = Command::new(exe).args(args).env(ENV, env.join(";")).spawn().map_err(KeeperError::Spawn)?;
    Ok((child, mine))
}

/// Wait for the server to exit, passing SIGTERM on, asking it to stop on a
/// restart (killing it past [`RESTART_GRACE`]), and taking what it hands
/// over; returns how it exited and whether a restart was asked for.
fn wait(
    child: &mut Child,
    link: &OwnedFd,
    held: &mut Held,
    locker: &mut Option<Locker>,
    stop: &AtomicBool,
    restart: &AtomicBool,
    startup_code: &mut crate::reclaim::StartupCode,
) -> (ExitStatus, bool) {
    use rustix::process::{kill_process, Pid, Signal};
    let pid = Pid::from_raw(child.id() as i32);
    let mut asked: Option<Instant> = None;
    loop {
        held.take_handed(link, locker);
        match child.try_wait() {
            Ok(Some(status)) => {
                held.take_handed(link, locker);
                return (status, asked.is_some());
            }
            Ok(None) => {}
            Err(e) => eprintln!("zmem: keeper: waiting for the server: {e}"),
        }
        if stop.swap(false, Ordering::SeqCst) {
            if let Some(p) = pid {
                let _ = kill_process(p, Signal::TERM);
            }
        }
        if asked.is_none() && restart.swap(false, Ordering::SeqCst) {
            if held.handed.is_none() {
                eprintln!("zmem: keeper: a restart was asked for, but the server's device cannot be handed over: it keeps serving");
            } else {
                asked = Some(Instant::now());
                if let Some(p) = pid {
                    let _ = kill_process(p, Signal::USR1);
                }
            }
        }
        if asked.is_some_and(|t| t.elapsed() > RESTART_GRACE) {
            if let Some(p) = pid {
                let _ = kill_process(p, Signal::KILL);
            }
        }
        if let Some(Err(e)) = startup_code.tick() {
            eprintln!("zmem: keeper: could not give back the start-up code ({e})");
        }
        std::thread::sleep(TICK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_loop_is_too_many_quick_deaths_in_a_row() {
        let quick = QUICK_DEATH / 2;
        let mut d = Deaths::default();
        for i in 0..CRASH_LIMIT {
            assert!(!d.died(quick), "death {i}");
        }
        assert!(d.died(quick), "one more in a row");
        // A server that served in between ends the run; servers killed
        // after they served never make a loop, however often.
        let mut d = Deaths::default();
        for i in 0..100 {
            let ran = if i % CRASH_LIMIT == 0 { QUICK_DEATH } else { quick };
            assert!(!d.died(ran), "death {i}");
        }
    }

    #[test]
    fn a_hand_over_naming_files_not_held_is_refused() {
        assert!(Kept::parse("fuse=999;link=998").is_none(), "files not open");
        assert!(Kept::parse("fuse=0;link=1").is_none(), "stdin and stdout are not the keeper's");
        assert!(Kept::parse("fuse=3").is_none(), "no link");
        assert!(Kept::parse("fuse=a;link=b").is_none());
        assert!(Kept::parse("what=1").is_none());
    }

    fn files(n: usize) -> Vec<OwnedFd> {
        (0..n).map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap())).collect()
    }

    #[test]
    fn a_hand_over_is_taken_only_whole_and_in_its_form() {
        let h = parse_handed(b"abffl", files(5)).expect("a pool with its backing file, two FUSE files and a listener");
        assert!(h.pool.as_ref().is_some_and(|p| p.backing.is_some()) && h.fuse.len() == 2 && h.listen.is_some());
        let h = parse_handed(b"l", files(1)).expect("a clean cache's listener alone");
        assert!(h.pool.is_none() && h.listen.is_some());
        assert!(parse_handed(b"", Vec::new()).is_some_and(|h| h.pool.is_none()), "nothing: a device that can be followed with no files");
        for (kinds, n, why) in [
            (&b"ab"[..], 1, "fewer files than kinds"),
            (b"a", 2, "more files than kinds"),
            (b"b", 1, "a backing file without an arena"),
            (b"aa", 2, "two arenas"),
            (b"ll", 2, "two listeners"),
            (b"x", 1, "an unknown kind"),
        ] {
            assert!(parse_handed(kinds, files(n)).is_none(), "{why}");
        }
        assert!(parse_handed(&[b'f'; MAX_FUSE + 1], files(MAX_FUSE + 1)).is_none(), "too many FUSE files");
    }

    #[test]
    fn a_server_s_failure_is_the_keeper_s_exit_code() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(KeeperError::ServerExited { status: ExitStatus::from_raw(3 << 8) }.exit_code(), 3);
        assert_eq!(KeeperError::ServerExited { status: ExitStatus::from_raw(9) }.exit_code(), 1, "killed by a signal");
        assert_eq!(KeeperError::NoServer.exit_code(), 1);
    }
}
