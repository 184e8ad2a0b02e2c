//! Deleting dead records without making a store wait.
//!
//! The engine frees a record when its page is overwritten, discarded or
//! brought back to RAM; a failed batch leaves orphans. Both queue ids on a
//! channel of at most [`QUEUE`] ids; one thread drains it into pipelined `UNLINK`s (the
//! cluster frees the memory in the background). A batch that fails is
//! tried again until it succeeds or the store closes, so a cluster that is
//! down for a while gets its frees when it returns. If the queue is full
//! (a cluster down for very long), the id is counted as failed: the record
//! stays until the namespace is swept at the next start.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex};

use crate::{keys, Conns};

/// Ids waiting to be deleted at most (8 MiB of them). The channel grows
/// with what it holds (a bounded one would take its whole size at start,
/// in a swap server's budget).
const QUEUE: u64 = 1 << 20;
/// Keys per pipeline.
const BATCH: usize = 1024;

struct Shared {
    pending: AtomicU64,
    failed: AtomicU64,
    stop: AtomicBool,
    /// Signalled when `pending` reaches 0.
    idle: Condvar,
    idle_lock: Mutex<()>,
}

pub(crate) struct Freer {
    tx: Option<Sender<u64>>,
    thread: Option<JoinHandle<()>>,
    sh: Arc<Shared>,
}

impl Freer {
    pub(crate) fn start(conns: Arc<Conns>, namespace: String) -> Freer {
        let (tx, rx) = unbounded();
        let sh = Arc::new(Shared {
            pending: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            idle: Condvar::new(),
            idle_lock: Mutex::new(()),
        });
        let s2 = Arc::clone(&sh);
        let thread = std::thread::Builder::new().name("zmem-remote-free".into()).spawn(move || run(&conns, &namespace, &rx, &s2)).ok();
        Freer { tx: Some(tx), thread, sh }
    }

    pub(crate) fn free(&self, id: u64) {
        let Some(tx) = &self.tx else { return };
        if self.sh.pending.fetch_add(1, Relaxed) >= QUEUE || tx.send(id).is_err() {
            self.sh.pending.fetch_sub(1, Relaxed);
            self.sh.failed.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn orphans(&self, ids: &[u64]) {
        for &id in ids {
            self.free(id);
        }
    }

    pub(crate) fn pending(&self) -> u64 {
        self.sh.pending.load(Relaxed)
    }

    pub(crate) fn failed(&self) -> u64 {
        self.sh.failed.load(Relaxed)
    }

    /// Wait until nothing is pending; false if `within` passed first.
    pub(crate) fn flush(&self, within: Duration) -> bool {
        let end = Instant::now() + within;
        let mut g = self.sh.idle_lock.lock();
        while self.sh.pending.load(Relaxed) > 0 {
            if self.sh.idle.wait_until(&mut g, end).timed_out() {
                return self.sh.pending.load(Relaxed) == 0;
            }
        }
        true
    }

    /// Flush for at most `within`, then stop the thread.
    pub(crate) fn stop(&mut self, within: Duration) {
        self.flush(within);
        self.sh.stop.store(true, Relaxed);
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(conns: &Arc<Conns>, namespace: &str, rx: &Receiver<u64>, sh: &Shared) {
    let mut batch: Vec<u64> = Vec::with_capacity(BATCH);
    let mut backoff = Duration::from_millis(10);
    loop {
        if batch.is_empty() {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(id) => batch.push(id),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(id) => batch.push(id),
                Err(_) => break,
            }
        }
        match unlink(conns, namespace, &batch) {
            Ok(()) => {
                done(sh, batch.len());
                batch.clear();
                backoff = Duration::from_millis(10);
            }
            Err(_) if sh.stop.load(Relaxed) => {
                sh.failed.fetch_add(batch.len() as u64, Relaxed);
                done(sh, batch.len());
                batch.clear();
            }
            Err(_) => {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

fn done(sh: &Shared, n: usize) {
    if sh.pending.fetch_sub(n as u64, Relaxed) == n as u64 {
        let _g = sh.idle_lock.lock();
        sh.idle.notify_all();
    }
}

fn unlink(conns: &Arc<Conns>, namespace: &str, ids: &[u64]) -> Result<(), crate::RemoteError> {
    let mut conn = conns.take(Instant::now() + Duration::from_secs(5))?;
    let mut pipe = redis::cluster::cluster_pipe();
    for &id in ids {
        pipe.cmd("UNLINK").arg(keys::key(namespace, id)).ignore();
    }
    pipe.query::<()>(&mut conn).map_err(|source| crate::RemoteError::Redis { op: "UNLINK", source })?;
    conns.give(conn);
    Ok(())
}
