//! `zmem serve --remote redis://…`: the block device's cold pages on a
//! real Redis cluster (3 masters, 3 replicas on loopback, started here and
//! killed when the test ends), driven by a real NBD client. No root needed.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use zmem_testkit::redis_cluster::{available, LocalCluster};

fn cluster() -> Option<LocalCluster> {
    cluster_with(5000)
}

fn cluster_with(node_timeout_ms: u32) -> Option<LocalCluster> {
    if !available() {
        zmem_testkit::ci::skip("redis-server and redis-cli are not installed (scripts/setup.sh installs them)");
        return None;
    }
    Some(LocalCluster::start(3, 1, node_timeout_ms).expect("starting a 3+3 Redis cluster"))
}

#[test]
#[ignore = "the failover matrix: slow, each test waits out a failover; scripts/test.sh runs it (cargo test -- --ignored)"]
fn a_device_reads_and_writes_through_a_masters_death_without_an_error() {
    require_tools!("nbdcopy", "sha256sum");
    // Redis's failover after 2 s: the reads and writes below run inside it.
    let Some(mut c) = cluster_with(2000) else { return };
    let dir = tempfile::tempdir().unwrap();
    let url = c.url();
    let mut s = ZmemServer::start("48M", &["--max-pool", "4M", "--remote", &url, "--remote-namespace", "failover"]);
    let src = fill_device(&s, dir.path(), 48 << 20, 11);
    assert!(s.stat_u64("written_back_pages") > 1000, "a 4 MiB pool must write back most of 48 MiB");
    // The master holding the most records: a batch goes only to a master
    // whose replica had attached when the store last read the map, so in
    // the cluster's first moments one master may hold none.
    let victim = c.masters().unwrap().into_iter().map(|m| m.0).max_by_key(|&m| c.keys_on(m).unwrap()).unwrap();
    assert!(c.keys_on(victim).unwrap() > 100, "the victim holds records");
    c.kill(victim).unwrap();
    let killed = std::time::Instant::now();
    // Every page reads back, a third of them from the dead master's replica.
    assert_reads_back(&s, &src, dir.path());
    let read_in = killed.elapsed();
    // The device written over whole: its batches go to the live masters.
    let src2 = fill_device(&s, dir.path(), 48 << 20, 12);
    assert_reads_back(&s, &src2, dir.path());
    eprintln!("read back in {read_in:?} after the kill, written and read again in {:?}", killed.elapsed());
    let st = s.stats();
    let g = |k: &str| st["stats"][k].as_u64().unwrap_or_else(|| panic!("no stats.{k}: {st}"));
    assert_eq!((g("backing_failed_reads"), g("failed_reads"), g("failed_writes")), (0, 0, 0), "{st}");
    assert!(g("backing_replica_reads") > 0, "no read went to the replica: {st}");
    assert!(s.stop().is_some_and(|st| st.success()), "{}", s.log_text());
}

