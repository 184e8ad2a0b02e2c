//! A real Redis Cluster on loopback, started by a test or a benchmark and
//! torn down by `Drop`, also when the test fails.
//!
//! [`LocalCluster::start_tls`] starts one that speaks TLS only (clients,
//! cluster bus and replication), with a CA, a server certificate for
//! 127.0.0.1 and a client certificate made at start by `openssl`.
//!
//! It runs Debian's `redis-server` (one process per node, cluster mode,
//! no persistence) and forms the cluster with `redis-cli --cluster create`,
//! as an operator would. Nothing here speaks the protocol itself: the
//! harness drives the nodes through `redis-cli`, so what it checks is what
//! the cluster says, not what zmem's client thinks.
//!
//! Ports: each node takes a client port P and the cluster bus P + 10000;
//! both are checked free before a node starts, and both lie below the
//! kernel's ephemeral range (`ip_local_port_range`), so the outgoing
//! connections of the tests and of the nodes themselves (bus links,
//! `redis-cli`) cannot take one between the check and the bind. A node
//! that still loses its port before the cluster forms starts again on
//! another.

use crate::ports::{free_ports, release};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `redis-server` and `redis-cli` are on this machine.
pub fn available() -> bool {
    ["redis-server", "redis-cli"]
        .iter()
        .all(|t| Command::new(t).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success()))
}

/// One node: its client port and, while it runs, its process.
struct Node {
    port: u16,
    child: Option<Child>,
}

/// A cluster of `masters` masters with `replicas` replicas each on
/// 127.0.0.1. Dropping it kills every node and removes its directory.
pub struct LocalCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
    node_timeout_ms: u32,
    /// TLS only: the directory of its certificates ([`Certs`]).
    tls: Option<Certs>,
}

/// A TLS cluster's files, made at start: `ca.crt` (and another CA,
/// `other-ca.crt`, that signed nothing of it), `server.crt`/`.key` for
/// 127.0.0.1, `client.crt`/`.key`.
#[derive(Clone, Debug)]
pub struct Certs {
    pub dir: PathBuf,
}

impl Certs {
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Make the CAs and the certificates in `dir` (EC P-256, valid 2 days).
    fn make(dir: &Path) -> Result<Certs> {
        std::fs::create_dir_all(dir).map_err(|e| ClusterError(format!("{}: {e}", dir.display())))?;
        let ssl = |args: &[&str]| -> Result<()> {
            let out = Command::new("openssl").args(args).current_dir(dir).output().map_err(|e| ClusterError(format!("openssl: {e} (is it installed?)")))?;
            if !out.status.success() {
                return err(format!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr)));
            }
            Ok(())
        };
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        for ca in ["ca", "other-ca"] {
            let (k, c, subj) = (format!("{ca}.key"), format!("{ca}.crt"), format!("/CN=zmem test {ca}"));
            ssl(&[&["req", "-x509"], &key[..], &["-keyout", &k, "-out", &c, "-days", "2", "-subj", &subj]].concat())?;
        }
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
            .map_err(|e| ClusterError(format!("san.ext: {e}")))?;
        for who in ["server", "client"] {
            let (k, csr, c, subj) = (format!("{who}.key"), format!("{who}.csr"), format!("{who}.crt"), format!("/CN=127.0.0.1 {who}"));
            ssl(&[&["req"], &key[..], &["-keyout", &k, "-out", &csr, "-subj", &subj]].concat())?;
            ssl(&["x509", "-req", "-in", &csr, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", &c, "-days", "2", "-extfile", "san.ext"])?;
        }
        Ok(Certs { dir: dir.to_path_buf() })
    }
}

/// How the harness fails: what it ran and what came back.
#[derive(Debug)]
pub struct ClusterError(pub String);

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClusterError {}

type Result<T> = std::result::Result<T, ClusterError>;

fn err<T>(what: impl Into<String>) -> Result<T> {
    Err(ClusterError(what.into()))
}

/// [`free_ports`] for a cluster's nodes.
fn node_ports(count: usize, taken: &[u16]) -> Result<Vec<u16>> {
    free_ports(count, taken).ok_or_else(|| ClusterError("no free loopback ports for a Redis cluster".into()))
}

/// How a node failed to start.
enum NodeStart {
    /// The process exited before it listened; its log's last lines.
    Exited(String),
    /// Anything else (it did not listen in time, it could not be spawned).
    Failed(ClusterError),
}

