//! FUSE over io_uring: the kernel's second transport (`CONFIG_FUSE_IO_URING`,
//! Linux 6.14 and later), for the requests of the image's file.
//!
//! # Design
//! The classic transport costs two syscalls a request (a read of
//! `/dev/fuse`, a write of the answer) and a wake-up of whichever worker
//! reads next, on whichever CPU it slept. Over io_uring the kernel keeps a
//! queue per CPU: a request goes to the queue of the CPU that issues it
//! (for a swap device, the CPU the loop device's worker runs on) and is
//! handed to a free ring entry of that queue, whose thread here the kernel
//! wakes; one `io_uring_enter` answers a request and waits for the next
//! (`COMMIT_AND_FETCH`). The threads are not pinned to their queue's CPU:
//! pinned, a synchronous read answered a little sooner, but when one CPU
//! issued most requests (a reader and the loop workers on it) that CPU
//! served them all while the other idled, and parallel reads lost a third
//! of their rate (`zmem bench blockdev`); unpinned, the scheduler runs a
//! woken thread where it was woken when that CPU is free, and elsewhere
//! when it is not.
//!
//! A queue has the configured number of threads (the FUSE workers' count),
//! each with its own ring of [`DEPTH`] entries: a request that waits on the
//! disk (a page read back from the backing file) holds its thread, and
//! with one thread a CPU every other request issued on that CPU waited
//! behind it, while the threads of the other CPUs idled. An entry is two
//! buffers the kernel
//! writes requests into and reads answers from: a header (`fuse_in_header`
//! or `fuse_out_header`, the opcode's fixed argument, and the entry's own
//! fields: the commit id and the payload's length) and a payload as large
//! as the largest request (`max_write`). A READ's data is read straight
//! into the payload: no copy in this process.
//!
//! # Setup and teardown
//! The rings and buffers are made before the mount (so a machine without
//! io_uring fails before the kernel has been told to use it); INIT goes
//! through fuser and asks for `FUSE_OVER_IO_URING`; then every queue's
//! thread registers its entries (`REGISTER`, retried while the kernel has
//! not finished INIT). Until every queue has an entry, the kernel holds new
//! requests; a register the kernel refuses turns io_uring off for the
//! connection and requests go on through `/dev/fuse`. Forgets and
//! interrupts always do (fuser's workers serve them). At unmount the
//! kernel ends every entry with `ENOTCONN`; a thread returns once all its
//! entries have ended, and only then frees their buffers, which the kernel
//! may write until then. A thread that must stop earlier leaks them.
//!
//! # Trade-offs
//! threads × [`DEPTH`] × (payload + header) bytes a CPU, locked with the
//! server's memory, and that many threads a CPU. The module parameter
//! `/sys/module/fuse/parameters/enable_uring` is the operator's (it is
//! system-wide): [`enabled`] reads it and the caller refuses to start
//! without it rather than set it. valgrind's memcheck cannot run this
//! transport (3.19 keeps its thread lock through `io_uring_enter`, and the
//! other threads, fuser's INIT among them, stall): the unsafe blocks here
//! are covered by the root tests (`tests/mount.rs`, zmem's swap tests),
//! not by memcheck.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::proto::{self, InHeader};
use crate::FileOps;

/// Entries per ring: requests a thread can hold at once.
pub(crate) const DEPTH: usize = 2;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the kernel's FUSE-over-io_uring transport is switched on.
pub(crate) fn enabled() -> bool {
    std::fs::read_to_string(PARAM).is_ok_and(|v| v.trim() == "Y")
}

/// The kernel's queues: one per possible CPU (`num_possible_cpus`).
fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let mut n = 0;
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.split('-').map(|x| x.parse::<usize>().ok());
        match (ends.next().flatten(), ends.next().flatten()) {
            (Some(a), Some(b)) if b >= a => n += b - a + 1,
            (Some(_), None) => n += 1,
            _ => {}
        }
    }
    n.max(1)
}

/// `struct fuse_uring_req_header`: in/out header, the opcode's argument,
/// and `struct fuse_uring_ent_in_out`.
#[repr(C, align(8))]
struct Header {
    in_out: [u8; 128],
    op_in: [u8; 128],
    /// flags u64, commit_id u64, payload_sz u32, padding u32, reserved u64.
    ent: [u8; 32],
}

