//! Plain connections to masters, for writeback batches.
//!
//! A batch goes to one master the store chose (its key tags name a slot
//! that master serves), so it needs no routing: one pipeline of `SET`s
//! and the `WAIT` behind them on one connection is one round trip, and
//! the `WAIT` counts exactly the writes of that connection. If the slot
//! has moved, the master answers MOVED, the batch fails (its pages stay in
//! RAM) and the store reads the slot map again.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

use crate::RemoteError;

pub(crate) struct Writers {
    /// `redis://` plus the seeds' `USER:PASSWORD@`, if any.
    prefix: String,
    timeout: Duration,
    idle: Mutex<HashMap<String, Vec<redis::Connection>>>,
}

impl Writers {
    /// Connections made with the seeds' credentials (`USER:PASSWORD@`).
    pub(crate) fn new(auth: &str, timeout: Duration) -> Writers {
        Writers { prefix: format!("redis://{auth}"), timeout, idle: Mutex::new(HashMap::new()) }
    }

    /// A connection to the master at `addr` (`HOST:PORT`).
    pub(crate) fn take(&self, addr: &str) -> Result<redis::Connection, RemoteError> {
        if let Some(c) = self.idle.lock().get_mut(addr).and_then(Vec::pop) {
            return Ok(c);
        }
        let err = |source| RemoteError::Redis { op: "connecting to a master", source };
        let client = redis::Client::open(format!("{}{addr}", self.prefix)).map_err(err)?;
        let c = client.get_connection_with_timeout(self.timeout).map_err(err)?;
        c.set_read_timeout(Some(self.timeout)).map_err(err)?;
        c.set_write_timeout(Some(self.timeout)).map_err(err)?;
        Ok(c)
    }

    /// Give back a connection whose last batch went through.
    pub(crate) fn give(&self, addr: &str, c: redis::Connection) {
        let mut idle = self.idle.lock();
        let v = idle.entry(addr.to_string()).or_default();
        if v.len() < 4 {
            v.push(c);
        }
    }
}
