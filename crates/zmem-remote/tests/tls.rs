//! RemoteStore against a real TLS-only Redis cluster (3 masters, 3
//! replicas) with certificates made at start, and an ACL user: a round
//! trip, replica reads, and a wrong CA, password or missing client
//! certificate refused at start with a message that names it.

use std::time::Duration;

use zmem_core::ColdStore;
use zmem_remote::{RemoteConfig, RemoteStore, Tls};
use zmem_testkit::redis_cluster::{available, LocalCluster};

fn tls_cluster() -> Option<LocalCluster> {
    if !available() {
        zmem_testkit::ci::skip("redis-server and redis-cli are not installed (scripts/setup.sh installs them)");
        return None;
    }
    let c = LocalCluster::start_tls(3, 1, 2000).expect("starting a 3+3 TLS Redis cluster");
    c.add_user("zmem", "s3cret pass").unwrap();
    Some(c)
}

/// The cluster's URL with `user:password@`.
fn url_as(c: &LocalCluster, auth: &str) -> String {
    c.url().replacen("rediss://", &format!("rediss://{auth}@"), 1)
}

fn config(c: &LocalCluster, auth: &str, ca: &str, client: bool) -> RemoteConfig {
    let certs = c.certs().unwrap();
    let mut cfg = RemoteConfig::new(&url_as(c, auth), "tls").unwrap();
    let read = |f: &str| std::fs::read(certs.file(f)).unwrap();
    cfg.tls = Some(Tls { ca: Some(read(ca)), client: client.then(|| (read("client.crt"), read("client.key"))) });
    cfg
}

#[test]
fn a_tls_cluster_with_an_acl_user_round_trips_and_reads_from_replicas() {
    let Some(mut c) = tls_cluster() else { return };
    let s = RemoteStore::open(config(&c, "zmem:s3cret%20pass", "ca.crt", true)).expect("opening over TLS as zmem");
    let objs: Vec<(u64, Vec<u8>)> = (0..192u64).map(|k| (k, format!("page {k} over TLS").repeat(20).into_bytes())).collect();
    let mut acked = Vec::new();
    for chunk in objs.chunks(16) {
        let refs: Vec<(u64, &[u8])> = chunk.iter().map(|(k, o)| (*k, &o[..])).collect();
        let ids = s.put_batch(&refs).expect("a batch over TLS");
        acked.extend(chunk.iter().zip(ids).map(|((k, o), id)| (*k, id.unwrap(), o.clone())));
    }
    let mut out = Vec::new();
    for (k, id, o) in &acked {
        s.read(*id, *k, &mut out).unwrap();
        assert_eq!(&out, o, "page {k}");
    }
    // A master killed: its replica answers over TLS too.
    let victim = c.masters().unwrap()[0].0;
    c.kill(victim).unwrap();
    for (k, id, o) in &acked {
        s.read(*id, *k, &mut out).unwrap_or_else(|e| panic!("page {k} with a master dead: {e}"));
        assert_eq!(&out, o, "page {k}");
    }
    assert!(s.stats().replica_reads > 0, "no read went to a replica");
}

#[test]
fn a_wrong_ca_password_or_scheme_is_refused_at_start_with_what_is_wrong() {
    let Some(c) = tls_cluster() else { return };
    let refused = |cfg: RemoteConfig| {
        let mut cfg = cfg;
        cfg.deadline = Duration::from_millis(500);
        let e = RemoteStore::open(cfg).err().expect("refused").to_string();
        eprintln!("refused: {e}");
        e
    };
    let e = refused(config(&c, "zmem:s3cret%20pass", "other-ca.crt", false));
    assert!(e.contains("--remote-ca"), "a CA that signed nothing of the cluster: {e}");
    let e = refused(config(&c, "zmem:wrong", "ca.crt", false));
    assert!(e.contains("user and password"), "a wrong password: {e}");
    assert!(!e.contains("wrong"), "the password shows in the error: {e}");
    // Plain redis:// to TLS ports: refused, not hung.
    let t = std::time::Instant::now();
    let plain = RemoteConfig::new(&c.url().replacen("rediss://", "redis://", 1), "tls").unwrap();
    let _ = refused(plain);
    assert!(t.elapsed() < Duration::from_secs(30), "plain to a TLS cluster took {:?}", t.elapsed());
    // The right CA, no client certificate (the cluster does not require one).
    let s = RemoteStore::open(config(&c, "zmem:s3cret%20pass", "ca.crt", false)).expect("the right CA");
    let ids = s.put_batch(&[(1, b"ok".as_slice())]).unwrap();
    let mut out = Vec::new();
    s.read(ids[0].unwrap(), 1, &mut out).unwrap();
    assert_eq!(out, b"ok");
}
