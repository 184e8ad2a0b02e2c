//! zmem's remote cold tier: the compressed objects the shrinker evicts go
//! to a Redis Cluster (Redis 7, or Valkey, which speaks the same
//! protocol), not to a local file.
//!
//! # Design
//!
//! [`RemoteStore`] is a [`ColdStore`]: the engine's tier picks the victims
//! and hands them over in batches; this crate decides where they live and
//! how they come back. It adds no cluster of its own: routing, redirects
//! after a resharding or failover, and reconnection are the `redis`
//! crate's; replication and failover are the cluster's.
//!
//! * **A batch is one pipeline to one master.** The store names each
//!   record's key with a hash tag of a slot it chose (`keys.rs`), so a
//!   batch of 64 objects becomes 64 `SET`s pipelined to one master, then
//!   one `WAIT`; batches rotate over the masters, and a master that failed
//!   is left alone for a while (`topology.rs`). Pipelining by node costs
//!   two round trips a batch instead of one per page.
//! * **A page leaves RAM only once a replica has it.** `put_batch` returns
//!   after the master acknowledged every `SET` *and* `WAIT` reported at
//!   least `replicas` replicas acknowledged them. Anything less fails the
//!   whole batch: the tier keeps every object of it in RAM (its contract
//!   for an error) and the records already written are deleted. `WAIT`
//!   is Redis's synchronous-replication point: it does not make the
//!   cluster strongly consistent, but a failover promotes the replica with
//!   the most replicated data, and with one replica per master that is
//!   the one that acknowledged.
//! * **Back-pressure.** At most `max_in_flight` batches are being written
//!   at once; a shrinker that finds them all in flight waits.
//! * **Every read is checked** (`record.rs`): the value must carry this
//!   store's namespace tag, the page key, the record id (its generation),
//!   the length and an xxh3 checksum. A record id is never reused within a
//!   run, so a page written back twice has two keys, and an older copy
//!   (say, on a replica promoted before it saw the newer one) cannot
//!   answer for the newer: the key is missing and the read fails.
//! * **A read rides through a failover.** An EIO on a swap-in kills the
//!   process that faulted, so a read asks the record's master, and when
//!   it does not answer (refused, hung past the call deadline), the
//!   master's replicas (`READONLY`): each holds every record its master
//!   acknowledged through `WAIT` to it. While none answers, it reads the
//!   slot map again and asks again, until the failover deadline
//!   ([`DEFAULT_FAILOVER`]: Redis's default node timeout and the
//!   election), and only then fails (EIO to an NBD or FUSE client), with
//!   each node it asked and why in the error. A master that failed a call
//!   is asked after its replicas for a while (`topology::BACKOFF`), so a
//!   hung master costs one call deadline, not one per read. It never
//!   returns wrong bytes.
//! * **TLS and users.** `rediss://` seeds make every connection TLS
//!   (rustls with ring, through the `redis` crate: the cluster client, and
//!   the single-node connections of batches and replica reads), trusting
//!   the CA the operator gives ([`Tls`]) or the system's roots, with a
//!   client certificate if the cluster asks for one. `USER:PASSWORD@` in
//!   the URL authenticates as an ACL user. What a refused connection most
//!   likely means (a CA that did not sign the cluster's certificate, a
//!   wrong password, TLS spoken to a plain port or the reverse) is in its
//!   error, and a password never is.
//! * **Frees are asynchronous** (`freer.rs`): the engine's frees
//!   (overwrites, discards, a page brought back to RAM) queue ids for a
//!   thread that deletes them in pipelined `UNLINK`s; a store never waits
//!   for them. A namespace per device: at open, records left by a server
//!   that died under the same namespace are found (`SCAN` on every
//!   master) and deleted; at a clean close, the store deletes its own.
//!   An owner key refuses a second live server on the same namespace.
//! * **Generations are reserved.** A store takes generations in blocks of
//!   [`GEN_BLOCK`], each written to the namespace's owner key before any
//!   of it is used; so the owner key always says past which generation
//!   no record of the namespace can be.
//! * **Taken over.** A server that follows one under the same pool (a
//!   keeper's, after a crash or a restart) opens the store without the
//!   sweep ([`RemoteStore::open_kept`]) and starts its generations past
//!   the dead one's reservation: none is reused. Its pool's ledger names
//!   the records still in use, which the store takes over at once
//!   ([`ColdStore::adopt`]); the rest of the namespace (a batch in flight,
//!   frees not yet sent) is deleted by a thread of its own
//!   (`zmem-remote-sweep`) while the device serves. A named record the
//!   cluster lost reads as missing, as one lost in a failover does.
//!
//! # What a failure loses
//!
//! | failure | effect |
//! |---|---|
//! | a master dies or hangs, its replica takes over | nothing acknowledged is lost: the replica had every acknowledged record; reads of its slots go to the replica at once, writes go to the other masters |
//! | a master dies with no replica in sync | writes to it were never acknowledged (`WAIT` failed), so they stayed in RAM; records it held are lost: reads of them fail with EIO |
//! | a master and all its replicas die | the records on them are lost: reads of them fail with EIO once the failover deadline has passed; the rest of the device works |
//! | the whole cluster stops | writeback fails and pages stay in RAM (the pool fills and refuses stores, as with a failing disk); reads of written-back pages wait for it up to the failover deadline, then fail; both resume when it returns, if its data survived (persistence is the cluster's) |
//! | zmem dies | under a keeper, the next server takes over the records its pool still names and deletes the rest; otherwise its records are dead, and the next start under the same namespace deletes them |
//! | a node answers with the wrong record | refused by the checks above: EIO, never wrong bytes |

