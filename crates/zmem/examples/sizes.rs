//! Print the compressed size of every page of a file (one per line), for
//! tuning the allocator's size classes offline.
fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or_else(|| anyhow::anyhow!("usage: sizes FILE [COMPRESSOR]"))?;
    let c: zmem_compress::Compressor = args.next().unwrap_or_else(|| "lz4".into()).parse()?;
    let set = zmem_bench::pages::read_paths(&[path.into()], None)?;
    let mut buf = vec![0u8; 8192];
    for p in set.iter() {
        let same = p.chunks_exact(8).all(|w| w == &p[..8]);
        let n = if same { 0 } else { c.compress(p, &mut buf)? };
        println!("{n}");
    }
    Ok(())
}
