//! Files a process was started with (by the keeper, `keeper.rs`), taken
//! by their numbers: this one `unsafe` block beside `malloc.rs` and
//! `pageout.rs`.

#![allow(unsafe_code)]

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Take file `n`, which this process was started with, if it is open and
/// what `kind` says (its `/proc/self/fd` link starts so: `/dev/fuse`,
/// `socket:`, `/memfd:`). `None` if it is not.
///
/// Each number must be taken once: the keeper's hand-over is read once a
/// process (`Kept::take`).
pub(crate) fn take(n: RawFd, kind: &str) -> Option<OwnedFd> {
    if n < 3 {
        return None;
    }
    let link = std::fs::read_link(format!("/proc/self/fd/{n}")).ok()?;
    if !link.as_os_str().as_encoded_bytes().starts_with(kind.as_bytes()) {
        return None;
    }
    // SAFETY: file `n` is open in this process (its /proc/self/fd link
    // exists) and of the kind the keeper said; it was inherited, so no
    // other owner of it exists in this process: std and every crate open
    // their files with O_CLOEXEC, so none of them holds an inherited one,
    // and `Kept::take` runs once a process (its guard) and takes each
    // number once.
    Some(unsafe { OwnedFd::from_raw_fd(n) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[test]
    fn a_file_is_taken_only_as_the_kind_it_is() {
        let n = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        assert!(take(n, "/dev/fuse").is_none(), "/dev/null taken for /dev/fuse");
        assert!(take(0, "/dev/").is_none() && take(-1, "/").is_none(), "stdio and bad numbers are never taken");
        let fd = take(n, "/dev/null").expect("the file, as what it is");
        assert_eq!(std::os::fd::AsRawFd::as_raw_fd(&fd), n);
    }
}