mod conns;
mod freer;
pub mod keys;
mod latency;
mod nodes;
pub mod record;
mod topology;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use zmem_core::{ColdError, ColdStats, ColdStore, RecordId};

use crate::conns::Conns;
use crate::freer::Freer;
use crate::latency::Histogram;
use crate::nodes::{Nodes, Role};
use crate::topology::Topology;

/// How a remote store is reached and what it promises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Cluster seeds, one `redis[s]://[USER:PASSWORD@]HOST:PORT` each.
    pub seeds: Vec<String>,
    /// TLS (`rediss://`): what the connections trust and show; None for
    /// plain `redis://`.
    pub tls: Option<Tls>,
    /// This device's namespace (keys `zm:NAMESPACE:…`).
    pub namespace: String,
    /// Replicas that must acknowledge a batch before its pages leave RAM
    /// (`WAIT`); 0 for a cluster without replicas.
    pub replicas: u32,
    /// How long one call to a node (a read, a batch's acknowledgement) may
    /// take.
    pub deadline: Duration,
    /// How long a read keeps asking while no node that holds the record
    /// answers: long enough for the cluster to promote a replica
    /// ([`DEFAULT_FAILOVER`]).
    pub failover: Duration,
    /// Batches written at once; more wait.
    pub max_in_flight: usize,
}

/// How the remote store fails, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("--remote {url:?}: {why} (give redis://HOST:PORT[,HOST:PORT…], with USER:PASSWORD@ before the first host if the cluster wants one)")]
    Url { url: String, why: String },
    #[error("remote namespace {0:?}: use 1 to 200 printable characters without spaces or braces")]
    Namespace(String),
    #[error("cannot reach the cluster at {seeds}: {source} ({})", advice(source))]
    Connect { seeds: String, source: redis::RedisError },
    #[error("cannot reach the cluster at {seeds}: {why}")]
    Unreachable { seeds: String, why: String },
    #[error("--remote-ca, --remote-cert and --remote-key are for a TLS cluster: give its URL as rediss://")]
    TlsWithoutRediss,
    #[error("the cluster at {seeds} cannot be used: {why}")]
    Cluster { seeds: String, why: String },
    #[error("remote namespace {namespace:?} is served by {owner} (stop that server, or give this one another --remote-namespace; if that server is gone for good, delete the key zm:{namespace}:owner on the cluster)")]
    InUse { namespace: String, owner: String },
    #[error("{op} on the cluster failed: {source}")]
    Redis { op: &'static str, source: redis::RedisError },
    #[error("writing a batch to the master of slot {slot}: {acked} of the {wanted} replicas acknowledged within {deadline:?} (the pages stay in RAM; is the master's replica up?)")]
    Replicas { slot: u16, acked: i64, wanted: u32, deadline: Duration },
    #[error("writeback waits: the cluster's masters have at most {most} replicas and --remote-replicas asks {wanted} to acknowledge each batch (the pages stay in RAM until replicas attach; lower --remote-replicas only if one copy is enough)")]
    NoReplicas { most: usize, wanted: u32 },
    #[error("reading {key}: no answer within the deadline of {deadline:?} ({last})")]
    Deadline { key: String, deadline: Duration, last: String },
    #[error("reading {key}: the cluster answered with a value that is not this record: {source}")]
    WrongRecord { key: String, source: record::RecordError },
}

impl From<RemoteError> for ColdError {
    fn from(e: RemoteError) -> ColdError {
        ColdError::Store(Box::new(e))
    }
}

/// How long a read waits for a record's master or replicas by default:
/// Redis Cluster's default `cluster-node-timeout` (15 s), after which a
/// replica of an unreachable master is promoted, plus 5 s for the
/// election and for the store to read the new map.
pub const DEFAULT_FAILOVER: Duration = Duration::from_secs(20);

/// What `rediss://` connections trust and present, as PEM bytes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// The CA that signed the cluster's certificates (None: the system's
    /// roots).
    pub ca: Option<Vec<u8>>,
    /// A client certificate (chain) and its key, for a cluster that asks
    /// clients for one (`tls-auth-clients`).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls").field("ca", &self.ca.as_ref().map(Vec::len)).field("client", &self.client.is_some()).finish()
    }
}

impl Tls {
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| redis::ClientTlsConfig { client_cert: cert.clone(), client_key: key.clone() }),
            root_cert: self.ca.clone(),
        }
    }
}

/// rustls's crypto (ring), installed once for the process.
fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // Another part of the process may have installed one: that one serves.
    ONCE.call_once(|| drop(rustls::crypto::ring::default_provider().install_default()));
}

/// What a connection error most likely means, for its message.
pub(crate) fn advice(e: &redis::RedisError) -> &'static str {
    let text = format!("{e:?} {e}");
    if text.contains("UnknownIssuer") || text.contains("invalid peer certificate") || text.contains("BadSignature") {
        "the cluster's TLS certificate is not signed by the CA zmem trusts: give the cluster's CA with --remote-ca"
    } else if text.contains("NotValidForName") {
        "the cluster's TLS certificate does not name the host in the URL"
    } else if text.contains("WRONGPASS") || text.contains("invalid username-password") || text.contains("NOAUTH") || text.contains("AuthenticationFailed") {
        "the cluster refused the user and password in the URL: check them, and the user's ACL"
    } else if text.contains("CertificateRequired") || text.contains("certificate required") {
        "the cluster asks for a client certificate: give --remote-cert and --remote-key"
    } else {
        "is it up, are these its nodes, and does it speak TLS (rediss://) or not (redis://)?"
    }
}

