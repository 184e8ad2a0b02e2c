//! An NBD (Network Block Device) server over a zmem page pool: zram's block
//! device, in userspace.
//!
//! * [`proto`] — wire constants, request/option parsing with typed errors,
//!   reply encoding (pure, no I/O);
//! * [`negotiate`] — the fixed-newstyle handshake as an explicit state
//!   machine ([`Negotiation`]) plus its I/O driver;
//! * [`Export`] (from `zmem-export`, shared with the FUSE frontend) —
//!   byte-range I/O over an `Arc<Pool>` (page `i` of the device is pool key
//!   `i`; partial pages are read-modify-written under a per-page lock);
//! * [`server`] — [`Server`]: accept loop, one reader thread per connection
//!   that executes small requests itself (replies batched) and feeds worker
//!   threads the big ones, replies matched by handle, clean shutdown;
//! * [`client`] — [`NbdOrigin`]: a small NBD client, so that another NBD
//!   server can be the origin of a caching export (`serve --origin nbd://…`).
//!
//! Supported: NBD_OPT_GO/INFO (export, block size 1/4096/32 MiB, name,
//! description), EXPORT_NAME, LIST, ABORT, STRUCTURED_REPLY,
//! LIST/SET_META_CONTEXT (`base:allocation`); commands READ, WRITE (+FUA),
//! FLUSH, TRIM, WRITE_ZEROES (+NO_HOLE), BLOCK_STATUS, DISC. The export is
//! advertised CAN_MULTI_CONN: the pool is shared and every write is in it
//! before its reply is sent, so all connections see it. No TLS, no
//! extended headers (both answered NBD_REP_ERR_UNSUP).

pub mod client;
pub mod negotiate;
pub mod proto;
pub mod server;

pub use client::{ClientError, ClientState, NbdOrigin};
pub use negotiate::{negotiate, ExportInfo, HsState, Negotiation, Step};
pub use proto::{Command, ProtoError, Request, Session};
pub use server::{poll_readable, Listener, Server, ServerConfig, ServerStats, Stream};
pub use zmem_export::{Export, ExportError};
