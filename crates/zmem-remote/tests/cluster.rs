//! RemoteStore against real Redis clusters (3 masters, 3 replicas) started
//! on loopback by the tests themselves and killed when each test ends,
//! also when it fails. The failover matrix's slow tests are `#[ignore]`d so
//! that a plain `cargo test` stays quick; `scripts/test.sh` (CI) runs them
//! with `--ignored`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use zmem_core::{ColdError, ColdStore, RecordId};
use zmem_remote::{RemoteConfig, RemoteStore};
use zmem_testkit::redis_cluster::{available, LocalCluster};
use zmem_testkit::XorShift;

fn cluster(node_timeout_ms: u32) -> Option<LocalCluster> {
    if !available() {
        zmem_testkit::ci::skip("redis-server and redis-cli are not installed (scripts/setup.sh installs them)");
        return None;
    }
    Some(LocalCluster::start(3, 1, node_timeout_ms).expect("starting a 3+3 Redis cluster"))
}

fn store(c: &LocalCluster, ns: &str) -> RemoteStore {
    let cfg = RemoteConfig::new(&c.url(), ns).unwrap();
    RemoteStore::open(cfg).expect("opening the remote store")
}

/// An object that compresses like a page would not matter here: any bytes.
fn object(rng: &mut XorShift, key: u64) -> Vec<u8> {
    let len = 16 + rng.below(3000) as usize;
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v[..8].copy_from_slice(&key.to_le_bytes());
    v
}

fn read(s: &RemoteStore, id: RecordId, key: u64) -> Result<Vec<u8>, ColdError> {
    let mut out = Vec::new();
    s.read(id, key, &mut out).map(|()| out)
}

#[test]
fn a_model_of_writes_rewrites_frees_and_reads_matches_byte_for_byte() {
    let Some(c) = cluster(5000) else { return };
    let s = store(&c, "model");
    let mut rng = XorShift::new(25);
    // key -> (id, bytes): what the engine would hold.
    let mut model: HashMap<u64, (RecordId, Vec<u8>)> = HashMap::new();
    for round in 0..60 {
        match rng.below(10) {
            0..=4 => {
                // A batch of writebacks; a key already there is a rewrite.
                let keys: Vec<u64> = (0..1 + rng.below(64)).map(|_| rng.below(400)).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
                let objs: Vec<(u64, Vec<u8>)> = keys.iter().map(|&k| (k, object(&mut rng, k))).collect();
                let refs: Vec<(u64, &[u8])> = objs.iter().map(|(k, o)| (*k, &o[..])).collect();
                let ids = s.put_batch(&refs).expect("a batch to a healthy cluster");
                assert_eq!(ids.len(), objs.len());
                for ((k, o), id) in objs.into_iter().zip(ids) {
                    let id = id.expect("the remote store keeps every object");
                    if let Some((old, _)) = model.insert(k, (id, o)) {
                        s.free(old).unwrap();
                    }
                }
            }
            5..=6 => {
                // Frees (discards).
                let ks: Vec<u64> = model.keys().copied().filter(|_| rng.below(4) == 0).collect();
                for k in ks {
                    let (id, _) = model.remove(&k).unwrap();
                    s.free(id).unwrap();
                }
            }
            r => {
                // Every other read round reads ahead first, as a frontend
                // does for a request of several pages.
                if r % 2 == 0 {
                    let ids: Vec<RecordId> = model.values().map(|(id, _)| *id).collect();
                    for chunk in ids.chunks(32) {
                        s.prefetch(chunk);
                    }
                }
                for (&k, (id, bytes)) in &model {
                    assert_eq!(&read(&s, *id, k).unwrap_or_else(|e| panic!("round {round}: key {k}: {e}")), bytes, "round {round}: key {k}");
                }
            }
        }
    }
    assert!(s.flush_frees(Duration::from_secs(20)), "frees did not reach the cluster");
    // Exactly the live records are on the cluster (and the owner key).
    assert_eq!(c.keys().unwrap(), model.len() as u64 + 1);
    for (&k, (id, bytes)) in &model {
        assert_eq!(&read(&s, *id, k).unwrap(), bytes);
    }
    let st = s.stats();
    assert_eq!(st.records, model.len() as u64);
    assert!(st.records_read > 0 && st.read_p50_ns > 0 && st.read_p99_ns >= st.read_p50_ns);
    assert!(st.prefetch_ops > 0, "no round read ahead");
    assert_eq!((st.failed_reads, st.failed_writes), (0, 0));
}

