//! Telling a service manager how the server is doing (`sd_notify`): READY
//! once it serves, STATUS lines, STOPPING when it winds down, so
//! `Type=notify` units start what depends on a device only once it is
//! there. Outside systemd (no `NOTIFY_SOCKET`) every call does nothing;
//! a failure to notify is reported once and never stops the server.

use std::sync::atomic::{AtomicBool, Ordering};

use sd_notify::NotifyState;

fn send(states: &[NotifyState]) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if let Err(e) = sd_notify::notify(states) {
        if !WARNED.swap(true, Ordering::Relaxed) {
            eprintln!("zmem: could not notify the service manager ({e}); going on");
        }
    }
}

/// The server serves: READY=1 and what it serves.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A STATUS= line.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// STOPPING=1: the server winds down.
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}