impl RemoteConfig {
    /// The defaults for `url` (see [`parse_seeds`]) and `namespace`: one
    /// replica acknowledges, a 1 s deadline per call, reads that wait
    /// [`DEFAULT_FAILOVER`] for a failover, 4 batches in flight.
    pub fn new(url: &str, namespace: &str) -> Result<RemoteConfig, RemoteError> {
        if !keys::valid_namespace(namespace) {
            return Err(RemoteError::Namespace(namespace.to_string()));
        }
        let seeds = parse_seeds(url)?;
        let tls = seeds.iter().any(|s| s.starts_with("rediss://")).then(Tls::default);
        Ok(RemoteConfig {
            seeds,
            tls,
            namespace: namespace.to_string(),
            replicas: 1,
            deadline: Duration::from_secs(1),
            failover: DEFAULT_FAILOVER,
            max_in_flight: 4,
        })
    }
}

/// `redis[s]://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT…]` as one seed URL
/// per node, each with the scheme and the credentials.
pub fn parse_seeds(url: &str) -> Result<Vec<String>, RemoteError> {
    let bad = |why: &str| RemoteError::Url { url: url.to_string(), why: why.to_string() };
    let (scheme, auth, hosts) = split_url(url);
    let scheme = match scheme {
        Some(s @ ("redis" | "rediss")) => s,
        Some(s) => return Err(bad(&format!("unknown scheme {s:?}"))),
        None => return Err(bad("no redis:// or rediss:// scheme")),
    };
    let mut seeds = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = h.rsplit_once(':').ok_or_else(|| bad(&format!("{h:?} has no :PORT")))?;
        if host.is_empty() || host.contains('/') {
            return Err(bad(&format!("{h:?} is not HOST:PORT")));
        }
        port.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| bad(&format!("{port:?} is not a port")))?;
        seeds.push(format!("{scheme}://{auth}{host}:{port}"));
    }
    Ok(seeds)
}

/// A URL's scheme, its `USER:PASSWORD@` (empty without one) and its
/// `HOST:PORT[,…]`: the one place that takes the URL apart.
fn split_url(url: &str) -> (Option<&str>, &str, &str) {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    let rest = rest.trim_end_matches('/');
    match rest.rsplit_once('@') {
        Some((a, h)) => (scheme, &rest[..a.len() + 1], h),
        None => (scheme, "", rest),
    }
}

/// `url` without its credentials, to show (`zmem stat`, logs).
pub fn redacted(url: &str) -> String {
    let (scheme, _, hosts) = split_url(url);
    format!("{}://{hosts}", scheme.unwrap_or("redis"))
}

/// The store's counters.
#[derive(Default)]
struct Counters {
    records_written: AtomicU64,
    bytes_written: AtomicU64,
    records_read: AtomicU64,
    bytes_read: AtomicU64,
    read_ops: AtomicU64,
    prefetch_ops: AtomicU64,
    failed_writes: AtomicU64,
    failed_reads: AtomicU64,
    /// Reads a replica answered because the master did not.
    replica_reads: AtomicU64,
    missing: AtomicU64,
    live: AtomicU64,
}

/// Batches in flight, and the shrinkers waiting for room.
struct Flight {
    n: Mutex<usize>,
    room: Condvar,
    max: usize,
}

struct Permit<'a>(&'a Flight);

impl Flight {
    fn acquire(&self) -> Permit<'_> {
        let mut n = self.n.lock();
        while *n >= self.max {
            self.room.wait(&mut n);
        }
        *n += 1;
        Permit(self)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.n.lock() -= 1;
        self.0.room.notify_one();
    }
}

/// A [`ColdStore`] on a Redis Cluster (see the crate notes).
pub struct RemoteStore {
    cfg: RemoteConfig,
    ns_tag: u32,
    conns: Arc<Conns>,
    topo: Mutex<Topology>,
    /// The next generation and the last one reserved.
    gens: Mutex<(u64, u64)>,
    /// The first generation of this store: records below it are an
    /// earlier server's.
    first_gen: u64,
    batches: AtomicU64,
    flight: Flight,
    c: Counters,
    reads: Histogram,
    freer: Freer,
    /// Records of an earlier server found and deleted (at open, or by the
    /// sweep after a takeover).
    cleaned: Arc<AtomicU64>,
    /// The sweep of what an earlier server left, after a takeover.
    sweeper: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// This store's value under the namespace's owner key.
    owner: String,
    /// Values fetched ahead for the reads of one request.
    ahead: Mutex<Ahead>,
    /// The process leaves the records to the next ([`ColdStore::leave`]):
    /// dropped, the store deletes none.
    left: std::sync::atomic::AtomicBool,
    /// Connections to single nodes: masters for batches, replicas for
    /// reads their master does not answer.
    nodes: Nodes,
}

/// Records fetched by [`ColdStore::prefetch`], oldest first, at most
/// [`AHEAD_BYTES`] of them: a read copies its value out and leaves it to
/// age out, since an extent's record answers the reads of several pages.
/// An id is never reused, so a value here can only ever answer the read
/// of its own record (and is checked like any other).
#[derive(Default)]
struct Ahead {
    order: std::collections::VecDeque<u64>,
    values: std::collections::HashMap<u64, Vec<u8>>,
    bytes: usize,
}

/// Generations a store reserves at a time (one write of the owner key).
pub const GEN_BLOCK: u64 = 1 << 20;

/// Records fetched ahead for one request at most (a few requests' worth
/// of single pages).
const AHEAD: usize = 512;
/// Bytes of records kept fetched ahead at most.
const AHEAD_BYTES: usize = AHEAD * (zmem_core::PAGE_SIZE + record::HEADER);