#[test]
fn a_record_of_another_generation_or_page_is_refused() {
    let Some(c) = cluster(5000) else { return };
    let s = store(&c, "gens");
    let ids = s.put_batch(&[(7, b"generation one".as_slice())]).unwrap();
    let old = ids[0].unwrap();
    let ids = s.put_batch(&[(7, b"generation two".as_slice()), (8, b"another page".as_slice())]).unwrap();
    let (new, other) = (ids[0].unwrap(), ids[1].unwrap());
    // A node answers a read of the newer record with the older one's
    // value, then with another page's: both refused, never handed on.
    let client = redis::cluster::ClusterClient::new(vec![format!("redis://127.0.0.1:{}", c.ports()[0])]).unwrap();
    let mut conn = client.get_connection().unwrap();
    for (from, what) in [(old, "Generation"), (other, "Key")] {
        let v: Vec<u8> = redis::cmd("GET").arg(s.key_of(from)).query(&mut conn).unwrap();
        let _: () = redis::cmd("SET").arg(s.key_of(new)).arg(v).query(&mut conn).unwrap();
        let e = read(&s, new, 7).unwrap_err();
        let text = format!("{e:?}");
        assert!(text.contains(what), "{text}");
    }
    // A flipped byte: the checksum.
    let mut v: Vec<u8> = redis::cmd("GET").arg(s.key_of(old)).query(&mut conn).unwrap();
    *v.last_mut().unwrap() ^= 0x40;
    let _: () = redis::cmd("SET").arg(s.key_of(old)).arg(v).query(&mut conn).unwrap();
    assert!(format!("{:?}", read(&s, old, 7).unwrap_err()).contains("Checksum"));
    assert_eq!(s.stats().failed_reads, 3);
    // A freed record is not live: the engine looks its page up again.
    s.free(other).unwrap();
    assert!(s.flush_frees(Duration::from_secs(10)));
    assert!(matches!(read(&s, other, 8), Err(ColdError::NotLive { .. })));
}

#[test]
#[ignore = "the failover matrix: slow, each test waits out a failover; scripts/test.sh runs it (cargo test -- --ignored)"]
fn a_master_killed_in_a_writeback_storm_loses_no_acknowledged_page() {
    let Some(mut c) = cluster(1000) else { return };
    let s = store(&c, "storm");
    let mut rng = XorShift::new(99);
    let mut acked: Vec<(u64, RecordId, Vec<u8>)> = Vec::new();
    let (mut failed, mut after_kill_ok) = (0u64, 0u64);
    let victim = c.masters().unwrap()[1].0;
    let start = Instant::now();
    let mut killed_at = None;
    let mut key = 0u64;
    // Write for 3 s after the kill and until the replica has taken over
    // and a batch went to it.
    loop {
        let objs: Vec<(u64, Vec<u8>)> = (0..64)
            .map(|_| {
                key += 1;
                (key, object(&mut rng, key))
            })
            .collect();
        let refs: Vec<(u64, &[u8])> = objs.iter().map(|(k, o)| (*k, &o[..])).collect();
        match s.put_batch(&refs) {
            Ok(ids) => {
                if killed_at.is_some() {
                    after_kill_ok += 1;
                }
                acked.extend(objs.into_iter().zip(ids).map(|((k, o), id)| (k, id.unwrap(), o)));
            }
            Err(_) => failed += 1,
        }
        if killed_at.is_none() && start.elapsed() > Duration::from_millis(500) {
            c.kill(victim).unwrap();
            killed_at = Some(Instant::now());
        }
        if killed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(3)) && c.wait_state(0, Duration::ZERO).is_ok() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the replica did not take over in a minute");
    }
    c.wait_state(0, Duration::from_secs(30)).unwrap();
    eprintln!("{} pages acknowledged, {failed} batches refused, {after_kill_ok} acknowledged after the kill", acked.len());
    assert!(after_kill_ok > 0, "the store did not go on after the kill");
    for (k, id, bytes) in &acked {
        assert_eq!(&read(&s, *id, *k).unwrap_or_else(|e| panic!("acknowledged page {k} after the failover: {e}")), bytes);
    }
    // And it goes on writing to every master once the old one is back
    // as a replica of its successor.
    c.restart(victim).unwrap();
    c.wait_state(1, Duration::from_secs(60)).unwrap();
    let ids = s.put_batch(&[(1 << 40, b"after".as_slice())]).unwrap();
    assert_eq!(read(&s, ids[0].unwrap(), 1 << 40).unwrap(), b"after");
}

