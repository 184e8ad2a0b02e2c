//! The pool options every command that builds a pool shares (`zmem serve`,
//! `zmem swap on`), and building the pool from them.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use anyhow::Context;
use zmem_compress::Compressor;
use zmem_core::{DictConfig, DictSource, Pool, PoolConfig, Reopened};
use zmem_server::keeper::Built;
use zmem_server::policy::{IdleRecompress, Policies, RecompressCpu, SizePool};
use zmem_server::sizing::Work;

use crate::util::{parse_on_off, parse_pool_limit, parse_size};

/// The help heading of the options a user seldom sets: the pool's finer
/// settings (compression, dedup, limits).
pub const POOL: &str = "Pool";
/// The backing file's and the remote tier's settings beyond where.
pub const COLD: &str = "Cold store";
/// The help heading of the options whose behaviour the machine decides by
/// default (docs/USAGE.md, "Expert options", says when another value won).
pub const EXPERT: &str = "Expert (the defaults adapt by themselves)";

#[derive(clap::Args, Debug, Clone)]
pub struct PoolArgs {
    /// Compressor: lz4, zstd[:LEVEL] or lzo.
    #[arg(long, default_value = "lz4")]
    pub compressor: String,
    /// Deduplicate identical pages: on or off.
    #[arg(long, default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set, help_heading = POOL)]
    pub dedup: bool,
    /// Cap on the pool's memory (zram's mem_limit, e.g. 256M): compressed
    /// pages and every table the pool keeps (mem_used_total never exceeds
    /// it); writes that need memory past it fail with ENOSPC.
    #[arg(long, value_parser = parse_size, help_heading = POOL)]
    pub mem_limit: Option<u64>,
    /// zswap's max_pool: a size (512M) or a share of RAM (20%), for the
    /// compressed pages and the tables that grow with them. Without
    /// --backing, writes past it fail with ENOSPC until the pool is back
    /// under --accept-threshold; with it, the coldest pages are written back.
    #[arg(long, default_value = "20%", value_parser = parse_pool_limit)]
    pub max_pool: u64,
    /// zswap's accept_threshold_percent.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u8).range(1..=100), help_heading = POOL)]
    pub accept_threshold: u8,
    /// Backing store for writeback: a regular file (created with mode 0600)
    /// or a block device; O_DIRECT where the file system allows. Cold pages
    /// go there compressed. An existing file or device that holds data other
    /// than a zmem store is refused unless --force is given.
    #[arg(long)]
    pub backing: Option<PathBuf>,
    /// Overwrite whatever the --backing file or device holds.
    #[arg(long, requires = "backing", help_heading = COLD)]
    pub force: bool,
    /// Cap on the backing file's size (e.g. 4G).
    #[arg(long, value_parser = parse_size, requires = "backing", help_heading = COLD)]
    pub backing_limit: Option<u64>,
    /// The least a read of the --backing file reads past the page it
    /// wants, for the pages written back next to it (0: the page's own
    /// sectors alone); reads that come in runs grow it, up to 64K. auto:
    /// 8K while a read of the file costs 0.2 ms or more (a disk that
    /// counts its operations or seeks), 0 while it costs less.
    #[arg(long, value_name = "SIZE|auto", default_value = "auto", value_parser = parse_read_ahead, help_heading = EXPERT)]
    pub read_ahead: ReadAhead,
    /// Write cold pages back to a Redis Cluster (or Valkey) instead of a
    /// file: redis://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…], the cluster's
    /// seed nodes. A page leaves RAM once --remote-replicas replicas have
    /// it; a read of it that the cluster does not answer within
    /// --remote-timeout fails (EIO).
    /// The URL may come from the environment instead (ZMEM_REMOTE_URL),
    /// which keeps a password out of the process list.
    #[arg(long, value_name = "URL", conflicts_with = "backing", env = REMOTE_URL_ENV, hide_env_values = true)]
    pub remote: Option<String>,
    /// This device's namespace on the cluster (default HOST/DEVICE).
    /// Records an earlier server left under it are deleted at start (a
    /// server that takes over from a dead or restarted one keeps those its
    /// pool names); a second live server under it is refused.
    #[arg(long, value_name = "NAME", requires = "remote", help_heading = COLD)]
    pub remote_namespace: Option<String>,
    /// Replicas that must acknowledge a batch (Redis WAIT) before its
    /// pages leave RAM; 0 for a cluster without replicas.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "remote", help_heading = COLD)]
    pub remote_replicas: u32,
    /// Deadline of a read from the cluster, and of a batch's
    /// acknowledgement (500ms, 2s).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = crate::util::parse_millis, requires = "remote", help_heading = COLD)]
    pub remote_timeout: std::time::Duration,
    /// How long a read of a written-back page keeps asking the record's
    /// master, its replicas and the cluster's new map while none answers
    /// (20s: Redis Cluster's default cluster-node-timeout of 15 s, then
    /// the election). A read that a replica can answer does not wait.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = crate::util::parse_millis, requires = "remote", help_heading = COLD)]
    pub remote_failover: std::time::Duration,
    /// The CA (a PEM file) that signed a TLS cluster's certificates
    /// (rediss://); without it, the system's roots.
    #[arg(long, value_name = "FILE", requires = "remote", help_heading = COLD)]
    pub remote_ca: Option<PathBuf>,
    /// A client certificate (PEM) for a TLS cluster that asks for one
    /// (tls-auth-clients), with --remote-key.
    #[arg(long, value_name = "FILE", requires_all = ["remote", "remote_key"], help_heading = COLD)]
    pub remote_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires_all = ["remote", "remote_cert"], help_heading = COLD)]
    pub remote_key: Option<PathBuf>,
    /// zswap's exclusive loads: on, off or auto. On: a page read from the
    /// pool is taken to be held by the kernel's swap or page cache from
    /// then on, so its compressed copy is the first written back (never
    /// dropped) and a written-back page read from the file stays there.
    /// Off: a load gives the page a second chance in RAM. Auto follows the
    /// kernel's rule for swap: on while the system's swap is more than half
    /// full (then the kernel frees a slot as soon as it has read it in),
    /// off below that (it keeps the slot of a page faulted in for reading,
    /// evicts the page clean and reads the slot again).
    #[arg(long, value_enum, help_heading = EXPERT)]
    pub exclusive_loads: Option<ExclusiveLoads>,
    /// A written-back page read from the file comes back to RAM while the
    /// pool has room (on), or is served from the file and stays there
    /// (off: zram's way with its backing device, and exclusive loads'),
    /// so that the pool's RAM holds pages not read since they were
    /// stored [default: on; zmem swap: off].
    #[arg(long, value_parser = parse_on_off, action = clap::ArgAction::Set, help_heading = EXPERT)]
    pub promote_loads: Option<bool>,
    /// zram's recomp_algorithm: an algorithm for `zmem recompress` and
    /// --recompress-idle, repeated for up to three, by priority [default:
    /// zstd:9; zmem swap: zstd:3].
    #[arg(long = "recomp-algo", value_name = "ALGO", action = clap::ArgAction::Append, help_heading = POOL)]
    pub recomp_algo: Vec<String>,
    /// Recompress pages idle this long in the background (300s, 5m), or
    /// off [default: off, as zram, which does it only when told (`zmem
    /// recompress`); zmem swap: 1s].
    #[arg(long, value_name = "DURATION|off", value_parser = parse_recompress_idle, help_heading = EXPERT)]
    pub recompress_idle: Option<RecompressIdle>,
    /// The share of one CPU --recompress-idle may use, in percent; auto
    /// (the default): half of what the machine's CPUs leave idle (up to
    /// one CPU), so a workload that keeps them busy keeps them.
    #[arg(long, value_name = "PERCENT|auto", value_parser = parse_recompress_cpu, help_heading = EXPERT)]
    pub recompress_cpu: Option<RecompressCpu>,
    /// Compression dictionary: auto (the pool trains one from a sample of
    /// its pages, and a new one when the data drifts), off, or the path of
    /// a zstd dictionary (`zstd --train` output).
    /// zstd compression uses it (stores with --compressor zstd, and
    /// recompression); lz4 stores only with --dict-lz4 on.
    #[arg(long, value_name = "auto|off|PATH", default_value = "off", help_heading = POOL)]
    pub dict: String,
    /// lz4 stores use the dictionary too (2-7 % smaller on this machine's
    /// data sets; zstd gains 7-11 %).
    #[arg(long, default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set, help_heading = EXPERT)]
    pub dict_lz4: bool,
    /// fixed: the pool's cap is --max-pool. auto: the cap starts at
    /// --max-pool and moves down to an eighth of it and back, to wherever
    /// the workload gets the most work done (its user CPU time, compared in
    /// trials of 20 s while it swaps; only a difference beyond the
    /// measurement's noise moves it). Default: auto for `zmem swap on`,
    /// fixed for `zmem serve`.
    #[arg(long, value_enum, help_heading = EXPERT)]
    pub pool_size: Option<PoolSize>,
    /// The cgroup of the workload whose CPU time --pool-size auto counts
    /// as its work (a directory with cgroup.procs, v1 or v2; it may be made
    /// after the server starts). Default for a swap device: its --charge-to
    /// or --cgroup; otherwise every process but the server.
    #[arg(long, value_name = "CGROUP", help_heading = EXPERT)]
    pub workload_cgroup: Option<PathBuf>,
}