impl Ahead {
    fn put(&mut self, id: u64, v: Vec<u8>) {
        self.bytes += v.len();
        match self.values.insert(id, v) {
            Some(old) => self.bytes -= old.len(),
            None => self.order.push_back(id),
        }
        while self.bytes > AHEAD_BYTES {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(v) = self.values.remove(&old) {
                self.bytes -= v.len();
            }
        }
    }

    fn get(&self, id: u64) -> Option<Vec<u8>> {
        self.values.get(&id).cloned()
    }
}

impl RemoteStore {
    /// Connect, claim the namespace, delete what an earlier server left
    /// under it, and start the freer.
    pub fn open(cfg: RemoteConfig) -> Result<RemoteStore, RemoteError> {
        Self::open_on(cfg, true)
    }

    /// [`RemoteStore::open`] for a server that takes over the pool of one
    /// that died or left: what the namespace holds stays until the pool
    /// says which records it still names ([`ColdStore::adopt`]).
    pub fn open_kept(cfg: RemoteConfig) -> Result<RemoteStore, RemoteError> {
        Self::open_on(cfg, false)
    }

    fn open_on(cfg: RemoteConfig, sweep_left: bool) -> Result<RemoteStore, RemoteError> {
        if !keys::valid_namespace(&cfg.namespace) {
            return Err(RemoteError::Namespace(cfg.namespace.clone()));
        }
        let Some(first) = cfg.seeds.first() else {
            return Err(RemoteError::Url { url: String::new(), why: "no seed nodes".into() });
        };
        if cfg.tls.is_some() {
            install_crypto();
        }
        let nodes = Nodes::new(split_url(first).1, cfg.deadline, cfg.tls.clone());
        // What errors show: never the password.
        let seeds = cfg.seeds.iter().map(|s| redacted(s)).collect::<Vec<_>>().join(",");
        let part = (cfg.deadline / 4).max(Duration::from_millis(10));
        let mut builder =
            ClusterClient::builder(cfg.seeds.clone()).connection_timeout(part).response_timeout(part).retries(2).min_retry_wait(5).max_retry_wait(50);
        if let Some(t) = &cfg.tls {
            builder = builder.certs(t.certificates());
        }
        let client = builder.build().map_err(|source| RemoteError::Connect { seeds: seeds.clone(), source })?;
        let conns = Conns::new(client, seeds.clone());
        let mut conn = conns.take(Instant::now() + cfg.deadline * 10)?;
        // Masters short of replicas (a cluster still healing, replicas
        // still attaching) take no batch until they have them: the pool
        // holds its pages meanwhile (`pick`).
        let masters = read_topology(&mut conn, &seeds)?;
        let owner = ownership::token();
        // Past whatever the last owner reserved (a fresh start sweeps it all).
        let floor = ownership::claim(&mut conn, &cfg.namespace, &owner)?;
        let cleaned = if sweep_left { sweep(&mut conn, &cfg.namespace, &masters, |_| true)? } else { 0 };
        ownership::reserve(&mut conn, &cfg.namespace, &owner, floor + GEN_BLOCK)?;
        conns.give(conn);
        let freer = Freer::start(Arc::clone(&conns), cfg.namespace.clone());
        let mut topo = Topology::default();
        topo.set(masters, Instant::now());
        Ok(RemoteStore {
            ns_tag: record::ns_tag(&cfg.namespace),
            flight: Flight { n: Mutex::new(0), room: Condvar::new(), max: cfg.max_in_flight.max(1) },
            cfg,
            conns,
            topo: Mutex::new(topo),
            gens: Mutex::new((floor + 1, floor + GEN_BLOCK)),
            first_gen: floor + 1,
            batches: AtomicU64::new(0),
            c: Counters::default(),
            reads: Histogram::default(),
            freer,
            cleaned: Arc::new(AtomicU64::new(cleaned)),
            sweeper: Mutex::new(None),
            owner,
            ahead: Mutex::new(Ahead::default()),
            nodes,
            left: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Records an earlier server left under this namespace, deleted at open.
    pub fn cleaned(&self) -> u64 {
        self.cleaned.load(Relaxed)
    }

    /// Wait until the sweep after a takeover has finished (tests, tools).
    pub fn wait_swept(&self) {
        if let Some(h) = self.sweeper.lock().take() {
            let _ = h.join();
        }
    }

    /// `n` generations for a batch: the first. A block past the reserved
    /// ones is written to the owner key before any of it is used.
    fn take_gens(&self, n: u64) -> Result<u64, RemoteError> {
        let mut g = self.gens.lock();
        if g.0 + n > g.1 + 1 {
            let end = g.1 + GEN_BLOCK.max(n);
            let mut conn = self.conns.take(Instant::now() + self.cfg.deadline)?;
            ownership::reserve(&mut conn, &self.cfg.namespace, &self.owner, end)?;
            self.conns.give(conn);
            g.1 = end;
        }
        let first = g.0;
        g.0 += n;
        Ok(first)
    }

    /// The cluster key of record `id` (for tests and tools).
    pub fn key_of(&self, id: RecordId) -> String {
        keys::key(&self.cfg.namespace, id.to_raw())
    }

    /// Wait until every queued free reached the cluster (or failed).
    pub fn flush_frees(&self, within: Duration) -> bool {
        self.freer.flush(within)
    }

    /// The master and slot for the next batch.
    fn pick(&self) -> Result<(String, u16), RemoteError> {
        let now = Instant::now();
        let mut t = self.topo.lock();
        if t.stale(now) {
            let mut conn = self.conns.take(now + self.cfg.deadline)?;
            let m = read_topology(&mut conn, &self.conns.seeds);
            match m {
                Ok(m) => {
                    self.conns.give(conn);
                    t.set(m, now);
                }
                Err(e) if t.masters.is_empty() => return Err(e),
                Err(_) => {}
            }
        }
        let w = t.writable(now, self.cfg.replicas);
        if w.is_empty() {
            // Read the map again for the next batch: replicas may attach.
            t.invalidate();
            let most = t.masters.iter().map(|m| m.replicas).max().unwrap_or(0);
            return Err(RemoteError::NoReplicas { most, wanted: self.cfg.replicas });
        }
        let n = self.batches.fetch_add(1, Relaxed);
        let m = &w[(n % w.len() as u64) as usize];
        Ok((m.addr.clone(), m.slot(n / w.len() as u64)))
    }

    /// One pipeline to the master of `slot`: a `SET` per object, then
    /// `WAIT` for the replicas; the bytes sent.
    fn write(&self, conn: &mut redis::Connection, slot: u16, objects: &[(u64, &[u8])], ids: &mut Vec<u64>) -> Result<u64, RemoteError> {
        let first = self.take_gens(objects.len() as u64)?;
        let mut pipe = redis::pipe();
        let mut buf = Vec::new();
        let mut bytes = 0;
        for (i, &(key, object)) in objects.iter().enumerate() {
            let id = keys::id((first + i as u64) & keys::MAX_GEN, slot);
            buf.clear();
            record::encode(&mut buf, self.ns_tag, key, id, object);
            let k = keys::key(&self.cfg.namespace, id);
            bytes += (k.len() + buf.len()) as u64;
            pipe.cmd("SET").arg(k).arg(&buf[..]).ignore();
            ids.push(id);
        }
        if self.cfg.replicas == 0 {
            pipe.query::<()>(conn).map_err(|source| RemoteError::Redis { op: "SET (a writeback batch)", source })?;
            return Ok(bytes);
        }
        pipe.cmd("WAIT").arg(self.cfg.replicas).arg(self.cfg.deadline.as_millis() as u64);
        let (acked,): (i64,) = pipe.query(conn).map_err(|source| RemoteError::Redis { op: "SET and WAIT (a writeback batch)", source })?;
        if acked < self.cfg.replicas as i64 {
            return Err(RemoteError::Replicas { slot, acked, wanted: self.cfg.replicas, deadline: self.cfg.deadline });
        }
        Ok(bytes)
    }

    /// Read the map of masters and replicas again now (a read that its
    /// master did not answer: a replica may have taken over).
    /// Not more often than every [`topology::RECENT`], whoever asks.
    fn refresh(&self, until: Instant) {
        let now = Instant::now();
        if now.checked_sub(topology::RECENT).is_some_and(|t| self.topo.lock().read_since(t)) {
            return;
        }
        let Ok(mut conn) = self.conns.take((now + self.cfg.deadline).min(until)) else { return };
        if let Ok(m) = read_topology(&mut conn, &self.conns.seeds) {
            self.conns.give(conn);
            self.topo.lock().set(m, Instant::now());
        }
    }

    /// `GET key` from the master of `slot`; if it does not answer, from
    /// its replicas (each holds what its master acknowledged through
    /// `WAIT`); if none does, again with a fresh map, until
    /// [`RemoteConfig::failover`] has passed. A master that failed a call
    /// in the last moments is asked after its replicas, not before. A
    /// master's nil is the answer; a replica's only if every replica says
    /// so (one may lag).
    fn get(&self, key: &str, slot: u16) -> Result<Option<Vec<u8>>, RemoteError> {
        let start = Instant::now();
        let until = start + self.cfg.failover.max(self.cfg.deadline);
        let mut pause = Duration::from_millis(20);
        // What each node asked last said, for the error.
        let mut last: Vec<String> = Vec::new();
        loop {
            last.clear();
            let (master, replicas, suspect) = {
                let t = self.topo.lock();
                (t.master_addr(slot), t.replicas_of(slot), t.backing_off(slot, Instant::now()))
            };
            if !suspect {
                match self.master_get(key, until) {
                    Ok(v) => return Ok(self.answered(start, v)),
                    Err(e) => {
                        last.push(format!("the master of slot {slot}, {master}: {e}"));
                        self.topo.lock().back_off(slot, Instant::now());
                    }
                }
            }
            let mut nils = 0;
            for addr in &replicas {
                let left = until.saturating_duration_since(Instant::now());
                if left < Duration::from_millis(5) {
                    break;
                }
                match self.replica_get(addr, key, left) {
                    Ok(Some(v)) => {
                        self.c.replica_reads.fetch_add(1, Relaxed);
                        return Ok(self.answered(start, Some(v)));
                    }
                    Ok(None) => nils += 1,
                    Err(e) => last.push(format!("replica {addr}: {e}")),
                }
            }
            if replicas.is_empty() {
                last.push(format!("slot {slot} lists no replica"));
            }
            if nils > 0 && nils == replicas.len() {
                return Ok(self.answered(start, None));
            }
            if suspect && Instant::now() + self.cfg.deadline / 4 < until {
                match self.master_get(key, until) {
                    Ok(v) => return Ok(self.answered(start, v)),
                    Err(e) => last.push(format!("the master of slot {slot}, {master} (failing): {e}")),
                }
            }
            // Another round only if one more call fits before the end.
            if Instant::now() + pause + self.cfg.deadline / 4 > until {
                if last.is_empty() {
                    last.push(format!("slot {slot}: no time left to ask its master"));
                }
                return Err(RemoteError::Deadline { key: key.to_string(), deadline: until - start, last: last.join("; ") });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(250));
            self.refresh(until);
        }
    }

    /// A read's answer, its time noted.
    fn answered(&self, start: Instant, v: Option<Vec<u8>>) -> Option<Vec<u8>> {
        self.reads.record(start.elapsed());
        v
    }

    /// `GET key` through the cluster connection: the key's master, by the
    /// connection's map (which follows MOVED).
    fn master_get(&self, key: &str, until: Instant) -> Result<Option<Vec<u8>>, RemoteError> {
        let mut conn = self.conns.take((Instant::now() + self.cfg.deadline).min(until))?;
        let v = redis::cmd("GET").arg(key).query::<Option<Vec<u8>>>(&mut conn).map_err(|source| RemoteError::Redis { op: "GET", source })?;
        self.conns.give(conn);
        Ok(v)
    }

    /// `GET key` from the replica at `addr` (`READONLY`), within `left`.
    fn replica_get(&self, addr: &str, key: &str, left: Duration) -> Result<Option<Vec<u8>>, RemoteError> {
        let mut conn = self.nodes.take(Role::Replica, addr, left)?;
        let v = redis::cmd("GET").arg(key).query::<Option<Vec<u8>>>(&mut conn).map_err(|source| RemoteError::Redis { op: "GET from a replica", source })?;
        self.nodes.give(Role::Replica, addr, conn);
        Ok(v)
    }
}

impl ColdStore for RemoteStore {
    fn put_batch(&self, objects: &[(u64, &[u8])]) -> Result<Vec<Option<RecordId>>, ColdError> {
        if objects.is_empty() {
            return Ok(Vec::new());
        }
        let _permit = self.flight.acquire();
        // A master that fails the batch backs off, and the batch goes to
        // the next at once: each master is tried once at most.
        let mut tried: Vec<String> = Vec::new();
        let mut failed = None;
        loop {
            let (addr, slot) = self.pick()?;
            if tried.contains(&addr) {
                return Err(failed.unwrap_or(RemoteError::NoReplicas { most: 0, wanted: self.cfg.replicas }).into());
            }
            let mut ids = Vec::with_capacity(objects.len());
            let written = self.nodes.take(Role::Master, &addr, self.cfg.deadline).and_then(|mut conn| {
                let bytes = self.write(&mut conn, slot, objects, &mut ids)?;
                self.nodes.give(Role::Master, &addr, conn);
                Ok(bytes)
            });
            match written {
                Ok(bytes) => {
                    self.c.records_written.fetch_add(ids.len() as u64, Relaxed);
                    self.c.bytes_written.fetch_add(bytes, Relaxed);
                    self.c.live.fetch_add(ids.len() as u64, Relaxed);
                    return Ok(ids.into_iter().map(|id| Some(RecordId::from_raw(id))).collect());
                }
                Err(e) => {
                    self.c.failed_writes.fetch_add(1, Relaxed);
                    self.topo.lock().back_off(slot, Instant::now());
                    // Whatever reached the cluster is dead: those pages stay in RAM.
                    self.freer.orphans(&ids);
                    tried.push(addr);
                    failed = Some(e);
                }
            }
        }
    }

    /// A cluster heals by itself: a failover, replicas attaching.
    fn ride_through(&self) -> Duration {
        self.cfg.failover
    }

    fn read(&self, id: RecordId, key: u64, out: &mut Vec<u8>) -> Result<(), ColdError> {
        let k = keys::key(&self.cfg.namespace, id.to_raw());
        let ahead = self.ahead.lock().get(id.to_raw());
        if ahead.is_none() {
            self.c.read_ops.fetch_add(1, Relaxed);
        }
        let got = match ahead {
            Some(v) => Ok(Some(v)),
            None => self.get(&k, keys::split(id.to_raw()).0),
        };
        let v = match got {
            Ok(Some(v)) => v,
            Ok(None) => {
                // Freed meanwhile (the engine looks again), or lost with
                // its master and replicas (the engine fails the load).
                self.c.missing.fetch_add(1, Relaxed);
                return Err(ColdError::NotLive { id: id.to_raw() });
            }
            Err(e) => {
                self.c.failed_reads.fetch_add(1, Relaxed);
                return Err(e.into());
            }
        };
        match record::decode(&v, self.ns_tag, key, id.to_raw()) {
            Ok(object) => {
                out.clear();
                out.extend_from_slice(object);
                self.c.records_read.fetch_add(1, Relaxed);
                self.c.bytes_read.fetch_add(v.len() as u64, Relaxed);
                Ok(())
            }
            Err(source) => {
                self.c.failed_reads.fetch_add(1, Relaxed);
                Err(RemoteError::WrongRecord { key: k, source }.into())
            }
        }
    }

    /// One pipeline of GETs for the records of one request (an NBD or
    /// FUSE read of several pages): one round trip instead of one per
    /// page. Best effort: what fails is left for each read to fetch.
    fn prefetch(&self, ids: &[RecordId]) -> usize {
        if ids.len() < 2 {
            return 0;
        }
        let ids = &ids[..ids.len().min(AHEAD / 2)];
        let start = Instant::now();
        let Ok(mut conn) = self.conns.take(start + self.cfg.deadline) else { return 0 };
        let mut pipe = redis::cluster::cluster_pipe();
        for id in ids {
            pipe.cmd("GET").arg(keys::key(&self.cfg.namespace, id.to_raw()));
        }
        let Ok(values) = pipe.query::<Vec<Option<Vec<u8>>>>(&mut conn) else { return 0 };
        self.conns.give(conn);
        self.reads.record(start.elapsed());
        self.c.read_ops.fetch_add(1, Relaxed);
        self.c.prefetch_ops.fetch_add(1, Relaxed);
        let mut ahead = self.ahead.lock();
        for (id, v) in ids.iter().zip(values) {
            if let Some(v) = v {
                ahead.put(id.to_raw(), v);
            }
        }
        1
    }

    fn buffer_bytes(&self) -> u64 {
        AHEAD_BYTES as u64
    }

    fn adoptable(&self) -> bool {
        true
    }

    fn leave(&self) {
        self.left.store(true, Relaxed);
    }

    /// Take over the records `ids` name (see the crate notes): each one
    /// an earlier server could have written (a generation below this
    /// store's) is taken at once; the keys of the namespace no id names
    /// are deleted by a thread while the device serves.
    fn adopt(&self, ids: &[RecordId]) -> Result<Vec<bool>, ColdError> {
        let first = self.first_gen;
        let taken: Vec<bool> = ids.iter().map(|id| (1..first).contains(&keys::split(id.to_raw()).1)).collect();
        let named: std::collections::HashSet<u64> = ids.iter().zip(&taken).filter(|(_, t)| **t).map(|(id, _)| id.to_raw()).collect();
        self.c.live.store(named.len() as u64, Relaxed);
        let (conns, ns, cleaned) = (Arc::clone(&self.conns), self.cfg.namespace.clone(), Arc::clone(&self.cleaned));
        let (masters, deadline) = (self.topo.lock().masters.clone(), self.cfg.deadline);
        let h = std::thread::Builder::new()
            .name("zmem-remote-sweep".into())
            .spawn(move || {
                // (This store's own records, from `first` on, are never touched.)
                let dead = |id: Option<u64>| id.is_none_or(|id| !named.contains(&id) && keys::split(id).1 < first);
                let r = conns.take(Instant::now() + deadline * 10).and_then(|mut conn| {
                    let r = sweep(&mut conn, &ns, &masters, dead);
                    conns.give(conn);
                    r
                });
                match r {
                    Ok(n) => {
                        cleaned.fetch_add(n, Relaxed);
                    }
                    Err(e) => eprintln!(
                        "zmem: could not delete the records a dead server left on the cluster under namespace {ns:?} ({e}); the next start under it will"
                    ),
                }
            })
            .map_err(|e| ColdError::Store(format!("cannot start the sweep thread: {e}").into()))?;
        *self.sweeper.lock() = Some(h);
        Ok(taken)
    }

    fn free(&self, id: RecordId) -> Result<(), ColdError> {
        let _ = self.c.live.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
        self.freer.free(id.to_raw());
        Ok(())
    }

    fn stats(&self) -> ColdStats {
        let c = &self.c;
        ColdStats {
            records: c.live.load(Relaxed),
            bytes_written: c.bytes_written.load(Relaxed),
            bytes_read: c.bytes_read.load(Relaxed),
            read_ops: c.read_ops.load(Relaxed),
            prefetch_ops: c.prefetch_ops.load(Relaxed),
            records_written: c.records_written.load(Relaxed),
            records_read: c.records_read.load(Relaxed),
            failed_writes: c.failed_writes.load(Relaxed),
            failed_reads: c.failed_reads.load(Relaxed),
            replica_reads: c.replica_reads.load(Relaxed),
            missing_reads: c.missing.load(Relaxed),
            read_p50_ns: self.reads.percentile(50.0),
            read_p99_ns: self.reads.percentile(99.0),
            in_flight: *self.flight.n.lock() as u64,
            masters_short: self.topo.lock().short_of(self.cfg.replicas) as u64,
            frees_pending: self.freer.pending(),
            frees_failed: self.freer.failed(),
            ..ColdStats::default()
        }
    }
}

impl Drop for RemoteStore {
    fn drop(&mut self) {
        // The device goes with the process: its records are dead (unless
        // the next server takes them over).
        self.wait_swept();
        self.freer.stop(self.cfg.deadline * 5);
        // Left to the next server: the records stay, and so does the owner
        // key, which says where the next one's generations start (this
        // process is gone when it claims it). (The frees above were of
        // records no page names any more.)
        if self.left.load(Relaxed) {
            return;
        }
        if let Ok(mut conn) = self.conns.take(Instant::now() + self.cfg.deadline) {
            let masters = self.topo.lock().masters.clone();
            if let Err(e) = sweep(&mut conn, &self.cfg.namespace, &masters, |_| true) {
                eprintln!("zmem: could not delete the remote records of namespace {:?} ({e}); the next start under it will", self.cfg.namespace);
            }
            ownership::release(&mut conn, &self.cfg.namespace, &self.owner);
        }
    }
}

/// The masters, from `CLUSTER SLOTS`.
fn read_topology(conn: &mut ClusterConnection, seeds: &str) -> Result<Vec<topology::Master>, RemoteError> {
    let v = conn
        .route_command(&redis::cmd("CLUSTER").arg("SLOTS").clone(), RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
        .map_err(|source| RemoteError::Redis { op: "CLUSTER SLOTS", source })?;
    topology::parse_slots(&v).map_err(|why| RemoteError::Cluster { seeds: seeds.to_string(), why })
}

/// Delete the record keys of `namespace` on `masters` (SCAN on each) that
/// `delete` says to (given the key's record id, None for a key that names
/// none); returns how many were deleted.
fn sweep(conn: &mut ClusterConnection, namespace: &str, masters: &[topology::Master], mut delete: impl FnMut(Option<u64>) -> bool) -> Result<u64, RemoteError> {
    let pattern = keys::scan_pattern(namespace);
    let mut n = 0;
    for m in masters {
        let route = || RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(m.slot(0), SlotAddr::Master)));
        let mut cursor = String::from("0");
        loop {
            let scan = redis::cmd("SCAN").arg(&cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000).clone();
            let v = conn.route_command(&scan, route()).map_err(|source| RemoteError::Redis { op: "SCAN", source })?;
            let (next, mut found) = redis::from_redis_value::<(String, Vec<String>)>(v).map_err(|e| RemoteError::Redis { op: "SCAN", source: e.into() })?;
            found.retain(|k| delete(keys::parse(namespace, k)));
            if !found.is_empty() {
                let mut pipe = redis::cluster::cluster_pipe();
                for k in &found {
                    pipe.cmd("UNLINK").arg(k).ignore();
                }
                pipe.query::<()>(conn).map_err(|source| RemoteError::Redis { op: "UNLINK", source })?;
                n += found.len() as u64;
            }
            if next == "0" {
                break;
            }
            cursor = next;
        }
    }
    Ok(n)
}

/// Who serves a namespace: `HOST PID TOKEN LAST-GENERATION` under its
/// owner key (the token tells two stores of one process apart; the last
/// generation it reserved, in hex, is where the next owner starts).
mod ownership {
    use super::*;

    fn host() -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string()
    }

    /// This store's owner value.
    pub fn token() -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        format!("{} {} {:x}", host(), std::process::id(), t ^ N.fetch_add(1, Relaxed) << 48)
    }