/// How a read storm fared through a failure of one master.
struct Storm {
    reads: u64,
    longest: Duration,
}

/// Read every record of `acked` round after round, checking each byte,
/// until `done` says so (asked between rounds with the time since the
/// start); a read that fails fails the test.
fn read_storm(s: &RemoteStore, acked: &[(u64, RecordId, Vec<u8>)], what: &str, mut done: impl FnMut(Duration) -> bool) -> Storm {
    let start = Instant::now();
    let mut st = Storm { reads: 0, longest: Duration::ZERO };
    while !done(start.elapsed()) {
        for (k, id, bytes) in acked {
            let t = Instant::now();
            let got = read(s, *id, *k).unwrap_or_else(|e| panic!("{what}: page {k}, {:?} in: {e}", start.elapsed()));
            st.longest = st.longest.max(t.elapsed());
            assert_eq!(&got, bytes, "{what}: page {k}");
            st.reads += 1;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{what}: the cluster did not heal in two minutes");
    }
    st
}

#[test]
#[ignore = "the failover matrix: slow, each test waits out a failover; scripts/test.sh runs it (cargo test -- --ignored)"]
fn reads_ride_through_a_master_hung_then_one_killed() {
    let node_timeout = Duration::from_millis(1000);
    let Some(mut c) = cluster(node_timeout.as_millis() as u32) else { return };
    let s = store(&c, "ride");
    let mut rng = XorShift::new(33);
    let mut acked: Vec<(u64, RecordId, Vec<u8>)> = Vec::new();
    // Batches rotate over the masters: every master holds some.
    for b in 0..24u64 {
        let objs: Vec<(u64, Vec<u8>)> = (0..16).map(|i| (b * 16 + i, object(&mut rng, b * 16 + i))).collect();
        let refs: Vec<(u64, &[u8])> = objs.iter().map(|(k, o)| (*k, &o[..])).collect();
        let ids = s.put_batch(&refs).expect("a batch to a healthy cluster");
        acked.extend(objs.into_iter().zip(ids).map(|((k, o), id)| (k, id.unwrap(), o)));
    }
    // A master hangs (SIGSTOP) for 10 s (10 node timeouts): its replica
    // takes over, and it comes back as a replica. Reads go on throughout.
    let hung = c.masters().unwrap()[0].0;
    c.signal(hung, true).unwrap();
    let mut resumed = false;
    let storm = read_storm(&s, &acked, "a master hung", |t| {
        if !resumed && t > node_timeout * 10 {
            c.signal(hung, false).unwrap();
            resumed = true;
        }
        resumed && t > node_timeout * 11 && c.wait_state(1, Duration::ZERO).is_ok()
    });
    eprintln!("a master hung for 10 s: {} reads, longest {:?}, {} answered by a replica", storm.reads, storm.longest, s.stats().replica_reads);
    assert!(s.stats().replica_reads > 0, "no read went to a replica while its master hung");
    // Then a master is killed: its replica has every acknowledged record.
    let killed = c.masters().unwrap()[1].0;
    c.kill(killed).unwrap();
    let before = s.stats().replica_reads;
    let storm = read_storm(&s, &acked, "a master killed", |t| t > node_timeout * 3 && c.wait_state(0, Duration::ZERO).is_ok());
    eprintln!("a master killed: {} reads, longest {:?}, {} answered by a replica", storm.reads, storm.longest, s.stats().replica_reads - before);
    let st = s.stats();
    assert_eq!((st.failed_reads, st.missing_reads), (0, 0));
}

#[test]
#[ignore = "the failover matrix: slow, each test waits out a failover; scripts/test.sh runs it (cargo test -- --ignored)"]
fn a_store_starts_while_replicas_are_away_and_writes_back_once_they_attach() {
    let Some(mut c) = cluster(1000) else { return };
    let replicas: Vec<u16> = c.masters().unwrap().into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(replicas.len(), 3, "a 3+3 cluster");
    for &r in &replicas {
        c.kill(r).unwrap();
    }
    // A cluster healing: the store starts all the same.
    let s = store(&c, "healing");
    // Once the cluster has marked the replicas failed, a batch is not even
    // tried: writeback waits, and says why. (Before, WAIT times out.)
    let end = Instant::now() + Duration::from_secs(60);
    let why = loop {
        match s.put_batch(&[(1, b"waits".as_slice())]) {
            Ok(_) => panic!("a batch was acknowledged with every replica dead"),
            Err(e) if e.to_string().contains("writeback waits") => break e.to_string(),
            Err(_) => {}
        }
        assert!(Instant::now() < end, "the cluster did not drop its dead replicas from CLUSTER SLOTS in a minute");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(why.contains("--remote-replicas"), "{why}");
    assert_eq!(s.stats().masters_short, 3);
    // The replicas come back: writeback resumes by itself.
    for &r in &replicas {
        c.restart(r).unwrap();
    }
    c.wait_state(1, Duration::from_secs(60)).unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    let id = loop {
        if let Ok(ids) = s.put_batch(&[(2, b"resumed".as_slice())]) {
            break ids[0].unwrap();
        }
        assert!(Instant::now() < end, "writeback did not resume within 30 s of the replicas attaching");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(read(&s, id, 2).unwrap(), b"resumed");
    assert_eq!(s.stats().masters_short, 0);
}

#[test]
fn a_stopped_cluster_gives_errors_within_the_deadline_and_recovers() {
    let Some(c) = cluster(5000) else { return };
    let mut cfg = RemoteConfig::new(&c.url(), "stopped").unwrap();
    cfg.deadline = Duration::from_millis(600);
    // No node answers: a read waits out the failover deadline, then fails.
    cfg.failover = Duration::from_millis(600);
    let s = RemoteStore::open(cfg).unwrap();
    let ids = s.put_batch(&[(1, b"one".as_slice()), (2, b"two".as_slice())]).unwrap();
    c.signal_all(true).unwrap();
    let resume = Guard(&c);
    for (k, id) in [(1, ids[0].unwrap()), (2, ids[1].unwrap())] {
        let t = Instant::now();
        let e = read(&s, id, k).unwrap_err();
        let took = t.elapsed();
        eprintln!("read of a hung cluster: {e} after {took:?}");
        assert!(took < Duration::from_millis(600 + 900), "a read took {took:?}, past its deadline");
    }
    let t = Instant::now();
    assert!(s.put_batch(&[(3, b"three".as_slice())]).is_err());
    assert!(t.elapsed() < Duration::from_secs(4), "a batch to a hung cluster took {:?}", t.elapsed());
    drop(resume);
    // Back: the old records read, new batches go.
    let end = Instant::now() + Duration::from_secs(60);
    let back = loop {
        if let Ok(v) = read(&s, ids[0].unwrap(), 1) {
            break v;
        }
        assert!(Instant::now() < end, "the store did not recover in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(back, b"one");
    let end = Instant::now() + Duration::from_secs(60);
    while s.put_batch(&[(4, b"four".as_slice())]).is_err() {
        assert!(Instant::now() < end, "writes did not resume in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(s.stats().failed_reads >= 2);
}

#[test]
#[ignore = "the failover matrix: slow, each test waits out a failover; scripts/test.sh runs it (cargo test -- --ignored)"]
fn a_read_waits_out_a_whole_cluster_paused_for_a_moment() {
    let Some(c) = cluster(5000) else { return };
    // The default failover deadline (20 s) covers a 3 s pause.
    let s = store(&c, "paused");
    let ids = s.put_batch(&[(1, b"one".as_slice()), (2, b"two".as_slice())]).unwrap();
    c.signal_all(true).unwrap();
    let resume = Guard(&c);
    let (got, took) = std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let t = Instant::now();
            (read(&s, ids[0].unwrap(), 1), t.elapsed())
        });
        std::thread::sleep(Duration::from_secs(3));
        drop(resume);
        reader.join().unwrap()
    });
    eprintln!("a read through a 3 s pause of the whole cluster took {took:?}");
    assert_eq!(got.expect("the read waited for the cluster"), b"one");
    assert!(took >= Duration::from_millis(2500), "the read did not wait for the cluster: {took:?}");
    assert_eq!(s.stats().failed_reads, 0);
}

/// Resumes a paused cluster when dropped (also when the test fails).
struct Guard<'a>(&'a LocalCluster);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let _ = self.0.signal_all(false);
    }
}

