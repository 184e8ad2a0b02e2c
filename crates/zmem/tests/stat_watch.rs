//! `zmem stat --watch`: not on a terminal, one line per interval with the
//! rates, until stopped; a bad interval is refused.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn one_line_per_interval_with_rates_until_stopped() {
    let s = ZmemServer::start("8M", &[]);
    let mut w = Command::new(ZMEM).args(["stat", "--watch", "0.2", "--control"]).arg(&s.control).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(w.stdout.take().unwrap()).lines();
    let header = lines.next().unwrap().unwrap();
    assert!(header.contains("stores/s") && header.contains("writeback/s") && header.contains("hits/s"), "{header}");
    let start = Instant::now();
    let mut rows = Vec::new();
    for line in lines.by_ref().take(3) {
        rows.push(line.unwrap());
    }
    let took = start.elapsed();
    let _ = w.kill();
    let _ = w.wait();
    assert_eq!(rows.len(), 3, "{rows:?}");
    for r in &rows {
        let f: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(f.len(), 9, "{r}");
        assert!(f[0].len() == 8 && f[0].as_bytes()[2] == b':', "a time first: {r}");
        assert!(f[1..7].iter().all(|x| x.parse::<f64>().is_ok()), "rates: {r}");
    }
    assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(30), "3 intervals of 0.2 s took {took:?}");

    let out = run_timeout(Command::new(ZMEM).args(["stat", "--watch", "0", "--control"]).arg(&s.control), Duration::from_secs(10));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("between 0.1 and 3600"));
}
