//! Which master serves which slots, from `CLUSTER SLOTS`, and which
//! masters the store writes to now, and which replicas a read may ask
//! when a master does not answer.
//!
//! The store picks, per batch, masters that are not backing off: a master
//! that failed a write or acknowledged it on fewer replicas than asked is
//! left alone for a while ([`BACKOFF`]), so one dead or replica-less node
//! does not stop writeback to the others. The map is read again after any
//! failure and every [`REFRESH`].

use std::time::{Duration, Instant};

use redis::Value;

/// How long a master that failed a write is left alone.
pub const BACKOFF: Duration = Duration::from_millis(500);
/// How often the map is read again when nothing failed.
pub const REFRESH: Duration = Duration::from_secs(5);
/// A map read this recently is not read again for a read that failed.
pub const RECENT: Duration = Duration::from_millis(100);

/// A master: its address, the slot ranges it serves, the replicas the
/// cluster lists for it (the fewest of any of its ranges) and their
/// addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Master {
    pub addr: String,
    pub ranges: Vec<(u16, u16)>,
    pub replicas: usize,
    pub replica_addrs: Vec<String>,
}

impl Master {
    /// The `n`-th slot this master serves (cycling through its ranges).
    pub fn slot(&self, n: u64) -> u16 {
        let total: u64 = self.ranges.iter().map(|&(a, b)| (b - a) as u64 + 1).sum();
        let mut i = n % total.max(1);
        for &(a, b) in &self.ranges {
            let len = (b - a) as u64 + 1;
            if i < len {
                return a + i as u16;
            }
            i -= len;
        }
        self.ranges.first().map_or(0, |r| r.0)
    }
}

/// `HOST:PORT` of a CLUSTER SLOTS node entry.
fn node_addr(v: &Value) -> Option<String> {
    let Value::Array(node) = v else { return None };
    Some(format!("{}:{}", node.first().and_then(text)?, node.get(1).and_then(int)?))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => text(v)?.parse().ok(),
    }
}

/// The masters in a `CLUSTER SLOTS` reply, or why it is not one.
pub fn parse_slots(v: &Value) -> Result<Vec<Master>, String> {
    let Value::Array(entries) = v else { return Err(format!("CLUSTER SLOTS answered {v:?}, not an array")) };
    let mut masters: Vec<Master> = Vec::new();
    for e in entries {
        let Value::Array(f) = e else { return Err("a CLUSTER SLOTS entry is not an array".into()) };
        let range = (f.first().and_then(int), f.get(1).and_then(int));
        let (Some(a), Some(b)) = range else { return Err("a CLUSTER SLOTS entry has no slot range".into()) };
        if !(0..16384).contains(&a) || !(a..16384).contains(&b) {
            return Err(format!("CLUSTER SLOTS names slots {a}..{b}"));
        }
        let Some(node) = f.get(2) else { return Err("a CLUSTER SLOTS entry has no master".into()) };
        let Some(addr) = node_addr(node) else { return Err("a CLUSTER SLOTS master has no address".into()) };
        let replica_addrs: Vec<String> = f.iter().skip(3).filter_map(node_addr).collect();
        let replicas = f.len().saturating_sub(3);
        match masters.iter_mut().find(|m| m.addr == addr) {
            Some(m) => {
                m.ranges.push((a as u16, b as u16));
                m.replicas = m.replicas.min(replicas);
                for r in replica_addrs {
                    if !m.replica_addrs.contains(&r) {
                        m.replica_addrs.push(r);
                    }
                }
            }
            None => masters.push(Master { addr, ranges: vec![(a as u16, b as u16)], replicas, replica_addrs }),
        }
    }
    if masters.is_empty() {
        return Err("the cluster serves no slots".into());
    }
    masters.sort_by(|a, b| a.addr.cmp(&b.addr));
    Ok(masters)
}

/// The map as last read, and the masters backing off.
#[derive(Debug, Default)]
pub struct Topology {
    pub masters: Vec<Master>,
    read_at: Option<Instant>,
    backoff: Vec<(String, Instant)>,
}

impl Topology {
    pub fn stale(&self, now: Instant) -> bool {
        self.read_at.is_none_or(|t| now.duration_since(t) > REFRESH)
    }

    /// Whether the map was read at or after `t`.
    pub fn read_since(&self, t: Instant) -> bool {
        self.read_at.is_some_and(|r| r >= t)
    }

    pub fn set(&mut self, masters: Vec<Master>, now: Instant) {
        self.masters = masters;
        self.read_at = Some(now);
    }

    /// The master serving `slot`, as last read.
    fn master_of(&self, slot: u16) -> Option<&Master> {
        self.masters.iter().find(|m| m.ranges.iter().any(|&(a, b)| (a..=b).contains(&slot)))
    }

    /// The address of the master serving `slot`, as last read ("?" if
    /// none does).
    pub fn master_addr(&self, slot: u16) -> String {
        self.master_of(slot).map_or_else(|| "?".to_string(), |m| m.addr.clone())
    }

    /// The replicas of the master serving `slot`, as last read.
    pub fn replicas_of(&self, slot: u16) -> Vec<String> {
        self.master_of(slot).map(|m| m.replica_addrs.clone()).unwrap_or_default()
    }