#[test]
fn freed_records_give_the_cluster_its_memory_back_and_a_restart_sweeps_the_rest() {
    let Some(c) = cluster(5000) else { return };
    let s = store(&c, "dead");
    let mut rng = XorShift::new(5);
    let mut ids = Vec::new();
    // The empty size is that of a cluster that has been written to: each
    // master's replication backlog (1 MiB by default) fills with the first
    // writes and stays, whatever they were. One round of writes and frees
    // fills it; the second round is the one measured.
    let round = |rng: &mut XorShift, ids: &mut Vec<RecordId>| {
        for b in 0..200u64 {
            let objs: Vec<(u64, Vec<u8>)> = (0..64).map(|i| (b * 64 + i, object(rng, b * 64 + i))).collect();
            let refs: Vec<(u64, &[u8])> = objs.iter().map(|(k, o)| (*k, &o[..])).collect();
            ids.extend(s.put_batch(&refs).unwrap().into_iter().map(Option::unwrap));
        }
    };
    round(&mut rng, &mut ids);
    for id in ids.drain(..) {
        s.free(id).unwrap();
    }
    assert!(s.flush_frees(Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(500));
    let empty = c.used_memory().unwrap();
    round(&mut rng, &mut ids);
    let full = c.used_memory().unwrap();
    for id in ids.drain(..) {
        s.free(id).unwrap();
    }
    assert!(s.flush_frees(Duration::from_secs(30)));
    let end = Instant::now() + Duration::from_secs(30);
    let mut now = c.used_memory().unwrap();
    while now as f64 > empty as f64 * 1.05 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
        now = c.used_memory().unwrap();
    }
    eprintln!("cluster used_memory: empty {empty}, with 12800 records {full}, after freeing them {now}");
    assert!(full > empty + 12800 * 1000, "the records did not reach the cluster");
    assert!(now as f64 <= empty as f64 * 1.05, "used_memory {now} is more than 5 % above the empty cluster's {empty}");
    // A server that dies leaves records; the next under its name sweeps them.
    let ids = s.put_batch(&[(1, b"left behind".as_slice()), (2, b"too".as_slice())]).unwrap();
    std::mem::forget(s);
    assert_eq!(c.keys().unwrap(), 3);
    let _ = ids;
    // It died: its owner key names a process of this machine that is gone.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let dead_pid = (4_000_000..).find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).unwrap();
    let client = redis::cluster::ClusterClient::new(vec![format!("redis://127.0.0.1:{}", c.ports()[0])]).unwrap();
    let mut conn = client.get_connection().unwrap();
    let _: () = redis::cmd("SET").arg(zmem_remote::keys::owner_key("dead")).arg(format!("{} {dead_pid} 1", host.trim())).query(&mut conn).unwrap();
    let s2 = store(&c, "dead");
    assert_eq!(s2.cleaned(), 2);
    assert_eq!(c.keys().unwrap(), 1, "only the owner key is left");
    // A second live server under the same name is refused.
    let e = RemoteStore::open(RemoteConfig::new(&c.url(), "dead").unwrap()).err().expect("a second owner");
    assert!(e.to_string().contains("is served by"), "{e}");
    drop(s2);
    assert_eq!(c.keys().unwrap(), 0, "a clean close deletes its records and its owner key");
}