/// `--read-ahead`: a floor of so many bytes, or one chosen by what a read
/// of the backing file costs (`BackingStore::set_read_ahead_auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadAhead {
    Bytes(u64),
    Auto,
}

impl std::fmt::Display for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadAhead::Bytes(n) => write!(f, "{n}"),
            ReadAhead::Auto => f.write_str("auto"),
        }
    }
}

/// What a command's pool does unless its options say otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    pub exclusive_loads: ExclusiveLoads,
    /// `--promote-loads`.
    pub promote_loads: bool,
    pub pool_size: PoolSize,
    pub recompress_idle: RecompressIdle,
    /// The recompression algorithm (`--recomp-algo`).
    pub recomp_algo: &'static str,
}

impl Defaults {
    /// `zmem serve`: zram's ways (recompression only when asked, zstd:9).
    pub const SERVE: Defaults = Defaults {
        exclusive_loads: ExclusiveLoads::Off,
        promote_loads: true,
        pool_size: PoolSize::Fixed,
        recompress_idle: RecompressIdle::Off,
        recomp_algo: "zstd:9",
    };
}

/// `--recompress-idle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecompressIdle {
    Off,
    /// Pages idle this many seconds.
    After(u32),
}

/// `--recompress-idle`: `off` or a duration.
pub fn parse_recompress_idle(s: &str) -> anyhow::Result<RecompressIdle> {
    match s {
        "off" => Ok(RecompressIdle::Off),
        d => crate::util::parse_secs(d).map(RecompressIdle::After).map_err(|e| anyhow::anyhow!("{e} (give a duration such as 1s or 5m, or off)")),
    }
}

