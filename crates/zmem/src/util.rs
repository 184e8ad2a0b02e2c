//! Small parsing and formatting helpers shared by subcommands.

use anyhow::{bail, Context};

/// Parse a size such as `4096`, `64K`, `512MiB`, `2G` (binary units).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        bail!("bad size `{s}`: expected a number with an optional unit (K, M, G, T), e.g. 512M");
    }
    let n: u64 = num.parse().with_context(|| format!("bad size `{s}`"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => bail!("bad size unit `{u}` in `{s}`: use K, M, G or T"),
    };
    n.checked_mul(mult).with_context(|| format!("size `{s}` is too large"))
}

/// How long a writeback or recompression of a large pool may take to
/// answer.
pub const LONG_REQUEST: std::time::Duration = std::time::Duration::from_secs(600);

/// Parse `on`/`off` (also true/false, yes/no, 1/0).
pub fn parse_on_off(s: &str) -> anyhow::Result<bool> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => bail!("expected on or off, got `{s}`"),
    }
}

/// Seconds from `300`, `300s`, `5m`, `2h` or `1d`.
pub fn parse_secs(s: &str) -> anyhow::Result<u32> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let mult: u64 = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => bail!("bad duration `{s}`: a number of seconds, or with s, m, h or d (300s, 5m)"),
    };
    let n: u64 = num.parse().with_context(|| format!("bad duration `{s}`: a number of seconds, or with s, m, h or d (300s, 5m)"))?;
    u32::try_from(n.saturating_mul(mult)).map_err(|_| anyhow::anyhow!("duration `{s}` is too long"))
}

/// A duration from `500ms`, `2s` or `2` (seconds), at least 1 ms.
pub fn parse_millis(s: &str) -> anyhow::Result<std::time::Duration> {
    let t = s.trim();
    let bad = || anyhow::anyhow!("bad duration `{s}`: milliseconds with ms (500ms), or seconds (2s, 2)");
    let (num, mult) = match t.strip_suffix("ms") {
        Some(n) => (n, 1),
        None => (t.strip_suffix('s').unwrap_or(t), 1000),
    };
    let ms = num.parse::<u64>().map_err(|_| bad())?.checked_mul(mult).ok_or_else(bad)?;
    if ms == 0 {
        bail!("duration `{s}` must be at least 1ms");
    }
    Ok(std::time::Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis() {
        assert_eq!(parse_millis("500ms").unwrap().as_millis(), 500);
        assert_eq!(parse_millis("2s").unwrap().as_millis(), 2000);
        assert_eq!(parse_millis("3").unwrap().as_millis(), 3000);
        for bad in ["", "0", "0ms", "1.5s", "-1", "ms", "99999999999999999999s"] {
            assert!(parse_millis(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert!(parse_size("").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn on_off() {
        assert!(parse_on_off("on").unwrap());
        assert!(!parse_on_off("OFF").unwrap());
        assert!(parse_on_off("maybe").is_err());
    }
}

/// Total RAM in bytes, from /proc/meminfo.
pub fn mem_total() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:")).context("/proc/meminfo has no MemTotal line")?;
    let kb: u64 = line.split_whitespace().nth(1).context("malformed MemTotal line")?.parse().context("malformed MemTotal line")?;
    Ok(kb * 1024)
}

/// Parse a pool limit: a size (`512M`) or a percentage of RAM (`20%`, zswap's
/// `max_pool_percent`).
pub fn parse_pool_limit(s: &str) -> anyhow::Result<u64> {
    if let Some(p) = s.trim().strip_suffix('%') {
        let pct: f64 = p.trim().parse().with_context(|| format!("bad percentage `{s}`: expected e.g. 20%"))?;
        if !(pct > 0.0 && pct <= 100.0) {
            bail!("bad percentage `{s}`: must be more than 0% and at most 100%");
        }
        return Ok((mem_total()? as f64 * pct / 100.0) as u64);
    }
    let b = parse_size(s)?;
    if b == 0 {
        bail!("a pool limit of 0 bytes holds nothing: give a size such as 64M or a share such as 20%");
    }
    Ok(b)
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn pool_limits() {
        assert_eq!(parse_pool_limit("64M").unwrap(), 64 << 20);
        let total = mem_total().unwrap();
        let p = parse_pool_limit("20%").unwrap();
        assert!(p > total / 6 && p < total / 4);
        assert!(parse_pool_limit("0%").is_err());
        assert!(parse_pool_limit("150%").is_err());
        assert!(parse_pool_limit("x%").is_err());
        assert!(parse_pool_limit("0").is_err());
    }
}