    /// Whether the owner `owner` may still be serving: a process of this
    /// machine that is alive, or any other machine's.
    fn alive(owner: &str) -> bool {
        let f: Vec<&str> = owner.split(' ').collect();
        match f.as_slice() {
            [h, pid, _, ..] if *h == host() => pid.parse::<u32>().is_ok_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists()),
            _ => true,
        }
    }

    /// The owner `me` (its token) of an owner key's value `HOST PID TOKEN
    /// [LAST-GENERATION]`.
    fn who(value: &str) -> &str {
        value.rsplit_once(' ').filter(|(who, _)| who.split(' ').count() == 3).map_or(value, |(who, _)| who)
    }

    /// Claim the namespace for `me`, keeping the last generation its
    /// earlier owner reserved (until `me` reserves past it: a claim that
    /// dies here loses nothing); that generation (0 if none).
    pub fn claim(conn: &mut ClusterConnection, namespace: &str, me: &str) -> Result<u64, RemoteError> {
        let key = keys::owner_key(namespace);
        let prev: Option<String> = redis::cmd("GET").arg(&key).query(conn).map_err(|source| RemoteError::Redis { op: "GET (namespace owner)", source })?;
        if let Some(p) = prev.as_deref().filter(|p| who(p) != me && alive(p)) {
            return Err(RemoteError::InUse { namespace: namespace.to_string(), owner: who(p).to_string() });
        }
        let last = prev.and_then(|p| u64::from_str_radix(p.split(' ').nth(3)?, 16).ok()).unwrap_or(0);
        reserve(conn, namespace, me, last)?;
        Ok(last)
    }

    /// `me` may use generations up to `last`: written before any is.
    pub fn reserve(conn: &mut ClusterConnection, namespace: &str, me: &str, last: u64) -> Result<(), RemoteError> {
        redis::cmd("SET")
            .arg(keys::owner_key(namespace))
            .arg(format!("{me} {last:x}"))
            .query::<()>(conn)
            .map_err(|source| RemoteError::Redis { op: "SET (namespace owner: generations reserved)", source })
    }

    pub fn release(conn: &mut ClusterConnection, namespace: &str, me: &str) {
        let key = keys::owner_key(namespace);
        let cur: Option<String> = redis::cmd("GET").arg(&key).query(conn).ok().flatten();
        if cur.as_deref().map(who) == Some(me) {
            let _: Result<(), _> = redis::cmd("DEL").arg(&key).query(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_flight_holds_the_next_batch_until_one_lands() {
        let f = Arc::new(Flight { n: Mutex::new(0), room: Condvar::new(), max: 2 });
        let (a, b) = (f.acquire(), f.acquire());
        let (tx, rx) = std::sync::mpsc::channel();
        let f2 = Arc::clone(&f);
        let waiter = std::thread::spawn(move || {
            let _p = f2.acquire();
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "a third batch went while two were in flight");
        drop(a);
        rx.recv_timeout(Duration::from_secs(10)).expect("the waiting batch went once one landed");
        waiter.join().unwrap();
        drop(b);
        assert_eq!(*f.n.lock(), 0);
    }

    #[test]
    fn urls_become_seeds_or_say_what_is_wrong() {
        assert_eq!(parse_seeds("redis://127.0.0.1:7000,127.0.0.1:7001").unwrap(), ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]);
        assert_eq!(parse_seeds("redis://u:p@h:1,g:2/").unwrap(), ["redis://u:p@h:1", "redis://u:p@g:2"]);
        assert_eq!(parse_seeds("rediss://u:p@h:1,g:2").unwrap(), ["rediss://u:p@h:1", "rediss://u:p@g:2"]);
        assert!(RemoteConfig::new("rediss://h:1", "n").unwrap().tls.is_some());
        assert!(RemoteConfig::new("redis://h:1", "n").unwrap().tls.is_none());
        assert_eq!(redacted("rediss://u:p@h:1"), "rediss://h:1");
        for bad in ["127.0.0.1:7000", "http://h:1", "redis://h", "redis://h:0", "redis://h:x", "redis://:1", "redis://h:1,"] {
            let e = parse_seeds(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
        assert!(matches!(RemoteConfig::new("redis://h:1", "a b"), Err(RemoteError::Namespace(_))));
        assert_eq!(redacted("redis://u:p@h:1,g:2/"), "redis://h:1,g:2");
        assert_eq!(split_url("redis://u:p@h:1").1, "u:p@");
    }
}