/// `--recompress-cpu`: `auto` or a percent (1-100, `%` optional).
pub fn parse_recompress_cpu(s: &str) -> anyhow::Result<RecompressCpu> {
    match s {
        "auto" => Ok(RecompressCpu::Spare),
        p => match p.trim_end_matches('%').parse::<u8>() {
            Ok(n @ 1..=100) => Ok(RecompressCpu::Percent(n)),
            _ => anyhow::bail!("{s:?} is not a share of a CPU: give a percent from 1 to 100, or auto"),
        },
    }
}

/// `--recompress-cpu` as the server takes it.
fn recompress_cpu_arg(c: RecompressCpu) -> String {
    match c {
        RecompressCpu::Percent(p) => p.to_string(),
        RecompressCpu::Spare => "auto".into(),
    }
}

/// `--recompress-idle` as the server takes it.
impl std::fmt::Display for RecompressIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecompressIdle::Off => f.write_str("off"),
            RecompressIdle::After(s) => write!(f, "{s}s"),
        }
    }
}

/// `--read-ahead`: `auto` or a size.
pub fn parse_read_ahead(s: &str) -> anyhow::Result<ReadAhead> {
    match s.trim() {
        "auto" => Ok(ReadAhead::Auto),
        size => Ok(ReadAhead::Bytes(parse_size(size).context("give a size (0, 4K, 8K, ... up to 64K) or auto")?)),
    }
}

/// `--pool-size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PoolSize {
    Fixed,
    Auto,
}

impl PoolSize {
    pub fn name(self) -> &'static str {
        match self {
            PoolSize::Fixed => "fixed",
            PoolSize::Auto => "auto",
        }
    }
}

/// The environment variable `--remote` is read from when not given.
pub const REMOTE_URL_ENV: &str = "ZMEM_REMOTE_URL";

/// The remote namespace of `device` on this machine: `HOST/DEVICE`.
fn default_namespace(device: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let clean = |s: &str| s.trim().chars().map(|c| if c.is_ascii_graphic() && c != '{' && c != '}' { c } else { '_' }).collect::<String>();
    format!("{}/{}", clean(&host), clean(device))
}

/// `--dict`: off, auto, or a dictionary file's bytes.
pub fn parse_dict(s: &str) -> anyhow::Result<DictSource> {
    Ok(match s {
        "off" | "" => DictSource::Off,
        "auto" => DictSource::Auto,
        path => {
            let bytes = std::fs::read(path).with_context(|| format!("--dict {path}: cannot read the dictionary (give auto, off or a file)"))?;
            // Refuse a file that is no dictionary now, with its name.
            zmem_compress::Dictionary::from_bytes(1, bytes.clone(), &[]).with_context(|| format!("--dict {path}"))?;
            DictSource::Bytes(bytes)
        }
    })
}

/// `--exclusive-loads`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExclusiveLoads {
    On,
    Off,
    /// On while the system's swap is more than half full (the
    /// `zmem_server::policy` thread follows it).
    Auto,
}

impl ExclusiveLoads {
    fn name(self) -> &'static str {
        match self {
            ExclusiveLoads::On => "on",
            ExclusiveLoads::Off => "off",
            ExclusiveLoads::Auto => "auto",
        }
    }

    /// Whether loads are exclusive now, in this mode.
    fn now(self) -> bool {
        match self {
            ExclusiveLoads::On => true,
            ExclusiveLoads::Off => false,
            ExclusiveLoads::Auto => zmem_server::policy::swap_over_half_full(),
        }
    }
}

impl PoolArgs {
    /// The pool these options describe (opening the backing store, if
    /// any), and its compressor.
    /// `default` is the command's default for --exclusive-loads; with
    /// auto, the caller runs [`PoolArgs::policies`].
    /// `device` names the device in the remote tier's default namespace.
    pub fn build(&self, default: &Defaults, device: &str) -> anyhow::Result<(Pool, Compressor)> {
        if self.pool_size == Some(PoolSize::Auto) && !self.has_cold_store() {
            anyhow::bail!(
                "--pool-size auto needs --backing or --remote: without a place to write pages back, a smaller cap would refuse stores instead of making room"
            );
        }
        let (cfg, comp) = self.config(default)?;
        self.build_with(cfg, comp, device)
    }

    /// [`PoolArgs::build`] of the configuration `cfg` made of these options.
    fn build_with(&self, cfg: zmem_core::PoolConfig, comp: Compressor, device: &str) -> anyhow::Result<(Pool, Compressor)> {
        if let Some(url) = &self.remote {
            let store = zmem_remote::RemoteStore::open(self.remote_config(url, device)?)?;
            if store.cleaned() > 0 {
                eprintln!("zmem: deleted {} records an earlier server left on the cluster under this namespace", store.cleaned());
            }
            return Ok((Pool::with_cold_store(cfg, Box::new(store))?, comp));
        }
        let pool = match &self.backing {
            Some(path) => {
                let existing = if self.force { zmem_backing::Existing::Overwrite } else { zmem_backing::Existing::Refuse };
                let (store, why) =
                    zmem_backing::BackingStore::open(path, self.backing_limit, existing).with_context(|| format!("opening backing file {}", path.display()))?;
                self.set_read_ahead(&store, why)?;
                Pool::with_cold_store(cfg, Box::new(store))?
            }
            None => Pool::new(cfg)?,
        };
        Ok((pool, comp))
    }