/// `struct iovec` on a 64-bit kernel, as plain integers (the addresses are
/// the slot's own buffers, which move with it between threads).
#[repr(C)]
struct IoVec {
    base: u64,
    len: u64,
}

/// One ring entry's buffers, and the iovecs that name them to the kernel.
struct Slot {
    header: Box<Header>,
    payload: Vec<u8>,
    iov: Box<[IoVec; 2]>,
    ended: bool,
}

/// A CPU's queue, made before the mount.
pub(crate) struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    slots: Vec<Slot>,
}

/// Make `per_cpu` rings for every possible CPU's queue, with `payload`
/// bytes a request.
pub(crate) fn prepare(payload: usize, per_cpu: usize) -> io::Result<Vec<Queue>> {
    (0..possible_cpus() * per_cpu.max(1))
        .map(|i| {
            let qid = i % possible_cpus();
            // Made whole here, so that nothing the thread must do before
            // its entries are registered can fail for long: once INIT has
            // asked for io_uring, the kernel holds every request until each
            // queue has an entry. (A single-issuer ring would have to be
            // enabled by its thread, one more step that could fail there.)
            // Cooperative task work: the kernel copies a request in when the
            // thread next enters it, without interrupting it.
            let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().setup_coop_taskrun().build(2 * DEPTH as u32)?;
            let slots = (0..DEPTH)
                .map(|_| {
                    let mut header = Box::new(Header { in_out: [0; 128], op_in: [0; 128], ent: [0; 32] });
                    // Written, so the pages are there before the server locks
                    // its memory (a read into them must never fault).
                    let mut payload = vec![0xa5u8; payload];
                    let iov = Box::new([
                        IoVec { base: &mut *header as *mut Header as u64, len: size_of::<Header>() as u64 },
                        IoVec { base: payload.as_mut_ptr() as u64, len: payload.len() as u64 },
                    ]);
                    Slot { header, payload, iov, ended: false }
                })
                .collect();
            Ok(Queue { qid: qid as u16, ring, slots })
        })
        .collect()
}

/// The 80-byte command area: `struct fuse_uring_cmd_req`.
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// Offset of `len` in `struct io_uring_sqe`.
const SQE_LEN: usize = 24;

impl Queue {
    fn register_sqe(&self, fd: i32, i: usize) -> squeue::Entry128 {
        let e = opcode::UringCmd80::new(types::Fd(fd), CMD_REGISTER)
            .cmd(cmd_req(0, self.qid))
            .addr(Some(self.slots[i].iov.as_ptr() as u64))
            .build()
            .user_data(i as u64);
        // The kernel wants the iovec count in the SQE's `len`, which the
        // crate's builder does not set.
        // SAFETY: Entry128 is `repr(C)` over the kernel's 128-byte SQE
        // (plain integers and unions of them, all initialised by `build`),
        // so it and `[u8; 128]` have the same size and every bit pattern is
        // valid for both.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        raw[SQE_LEN..SQE_LEN + 4].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: as above.
        unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
    }

    fn commit_sqe(&self, fd: i32, i: usize, commit_id: u64) -> squeue::Entry128 {
        opcode::UringCmd80::new(types::Fd(fd), CMD_COMMIT_AND_FETCH).cmd(cmd_req(commit_id, self.qid)).build().user_data(i as u64)
    }