/// Wait (at most a minute) until the cluster holds exactly one key per
/// page `s` has written back, and the namespace's owner key: the shrinker
/// done, the frees of replaced records sent. The pages written back.
fn settled_keys(c: &LocalCluster, s: &ZmemServer) -> u64 {
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (keys, st) = (c.keys().unwrap(), s.stats());
        let pages = st["stats"]["bd_count"].as_u64().unwrap();
        if keys == pages + 1 && st["stats"]["backing_frees_pending"] == 0 && s.stats()["stats"]["bd_count"] == pages {
            return pages;
        }
        assert!(std::time::Instant::now() < end, "{keys} keys on the cluster for {pages} pages written back: {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn written_back_pages_come_back_from_the_cluster() {
    require_tools!("nbdcopy", "sha256sum");
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let url = c.url();
    let mut s = ZmemServer::start("48M", &["--max-pool", "4M", "--remote", &url, "--remote-namespace", "nbdtest"]);
    let src = fill_device(&s, dir.path(), 48 << 20, 7);

    let st = s.stats();
    let g = |k: &str| st["stats"][k].as_u64().unwrap_or_else(|| panic!("no stats.{k}: {st}"));
    assert!(g("written_back_pages") > 1000, "a 4 MiB pool must write back most of 48 MiB: {st}");
    assert!(g("backing_bytes_written") < g("written_back_pages") * 4096, "writeback is compressed: {st}");
    // Once the shrinker is done and the frees of records it replaced have
    // reached the cluster, it holds one key per page written back (and
    // the namespace's owner key).
    assert!(settled_keys(&c, &s) > 1000);

    // The whole device reads back exactly, most of it from the cluster.
    assert_reads_back(&s, &src, dir.path());
    assert!(s.stat_u64("bd_reads") > 1000);
    assert!(s.stat_u64("backing_read_p50_ns") > 0);
    assert_eq!(s.stat_u64("backing_failed_reads"), 0);

    let text = run_ok(Command::new(ZMEM).arg("stat").arg("--control").arg(&s.control), Duration::from_secs(10));
    assert!(text.contains("remote: redis://127.0.0.1:") && text.contains("namespace nbdtest") && text.contains("read p50"), "{text}");

    // A clean stop deletes the device's records: nothing is left behind.
    assert!(s.stop().is_some_and(|st| st.success()), "{}", s.log_text());
    assert_eq!(c.keys().unwrap(), 0, "records left on the cluster after a clean stop");
}

/// The server killed, then replaced on purpose: the next one takes over
/// the records the pool names (nothing swept, nothing lost), deletes what
/// no page names, and writes new records under new names.
#[test]
fn a_device_on_the_cluster_outlives_its_server() {
    require_tools!("nbdcopy", "sha256sum");
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let url = c.url();
    let mut s = ZmemServer::start("32M", &["--max-pool", "2M", "--remote", &url, "--remote-namespace", "kept"]);
    let src = fill_device(&s, dir.path(), 32 << 20, 21);
    assert!(s.stat_u64("written_back_pages") > 1000, "a 2 MiB pool must write back most of 32 MiB (3.6 MiB compressed): {}", s.stats());
    for (i, kill) in [true, false].into_iter().enumerate() {
        s.replace_server(kill);
        let rec = &s.stats()["recovery"];
        assert_eq!((rec["pages"].as_u64(), rec["lost_pages"].as_u64()), (Some(8192), Some(0)), "replacement {i}: {rec}");
        assert!(s.stat_u64("bd_count") > 1000, "the written-back pages were taken over, not read back into RAM");
        assert_reads_back(&s, &src, dir.path());
    }
    assert!(!s.log_text().contains("deleted"), "a server that took over swept the records: {}", s.log_text());
    // Written over whole after the takeovers: new records, none reusing a
    // name, and the cluster ends up holding only what pages name.
    let src2 = fill_device(&s, dir.path(), 32 << 20, 22);
    assert_reads_back(&s, &src2, dir.path());
    settled_keys(&c, &s);
    assert!(s.stop().is_some_and(|st| st.success()), "{}", s.log_text());
    assert_eq!(c.keys().unwrap(), 0, "records left on the cluster after a clean stop");
}

#[test]
fn remote_flags_that_cannot_work_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let serve = |extra: &[&str]| {
        let out = run_timeout(Command::new(ZMEM).args(["serve", "--size", "16M", "--socket"]).arg(&sock).args(extra), Duration::from_secs(30));
        assert!(!out.status.success(), "zmem serve {extra:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Nothing listens on port 1.
    let e = serve(&["--remote", "redis://127.0.0.1:1", "--remote-timeout", "300ms"]);
    assert!(e.contains("cannot reach the cluster at redis://127.0.0.1:1"), "{e}");
    let e = serve(&["--remote", "127.0.0.1:7000"]);
    assert!(e.contains("no redis:// or rediss:// scheme"), "{e}");
    let e = serve(&["--remote", "redis://h:1", "--backing", "/tmp/x"]);
    assert!(e.contains("cannot be used with"), "{e}");
    let e = serve(&["--remote", "redis://h:1", "--remote-namespace", "a{b}"]);
    assert!(e.contains("without spaces or braces"), "{e}");
    let e = serve(&["--remote-replicas", "2"]);
    assert!(e.contains("--remote"), "{e}");
    let e = serve(&["--remote", "redis://h:1", "--remote-timeout", "0ms"]);
    assert!(e.contains("at least 1ms"), "{e}");
    // TLS files: for a rediss:// cluster only, and named when unreadable.
    let e = serve(&["--remote", "redis://h:1", "--remote-ca", "/etc/hostname"]);
    assert!(e.contains("give its URL as rediss://"), "{e}");
    let e = serve(&["--remote", "rediss://h:1", "--remote-ca", "/nonexistent/ca.pem"]);
    assert!(e.contains("--remote-ca /nonexistent/ca.pem"), "{e}");
}
