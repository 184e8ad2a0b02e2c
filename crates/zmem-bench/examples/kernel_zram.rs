//! Run a data set through kernel zram and print the result as JSON.
//!
//! ```text
//! kernel_zram [--algorithm lz4] [--max-bytes N] [--pid PID | PATH...]
//! ```
//! With neither `--pid` nor paths, a default python3 process of 64 MiB is
//! started, read and killed.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use zmem_bench::{kernel_zram, pages};

fn main() -> anyhow::Result<()> {
    let mut algorithm = "lz4".to_string();
    let mut max_bytes: Option<u64> = None;
    let mut pid: Option<u32> = None;
    let mut paths: Vec<PathBuf> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--algorithm" => algorithm = args.next().context("--algorithm needs a value")?,
            "--max-bytes" => {
                max_bytes = Some(args.next().context("--max-bytes needs a value")?.parse()?)
            }
            "--pid" => pid = Some(args.next().context("--pid needs a value")?.parse()?),
            "-h" | "--help" => {
                println!("kernel_zram [--algorithm lz4] [--max-bytes N] [--pid PID | PATH...]");
                return Ok(());
            }
            s if s.starts_with('-') => bail!("unknown option {s}"),
            _ => paths.push(PathBuf::from(a)),
        }
    }
    let t = Instant::now();
    let set = if let Some(pid) = pid {
        pages::read_process(pid, max_bytes)?
    } else if !paths.is_empty() {
        pages::read_paths(&paths, max_bytes)?
    } else {
        let mut child = pages::spawn_default_process(64 << 20)?;
        let r = pages::read_process(child.id(), max_bytes);
        let _ = child.kill();
        let _ = child.wait();
        r?
    };
    eprintln!(
        "read {} pages from {} sources in {:.2?}",
        set.pages(),
        set.sources.len(),
        t.elapsed()
    );
    let res = kernel_zram::run(&set.data, &algorithm)?;
    println!("{}", serde_json::to_string_pretty(&res)?);
    Ok(())
}