    fn push(&mut self, e: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: the buffers the entry names (the slot's iovecs, header and
        // payload) live in `self.slots` until this queue is dropped, and
        // `serve` drops it only once the kernel has ended every entry (else
        // it leaks them); the queue has room for every slot's one command.
        unsafe { self.ring.submission().push(e) }.map_err(|_| io::Error::other("io_uring submission queue full"))
    }

    /// Answer the request in slot `i`; returns its commit id.
    fn answer(&mut self, i: usize, ops: &FileOps) -> u64 {
        ops.stats.uring_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let s = &mut self.slots[i];
        let commit_id = u64::from_ne_bytes(s.header.ent[8..16].try_into().unwrap_or_default());
        let len = u32::from_ne_bytes(s.header.ent[16..20].try_into().unwrap_or_default()) as usize;
        let (error, out_len, unique) = match InHeader::parse(&s.header.in_out) {
            Some(h) => {
                let (error, n) = proto::dispatch(ops, &h, &s.header.op_in, &mut s.payload, len);
                (error, n, h.unique)
            }
            None => (-libc::EINVAL, 0, commit_id),
        };
        s.header.in_out[..proto::OUT_HEADER].copy_from_slice(&proto::out_header(unique, error, out_len));
        s.header.ent[16..20].copy_from_slice(&(out_len as u32).to_ne_bytes());
        commit_id
    }
}

/// The queues' threads; [`Threads::join`] after the unmount.
pub(crate) struct Threads(Vec<JoinHandle<()>>);

/// Start a thread per ring, serving `ops` on the FUSE connection `fd`.
pub(crate) fn start(queues: Vec<Queue>, fd: OwnedFd, ops: Arc<FileOps>) -> io::Result<Threads> {
    let fd = Arc::new(fd);
    let mut threads = Vec::new();
    for q in queues {
        let (fd, ops) = (Arc::clone(&fd), Arc::clone(&ops));
        let name = format!("fuse-uring-{}.{}", q.qid, threads.len());
        threads.push(std::thread::Builder::new().name(name).spawn(move || serve(q, &fd, &ops))?);
    }
    Ok(Threads(threads))
}

impl Threads {
    /// Wait (up to `limit`) for the threads, which end once the kernel has
    /// ended their entries at unmount; a thread still running is left (and
    /// keeps its buffers).
    pub(crate) fn join(self, limit: Duration) {
        crate::join_within(self.0, limit, "a FUSE io_uring thread");
    }
}

fn serve(mut q: Queue, fd: &OwnedFd, ops: &FileOps) {
    let raw = fd.as_raw_fd();
    let mut registered = vec![false; q.slots.len()];
    // Completions of one wait; at most one a slot, so never grown after
    // this.
    let mut done: Vec<(usize, i32)> = Vec::with_capacity(q.slots.len());
    let mut ok = (0..q.slots.len()).try_for_each(|i| {
        let e = q.register_sqe(raw, i);
        q.push(&e)
    });
    while ok.is_ok() && q.slots.iter().any(|s| !s.ended) {
        if let Err(e) = q.ring.submit_and_wait(1) {
            // Interrupted, or short of memory for a moment: try again.
            if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::ENOMEM)) {
                if e.raw_os_error() != Some(libc::EINTR) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                continue;
            }
            ok = Err(e);
            break;
        }
        // (Taken out first: answering pushes to the same ring.)
        done.clear();
        done.extend(q.ring.completion().map(|c| (c.user_data() as usize, c.result())));
        for &(i, res) in &done {
            if i >= q.slots.len() {
                continue;
            }
            let next = if res == 0 {
                registered[i] = true;
                let commit_id = q.answer(i, ops);
                Some(q.commit_sqe(raw, i, commit_id))
            } else if res == -libc::EAGAIN && !registered[i] {
                // INIT's answer not processed yet. Retried for as long as
                // it takes: an entry given up here would leave the kernel
                // holding every request of the mount (it waits for an entry
                // on each queue); a connection that ends answers ENOTCONN.
                std::thread::sleep(Duration::from_millis(1));
                Some(q.register_sqe(raw, i))
            } else {
                if ![-libc::ENOTCONN, -libc::ECANCELED, -libc::ENODEV].contains(&res) {
                    tracing::warn!("FUSE io_uring queue {} entry {i} ended: {}", q.qid, io::Error::from_raw_os_error(-res));
                }
                q.slots[i].ended = true;
                None
            };
            if let Some(e) = next {
                if let Err(e) = q.push(&e) {
                    ok = Err(e);
                }
            }
        }
    }
    if let Err(e) = ok {
        tracing::error!("FUSE io_uring queue {} stopped: {e}", q.qid);
        // The kernel may still hold entries and write into their buffers.
        std::mem::forget(q.slots);
    }
}
