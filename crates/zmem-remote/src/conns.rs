//! Connections to the cluster, shared by readers, writers and the freer,
//! with a bound on how long anyone waits for one.
//!
//! A caller takes an idle connection, uses it, and gives it back; one
//! that failed is dropped (a timed-out reply could still be in flight on
//! it). Making a connection asks the seeds one after another and can take
//! a timeout per seed when the cluster hangs, longer than a read may
//! wait: so a connection is made on a thread of its own, and a caller
//! waits for it only until its own deadline. A failed attempt fails the
//! callers waiting for it, with its reason.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use redis::cluster::{ClusterClient, ClusterConnection};

use crate::RemoteError;

/// Idle connections kept at most.
const IDLE: usize = 16;

#[derive(Default)]
struct State {
    idle: Vec<ClusterConnection>,
    connecting: bool,
    /// When the last attempt failed, and why.
    failed: Option<(Instant, String)>,
}

pub(crate) struct Conns {
    client: ClusterClient,
    pub(crate) seeds: String,
    st: Mutex<State>,
    ready: Condvar,
}

impl Conns {
    pub(crate) fn new(client: ClusterClient, seeds: String) -> Arc<Conns> {
        Arc::new(Conns { client, seeds, st: Mutex::new(State::default()), ready: Condvar::new() })
    }

    /// A connection, waiting until `until` at most.
    pub(crate) fn take(self: &Arc<Self>, until: Instant) -> Result<ClusterConnection, RemoteError> {
        let asked = Instant::now();
        let mut st = self.st.lock();
        loop {
            if let Some(c) = st.idle.pop() {
                return Ok(c);
            }
            if let Some((at, why)) = &st.failed {
                if *at >= asked {
                    return Err(RemoteError::Unreachable { seeds: self.seeds.clone(), why: why.clone() });
                }
            }
            if !st.connecting {
                st.connecting = true;
                let me = Arc::clone(self);
                if let Err(e) = std::thread::Builder::new().name("zmem-remote-conn".into()).spawn(move || me.connect()) {
                    st.connecting = false;
                    return Err(RemoteError::Unreachable {
                        seeds: self.seeds.clone(),
                        why: format!("cannot start a thread to connect: {e} (the machine is out of threads or memory)"),
                    });
                }
            }
            if self.ready.wait_until(&mut st, until).timed_out() {
                return Err(RemoteError::Unreachable {
                    seeds: self.seeds.clone(),
                    why: format!("no connection within {:?} (is it up, and are these its nodes?)", until.saturating_duration_since(asked)),
                });
            }
        }
    }

    fn connect(&self) {
        let r = self.client.get_connection();
        let mut st = self.st.lock();
        st.connecting = false;
        match r {
            Ok(c) => st.idle.push(c),
            Err(e) => st.failed = Some((Instant::now(), format!("{e} ({})", crate::advice(&e)))),
        }
        self.ready.notify_all();
    }

    /// Give back a connection that worked.
    pub(crate) fn give(&self, c: ClusterConnection) {
        let mut st = self.st.lock();
        if st.idle.len() < IDLE {
            st.idle.push(c);
        }
        self.ready.notify_one();
    }
}
