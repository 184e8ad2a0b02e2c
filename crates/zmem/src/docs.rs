//! `zmem man DIR` and `zmem completions SHELL`: the manual pages and the
//! completion scripts, generated from the clap definitions, so they say
//! what `--help` says. The package build calls both.

use std::path::{Path, PathBuf};

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing).
    pub dir: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct CompletionArgs {
    /// bash, zsh, fish, elvish or powershell.
    pub shell: clap_complete::Shell,
}

/// Write `zmem.1` and a page for every visible subcommand, nested ones
/// named by their path (`zmem-swap-on.1`).
pub fn man(cmd: &clap::Command, a: &ManArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let mut written = Vec::new();
    page(cmd.clone(), "zmem", &a.dir, &mut written)?;
    println!("{} pages written to {}", written.len(), a.dir.display());
    Ok(())
}

fn page(cmd: clap::Command, name: &str, dir: &Path, written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    // The page's title and file are named by its path (zmem-swap-on), its
    // synopsis by the words one types (zmem swap on).
    let cmd = cmd.display_name(name.to_string()).bin_name(name.replace('-', " "));
    let path = dir.join(format!("{name}.1"));
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut out).with_context(|| format!("rendering {name}.1"))?;
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        page(sub.clone(), &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

/// The completion script for `a.shell`, on standard output.
/// (Rendered into memory first: the generator panics on a failed write,
/// and a reader that stops early, `| head`, is no error.)
pub fn completions(mut cmd: clap::Command, a: &CompletionArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "zmem", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing the completion script"),
        _ => Ok(()),
    }
}