/// A page that compresses about 2:1 (half random, half zeros), from `key`.
fn page(key: u64) -> Vec<u8> {
    let mut p = vec![0u8; zmem_core::PAGE_SIZE];
    XorShift::new(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).fill(&mut p[..zmem_core::PAGE_SIZE / 2]);
    p
}

#[test]
#[ignore = "the failover matrix: slow, each test waits out a failover; scripts/test.sh runs it (cargo test -- --ignored)"]
fn a_full_pool_rides_through_a_master_killed_in_a_store_storm() {
    let node_timeout = Duration::from_millis(1000);
    let Some(mut c) = cluster(node_timeout.as_millis() as u32) else { return };
    let store = store(&c, "pool");
    // A small pool: stores keep writeback busy all through.
    let cfg = zmem_core::PoolConfig { max_pool: Some(2 << 20), shards: 8, ..zmem_core::PoolConfig::default() };
    let pool = zmem_core::Pool::with_cold_store(cfg, Box::new(store)).unwrap();
    let victim = c.masters().unwrap()[0].0;
    let start = Instant::now();
    let (mut key, mut longest, mut killed_at) = (0u64, Duration::ZERO, None);
    loop {
        let t = Instant::now();
        pool.store(key, &page(key)).unwrap_or_else(|e| panic!("page {key}, {:?} after the kill: {e}", killed_at.map(|k: Instant| k.elapsed())));
        longest = longest.max(t.elapsed());
        key += 1;
        if killed_at.is_none() && start.elapsed() > Duration::from_secs(1) {
            c.kill(victim).unwrap();
            killed_at = Some(Instant::now());
        }
        if killed_at.is_some_and(|k| k.elapsed() > node_timeout * 4) && c.wait_state(0, Duration::ZERO).is_ok() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "the cluster did not heal in two minutes");
    }
    let st = pool.stats();
    eprintln!(
        "{key} pages stored through a master's death, the longest store {longest:?}; {} written back, {} batches refused",
        st.written_back_pages, st.backing_failed_writes
    );
    assert!(st.written_back_pages > 1000, "the pool hardly wrote back: the test tested nothing");
    let mut buf = vec![0u8; zmem_core::PAGE_SIZE];
    for k in 0..key {
        pool.load(k, &mut buf).unwrap_or_else(|e| panic!("page {k}: {e}"));
        assert!(buf == page(k), "page {k} read back wrong");
    }
    assert_eq!(pool.stats().backing_failed_reads, 0);
}

