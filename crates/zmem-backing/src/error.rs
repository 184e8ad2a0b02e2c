/// Everything a [`BackingStore`](crate::BackingStore) operation can fail
/// with. No error leaves the store inconsistent: a failed
/// [`write_batch`](crate::BackingStore::write_batch) records nothing (the
/// caller still owns its pages), a failed read or free changes nothing, and
/// a failed compaction leaves every record where it was or where it moved.
#[derive(Debug, thiserror::Error)]
pub enum BackingError {
    /// The operating system refused an operation on the backing file. The
    /// source names the file (for [`OsFile`](crate::OsFile)).
    #[error("backing file {op} failed: {source} (check that the backing file's directory exists and is writable, and that its device is healthy and has free space)")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The file accepted fewer bytes than asked and then stopped accepting
    /// more: usually a full filesystem or a file size limit (`ulimit -f`).
    #[error("short write to backing file: {written} of {expected} bytes written (the filesystem is probably full: free space, lower the store's limit, or move the backing file)")]
    ShortWrite { expected: usize, written: usize },
    /// The file ended before a record did: something truncated or replaced
    /// the backing file underneath the store.
    #[error("short read from backing file: got {got} of {expected} bytes (the file was truncated or replaced by something other than zmem)")]
    ShortRead { expected: usize, got: usize },
    /// The record's magic, length, key or checksum did not match: the bytes
    /// on disk are not the ones written. The payload is never returned.
    #[error("record {id:#x} failed verification (magic, length, key or checksum mismatch): the backing file is corrupt or was modified; this page is lost")]
    Checksum { id: u64 },
    /// The id was never issued by this store, or its record was freed.
    #[error("record id {id:#x} is not live in this backing store (never written here, already freed, or stale)")]
    InvalidRecord { id: u64 },
    /// Payloads are compressed pages or extents of them: at most
    /// `MAX_PAYLOAD` bytes.
    #[error("record payload of {len} bytes exceeds the largest record ({} bytes: an extent of a block's pages)", crate::record::MAX_PAYLOAD)]
    TooLarge { len: usize },
    /// The path names something that must not be used as a backing store
    /// (a link, a device that is not a block device, data that is not ours).
    #[error("refusing to use {} as a backing store: {why}", path.display())]
    Refused { path: std::path::PathBuf, why: String },
    /// The filesystem could not reserve room for the file to grow, even
    /// after compaction moved records out of sparse segments.
    #[error("the backing file's filesystem is full: {source} (free space on it, or set a smaller --backing-limit)")]
    NoSpace {
        #[source]
        source: std::io::Error,
    },
    /// A least read-ahead larger than the most a read reads past a record.
    #[error("a read-ahead of at least {asked} bytes is more than the most a read of the backing file reads past a record ({most} bytes): give at most that")]
    ReadAhead { asked: usize, most: usize },
    /// [`BackingStore::adopt`](crate::BackingStore::adopt) was given a
    /// store that is not new.
    #[error("cannot take over the records of a backing file: {why}")]
    Adopt { why: String },
    /// Appending would grow the file past its size cap, even after
    /// compaction.
    #[error("backing file reached its limit of {limit_bytes} bytes even after compaction (raise the limit, free records, or stop writeback)")]
    Full { limit_bytes: u64 },
}
