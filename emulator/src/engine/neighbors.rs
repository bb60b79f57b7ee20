//! The neighbour table: IP address → MAC, learnt from ARP and neighbour discovery, each entry
//! valid for a while (Linux's `base_reachable_time` is 30 s; entries here live
//! [`Neighbors::TTL`] and are refreshed by every frame that confirms them).
//!
//! The table is bounded: a storm of ARP packets with made-up senders fills it to
//! [`Neighbors::CAPACITY`] and no further (expired entries make room; live ones are kept).
use crate::time::Nanos;
use rocemu_wire::eth::Mac;
use std::collections::HashMap;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    mac: Mac,
    expires: Nanos,
}

/// IP → MAC with timeouts.
#[derive(Debug, Default)]
pub struct Neighbors {
    map: HashMap<IpAddr, Entry>,
}

/// What [`Neighbors::learn`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learnt {
    New,
    Changed,
    Refreshed,
    /// The table is full of live entries.
    Refused,
}

impl Neighbors {
    pub const TTL: Nanos = Nanos::from_millis(300_000);
    pub const CAPACITY: usize = 4096;

    /// The MAC of `ip` if a live entry has it.
    pub fn get(&self, ip: IpAddr, now: Nanos) -> Option<Mac> {
        self.map.get(&ip).filter(|e| e.expires > now).map(|e| e.mac)
    }

    /// Records that `ip` is at `mac` as of `now`.
    pub fn learn(&mut self, ip: IpAddr, mac: Mac, now: Nanos) -> Learnt {
        let expires = now + Self::TTL;
        if let Some(e) = self.map.get_mut(&ip) {
            let changed = e.mac != mac;
            *e = Entry { mac, expires };
            return if changed {
                Learnt::Changed
            } else {
                Learnt::Refreshed
            };
        }
        if self.map.len() >= Self::CAPACITY {
            self.map.retain(|_, e| e.expires > now);
            if self.map.len() >= Self::CAPACITY {
                return Learnt::Refused;
            }
        }
        self.map.insert(ip, Entry { mac, expires });
        Learnt::New
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_refresh() {
        let mut n = Neighbors::default();
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let m = Mac([2, 0, 0, 0, 0, 2]);
        assert_eq!(n.learn(ip, m, Nanos(0)), Learnt::New);
        assert_eq!(n.get(ip, Nanos(1)), Some(m));
        assert_eq!(n.get(ip, Neighbors::TTL), None);
        assert_eq!(n.learn(ip, m, Nanos(5)), Learnt::Refreshed);
        assert_eq!(n.get(ip, Neighbors::TTL), Some(m));
        assert_eq!(
            n.learn(ip, Mac([2, 0, 0, 0, 0, 3]), Nanos(6)),
            Learnt::Changed
        );
    }

    #[test]
    fn bounded_under_a_storm() {
        let mut n = Neighbors::default();
        let m = Mac([2, 0, 0, 0, 0, 2]);
        for i in 0..(Neighbors::CAPACITY as u32 + 100) {
            n.learn(IpAddr::from(i.to_be_bytes()), m, Nanos(0));
        }
        assert_eq!(n.len(), Neighbors::CAPACITY);
        // Once the storm's entries expire, a real neighbour gets in again.
        let later = Neighbors::TTL + Nanos(1);
        assert_eq!(n.learn("10.0.0.2".parse().unwrap(), m, later), Learnt::New);
        assert_eq!(n.len(), 1);
    }
}
