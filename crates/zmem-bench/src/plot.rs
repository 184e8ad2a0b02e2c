//! The swap bench as a picture: runtime and disk I/O against the memory
//! budget, one line per system, one row of two charts per (disk, jobs).
//!
//! plotters draws into an RGB buffer with its pure-Rust backend, which the
//! png crate writes out as a PNG; text needs a
//! TrueType font, taken from the system (Debian's fonts-dejavu-core, which
//! `scripts/setup.sh` installs), so nothing is linked but Rust crates.

use std::path::Path;

use anyhow::{bail, Context};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::swap::{Report, System};

const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

fn load_font() -> anyhow::Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let r = DONE.get_or_init(|| {
        let Some(bytes) = FONTS.iter().find_map(|p| std::fs::read(p).ok()) else {
            return Err(format!("no TrueType font found ({}); install fonts-dejavu-core", FONTS.join(", ")));
        };
        // plotters keeps registered fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| "the font file is not a usable TrueType font".to_string())
    });
    r.clone().map_err(anyhow::Error::msg)
}

fn colour(s: System) -> RGBColor {
    match s {
        System::Disk => RGBColor(90, 90, 90),
        System::Zswap => RGBColor(31, 119, 180),
        System::Zram => RGBColor(44, 160, 44),
        System::Zmem => RGBColor(214, 39, 40),
        System::ZmemRemote => RGBColor(148, 103, 189),
        System::ZmemB => RGBColor(255, 127, 14),
    }
}

/// One (x, y) series per system for the runs of one (disk, jobs) set.
type Series = Vec<(System, Vec<(f64, f64)>)>;

fn series(report: &Report, disk: crate::swap::DiskKind, jobs: u32, y: impl Fn(&crate::swap::RunResult) -> f64) -> Series {
    System::ALL
        .into_iter()
        .filter_map(|s| {
            let mut pts: Vec<(f64, f64)> = report
                .runs
                .iter()
                .filter(|r| r.system == s && r.disk == Some(disk) && r.jobs == jobs && r.exit_ok)
                .map(|r| ((r.budget_bytes >> 20) as f64, y(r)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (!pts.is_empty()).then_some((s, pts))
        })
        .collect()
}

/// Of points sorted by x, one per x: the median of its y values.
fn medians(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    pts.chunk_by(|a, b| a.0 == b.0)
        .map(|run| {
            let mut ys: Vec<f64> = run.iter().map(|p| p.1).collect();
            ys.sort_by(f64::total_cmp);
            (run[0].0, crate::swap::median(&ys))
        })
        .collect()
}

fn chart(area: &DrawingArea<BitMapBackend, plotters::coord::Shift>, title: &str, y_label: &str, data: &Series) -> anyhow::Result<()> {
    if data.is_empty() {
        // Every run of the set failed or was interrupted: no axis to draw
        // (an empty range sends plotters' tick search into an endless loop).
        area.titled(&format!("{title}: no run completed"), ("sans-serif", 18))?;
        return Ok(());
    }
    let xs = data.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let y1 = data.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)).fold(0.0f64, f64::max);
    let pad = ((x1 - x0) * 0.1).max(16.0);
    let mut c = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..(y1 * 1.15).max(1.0))?;
    c.configure_mesh().x_desc("memory budget, MiB (workload + pool)").y_desc(y_label).draw()?;
    for (s, pts) in data {
        let col = colour(*s);
        // Each run a point; the line through each budget's median, where
        // `--sets` ran it more than once.
        c.draw_series(LineSeries::new(medians(pts), col.stroke_width(2)))?
            .label(s.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 4, col.filled())))?;
    }
    c.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    Ok(())
}

/// Write the report's runtime and disk I/O charts to `path` (PNG).
pub fn swap_png(report: &Report, path: &Path) -> anyhow::Result<()> {
    load_font()?;
    let mut sets: Vec<(crate::swap::DiskKind, u32)> = Vec::new();
    for r in &report.runs {
        if let Some(d) = r.disk {
            if !sets.contains(&(d, r.jobs)) {
                sets.push((d, r.jobs));
            }
        }
    }
    if sets.is_empty() {
        bail!("no limited runs to plot");
    }
    let (w, h) = (1200u32, 420 * sets.len() as u32);
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let rows = root.split_evenly((sets.len(), 2));
        for (i, &(disk, jobs)) in sets.iter().enumerate() {
            let t = series(report, disk, jobs, |r| r.wall_secs);
            let io = series(report, disk, jobs, |r| r.disk_bytes() as f64 / 1e6);
            chart(&rows[2 * i], &format!("runtime, {} disk, -j{jobs}", disk.name()), "wall time, s", &t)?;
            chart(&rows[2 * i + 1], &format!("swap disk I/O, {} disk, -j{jobs}", disk.name()), "read + written, MB", &io)?;
        }
        root.present()?;
    }
    write_png(path, w, h, &rgb).with_context(|| format!("cannot write {}", path.display()))
}

/// An 8-bit RGB image as a PNG file.
fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) -> anyhow::Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut out = enc.write_header()?;
    out.write_image_data(rgb)?;
    out.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swap::{test_run, DiskKind};

    /// `swap_png` on another thread, failing the test if it takes over 60 s.
    fn plot(report: Report) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        let p = path.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(swap_png(&report, &p).map_err(|e| format!("{e:#}"))));
        rx.recv_timeout(std::time::Duration::from_secs(60)).expect("plotting hung").expect("plotting failed");
        std::fs::read(&path).unwrap()
    }

    use crate::swap::test_report as report;

    #[test]
    fn a_plot_of_runs() {
        let d = Some(DiskKind::Real);
        let runs = vec![test_run(System::Disk, d, 400 << 20, 100.0, 1 << 30), test_run(System::Zmem, d, 400 << 20, 60.0, 1 << 28)];
        let file = plot(report(runs));
        assert_eq!(&file[1..4], b"PNG");
        // A whole picture, of one row of two charts, with something drawn on white.
        let mut reader = png::Decoder::new(std::io::Cursor::new(file)).read_info().unwrap();
        let mut rgb = vec![0; reader.output_buffer_size()];
        let frame = reader.next_frame(&mut rgb).unwrap();
        assert_eq!((frame.width, frame.height, frame.color_type), (1200, 420, png::ColorType::Rgb));
        let dark = rgb[..frame.buffer_size()].chunks(3).filter(|p| p.iter().all(|&c| c < 128)).count();
        assert!(dark > 1000 && dark < 1200 * 420 / 2, "{dark} dark pixels");
    }

    #[test]
    fn repeated_sets_draw_a_line_through_each_budgets_median() {
        assert_eq!(medians(&[(1.0, 5.0), (1.0, 1.0), (1.0, 2.0), (2.0, 4.0), (3.0, 1.0), (3.0, 3.0)]), [(1.0, 2.0), (2.0, 4.0), (3.0, 2.0)]);
        assert!(medians(&[]).is_empty());
    }

    #[test]
    fn a_set_whose_every_run_failed_still_plots() {
        // As after a Ctrl-C during the first limited run.
        let mut r = test_run(System::Disk, Some(DiskKind::Throttled), 434 << 20, 50.0, 1 << 29);
        r.exit_ok = false;
        let base = test_run(System::Disk, None, 0, 90.0, 0);
        assert_eq!(&plot(report(vec![base, r]))[1..4], b"PNG");
    }
}