    /// Read the map again before the next batch.
    pub fn invalidate(&mut self) {
        self.read_at = None;
    }

    /// Leave the master serving `slot` alone for [`BACKOFF`].
    pub fn back_off(&mut self, slot: u16, now: Instant) {
        if let Some(m) = self.master_of(slot).cloned() {
            self.backoff.retain(|(a, _)| a != &m.addr);
            self.backoff.push((m.addr.clone(), now + BACKOFF));
        }
        self.invalidate();
    }

    /// Whether the master serving `slot` failed a call in the last
    /// [`BACKOFF`] (a read then asks its replicas first).
    pub fn backing_off(&self, slot: u16, now: Instant) -> bool {
        self.master_of(slot).is_some_and(|m| self.backoff.iter().any(|(a, until)| a == &m.addr && *until > now))
    }

    /// The masters to write to now: those with at least `replicas`
    /// replicas (a batch to another could not be acknowledged) that are
    /// not backing off, or, if every one of those is, all of them (a batch
    /// must go somewhere to find out). Empty if no master has the replicas.
    pub fn writable(&mut self, now: Instant, replicas: u32) -> Vec<Master> {
        self.backoff.retain(|(_, until)| *until > now);
        let able: Vec<&Master> = self.masters.iter().filter(|m| m.replicas as u32 >= replicas).collect();
        let ok: Vec<Master> = able.iter().filter(|m| !self.backoff.iter().any(|(a, _)| a == &m.addr)).map(|m| (*m).clone()).collect();
        if ok.is_empty() {
            able.into_iter().cloned().collect()
        } else {
            ok
        }
    }

    /// Masters with fewer than `replicas` replicas, as last read.
    pub fn short_of(&self, replicas: u32) -> usize {
        self.masters.iter().filter(|m| (m.replicas as u32) < replicas).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(a: i64, b: i64, master: u16, replicas: &[u16]) -> Value {
        let mut f = vec![Value::Int(a), Value::Int(b), Value::Array(vec![bulk("127.0.0.1"), Value::Int(master as i64), bulk("id")])];
        f.extend(replicas.iter().map(|&r| Value::Array(vec![bulk("127.0.0.1"), Value::Int(r as i64), bulk("rid")])));
        Value::Array(f)
    }

    #[test]
    fn a_slots_reply_becomes_masters_with_their_ranges() {
        let v = Value::Array(vec![entry(0, 5460, 7001, &[7004]), entry(5461, 10922, 7002, &[]), entry(10923, 16383, 7001, &[7004])]);
        let m = parse_slots(&v).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[0],
            Master { addr: "127.0.0.1:7001".into(), ranges: vec![(0, 5460), (10923, 16383)], replicas: 1, replica_addrs: vec!["127.0.0.1:7004".into()] }
        );
        assert_eq!((m[1].replicas, m[1].replica_addrs.len()), (0, 0));
        let mut t = Topology::default();
        t.set(m.clone(), Instant::now());
        assert_eq!(t.replicas_of(12000), ["127.0.0.1:7004"]);
        assert!(t.replicas_of(6000).is_empty());
        assert_eq!(m[0].slot(5461), 10923);
        assert_eq!(m[0].slot(0), 0);
    }

    #[test]
    fn malformed_replies_are_refused_not_panicked_on() {
        for v in [Value::Nil, Value::Array(vec![]), Value::Array(vec![Value::Int(1)]), Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(99999)])])]
        {
            assert!(parse_slots(&v).is_err(), "{v:?}");
        }
    }

    #[test]
    fn a_master_backs_off_then_returns() {
        let mut t = Topology::default();
        let now = Instant::now();
        let v = Value::Array(vec![entry(0, 8191, 7001, &[7004]), entry(8192, 16383, 7002, &[7005])]);
        t.set(parse_slots(&v).unwrap(), now);
        t.back_off(9000, now);
        assert!(t.backing_off(9000, now) && t.backing_off(16383, now) && !t.backing_off(0, now));
        assert!(!t.backing_off(9000, now + BACKOFF + Duration::from_millis(1)));
        assert_eq!(t.writable(now, 1).iter().map(|m| m.addr.as_str()).collect::<Vec<_>>(), ["127.0.0.1:7001"]);
        assert_eq!(t.writable(now + BACKOFF + Duration::from_millis(1), 1).len(), 2);
        t.back_off(1, now);
        t.back_off(9000, now);
        assert_eq!(t.writable(now, 1).len(), 2, "all backing off: try them all");
        // Masters without the replicas a batch needs take none.
        assert!(t.writable(now, 2).is_empty());
        assert_eq!(t.short_of(2), 2);
        let v = Value::Array(vec![entry(0, 8191, 7001, &[7004]), entry(8192, 16383, 7002, &[])]);
        t.set(parse_slots(&v).unwrap(), now);
        assert_eq!(t.writable(now, 1).iter().map(|m| m.addr.as_str()).collect::<Vec<_>>(), ["127.0.0.1:7001"], "even while it backs off");
        assert_eq!((t.short_of(1), t.short_of(0)), (1, 0));
        assert_eq!(t.writable(now, 0).len(), 2);
    }
}
