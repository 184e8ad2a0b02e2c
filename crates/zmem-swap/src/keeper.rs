//! The keeper: what lets a swap device outlive its server.
//!
//! # Why
//! A swap device's pages live in its server. A kernel module never dies
//! alone; a process can (a bug, the OOM killer, an upgrade), and when the
//! FUSE connection goes with it, every process with a page on the device
//! dies of SIGBUS at its next swap-in. Two things must outlive the server:
//! the connection, and the pool.
//!
//! # How
//! `zmem swap serve` is the keeper. It mounts the FUSE filesystem and
//! makes a clone of the connection's file for each worker
//! (`zmem_fuse::Channel`), then starts the server, the same binary, with
//! those files inherited and their numbers in [`ENV`]. A server with a
//! pool that can be opened again (a ledger: `zmem_core::PoolConfig::
//! ledger_keys`) hands the keeper its arena, the memfd holding every
//! object and the ledger, over a socket pair ([`Kept::hand_over`]). The
//! keeper does no I/O and holds no page itself: it waits.
//!
//! When the server dies (any signal, any exit but a clean stop), the
//! keeper starts a new one with the same files and the arena. The new
//! server opens the pool where the old one left it (`zmem_core::Pool::
//! open`: every published page whole, what was half done freed or marked
//! lost) and takes the connection over: the kernel sends again the
//! requests the old one had read and not answered (`zmem_fuse::Start::
//! TakeOver`). The processes waiting on a swap-in see a pause. A restart
//! asked for (`zmem swap restart`, SIGHUP to the keeper) is the same with
//! the server stopped on purpose, by the binary now on disk: an upgrade.
//!
//! A server that keeps dying at once is not started again and again: past
//! [`CRASH_LIMIT`] deaths in a row of servers that ran less than
//! [`QUICK_DEATH`] each, the keeper stops trying,
//! says so, and holds the pages and the connection (the waiting processes
//! wait) until a restart is asked for or the device is turned off. A
//! server that died before it handed its arena over (or whose pool keeps
//! no ledger: a remote tier, dedup or a dictionary) cannot be followed: the keeper exits,
//! and the device fails as it did before the keeper.
//!
//! # Costs
//! The keeper is a second process, small and idle: it wakes every
//! [`TICK`] to look at its child, and its lock thread every
//! [`LOCK_EVERY`] to lock the pool's new pages (`Locker`: it maps the
//! pool's pages, which the server's memory counts already). Its memory is
//! locked as the server's is (`zmem_server::reclaim::protect`).

use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};

use crate::error::{Result, SwapError};

/// The environment variable that tells a server it was started by a
/// keeper, and which files it holds: `fuse=A,B,C;link=L[;arena=M];restarts=N`.
pub const ENV: &str = "ZMEM_SWAP_KEPT";
/// Quick deaths in a row ([`QUICK_DEATH`]) past which the keeper stops
/// starting servers: a crash loop.
pub const CRASH_LIMIT: usize = 5;
/// A server that dies sooner than this after it was started died at once
/// (its start, or the first requests it was sent, kill it); one that ran
/// longer served, and ends a run of quick deaths.
pub const QUICK_DEATH: Duration = Duration::from_secs(5);
/// The exit code of a server that left the device to the next one (a
/// restart asked for: `Served::Left`); EX_TEMPFAIL.
pub const EXIT_LEFT: i32 = 75;
/// How often the keeper looks at its server.
const TICK: Duration = Duration::from_millis(10);
/// How often the keeper locks the pool's pages the server touched since
/// (see `Locker`).
const LOCK_EVERY: Duration = Duration::from_secs(1);
/// A server asked to stop for a restart that has not exited by then is
/// killed (the new one takes over what it left, as after a crash).
const RESTART_GRACE: Duration = Duration::from_secs(5);

/// What a server started by a keeper was handed.
pub struct Kept {
    /// The FUSE connection's files (the mount's first).
    pub fds: Vec<OwnedFd>,
    /// The socket to the keeper.
    link: OwnedFd,
    /// What a server before this one handed over (its pool's arena and
    /// backing file), if one did.
    pub left: Option<Handed>,
    /// Servers the keeper started before this one.
    pub restarts: u64,
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
        Kept::parse(&v).ok_or_else(|| SwapError::Keeper(format!("{ENV}={v}: names files this server does not hold"))).map(Some)
    }

    fn parse(v: &str) -> Option<Kept> {
        let (mut fds, mut link, mut arena, mut backing, mut restarts) = (Vec::new(), None, None, None, 0);
        for part in v.split(';') {
            let (k, val) = part.split_once('=')?;
            match k {
                "fuse" => {
                    for n in val.split(',') {
                        fds.push(crate::inherit::take(n.parse().ok()?, "/dev/fuse")?);
                    }
                }
                "link" => link = Some(crate::inherit::take(val.parse().ok()?, "socket:")?),
                "arena" => arena = Some(crate::inherit::take(val.parse().ok()?, "/memfd:")?),
                "backing" => backing = Some(crate::inherit::take(val.parse().ok()?, "/")?),
                "restarts" => restarts = val.parse().ok()?,
                _ => return None,
            }
        }
        if fds.is_empty() {
            return None;
        }
        if backing.is_some() && arena.is_none() {
            return None;
        }
        Some(Kept { fds, link: link?, left: arena.map(|arena| Handed { arena, backing }), restarts })
    }

    /// Give the keeper the pool's arena (and its backing file, if it has
    /// one), so that it can start another server on them.
    pub fn hand_over(&self, arena: BorrowedFd<'_>, backing: Option<BorrowedFd<'_>>) -> Result<()> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds: Vec<BorrowedFd> = std::iter::once(arena).chain(backing).collect();
        control.push(SendAncillaryMessage::ScmRights(&fds));
        rustix::net::sendmsg(&self.link, &[IoSlice::new(b"arena")], &mut control, SendFlags::empty())
            .map_err(|e| SwapError::Keeper(format!("handing the pool's arena to the keeper: {e}")))?;
        Ok(())
    }
}