#[test]
#[ignore = "the failover matrix: slow, each test waits out a failover; scripts/test.sh runs it (cargo test -- --ignored)"]
fn a_shard_gone_whole_fails_only_its_own_reads_and_says_where() {
    let Some(mut c) = cluster(1000) else { return };
    let mut cfg = RemoteConfig::new(&c.url(), "gone").unwrap();
    cfg.failover = Duration::from_secs(2);
    let s = RemoteStore::open(cfg).unwrap();
    let mut rng = XorShift::new(8);
    let mut acked = Vec::new();
    for b in 0..12u64 {
        let objs: Vec<(u64, Vec<u8>)> = (0..8).map(|i| (b * 8 + i, object(&mut rng, b * 8 + i))).collect();
        let refs: Vec<(u64, &[u8])> = objs.iter().map(|(k, o)| (*k, &o[..])).collect();
        let ids = s.put_batch(&refs).unwrap();
        acked.extend(objs.into_iter().zip(ids).map(|((k, o), id)| (k, id.unwrap(), o)));
    }
    // A master and its replica die: that shard's records are gone.
    let (master, replicas) = c.masters().unwrap().remove(0);
    c.kill(master).unwrap();
    for r in replicas {
        c.kill(r).unwrap();
    }
    let (mut lost, mut found) = (0, 0);
    // A batch is one slot: one lost record of a slot stands for the rest.
    let mut lost_slots = std::collections::HashSet::new();
    for (k, id, bytes) in &acked {
        let slot = zmem_remote::keys::split(id.to_raw()).0;
        if lost_slots.contains(&slot) {
            continue;
        }
        let t = Instant::now();
        match read(&s, *id, *k) {
            Ok(v) => {
                assert_eq!(&v, bytes, "page {k}");
                found += 1;
            }
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains(&format!(":{master}")), "the error names the dead master: {e}");
                // It asked until the failover deadline (2 s) was near, not once.
                assert!(t.elapsed() >= Duration::from_secs(1), "a read gave up after {:?}, long before the failover deadline", t.elapsed());
                lost_slots.insert(slot);
                lost += 1;
            }
        }
    }
    eprintln!("a shard gone: {found} records read, {lost} lost");
    assert!(lost > 0 && found > 0, "{lost} lost, {found} read: every shard held some");
}

