//! The threads a server runs beside its frontend, started in one place
//! and stopped by one rule.
//!
//! Every server (`zmem serve`'s NBD device, a swap device's FUSE server)
//! answers its control socket, serves its metrics and runs its policy
//! threads for exactly as long as its frontend's main loop runs: they
//! start before the server says it is ready and stop, on a flag of their
//! own, once the main loop has returned, whatever it returned and
//! whatever asked it to. A signal the main loop refuses (a swap device
//! whose loop devices are still attached) therefore never silences the
//! control socket, and a main loop that fails never leaves a thread
//! behind.

use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::control::{control_loop, Info};
use crate::metrics::{render, MetricsServer};
use crate::policy::Policies;

/// A job a frontend runs beside its main loop, until the flag it is given
/// is set.
pub type SideJob<'a> = Box<dyn FnOnce(&AtomicBool) + Send + 'a>;

/// What runs beside a server's main loop.
pub struct SideThreads<'a> {
    /// The control socket, bound (`control::bind_unix`).
    pub control: Option<UnixListener>,
    /// The metrics endpoint, bound.
    pub metrics: Option<MetricsServer>,
    pub policies: Policies,
    /// A frontend's own jobs (the swap server's unmapped-page scanner).
    pub jobs: Vec<SideJob<'a>>,
}

impl SideThreads<'_> {
    /// Start the side threads, call `ready` (the server's ready file or
    /// log line, and systemd's READY=1 through [`crate::notify::ready`]),
    /// run `main` on this thread (which tells systemd the server stops, if
    /// it does: [`crate::notify::stopping`]), then stop the side threads;
    /// returns what `main` returned once they have all ended.
    pub fn run<R>(self, info: &Info, ready: impl FnOnce(), main: impl FnOnce() -> R) -> R {
        let quit = AtomicBool::new(false);
        let SideThreads { control, metrics, policies, jobs } = self;
        std::thread::scope(|s| {
            let quit = &quit;
            if let Some(l) = control {
                s.spawn(move || control_loop(l, info, quit));
            }
            if let Some(ep) = &metrics {
                s.spawn(move || ep.serve(|| render(&info.stats(), &info.device), quit));
            }
            policies.spawn(s, info.export.pool(), quit);
            for job in jobs {
                s.spawn(move || job(quit));
            }
            ready();
            // (`main` tells the service manager it stops, if it does: a
            // server that leaves for the next one does not.)
            let r = main();
            quit.store(true, Ordering::SeqCst);
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::time::Duration;

    use zmem_core::{Pool, PoolConfig};
    use zmem_export::Export;

    use super::*;
    use crate::control::Frontend;

    fn info() -> Info {
        let export = Arc::new(Export::new(Arc::new(Pool::new(PoolConfig::default()).unwrap()), 1 << 20));
        let server = Arc::new(zmem_nbd::Server::new(Arc::clone(&export), "", zmem_nbd::ServerConfig::default()));
        Info {
            device: "t".into(),
            export,
            frontend: Frontend::Nbd { server, fuse: None },
            algorithm: "lz4".into(),
            dedup: false,
            endpoint: "t".into(),
            backing: None,
            recovery: None,
        }
    }

    #[test]
    fn side_threads_run_while_main_does_and_stop_when_it_returns() {
        let info = info();
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("control.sock");
        let control = crate::control::bind_unix(&sock, 0o600, None).unwrap();
        let (ticks, ended) = (AtomicU64::new(0), AtomicBool::new(false));
        let job: SideJob = Box::new(|quit: &AtomicBool| {
            while !quit.load(Ordering::Relaxed) {
                ticks.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
            ended.store(true, Ordering::SeqCst);
        });
        let mut was_ready = false;
        let side = SideThreads { control: Some(control), metrics: None, policies: Policies::default(), jobs: vec![job] };
        let r = side.run(
            &info,
            || was_ready = true,
            || {
                // The control socket answers while the main loop runs, and
                // the frontend's own job runs beside it.
                let reply = crate::protocol::stats(&sock).expect("the control socket answers");
                assert_eq!(reply.algorithm, "lz4");
                while ticks.load(Ordering::Relaxed) == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert!(!ended.load(Ordering::SeqCst), "a side thread stopped before the main loop returned");
                7
            },
        );
        assert_eq!(r, 7);
        assert!(was_ready, "ready was called");
        assert!(ended.load(Ordering::SeqCst), "every side thread ended before run returned");
    }
}