/// What a server hands its keeper, and the keeper the next server: the
/// pool's arena (its objects and ledger), and its backing file if it has
/// one.
#[derive(Debug)]
pub struct Handed {
    pub arena: OwnedFd,
    pub backing: Option<OwnedFd>,
}

/// What the server sent on `link`, if it did (non-blocking).
fn receive_handed(link: &OwnedFd) -> Option<Handed> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut buf = [0u8; 16];
    let msg = rustix::net::recvmsg(link, &mut [IoSliceMut::new(&mut buf)], &mut control, RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC).ok()?;
    let mut got = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            got.extend(fds);
        }
    }
    if &buf[..msg.bytes.min(buf.len())] != b"arena" || got.len() > 2 {
        return None;
    }
    let mut got = got.into_iter();
    Some(Handed { arena: got.next()?, backing: got.next() })
}

/// What a keeper runs.
#[derive(Clone, Debug)]
pub struct KeeperConfig {
    /// The device's directory (its `mnt/` is mounted here).
    pub dir: PathBuf,
    /// Workers the servers run: a file of the connection each.
    pub workers: usize,
    /// The server's program and arguments.
    pub server: Vec<OsString>,
}

/// Run the keeper of the device in `cfg.dir` until its server stops
/// cleanly (the device is off), or cannot be followed. SIGTERM (`stop`)
/// is passed on to the server; `restart` (SIGHUP) replaces it.
pub fn keep(cfg: &KeeperConfig, stop: &AtomicBool, restart: &AtomicBool) -> Result<()> {
    zmem_server::reclaim::protect()?;
    let mut startup_code = zmem_server::reclaim::StartupCode::new();
    let mnt = cfg.dir.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| SwapError::file("create", &mnt, e))?;
    let channel = zmem_fuse::Channel::mount(&mnt, cfg.workers, false).map_err(|source| SwapError::Mount { mnt: mnt.clone(), source })?;
    let fds: Vec<BorrowedFd> = channel.fds().collect();
    for fd in &fds {
        zmem_fuse::inheritable(fd).map_err(|e| SwapError::Keeper(format!("passing the FUSE files on: {e}")))?;
    }
    let fuse_list = fds.iter().map(|f| f.as_raw_fd().to_string()).collect::<Vec<_>>().join(",");
    let mut handed: Option<Handed> = None;
    let mut deaths = Deaths::default();
    let mut restarts = 0u64;
    // Holds the pool's pages in RAM from the hand-over on (see `Locker`).
    let mut locker: Option<Locker> = None;
    loop {
        let started = Instant::now();
        let (mut child, link) = spawn(cfg, &fuse_list, handed.as_ref(), restarts)?;
        eprintln!("zmem: keeper {}: started server {} ({})", std::process::id(), child.id(), if restarts == 0 { "new pool" } else { "taking over" });
        let (status, asked) = wait(&mut child, &link, &mut handed, &mut locker, stop, restart, &mut startup_code);
        if let Some(l) = &locker {
            // What the dead server touched last is locked by no one now.
            l.nudge();
        }
        let asked = asked || status.code() == Some(EXIT_LEFT);
        if status.success() && !asked {
            eprintln!("zmem: keeper {}: the server stopped; the device is off", std::process::id());
            return Ok(());
        }
        if handed.is_none() {
            // Nothing to start a new server on: let the connection go.
            drop(channel);
            return Err(SwapError::Keeper(format!(
                "the server exited ({status}) before it handed over its pool (a pool with a remote tier, dedup or a dictionary is not kept yet): the device is lost"
            )));
        }
        restarts += 1;
        if asked {
            eprintln!("zmem: keeper {}: restarting the server, as asked ({status})", std::process::id());
            continue;
        }
        eprintln!("zmem: keeper {}: the server died ({status}); starting another on the same pool", std::process::id());
        if deaths.died(started.elapsed()) {
            eprintln!(
                "zmem: keeper {}: {} servers in a row died within {} s of their start; not starting another. The pages are held; `zmem swap restart` tries again, `zmem swap off` ends the device",
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
                    return Err(SwapError::Keeper("stopped after a crash loop: the device's pages are lost".into()));
                }
                std::thread::sleep(TICK);
            }
        }
    }
}