/// A store opened on what a dead server left (`open_kept`) sweeps nothing
/// until told which records its pool still names (`adopt`): those are
/// taken at once and read back, every other key of the namespace is
/// deleted (by the sweep thread), an id the dead server could not have
/// written is refused, and new records start past the generations it had
/// reserved.
#[test]
fn a_store_taken_over_keeps_what_its_pool_names_and_deletes_the_rest() {
    let Some(c) = cluster(5000) else { return };
    let s = store(&c, "taken");
    let mut rng = XorShift::new(9);
    let objs: Vec<(u64, Vec<u8>)> = (0..200).map(|k| (k, object(&mut rng, k))).collect();
    let refs: Vec<(u64, &[u8])> = objs.iter().map(|(k, o)| (*k, &o[..])).collect();
    let ids: Vec<RecordId> = s.put_batch(&refs).unwrap().into_iter().map(Option::unwrap).collect();
    // It dies (nothing dropped), its owner key naming a process now gone.
    std::mem::forget(s);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let dead_pid = (4_000_000..).find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).unwrap();
    let client = redis::cluster::ClusterClient::new(vec![format!("redis://127.0.0.1:{}", c.ports()[0])]).unwrap();
    let mut conn = client.get_connection().unwrap();
    let key = zmem_remote::keys::owner_key("taken");
    let owner: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    let fields: Vec<&str> = owner.split(' ').collect();
    assert_eq!((fields.len(), fields[0]), (4, host.trim()), "HOST PID TOKEN LAST-GENERATION: {owner}");
    let _: () = redis::cmd("SET").arg(&key).arg(format!("{} {dead_pid} {} {}", fields[0], fields[2], fields[3])).query(&mut conn).unwrap();

    let s2 = RemoteStore::open_kept(RemoteConfig::new(&c.url(), "taken").unwrap()).unwrap();
    assert_eq!((s2.cleaned(), c.keys().unwrap()), (0, 201), "opened kept, nothing is swept yet");
    // The pool names the even records, and one id past what the dead
    // server had reserved.
    let generation = |id: RecordId| zmem_remote::keys::split(id.to_raw()).1;
    let bogus = RecordId::from_raw(zmem_remote::keys::id(1 << 40, 5));
    let named: Vec<RecordId> = ids.iter().step_by(2).copied().chain([bogus]).collect();
    let taken = s2.adopt(&named).unwrap();
    assert_eq!(taken.iter().filter(|t| **t).count(), 100);
    assert!(!taken[100], "an id the dead server could not have written was taken");
    assert_eq!(s2.stats().records, 100);
    s2.wait_swept();
    assert_eq!((s2.cleaned(), c.keys().unwrap()), (100, 101), "the records no page names are deleted, with the owner key kept");
    for (i, (k, o)) in objs.iter().enumerate().step_by(2) {
        assert_eq!(&read(&s2, ids[i], *k).unwrap(), o, "record {i}");
    }
    // New records: generations past all the dead server reserved.
    let new = s2.put_batch(&[(7, b"new".as_slice())]).unwrap()[0].unwrap();
    let reserved = u64::from_str_radix(fields[3], 16).unwrap();
    assert!(reserved >= ids.iter().map(|&id| generation(id)).max().unwrap());
    assert!(generation(new) > reserved, "a new record reuses a generation the dead server reserved");
    drop(s2);
    assert_eq!(c.keys().unwrap(), 0, "a clean close deletes its records and its owner key");
}
