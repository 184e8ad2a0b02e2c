//! Plain connections to one node each: to masters for writeback batches,
//! and to replicas for the reads a master does not answer.
//!
//! A batch goes to one master the store chose (its key tags name a slot
//! that master serves), so it needs no routing: one pipeline of `SET`s
//! and the `WAIT` behind them on one connection is one round trip, and
//! the `WAIT` counts exactly the writes of that connection. If the slot
//! has moved, the master answers MOVED, the batch fails (its pages stay in
//! RAM) and the store reads the slot map again.
//!
//! A read goes to a replica only when the master did not answer: a
//! replica connection says `READONLY` once, when it is made, so that the
//! replica answers for its master's slots instead of redirecting.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

use crate::RemoteError;

/// Idle connections kept per node.
const IDLE: usize = 4;

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// Batches to a master.
    Master,
    /// Reads from a replica (`READONLY`).
    Replica,
}

pub(crate) struct Nodes {
    /// `redis://` (or `rediss://`) plus the seeds' `USER:PASSWORD@`, if any.
    prefix: String,
    tls: Option<crate::Tls>,
    timeout: Duration,
    idle: Mutex<HashMap<(Role, String), Vec<redis::Connection>>>,
}

impl Nodes {
    /// Connections made with the seeds' credentials (`USER:PASSWORD@`),
    /// each of whose calls may take `timeout`.
    pub(crate) fn new(auth: &str, timeout: Duration, tls: Option<crate::Tls>) -> Nodes {
        let scheme = if tls.is_some() { "rediss" } else { "redis" };
        Nodes { prefix: format!("{scheme}://{auth}"), tls, timeout, idle: Mutex::new(HashMap::new()) }
    }

    /// A connection to the node at `addr` (`HOST:PORT`) for `role`, for
    /// one call: making it (its handshake, `READONLY`) and the call take
    /// at most the store's call deadline, or `within` if that is shorter
    /// (a read near its end). A node that accepts connections but hangs
    /// (stopped) costs that long, not a deadline per round trip.
    pub(crate) fn take(&self, role: Role, addr: &str, within: Duration) -> Result<redis::Connection, RemoteError> {
        let mut timeout = self.timeout.min(within).max(Duration::from_millis(3));
        let op = match role {
            Role::Master => "connecting to a master",
            Role::Replica => "connecting to a replica",
        };
        let err = |source| RemoteError::Redis { op, source };
        if let Some(c) = self.idle.lock().get_mut(&(role, addr.to_string())).and_then(Vec::pop) {
            c.set_read_timeout(Some(timeout)).map_err(err)?;
            c.set_write_timeout(Some(timeout)).map_err(err)?;
            return Ok(c);
        }
        // A new connection: three round trips share the time.
        timeout /= 3;
        let url = format!("{}{addr}", self.prefix);
        let client = match &self.tls {
            Some(t) => redis::Client::build_with_tls(url, t.certificates()),
            None => redis::Client::open(url),
        }
        .map_err(err)?;
        let mut c = client.get_connection_with_timeout(timeout).map_err(err)?;
        c.set_read_timeout(Some(timeout)).map_err(err)?;
        c.set_write_timeout(Some(timeout)).map_err(err)?;
        if role == Role::Replica {
            redis::cmd("READONLY").query::<()>(&mut c).map_err(err)?;
        }
        Ok(c)
    }

    /// Give back a connection whose last call went through.
    pub(crate) fn give(&self, role: Role, addr: &str, c: redis::Connection) {
        let mut idle = self.idle.lock();
        let v = idle.entry((role, addr.to_string())).or_default();
        if v.len() < IDLE {
            v.push(c);
        }
    }
}
