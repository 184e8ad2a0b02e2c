//! `zmem serve --dict auto|PATH`: dictionaries on a block device driven by
//! a real client (nbdcopy), kept across the server's crash and restart.
//! No root needed.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use zmem_testkit::XorShift;

const T: Duration = Duration::from_secs(120);

/// Pages of words from a vocabulary of 600 that pages share but rarely
/// repeat within one: what a dictionary holds and a page alone does not.
fn words_image(pages: usize, seed: u64) -> Vec<u8> {
    let word = |i: u64| {
        let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (0..11).map(|b| b'a' + ((h >> (b * 5)) % 26) as u8).collect::<Vec<u8>>()
    };
    let mut r = XorShift::from_state(seed | 1);
    let mut out = Vec::with_capacity(pages * 4096);
    while out.len() < pages * 4096 {
        out.extend_from_slice(&word(r.below(600)));
        out.push(b' ');
    }
    out.truncate(pages * 4096);
    out
}

#[test]
fn serve_trains_a_dictionary_and_pages_read_back() {
    require_tools!("nbdcopy", "sha256sum");
    let dir = tempfile::tempdir().unwrap();
    let s = ZmemServer::start("80M", &["--compressor", "zstd:3", "--dict", "auto"]);
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    // 20,480 pages: one in 16 fills the 1,024-page sample ring.
    std::fs::write(&src, words_image(20_480, 5)).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(s.uri()), T);
    let t = Instant::now();
    while s.stat_u64("dict_id") == 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "no dictionary after 60 s: {}", s.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = s.stat_u64("compr_data_size");
    // Written again, every page now goes through the dictionary.
    run_ok(Command::new("nbdcopy").arg(&src).arg(s.uri()), T);
    assert_eq!(s.stat_u64("dict_pages"), 20_480);
    let after = s.stat_u64("compr_data_size");
    assert!(after * 10 < before * 9, "the dictionary shrank the pages: {before} -> {after}");
    assert!(s.stat_u64("dict_bytes") > 0);
    run_ok(Command::new("nbdcopy").arg(s.uri()).arg(&back), T);
    assert_eq!(sha256(&src), sha256(&back), "data read back differs");
    let text = run_ok(Command::new(ZMEM).arg("stat").arg("--control").arg(&s.control), T);
    assert!(text.contains("dict: id 1 on 20480 pages"), "{text}");
    // The server killed, then replaced on purpose: the dictionary is
    // taken over with the pool, and every page reads back.
    for (i, kill) in [true, false].into_iter().enumerate() {
        s.replace_server(kill);
        let rec = &s.stats()["recovery"];
        assert_eq!((rec["pages"].as_u64(), rec["lost_pages"].as_u64()), (Some(20_480), Some(0)), "{rec}");
        let text = run_ok(Command::new(ZMEM).arg("stat").arg("--control").arg(&s.control), T);
        assert!(text.contains("dict: id 1 on 20480 pages"), "after replacement {i}: {text}");
        std::fs::remove_file(&back).unwrap();
        run_ok(Command::new("nbdcopy").arg(s.uri()).arg(&back), T);
        assert_eq!(sha256(&src), sha256(&back), "data read back differs after replacement {i}");
    }
}

#[test]
fn serve_takes_a_dictionary_file_and_refuses_a_bad_one() {
    require_tools!("nbdcopy", "sha256sum", "zstd");
    let dir = tempfile::tempdir().unwrap();
    let samples = dir.path().join("samples");
    std::fs::create_dir(&samples).unwrap();
    for (i, page) in words_image(300, 9).chunks(4096).enumerate() {
        std::fs::write(samples.join(format!("{i}")), page).unwrap();
    }
    let dict = dir.path().join("pages.dict");
    run_ok(Command::new("zstd").args(["-q", "--train", "-r"]).arg(&samples).arg("-o").arg(&dict).arg("--maxdict=16384"), T);
    let s = ZmemServer::start("8M", &["--compressor", "zstd:3", "--dict", dict.to_str().unwrap()]);
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    std::fs::write(&src, words_image(2048, 11)).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(s.uri()), T);
    assert_eq!(s.stat_u64("dict_pages"), 2048);
    run_ok(Command::new("nbdcopy").arg(s.uri()).arg(&back), T);
    assert_eq!(sha256(&src), sha256(&back), "data read back differs");

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "plain text, not a dictionary").unwrap();
    let missing = dir.path().join("missing.dict");
    for (path, says) in [(&missing, "missing.dict"), (&text, "not a zstd dictionary")] {
        let out = run_timeout(Command::new(ZMEM).args(["serve", "--size", "8M", "--socket"]).arg(dir.path().join("x.sock")).arg("--dict").arg(path), T);
        assert!(!out.status.success(), "{} accepted", path.display());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
    }
}