    /// The backing store's read-ahead as --read-ahead says; `why` (why
    /// the file is not under `O_DIRECT`) told the user.
    fn set_read_ahead(&self, store: &zmem_backing::BackingStore, why: Option<String>) -> anyhow::Result<()> {
        match self.read_ahead {
            ReadAhead::Bytes(n) => store.set_min_read_ahead(usize::try_from(n).unwrap_or(usize::MAX)),
            ReadAhead::Auto => store.set_read_ahead_auto(zmem_backing::MIN_READAHEAD),
        }
        .context("--read-ahead")?;
        if let Some(why) = why {
            eprintln!("zmem: {why}");
        }
        Ok(())
    }

    /// A swap device's pool of `pages` pages, under a keeper: with a ledger
    /// where it can keep one (no dedup yet), so that the next server opens
    /// it again; opened from `left` (the arena the server before this one
    /// left, and its backing file) when given, with what opening it found
    /// (its remote tier's records taken over: `RemoteStore::open_kept`),
    /// and the backing file for the keeper to hold when this server made
    /// it.
    pub fn build_kept(&self, default: &Defaults, device: &str, pages: u64, left: Option<(OwnedFd, Option<OwnedFd>)>) -> anyhow::Result<Built> {
        let (mut cfg, comp) = self.config(default)?;
        let kept = cfg.keep_ledger(pages);
        let report = |r: &Reopened| {
            eprintln!(
                "zmem: opened the pool the last server left in {} ms: {} pages, {} objects it had not published freed, {} pages lost",
                r.took.as_millis(),
                r.pages,
                r.strays_freed,
                r.lost
            )
        };
        match (left, &self.backing) {
            (None, _) if !kept => {
                eprintln!("zmem: warning: this device's pool cannot be kept across a server crash or restart (dedup): a dead server loses its pages");
                let (pool, comp) = self.build(default, device)?;
                Ok(Built { pool, comp, reopened: None, backing: None })
            }
            (None, _) if self.remote.is_some() => {
                // (A ledger, and the store's sweep of what an earlier server left.)
                let (pool, comp) = self.build_with(cfg, comp, device)?;
                Ok(Built { pool, comp, reopened: None, backing: None })
            }
            (Some((_, Some(_))), _) if self.remote.is_some() => {
                anyhow::bail!("the pool another server left has a backing file: start it with the --backing it was made with")
            }
            (Some((arena, None)), _) if self.remote.is_some() => {
                let url = self.remote.as_deref().unwrap_or_default();
                let store = zmem_remote::RemoteStore::open_kept(self.remote_config(url, device)?)?;
                let (pool, r) = Pool::open_with_cold_store(arena, cfg, Box::new(store)).context("opening the pool the last server left")?;
                report(&r);
                Ok(Built { pool, comp, reopened: Some(r), backing: None })
            }
            (None, None) => Ok(Built { pool: Pool::new(cfg)?, comp, reopened: None, backing: None }),
            (None, Some(path)) => {
                let existing = if self.force { zmem_backing::Existing::Overwrite } else { zmem_backing::Existing::Refuse };
                let (f, why) = zmem_backing::OsFile::open(path, existing).with_context(|| format!("opening backing file {}", path.display()))?;
                let backing = f.file().try_clone().with_context(|| format!("keeping backing file {}", path.display()))?;
                let store = zmem_backing::BackingStore::on_file(f, self.backing_limit).with_context(|| format!("opening backing file {}", path.display()))?;
                self.set_read_ahead(&store, why)?;
                Ok(Built { pool: Pool::with_cold_store(cfg, Box::new(store))?, comp, reopened: None, backing: Some(backing.into()) })
            }
            (Some(_), _) if !kept => {
                anyhow::bail!("the pool another server left keeps a ledger, which these options cannot have: start it with the options it was made with")
            }
            (Some((arena, None)), None) => {
                let (pool, r) = Pool::open(arena, cfg).context("opening the pool the last server left")?;
                report(&r);
                Ok(Built { pool, comp, reopened: Some(r), backing: None })
            }
            (Some((arena, Some(file))), Some(path)) => {
                let f = zmem_backing::OsFile::kept(std::fs::File::from(file), path).with_context(|| format!("taking over backing file {}", path.display()))?;
                let store =
                    zmem_backing::BackingStore::on_file(f, self.backing_limit).with_context(|| format!("taking over backing file {}", path.display()))?;
                self.set_read_ahead(&store, None)?;
                let (pool, r) = Pool::open_with_cold_store(arena, cfg, Box::new(store)).context("opening the pool the last server left")?;
                report(&r);
                Ok(Built { pool, comp, reopened: Some(r), backing: None })
            }
            (Some((_, Some(_))), None) => anyhow::bail!("the pool another server left has a backing file: start it with the --backing it was made with"),
            (Some((_, None)), Some(path)) => {
                anyhow::bail!(
                    "the pool another server left has no backing file, and --backing {} was given: start it with the options it was made with",
                    path.display()
                )
            }
        }
    }

    /// The remote tier's settings for `device`.
    fn remote_config(&self, url: &str, device: &str) -> anyhow::Result<zmem_remote::RemoteConfig> {
        let mut rc = zmem_remote::RemoteConfig::new(url, &self.namespace(device))?;
        rc.replicas = self.remote_replicas;
        rc.deadline = self.remote_timeout;
        rc.failover = self.remote_failover;
        let read = |p: &PathBuf, what: &str| std::fs::read(p).with_context(|| format!("{what} {}: cannot read it", p.display()));
        let client = match (&self.remote_cert, &self.remote_key) {
            (Some(c), Some(k)) => Some((read(c, "--remote-cert")?, read(k, "--remote-key")?)),
            _ => None,
        };
        let ca = self.remote_ca.as_ref().map(|p| read(p, "--remote-ca")).transpose()?;
        if ca.is_some() || client.is_some() {
            let tls = rc.tls.as_mut().ok_or(zmem_remote::RemoteError::TlsWithoutRediss)?;
            (tls.ca, tls.client) = (ca, client);
        }
        Ok(rc)
    }