impl LocalCluster {
    /// Start `masters` × (1 + `replicas`) nodes and form the cluster;
    /// returns when every slot is served, every node agrees the cluster is
    /// ok and every replica's link to its master is up. `node_timeout_ms`
    /// is `cluster-node-timeout`: how long a dead master goes unnoticed
    /// before its replica takes over.
    pub fn start(masters: usize, replicas: usize, node_timeout_ms: u32) -> Result<LocalCluster> {
        Self::start_with(masters, replicas, node_timeout_ms, false)
    }

    /// [`LocalCluster::start`], speaking TLS only ([`Certs`]; clients may
    /// present a certificate, and need not).
    pub fn start_tls(masters: usize, replicas: usize, node_timeout_ms: u32) -> Result<LocalCluster> {
        Self::start_with(masters, replicas, node_timeout_ms, true)
    }

    fn start_with(masters: usize, replicas: usize, node_timeout_ms: u32, tls: bool) -> Result<LocalCluster> {
        let n = masters * (1 + replicas);
        let ports = node_ports(n, &[])?;
        let dir = std::env::temp_dir().join(format!("zmem-redis-{}-{}", std::process::id(), ports[0]));
        std::fs::create_dir_all(&dir).map_err(|e| ClusterError(format!("{}: {e}", dir.display())))?;
        let mut c = LocalCluster { nodes: ports.iter().map(|&port| Node { port, child: None }).collect(), dir, node_timeout_ms, tls: None };
        if tls {
            c.tls = Some(Certs::make(&c.dir.join("tls"))?);
        }
        for i in 0..n {
            // Before the cluster forms a node has no identity to keep: one
            // that lost its port to another process starts on a new one.
            let mut tries = 0;
            loop {
                match c.try_start_node(i) {
                    Ok(()) => break,
                    Err(NodeStart::Exited(log)) if tries < 5 => {
                        tries += 1;
                        let taken: Vec<u16> = c.nodes.iter().map(|n| n.port).collect();
                        let lost = c.nodes[i].port;
                        c.nodes[i].port = node_ports(1, &taken)?[0];
                        release(&[lost]);
                        eprintln!("redis-server exited before it listened ({log}); trying port {}", c.nodes[i].port);
                    }
                    Err(NodeStart::Exited(log)) => return err(format!("redis-server exited before it listened, {tries} ports tried: {log}")),
                    Err(NodeStart::Failed(e)) => return Err(e),
                }
            }
        }
        let ports = c.ports();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
        args.extend(["--cluster-replicas".into(), replicas.to_string(), "--cluster-yes".into()]);
        let out = Command::new("redis-cli").args(c.tls_args()).args(&args).output().map_err(|e| ClusterError(format!("redis-cli: {e}")))?;
        if !out.status.success() {
            return err(format!("redis-cli --cluster create failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
        }
        c.wait_state(replicas, Duration::from_secs(60))?;
        Ok(c)
    }

    fn start_node(&mut self, i: usize) -> Result<()> {
        self.try_start_node(i).map_err(|e| match e {
            NodeStart::Exited(log) => ClusterError(format!("redis-server on port {} exited before it listened: {log}", self.nodes[i].port)),
            NodeStart::Failed(e) => e,
        })
    }

    fn try_start_node(&mut self, i: usize) -> std::result::Result<(), NodeStart> {
        let port = self.nodes[i].port;
        let log = self.dir.join(format!("{port}.log"));
        let mut server = Command::new("redis-server");
        match &self.tls {
            None => server.args(["--port", &port.to_string()]),
            Some(t) => server
                .args(["--port", "0", "--tls-port", &port.to_string(), "--tls-cluster", "yes", "--tls-replication", "yes"])
                .args(["--tls-auth-clients", "optional"])
                .arg("--tls-cert-file")
                .arg(t.file("server.crt"))
                .arg("--tls-key-file")
                .arg(t.file("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(t.file("ca.crt")),
        };
        let mut child = server
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--cluster-node-timeout", &self.node_timeout_ms.to_string()])
            .args(["--appendonly", "no", "--save", "", "--daemonize", "no"])
            // A replica's first sync starts at once (Redis waits 5 s by
            // default for more replicas to share a diskless transfer), and
            // its master pings it every second, not every 10: until the
            // replication offset moves, CLUSTER SLOTS leaves the replica
            // out (Redis 7), and the cluster is not ready for a test.
            .args(["--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1"])
            // A shard lost whole leaves the others serving (with Redis's
            // default, the whole cluster stops until the shard is back).
            .args(["--cluster-require-full-coverage", "no"])
            .args(["--dir", &self.dir.display().to_string(), "--logfile", &format!("{port}.log")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| NodeStart::Failed(ClusterError(format!("redis-server: {e}"))))?;
        let end = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect();
                return Err(NodeStart::Exited(format!("{status}; {}: {}", log.display(), tail.join(" | "))));
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                return Err(NodeStart::Failed(ClusterError(format!("redis-server on port {port} did not listen in 20 s (log: {})", log.display()))));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.nodes[i].child = Some(child);
        Ok(())
    }

    /// The seeds as zmem's `--remote` takes them (`rediss://` for TLS).
    pub fn url(&self) -> String {
        let live: Vec<String> = self.nodes.iter().filter(|n| n.child.is_some()).map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("{}://{}", if self.tls.is_some() { "rediss" } else { "redis" }, live.join(","))
    }

    /// A TLS cluster's certificates.
    pub fn certs(&self) -> Option<&Certs> {
        self.tls.as_ref()
    }

    /// redis-cli's arguments for a TLS cluster (none for a plain one).
    fn tls_args(&self) -> Vec<std::ffi::OsString> {
        match &self.tls {
            None => vec![],
            Some(t) => vec!["--tls".into(), "--cacert".into(), t.file("ca.crt").into()],
        }
    }

    /// Add the ACL user `user` with `password` and every right, on every
    /// running node (ACLs are not shared across a cluster).
    pub fn add_user(&self, user: &str, password: &str) -> Result<()> {
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            self.cli(n.port, &["ACL", "SETUSER", user, "on", &format!(">{password}"), "~*", "&*", "+@all"])?;
        }
        Ok(())
    }

    /// Every node's client port.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The directory holding the nodes' logs and cluster files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `redis-cli -p PORT ARGS…`'s output.
    pub fn cli(&self, port: u16, args: &[&str]) -> Result<String> {
        let out = Command::new("redis-cli")
            .args(self.tls_args())
            .args(["-p", &port.to_string(), "--no-auth-warning"])
            .args(args)
            .output()
            .map_err(|e| ClusterError(format!("redis-cli: {e}")))?;
        if !out.status.success() {
            return err(format!("redis-cli -p {port} {args:?}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A field of `INFO` on `port` (e.g. `used_memory`).
    pub fn info_field(&self, port: u16, field: &str) -> Result<String> {
        let info = self.cli(port, &["INFO"])?;
        info.lines()
            .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')).map(|v| v.trim().to_string()))
            .ok_or_else(|| ClusterError(format!("INFO on {port} has no {field}")))
    }

    /// The running nodes' roles from `CLUSTER NODES`, as seen by a live
    /// node: the client ports of the masters serving slots, with the ports
    /// of their connected replicas.
    pub fn masters(&self) -> Result<Vec<(u16, Vec<u16>)>> {
        let asker = self.live_port().ok_or_else(|| ClusterError("no node is running".into()))?;
        let text = self.cli(asker, &["CLUSTER", "NODES"])?;
        let mut masters: Vec<(String, u16, Vec<u16>)> = Vec::new();
        let mut replicas: Vec<(String, u16)> = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 || f[2].contains("fail") || f[7] != "connected" {
                continue;
            }
            let Some(port) = f[1].split('@').next().and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse().ok()) else { continue };
            if f[2].contains("master") && f.len() > 8 {
                masters.push((f[0].to_string(), port, Vec::new()));
            } else if f[2].contains("slave") {
                replicas.push((f[3].to_string(), port));
            }
        }
        for (of, port) in replicas {
            if let Some(m) = masters.iter_mut().find(|m| m.0 == of) {
                m.2.push(port);
            }
        }
        Ok(masters.into_iter().map(|(_, p, r)| (p, r)).collect())
    }

    fn live_port(&self) -> Option<u16> {
        self.nodes.iter().find(|n| n.child.is_some()).map(|n| n.port)
    }

    /// Wait until every running node says `cluster_state:ok` with all
    /// 16384 slots, and every master has at least `min_replicas`
    /// replicas whose link is up.
    pub fn wait_state(&self, min_replicas: usize, within: Duration) -> Result<()> {
        let end = Instant::now() + within;
        loop {
            let last = match self.state(min_replicas) {
                Ok(()) => return Ok(()),
                Err(e) => e.0,
            };
            if Instant::now() > end {
                return err(format!("the cluster did not settle in {within:?}: {last}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn state(&self, min_replicas: usize) -> Result<()> {
        let masters = self.masters()?;
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            let info = self.cli(n.port, &["CLUSTER", "INFO"])?;
            if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
                return err(format!("node {} is not ok yet", n.port));
            }
            // Every node's view (what a client's CLUSTER SLOTS shows) has
            // the replicas too, not only the master's own.
            let slots = self.cli(n.port, &["CLUSTER", "SLOTS"])?;
            let entries = masters.len();
            let addrs = slots.lines().filter(|l| l.trim() == "127.0.0.1").count();
            if addrs < entries * (1 + min_replicas) {
                return err(format!("node {} lists {addrs} addresses in CLUSTER SLOTS, {} wanted", n.port, entries * (1 + min_replicas)));
            }
        }
        for (m, _) in masters {
            let links = self.info_field(m, "connected_slaves")?.parse::<usize>().unwrap_or(0);
            let ups = self.cli(m, &["INFO", "replication"])?.lines().filter(|l| l.starts_with("slave") && l.contains("state=online")).count();
            if links.min(ups) < min_replicas {
                return err(format!("master {m} has {ups} replicas online, {min_replicas} wanted"));
            }
        }
        Ok(())
    }

    /// SIGKILL the node on `port` (its files stay, so it can come back).
    pub fn kill(&mut self, port: u16) -> Result<()> {
        let n = self.nodes.iter_mut().find(|n| n.port == port).ok_or_else(|| ClusterError(format!("no node on {port}")))?;
        if let Some(mut c) = n.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        Ok(())
    }

    /// Start the node on `port` again with its cluster file: it rejoins
    /// (a killed master comes back as a replica of its successor).
    pub fn restart(&mut self, port: u16) -> Result<()> {
        let i = self.nodes.iter().position(|n| n.port == port).ok_or_else(|| ClusterError(format!("no node on {port}")))?;
        if self.nodes[i].child.is_none() {
            self.start_node(i)?;
        }
        Ok(())
    }

    /// SIGSTOP (`pause`) or SIGCONT every running node: a cluster that
    /// hangs instead of refusing, and comes back with its data.
    pub fn signal_all(&self, pause: bool) -> Result<()> {
        self.nodes.iter().try_for_each(|n| self.signal(n.port, pause))
    }

    /// SIGSTOP (`pause`) or SIGCONT the node on `port`, if it runs: a node
    /// that hangs instead of refusing.
    pub fn signal(&self, port: u16, pause: bool) -> Result<()> {
        let n = self.nodes.iter().find(|n| n.port == port).ok_or_else(|| ClusterError(format!("no node on {port}")))?;
        if let Some(c) = &n.child {
            let sig = if pause { "-STOP" } else { "-CONT" };
            let st = Command::new("kill").args([sig, &c.id().to_string()]).status().map_err(|e| ClusterError(format!("kill: {e}")))?;
            if !st.success() {
                return err(format!("kill {sig} {} failed", c.id()));
            }
        }
        Ok(())
    }

    /// SIGKILL every node.
    pub fn kill_all(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Start every stopped node again.
    pub fn restart_all(&mut self) -> Result<()> {
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                self.start_node(i)?;
            }
        }
        Ok(())
    }

    /// The sum of `used_memory` over the running masters.
    pub fn used_memory(&self) -> Result<u64> {
        let mut sum = 0;
        for (m, _) in self.masters()? {
            sum += self.info_field(m, "used_memory")?.parse::<u64>().map_err(|e| ClusterError(format!("used_memory on {m}: {e}")))?;
        }
        Ok(sum)
    }

    /// The number of keys on the running masters.
    pub fn keys(&self) -> Result<u64> {
        let mut sum = 0;
        for (m, _) in self.masters()? {
            sum += self.keys_on(m)?;
        }
        Ok(sum)
    }

    /// The number of keys on the node at `port`.
    pub fn keys_on(&self, port: u16) -> Result<u64> {
        self.cli(port, &["DBSIZE"])?.trim().parse::<u64>().map_err(|e| ClusterError(format!("DBSIZE on {port}: {e}")))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = self.signal_all(false);
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.dir);
        release(&self.ports());
    }
}
