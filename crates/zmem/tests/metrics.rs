//! `zmem serve --metrics ADDR` and `zmem stat --prometheus`: a live server
//! scraped with a real HTTP client (ureq), the text read by a Prometheus
//! parser (prometheus-parse), every number `zmem stat --json` shows found
//! under its metric name with the same value.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn a_scrape_has_every_counter_zmem_stat_shows() {
    require_tools!("nbdcopy");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let s = ZmemServer::start("16M", &["--metrics", &addr, "--export-name", "m0"]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    std::fs::write(&src, test_data(16 << 20, 3)).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(format!("nbd+unix:///m0?socket={}", s.socket.display())), Duration::from_secs(60));

    let before = s.stats();
    let (ct, text) = scrape(&format!("http://{addr}/metrics"));
    let after = s.stats();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(text.ends_with("# EOF\n"));
    let got = samples(&text, "m0");
    let n = every_field_is_there(&before["stats"], &got, &after["stats"]);
    assert!(n > 70, "only {n} fields checked");
    assert!(got["zmem_stores_total"] >= 4096.0 && got["zmem_orig_data_size_bytes"] > 0.0);
    assert!(got["zmem_nbd_requests_total"] > 0.0 && got.contains_key("zmem_nbd_connections_active"));
    // Every request but the disconnect ran and was timed.
    let timed = got["zmem_nbd_request_duration_seconds"];
    assert!(timed > 0.0 && timed <= got["zmem_nbd_requests_total"], "{timed} timed of {} requests", got["zmem_nbd_requests_total"]);
    assert_eq!(got["zmem_disksize_bytes"], (16 << 20) as f64);

    // The same text, once, from the control socket.
    let once = run_ok(Command::new(ZMEM).args(["stat", "--prometheus", "--control"]).arg(&s.control), Duration::from_secs(10));
    let again = samples(&once, "m0");
    assert_eq!(again.keys().collect::<std::collections::BTreeSet<_>>(), got.keys().collect());

    // Only GET /metrics.
    match ureq::get(&format!("http://{addr}/")).call() {
        Err(ureq::Error::StatusCode(404)) => {}
        other => panic!("GET / answered {other:?}"),
    }
    match ureq::post(&format!("http://{addr}/metrics")).send("") {
        Err(ureq::Error::StatusCode(405)) => {}
        other => panic!("POST answered {other:?}"),
    }
}

#[test]
fn metrics_on_a_unix_socket_and_bad_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("metrics.sock");
    let s = ZmemServer::start("8M", &["--metrics", &format!("unix:{}", sock.display())]);
    // A plain HTTP/1.0 request on the socket (ureq speaks TCP only).
    use std::io::{Read, Write};
    let mut c = std::os::unix::net::UnixStream::connect(&sock).expect("the metrics socket is there");
    c.write_all(b"GET /metrics HTTP/1.0\r\nHost: zmem\r\n\r\n").unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.") && head.contains(" 200 "), "{head}");
    let got = samples(body, "serve");
    assert!(got.contains_key("zmem_stores_total"));
    drop(s);
    assert!(!sock.exists(), "the socket is removed when the server stops");

    let out = run_timeout(Command::new(ZMEM).args(["serve", "--size", "8M", "--metrics", "localhost"]), Duration::from_secs(10));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("neither HOST:PORT"));
}