    /// `--remote-namespace`, or `device`'s default.
    fn namespace(&self, device: &str) -> String {
        self.remote_namespace.clone().unwrap_or_else(|| default_namespace(device))
    }

    /// Whether the cap sizes itself: --pool-size as given, else the
    /// command's default, which needs a cold store as the option given
    /// does ([`PoolArgs::build`]).
    fn sizes_pool(&self, default: PoolSize) -> bool {
        match self.pool_size {
            Some(given) => given == PoolSize::Auto,
            None => default == PoolSize::Auto && self.has_cold_store(),
        }
    }

    /// Whether pages past the cap are written back (--backing, --remote).
    fn has_cold_store(&self) -> bool {
        self.backing.is_some() || self.remote.is_some()
    }

    /// Where cold pages go, as `zmem stat` shows it (no password).
    pub fn cold_store(&self, device: &str) -> Option<String> {
        if let Some(url) = &self.remote {
            return Some(format!("{} (namespace {})", zmem_remote::redacted(url), self.namespace(device)));
        }
        self.backing.as_ref().map(|p| p.display().to_string())
    }

    /// The pool's configuration from these options, and its compressor.
    fn config(&self, default: &Defaults) -> anyhow::Result<(PoolConfig, Compressor)> {
        if self.recompress_cpu.is_some() && self.recompress_idle.unwrap_or(default.recompress_idle) == RecompressIdle::Off {
            anyhow::bail!("--recompress-cpu shares out idle recompression, which is off here: give --recompress-idle DURATION too");
        }
        let comp: Compressor = self.compressor.parse()?;
        let algos: Vec<&str> = if self.recomp_algo.is_empty() { vec![default.recomp_algo] } else { self.recomp_algo.iter().map(String::as_str).collect() };
        let cfg = PoolConfig {
            exclusive_loads: self.exclusive_mode(default.exclusive_loads).now(),
            promote_loads: self.promote_loads.unwrap_or(default.promote_loads),
            compressor: comp,
            dedup: self.dedup,
            mem_limit: self.mem_limit,
            max_pool: Some(self.max_pool),
            accept_threshold_percent: self.accept_threshold,
            recomp_algorithms: algos.iter().map(|a| a.parse()).collect::<Result<_, _>>().context("--recomp-algo")?,
            dict: DictConfig { source: parse_dict(&self.dict)?, lz4: self.dict_lz4, ..DictConfig::default() },
            ..Default::default()
        };
        Ok((cfg, comp))
    }

    /// A clean cache's pool (`serve --origin`): it drops its coldest pages
    /// when it reaches --max-pool, and keeps no page that compresses to
    /// more than `max_compressed` bytes; at 4096 it keeps every page (one
    /// that does not compress as it is).
    pub fn build_clean_cache(&self, max_compressed: usize) -> anyhow::Result<(Pool, Compressor)> {
        if self.backing.is_some() || self.remote.is_some() {
            anyhow::bail!("--backing and --remote exclude --origin: a cache of an origin drops its cold pages, it writes none back");
        }
        let (mut cfg, comp) = self.config(&Defaults::SERVE)?;
        if max_compressed < zmem_core::PAGE_SIZE {
            cfg.huge_threshold = max_compressed + 1;
            cfg.store_incompressible = false;
        }
        Ok((Pool::with_cold_store(cfg, Box::new(zmem_core::DropCold))?, comp))
    }

    /// The policy threads these options ask of a server's pool, with the
    /// command's defaults for the options not given.
    pub fn policies(&self, default: &Defaults) -> Policies {
        let cpu = self.recompress_cpu.unwrap_or(RecompressCpu::Spare);
        Policies {
            follow_swap_fullness: self.exclusive_mode(default.exclusive_loads) == ExclusiveLoads::Auto,
            recompress_idle: match self.recompress_idle.unwrap_or(default.recompress_idle) {
                RecompressIdle::Off => None,
                RecompressIdle::After(idle_secs) => Some(IdleRecompress { idle_secs, cpu }),
            },
            size_pool: self
                .sizes_pool(default.pool_size)
                .then(|| SizePool { max: self.max_pool, work: self.workload_cgroup.clone().map_or(Work::Machine, Work::Cgroup) }),
        }
    }

    /// --exclusive-loads as given, or the command's default.
    pub fn exclusive_mode(&self, default: ExclusiveLoads) -> ExclusiveLoads {
        self.exclusive_loads.unwrap_or(default)
    }

