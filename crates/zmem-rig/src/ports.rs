//! Loopback ports for a test's servers.
//!
//! A port found by binding port 0 and letting go lies in the kernel's
//! ephemeral range, from which every outgoing connection takes its local
//! port: between the check and the server's bind, a connection of another
//! test (or of a Redis node's cluster bus) can take it. The ports handed out
//! here lie below that range, are checked free, and are held for the
//! process so two tests of one binary never get the same one.

use std::net::TcpListener;

/// A free loopback port below the ephemeral range, held for the rest of
/// the process.
pub fn free_port() -> u16 {
    free_ports(1, &[]).expect("no free loopback port below the ephemeral range")[0]
}

/// The kernel's ephemeral port range, from which outgoing connections
/// take their local ports.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            let mut f = t.split_whitespace().map(|v| v.parse::<u16>());
            Some((f.next()?.ok()?, f.next()?.ok()?))
        })
        .unwrap_or((32768, 60999))
}

/// The ports handed out: P and P + 10000 (a Redis node's cluster bus)
/// both outside the ephemeral range (below it on a default kernel: 10000..22768).
fn port_window() -> (u16, u16) {
    let (lo, _) = ephemeral_range();
    match lo.checked_sub(10000) {
        Some(top) if top > 10100 => (10000, top),
        // A kernel whose ephemeral range starts low: any port, as before.
        _ => (20000, 50000),
    }
}

/// The ports handed out and not released: a Redis cluster whose node is
/// down for a restart keeps its port from the next test's.
static HELD: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

fn held() -> std::sync::MutexGuard<'static, Vec<u16>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// `count` ports, each free with its bus port (+10000), none in
/// `taken` nor held by another cluster of this process; they are held
/// until `release`. None if 2,000 draws found no more.
pub(crate) fn free_ports(count: usize, taken: &[u16]) -> Option<Vec<u16>> {
    let mut held = held();
    let mut ports = Vec::new();
    // Tests of one process start clusters at once: each call draws from
    // its own stream (time, pid and a counter), and a port is taken only
    // if it can be bound now.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let seed = now ^ (std::process::id() as u64) << 32 ^ CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed).wrapping_mul(0xA24B_AED4_963E_E407);
    let mut rng = crate::xorshift::XorShift::new(seed);
    let (from, to) = port_window();
    for _ in 0..2000 {
        let p = from + rng.below(u64::from(to - from)) as u16;
        let clash = |q: &u16| *q == p || q.abs_diff(p) == 10000;
        if ports.iter().any(clash) || taken.iter().any(clash) || held.iter().any(clash) {
            continue;
        }
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(p) && free(p + 10000) {
            ports.push(p);
            if ports.len() == count {
                held.extend_from_slice(&ports);
                return Some(ports);
            }
        }
    }
    None
}

pub(crate) fn release(ports: &[u16]) {
    held().retain(|p| !ports.contains(p));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_lie_outside_the_ephemeral_range_and_are_held_until_released() {
        let (lo, hi) = ephemeral_range();
        let a = free_ports(6, &[]).unwrap();
        let b = free_ports(6, &[]).unwrap();
        for &p in a.iter().chain(&b) {
            if lo > 20100 {
                for q in [p, p + 10000] {
                    assert!(!(lo..=hi).contains(&q), "port {q} is in the ephemeral range {lo}-{hi}");
                }
            }
            assert_eq!(a.iter().chain(&b).filter(|&&q| q == p || q.abs_diff(p) == 10000).count(), 1, "port {p} handed out twice");
        }
        release(&a);
        assert!(held().iter().all(|p| !a.contains(p)));
        assert!(b.iter().all(|p| held().contains(p)));
        release(&b);
    }
}
