use zmem_alloc::AllocError;
use zmem_compress::CompressError;

/// Everything a pool operation can fail with. None of these leave the pool
/// inconsistent: a failed store keeps the key's previous contents (if any),
/// and every other entry is untouched.
#[derive(Debug, thiserror::Error)]
pub enum ZmemError {
    #[error("a page must be exactly 4096 bytes, got {len}")]
    BadPageSize { len: usize },
    #[error("key {key:#x} is not in the pool")]
    NotFound { key: u64 },
    #[error("pool is full: it reached its limit of {limit_bytes} bytes (raise --max-pool or --mem-limit, or give it a backing store with --backing)")]
    PoolFull { limit_bytes: u64 },
    #[error("page does not compress below the huge threshold and this pool rejects incompressible pages")]
    CompressPoor,
    #[error("allocator failed: {0}")]
    Alloc(AllocError),
    #[error("stored object for key {key:#x} could not be decompressed: {source}")]
    Corrupt { key: u64, source: CompressError },
    #[error("the object of key {key:#x} was written with the dictionary in slot {slot}, which holds none (a corrupt entry, or a zmem bug: please report it)")]
    DictMissing { key: u64, slot: usize },
    #[error("the allocator cannot read the object of key {key:#x}: {source} (an index entry names a freed object: a zmem bug, please report it)")]
    ObjectUnreadable { key: u64, source: AllocError },
    #[error("internal inconsistency at key {key:#x}: {what} (a zmem bug, please report it)")]
    Inconsistent { key: u64, what: String },
    #[error("compressor error: {0}")]
    Compress(#[from] CompressError),
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("cold store: {0}")]
    Cold(crate::cold::ColdError),
    #[error("this pool has no backing store: give it one (--backing FILE) to write pages back")]
    NoBackingStore,
    #[error("cannot open the pool again: {0}")]
    Reopen(String),
    #[error(
        "the page of key {key:#x} was lost when the pool was opened again (its entry could not be proven right): it reads as an error until it is written"
    )]
    Lost { key: u64 },
    #[error("key {key:#x} is past the pool's ledger of {keys} keys (the device's size)")]
    PastLedger { key: u64, keys: u64 },
}

impl From<AllocError> for ZmemError {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::LimitReached { limit_bytes } => ZmemError::PoolFull { limit_bytes },
            e => ZmemError::Alloc(e),
        }
    }
}

pub type Result<T> = std::result::Result<T, ZmemError>;