    /// What a child server process takes from its environment: the
    /// cluster URL, which may hold a password (`ps` shows arguments to
    /// every user of the machine, an environment only to its owner).
    pub fn to_env(&self) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        self.remote.iter().map(|u| (REMOTE_URL_ENV.into(), u.into())).collect()
    }

    /// The same options as command-line words (for a child server
    /// process), but for the cluster URL ([`PoolArgs::to_env`]).
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--compressor".to_string(),
            self.compressor.clone(),
            "--dedup".into(),
            if self.dedup { "on" } else { "off" }.into(),
            "--max-pool".into(),
            self.max_pool.to_string(),
            "--accept-threshold".into(),
            self.accept_threshold.to_string(),
        ];
        if let Some(l) = self.mem_limit {
            v.extend(["--mem-limit".into(), l.to_string()]);
        }
        if let Some(x) = self.exclusive_loads {
            v.extend(["--exclusive-loads".into(), x.name().into()]);
        }
        if let Some(p) = self.promote_loads {
            v.extend(["--promote-loads".into(), if p { "on" } else { "off" }.into()]);
        }
        if let Some(x) = self.pool_size {
            v.extend(["--pool-size".into(), x.name().into()]);
        }
        if let Some(cg) = &self.workload_cgroup {
            v.extend(["--workload-cgroup".into(), cg.display().to_string()]);
        }
        for a in &self.recomp_algo {
            v.extend(["--recomp-algo".into(), a.clone()]);
        }
        if let Some(i) = self.recompress_idle {
            v.extend(["--recompress-idle".into(), i.to_string()]);
        }
        if let Some(c) = self.recompress_cpu {
            v.extend(["--recompress-cpu".into(), recompress_cpu_arg(c)]);
        }
        v.extend(["--dict".into(), self.dict.clone(), "--dict-lz4".into(), if self.dict_lz4 { "on" } else { "off" }.into()]);
        if self.remote.is_some() {
            // The URL itself goes by the environment ([`PoolArgs::to_env`]).
            v.extend(["--remote-replicas".into(), self.remote_replicas.to_string()]);
            v.extend(["--remote-timeout".into(), format!("{}ms", self.remote_timeout.as_millis())]);
            v.extend(["--remote-failover".into(), format!("{}ms", self.remote_failover.as_millis())]);
            for (flag, file) in [("--remote-ca", &self.remote_ca), ("--remote-cert", &self.remote_cert), ("--remote-key", &self.remote_key)] {
                if let Some(f) = file {
                    v.extend([flag.into(), f.display().to_string()]);
                }
            }
            if let Some(ns) = &self.remote_namespace {
                v.extend(["--remote-namespace".into(), ns.clone()]);
            }
        }
        if let Some(b) = &self.backing {
            v.extend(["--backing".into(), b.display().to_string()]);
            if self.force {
                v.push("--force".into());
            }
            if let Some(l) = self.backing_limit {
                v.extend(["--backing-limit".into(), l.to_string()]);
            }
            v.extend(["--read-ahead".into(), self.read_ahead.to_string()]);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The serve defaults with a cap that sizes itself.
    const AUTO_SIZE: Defaults = Defaults { pool_size: PoolSize::Auto, ..Defaults::SERVE };

    /// These options alone, parsed as a command's are.
    fn parse_pool(args: &[&str]) -> Result<PoolArgs, clap::Error> {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            pool: PoolArgs,
        }
        Cli::try_parse_from(std::iter::once("zmem").chain(args.iter().copied())).map(|c| c.pool)
    }

    #[test]
    fn exclusive_loads_parse_and_round_trip() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            pool: PoolArgs,
        }
        for mode in ["on", "off", "auto"] {
            let c = Cli::try_parse_from(["zmem", "--exclusive-loads", mode]).unwrap();
            let words = c.pool.to_args();
            let i = words.iter().position(|w| w == "--exclusive-loads").expect("passed on to the server");
            assert_eq!(words[i + 1], mode);
        }
        let err = Cli::try_parse_from(["zmem", "--exclusive-loads", "sometimes"]).err().expect("refused").to_string();
        assert!(err.contains("on") && err.contains("auto"), "names the choices: {err}");
        let c = Cli::try_parse_from(["zmem"]).unwrap();
        assert_eq!(c.pool.exclusive_mode(ExclusiveLoads::Auto), ExclusiveLoads::Auto);
        assert_eq!(c.pool.policies(&Defaults::SERVE).size_pool, None, "the cap is fixed unless asked");
        assert_eq!(c.pool.policies(&AUTO_SIZE).size_pool, None, "no cold store: nowhere to shrink to");
        let c = Cli::try_parse_from(["zmem", "--backing", "/var/tmp/x"]).unwrap();
        let auto = c.pool.policies(&AUTO_SIZE).size_pool;
        assert_eq!(auto, Some(SizePool { max: c.pool.max_pool, work: Work::Machine }), "or unless the command's default is auto");
        let fixed = Cli::try_parse_from(["zmem", "--pool-size", "fixed", "--backing", "/var/tmp/x"]).unwrap();
        assert_eq!(fixed.pool.policies(&AUTO_SIZE).size_pool, None, "--pool-size fixed overrides it");
        // --pool-size auto sizes up to --max-pool, and reaches the server.
        let c = Cli::try_parse_from(["zmem", "--pool-size", "auto", "--max-pool", "64M"]).unwrap();
        assert_eq!(c.pool.policies(&Defaults::SERVE).size_pool, Some(SizePool { max: 64 << 20, work: Work::Machine }));
        let words = c.pool.to_args();
        let i = words.iter().position(|w| w == "--pool-size").expect("passed on to the server");
        assert_eq!(words[i + 1], "auto");
        // --workload-cgroup names whose work counts, and reaches the server.
        let c = Cli::try_parse_from(["zmem", "--pool-size", "auto", "--max-pool", "64M", "--workload-cgroup", "/cg/build"]).unwrap();
        let work = Work::Cgroup("/cg/build".into());
        assert_eq!(c.pool.policies(&Defaults::SERVE).size_pool, Some(SizePool { max: 64 << 20, work }));
        let words = c.pool.to_args();
        let i = words.iter().position(|w| w == "--workload-cgroup").expect("passed on to the server");
        assert_eq!(words[i + 1], "/cg/build");
        // Asked for without a cold store: refused, with the reason.
        let err = c.pool.build(&Defaults::SERVE, "t").err().expect("refused").to_string();
        assert!(err.contains("needs --backing or --remote"), "{err}");
        assert!(Cli::try_parse_from(["zmem", "--pool-size", "big"]).is_err());
    }

    #[test]
    fn promote_loads_takes_the_commands_default_unless_given_and_reaches_the_server() {
        let swap_like = Defaults { promote_loads: false, ..Defaults::SERVE };
        let c = parse_pool(&[]).unwrap();
        assert!(!c.to_args().iter().any(|w| w == "--promote-loads"), "the server keeps its command's default");
        for (d, want) in [(Defaults::SERVE, true), (swap_like, false)] {
            assert_eq!(c.config(&d).unwrap().0.promote_loads, want);
        }
        for (word, want) in [("on", true), ("off", false)] {
            let c = parse_pool(&["--promote-loads", word]).unwrap();
            assert_eq!(c.config(&swap_like).unwrap().0.promote_loads, want);
            assert_eq!(c.config(&Defaults::SERVE).unwrap().0.promote_loads, want);
            let words = c.to_args();
            let i = words.iter().position(|w| w == "--promote-loads").expect("passed on to the server");
            assert_eq!(words[i + 1], word);
        }
        assert!(parse_pool(&["--promote-loads", "maybe"]).is_err());
    }

    #[test]
    fn read_ahead_reaches_the_server_and_a_floor_past_the_most_is_refused() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            pool: PoolArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("b.img");
        let c = Cli::try_parse_from(["zmem", "--backing", file.to_str().unwrap(), "--read-ahead", "0"]).unwrap();
        let words = c.pool.to_args();
        let i = words.iter().position(|w| w == "--read-ahead").expect("passed on to the server");
        assert_eq!(words[i + 1], "0");
        c.pool.build(&Defaults::SERVE, "t").expect("a floor of 0 is taken");
        let c = Cli::try_parse_from(["zmem", "--backing", file.to_str().unwrap(), "--force", "--read-ahead", "1M"]).unwrap();
        let err = format!("{:#}", c.pool.build(&Defaults::SERVE, "t").err().expect("refused"));
        assert!(err.contains("--read-ahead") && err.contains("at most"), "{err}");
        assert_eq!(Cli::try_parse_from(["zmem"]).unwrap().pool.read_ahead, ReadAhead::Auto, "chosen by what a read costs unless set");
        // auto goes to the server as itself, and is taken.
        let c = Cli::try_parse_from(["zmem", "--backing", file.to_str().unwrap(), "--force", "--read-ahead", "auto"]).unwrap();
        let words = c.pool.to_args();
        let i = words.iter().position(|w| w == "--read-ahead").expect("passed on to the server");
        assert_eq!(words[i + 1], "auto");
        c.pool.build(&Defaults::SERVE, "t").expect("auto is taken");
        let err = Cli::try_parse_from(["zmem", "--read-ahead", "sometimes"]).err().expect("refused").to_string();
        assert!(err.contains("or auto"), "{err}");
    }

    #[test]
    fn the_recompression_cpu_share_is_a_percent_or_auto_and_reaches_the_server() {
        let share = |v: &str| parse_pool(&["--recompress-idle", "1s", "--recompress-cpu", v]);
        for (v, want) in [("auto", RecompressCpu::Spare), ("50", RecompressCpu::Percent(50)), ("100%", RecompressCpu::Percent(100))] {
            let p = share(v).unwrap_or_else(|e| panic!("{v}: {e}"));
            assert_eq!(p.recompress_cpu, Some(want), "{v}");
            let words = p.to_args();
            let i = words.iter().position(|w| w == "--recompress-cpu").expect("passed on to the server");
            assert_eq!(parse_recompress_cpu(&words[i + 1]).unwrap(), want, "{v} as the server reads it");
            let c = parse_pool(&words.iter().map(String::as_str).collect::<Vec<_>>()).expect("the server takes its words");
            assert_eq!(c.policies(&Defaults::SERVE).recompress_idle, Some(IdleRecompress { idle_secs: 1, cpu: want }), "{v}");
        }
        for bad in ["0", "101", "half", ""] {
            let err = share(bad).err().unwrap_or_else(|| panic!("{bad:?} taken")).to_string();
            assert!(err.contains("1 to 100, or auto"), "{bad:?}: {err}");
        }
        let err = parse_pool(&["--recompress-idle", "soon"]).expect_err("refused").to_string();
        assert!(err.contains("or off"), "{err}");
    }

    /// A command's defaults where an option is not given: `zmem serve`
    /// recompresses only when asked (zram's way), with zstd:9; `zmem swap
    /// on` recompresses pages idle 1 s, on the CPU the machine leaves idle,
    /// with zstd:3, unless its options say otherwise, off included; and an
    /// option given reaches a child server as itself.
    #[test]
    fn recompression_defaults_are_the_commands_and_options_override_them() {
        let swap = crate::swap::DEFAULTS;
        let parse = |args: &[&str]| parse_pool(args).unwrap();
        let none = parse(&[]);
        assert_eq!(none.policies(&Defaults::SERVE).recompress_idle, None);
        assert_eq!(none.policies(&swap).recompress_idle, Some(IdleRecompress { idle_secs: 1, cpu: RecompressCpu::Spare }));
        let algos = |p: &PoolArgs, d: &Defaults| p.config(d).unwrap().0.recomp_algorithms.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        assert_eq!(algos(&none, &Defaults::SERVE), ["zstd:9"]);
        assert_eq!(algos(&none, &swap), ["zstd:3"]);
        assert!(!none.to_args().iter().any(|w| w.starts_with("--recomp")), "defaults are the server's own: {:?}", none.to_args());
        let off = parse(&["--recompress-idle", "off"]);
        assert_eq!(off.policies(&swap).recompress_idle, None);
        let words = off.to_args();
        assert_eq!(parse(&words.iter().map(String::as_str).collect::<Vec<_>>()).policies(&swap).recompress_idle, None, "off reaches the server");
        // A share of recompression that is off is refused; swap's is on.
        let cpu_alone = parse(&["--recompress-cpu", "20"]);
        assert!(cpu_alone.config(&Defaults::SERVE).unwrap_err().to_string().contains("--recompress-idle"));
        assert!(parse(&["--recompress-idle", "off", "--recompress-cpu", "20"]).config(&swap).is_err());
        assert_eq!(cpu_alone.policies(&swap).recompress_idle, Some(IdleRecompress { idle_secs: 1, cpu: RecompressCpu::Percent(20) }));
        assert!(cpu_alone.config(&swap).is_ok());
        let given = parse(&["--recompress-idle", "5m", "--recompress-cpu", "20", "--recomp-algo", "zstd:9", "--recomp-algo", "zstd:19"]);
        assert_eq!(given.policies(&swap).recompress_idle, Some(IdleRecompress { idle_secs: 300, cpu: RecompressCpu::Percent(20) }));
        assert_eq!(algos(&given, &swap), ["zstd:9", "zstd:19"]);
        let again = parse(&given.to_args().iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!((again.policies(&swap).recompress_idle, algos(&again, &swap)), (given.policies(&swap).recompress_idle, algos(&given, &swap)));
    }

    #[test]
    fn a_cluster_url_goes_to_a_child_server_by_its_environment_not_its_arguments() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            pool: PoolArgs,
        }
        let url = "redis://:secret@10.0.0.5:7000";
        let c = Cli::try_parse_from(["zmem", "--remote", url, "--remote-replicas", "2", "--remote-timeout", "250ms", "--remote-failover", "3s"]).unwrap();
        let words = c.pool.to_args();
        assert!(!words.iter().any(|w| w.contains("secret")), "{words:?}");
        assert_eq!(c.pool.to_env(), vec![(REMOTE_URL_ENV.into(), url.into())]);
        let i = words.iter().position(|w| w == "--remote-timeout").unwrap();
        assert_eq!((words[i + 1].as_str(), c.pool.remote_timeout.as_millis()), ("250ms", 250));
        let i = words.iter().position(|w| w == "--remote-failover").unwrap();
        assert_eq!((words[i + 1].as_str(), c.pool.remote_failover.as_millis()), ("3000ms", 3000));
        let rc = c.pool.remote_config(url, "zmem0").unwrap();
        assert_eq!((rc.deadline.as_millis(), rc.failover.as_millis()), (250, 3000));
        assert!(rc.tls.is_none());
        assert!(c.pool.cold_store("zmem0").unwrap().starts_with("redis://10.0.0.5:7000 (namespace "), "no password in what stat shows");
        assert!(Cli::try_parse_from(["zmem", "--remote", url, "--backing", "/tmp/x"]).is_err());
        // TLS files: read, named when missing, refused with a plain URL, passed on.
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, b"-----BEGIN CERTIFICATE-----").unwrap();
        let ca_arg = ca.to_str().unwrap();
        let c = Cli::try_parse_from(["zmem", "--remote", "rediss://h:1", "--remote-ca", ca_arg]).unwrap();
        assert_eq!(c.pool.remote_config("rediss://h:1", "zmem0").unwrap().tls.unwrap().ca.as_deref(), Some(&b"-----BEGIN CERTIFICATE-----"[..]));
        let words = c.pool.to_args();
        assert!(words.windows(2).any(|w| w[0] == "--remote-ca" && w[1] == ca_arg), "{words:?}");
        let e = format!("{:#}", c.pool.remote_config("redis://h:1", "zmem0").unwrap_err());
        assert!(e.contains("rediss://"), "{e}");
        let c = Cli::try_parse_from(["zmem", "--remote", "rediss://h:1", "--remote-ca", "/nonexistent/ca.pem"]).unwrap();
        let e = format!("{:#}", c.pool.remote_config("rediss://h:1", "zmem0").unwrap_err());
        assert!(e.contains("--remote-ca /nonexistent/ca.pem"), "{e}");
        assert!(Cli::try_parse_from(["zmem", "--remote", "rediss://h:1", "--remote-cert", ca_arg]).is_err(), "a certificate without its key");
    }

    #[test]
    fn dict_choices_and_bad_files() {
        assert_eq!(parse_dict("off").unwrap(), DictSource::Off);
        assert_eq!(parse_dict("auto").unwrap(), DictSource::Auto);
        let e = format!("{:#}", parse_dict("/nonexistent/zmem.dict").unwrap_err());
        assert!(e.contains("/nonexistent/zmem.dict") && e.contains("auto, off"), "{e}");
        let dir = std::env::temp_dir().join(format!("zmem-dict-test-{}", std::process::id()));
        std::fs::write(&dir, b"plain text, no dictionary").unwrap();
        let e = format!("{:#}", parse_dict(dir.to_str().unwrap()).unwrap_err());
        std::fs::remove_file(&dir).unwrap();
        assert!(e.contains("not a zstd dictionary"), "{e}");
    }
}
