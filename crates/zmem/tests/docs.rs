//! `zmem man DIR` and `zmem completions SHELL`: pages and scripts made from
//! the same definitions as `--help`, so they cannot drift from it.

use std::collections::BTreeSet;
use std::process::Command;

fn zmem(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_zmem")).args(args).output().unwrap();
    assert!(out.status.success(), "zmem {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The long options a text names (`--max-pool`), roff's `\-` read as `-`.
fn long_options(text: &str) -> BTreeSet<String> {
    let text = text.replace("\\-", "-");
    let mut set = BTreeSet::new();
    for (i, _) in text.match_indices("--") {
        let name: String = text[i + 2..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        if name.len() > 1 {
            set.insert(name);
        }
    }
    set
}

#[test]
fn a_page_per_command_with_every_option_its_help_shows() {
    let d = tempfile::tempdir().unwrap();
    let out = zmem(&["man", d.path().to_str().unwrap()]);
    assert!(out.contains("pages written"), "{out}");
    let commands: [&[&str]; 9] =
        [&[], &["serve"], &["stat"], &["swap"], &["swap", "on"], &["swap", "off"], &["bench", "store"], &["bench", "remote"], &["completions"]];
    for words in commands {
        let name = std::iter::once("zmem").chain(words.iter().copied()).collect::<Vec<_>>().join("-");
        let page = std::fs::read_to_string(d.path().join(format!("{name}.1"))).unwrap_or_else(|e| panic!("{name}.1: {e}"));
        assert!(page.starts_with(".ie") || page.contains(".TH"), "{name}.1 is no man page");
        let mut help_args: Vec<&str> = words.to_vec();
        help_args.push("--help");
        let help = long_options(&zmem(&help_args));
        let man = long_options(&page);
        let missing: Vec<_> = help.difference(&man).collect();
        assert!(missing.is_empty(), "{name}.1 lacks options its --help shows: {missing:?}");
    }
    assert!(!d.path().join("zmem-swap-serve.1").exists(), "the hidden server command has no page");
    // The pages render, where the machine has man.
    if Command::new("man").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let out = Command::new("man").args(["-l", "-P", "cat"]).arg(d.path().join("zmem-swap-on.1")).env("MANWIDTH", "80").output().unwrap();
        assert!(out.status.success(), "man -l: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("zmem swap on") && text.contains("remote-namespace"), "{text}");
    }
}

#[test]
fn completion_scripts_for_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = zmem(&["completions", shell]);
        assert!(script.contains("serve") && script.contains("remote-namespace"), "{shell}: no subcommands or options");
    }
    let script = zmem(&["completions", "bash"]);
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("zmem.bash");
    std::fs::write(&p, &script).unwrap();
    let out = Command::new("bash").arg("-n").arg(&p).output().unwrap();
    assert!(out.status.success(), "bash -n: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_zmem")).args(["completions", "tcsh"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("possible values"));
}