/// The keeper's thread that holds the pool's pages in RAM
/// (`zmem_core::ArenaLock`), refreshed every [`LOCK_EVERY`] and when
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
            let mut said = false;
            while !matches!(nudged.recv_timeout(LOCK_EVERY), Err(std::sync::mpsc::RecvTimeoutError::Disconnected)) {
                if let Err(e) = lock.refresh(fd.as_fd()) {
                    if !std::mem::replace(&mut said, true) {
                        eprintln!("zmem: keeper: could not lock the pool's new pages ({e}); trying again every {} s", LOCK_EVERY.as_secs());
                    }
                }
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

/// What the server handed over on `link`, if it has and nothing was
/// taken yet; the lock thread started on its arena.
fn take_handed(link: &OwnedFd, handed: &mut Option<Handed>, locker: &mut Option<Locker>) {
    if handed.is_none() {
        *handed = receive_handed(link);
    }
    if locker.is_none() {
        *locker = handed.as_ref().map(|h| Locker::start(&h.arena));
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

/// Start a server on the kept files.
fn spawn(cfg: &KeeperConfig, fuse_list: &str, handed: Option<&Handed>, restarts: u64) -> Result<(Child, OwnedFd)> {
    let (mine, theirs) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .map_err(|e| SwapError::Keeper(format!("making the keeper's socket: {e}")))?;
    zmem_fuse::inheritable(&theirs).map_err(|e| SwapError::Keeper(format!("passing the socket on: {e}")))?;
    let mut env = format!("fuse={fuse_list};link={};restarts={restarts}", theirs.as_raw_fd());
    if let Some(h) = handed {
        zmem_fuse::inheritable(&h.arena).map_err(|e| SwapError::Keeper(format!("passing the arena on: {e}")))?;
        env += &format!(";arena={}", h.arena.as_raw_fd());
        if let Some(b) = &h.backing {
            zmem_fuse::inheritable(b).map_err(|e| SwapError::Keeper(format!("passing the backing file on: {e}")))?;
            env += &format!(";backing={}", b.as_raw_fd());
        }
    }
    let (exe, args) = cfg.server.split_first().ok_or(SwapError::NoServer)?;
    let child = Command::new(exe).args(args).env(ENV, env).spawn().map_err(SwapError::Spawn)?;
    Ok((child, mine))
}

/// Wait for the server to exit, passing SIGTERM on, asking it to stop on a
/// restart (killing it past [`RESTART_GRACE`]), and taking its arena;
/// returns how it exited and whether a restart was asked for.
fn wait(
    child: &mut Child,
    link: &OwnedFd,
    handed: &mut Option<Handed>,
    locker: &mut Option<Locker>,
    stop: &AtomicBool,
    restart: &AtomicBool,
    startup_code: &mut zmem_server::reclaim::StartupCode,
) -> (ExitStatus, bool) {
    use rustix::process::{kill_process, Pid, Signal};
    let pid = Pid::from_raw(child.id() as i32);
    let mut asked: Option<Instant> = None;
    loop {
        take_handed(link, handed, locker);
        match child.try_wait() {
            Ok(Some(status)) => {
                take_handed(link, handed, locker);
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
            if handed.is_none() {
                eprintln!("zmem: keeper: a restart was asked for, but the server's pool cannot be handed over: it keeps serving");
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

/// The pid of the server serving the device in `dir` now (its `ready`
/// file), if it is running.
pub(crate) fn server_pid(dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("ready")).ok()?.trim().parse().ok()?;
    crate::is_our_server(pid, dir).then_some(pid)
}

/// Replace the server of the device in `dir` (whose keeper is `keeper`)
/// with a new one, from the binary on disk now, and wait until it serves
/// (at most `limit`); returns the old server's pid and the new one's.
pub(crate) fn restart(dir: &Path, keeper: u32, limit: Duration) -> Result<(Option<u32>, u32)> {
    use rustix::process::{kill_process, Pid, Signal};
    let old = server_pid(dir);
    let pid = Pid::from_raw(keeper as i32).ok_or_else(|| SwapError::Keeper(format!("bad keeper pid {keeper}")))?;
    kill_process(pid, Signal::HUP).map_err(|e| SwapError::Keeper(format!("signalling keeper {keeper}: {e}")))?;
    let end = Instant::now() + limit;
    loop {
        if let Some(new) = server_pid(dir).filter(|&p| Some(p) != old) {
            return Ok((old, new));
        }
        if !crate::is_our_server(keeper, dir) {
            return Err(SwapError::Keeper(format!("keeper {keeper} exited during the restart; see {}", dir.join("server.log").display())));
        }
        if Instant::now() > end {
            return Err(SwapError::Keeper(format!("no new server after {} s; see {}", limit.as_secs(), dir.join("server.log").display())));
        }
        std::thread::sleep(Duration::from_millis(10));
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
        assert!(Kept::parse("link=998").is_none());
        assert!(Kept::parse("fuse=a;link=b").is_none());
        assert!(Kept::parse("what=1").is_none());
    }
}
