//! The neighbour table: IP address → MAC, learnt from ARP and neighbour discovery, each entry
//! valid for a while (Linux's `base_reachable_time` is 30 s; entries here live
//! [`Neighbors::TTL`] and are refreshed by every frame that confirms them).
//!
//! The table is bounded: a storm of ARP packets with made-up senders fills it to
//! [`Neighbors::CAPACITY`] and no further (expired entries make room; live ones are kept).
//!
//! The RNIC keeps a copy for its own lookups (a UD work request's destination, a QP's
//! address vector), fed by the engine and by programs that set static entries: the same table
//! with [`Neighbors::pin`]ned entries, which have no deadline of their own (the engine keeps
//! those) and are bounded to the same capacity by forgetting the entries confirmed longest ago.
//! The table is sans-IO: it reads no clock.
use crate::time::Nanos;
use rocemu_wire::eth::Mac;
use std::collections::HashMap;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    mac: Mac,
    expires: Nanos,
    /// Learnt from an answer to our own question: a storm cannot push it out.
    asked: bool,
    /// When it was last set or confirmed, in the table's own count of updates: which pinned
    /// entry is the oldest.
    stamp: u64,
}

/// IP → MAC with timeouts.
#[derive(Debug, Default)]
pub struct Neighbors {
    map: HashMap<IpAddr, Entry>,
    /// When a full table was last swept for expired entries: at most once a second, so that a
    /// storm against a full table costs a hash lookup per frame, not a sweep.
    last_sweep: Option<Nanos>,
    /// Updates so far (the stamp of the next one).
    stamps: u64,
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

    /// Records that `ip` is at `mac` as of `now`. `asked`: this answers a question of ours (a
    /// table full of unasked-for entries then makes room for it).
    pub fn learn(&mut self, ip: IpAddr, mac: Mac, now: Nanos, asked: bool) -> Learnt {
        let expires = now + Self::TTL;
        let stamp = self.stamp();
        if let Some(e) = self.map.get_mut(&ip) {
            let changed = e.mac != mac;
            *e = Entry {
                mac,
                expires,
                asked: asked || e.asked,
                stamp,
            };
            return if changed {
                Learnt::Changed
            } else {
                Learnt::Refreshed
            };
        }
        if self.map.len() >= Self::CAPACITY {
            if self
                .last_sweep
                .is_none_or(|t| now.saturating_sub(t) >= Nanos::from_millis(1000))
            {
                self.last_sweep = Some(now);
                self.map.retain(|_, e| e.expires > now);
            }
            if self.map.len() >= Self::CAPACITY {
                let victim = asked
                    .then(|| self.map.iter().find(|(_, e)| !e.asked).map(|(k, _)| *k))
                    .flatten();
                match victim {
                    Some(k) => {
                        self.map.remove(&k);
                    }
                    None => return Learnt::Refused,
                }
            }
        }
        self.map.insert(
            ip,
            Entry {
                mac,
                expires,
                asked,
                stamp,
            },
        );
        Learnt::New
    }

    fn stamp(&mut self) -> u64 {
        self.stamps += 1;
        self.stamps
    }

    /// Records that `ip` is at `mac`, with no deadline: for the RNIC's copy, whose entries the
    /// engine confirms (and lets expire in its own table). A full table forgets its oldest
    /// sixteenth first, so that a flood costs O(1) per entry on average.
    pub fn pin(&mut self, ip: IpAddr, mac: Mac) {
        let stamp = self.stamp();
        let e = Entry {
            mac,
            expires: Nanos(u64::MAX),
            asked: true,
            stamp,
        };
        if self.map.len() >= Self::CAPACITY && !self.map.contains_key(&ip) {
            let mut stamps: Vec<u64> = self.map.values().map(|e| e.stamp).collect();
            let n = Self::CAPACITY / 16;
            let (_, &mut cut, _) = stamps.select_nth_unstable(n - 1);
            self.map.retain(|_, e| e.stamp > cut);
        }
        self.map.insert(ip, e);
    }

    /// The MAC of `ip`, whatever its deadline (for a table of pinned entries).
    pub fn pinned(&self, ip: IpAddr) -> Option<Mac> {
        self.map.get(&ip).map(|e| e.mac)
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
        assert_eq!(n.learn(ip, m, Nanos(0), false), Learnt::New);
        assert_eq!(n.get(ip, Nanos(1)), Some(m));
        assert_eq!(n.get(ip, Neighbors::TTL), None);
        assert_eq!(n.learn(ip, m, Nanos(5), false), Learnt::Refreshed);
        assert_eq!(n.get(ip, Neighbors::TTL), Some(m));
        assert_eq!(
            n.learn(ip, Mac([2, 0, 0, 0, 0, 3]), Nanos(6), false),
            Learnt::Changed
        );
    }

    #[test]
    fn bounded_under_a_storm() {
        let mut n = Neighbors::default();
        let m = Mac([2, 0, 0, 0, 0, 2]);
        for i in 0..(Neighbors::CAPACITY as u32 + 100) {
            n.learn(IpAddr::from(i.to_be_bytes()), m, Nanos(0), false);
        }
        assert_eq!(n.len(), Neighbors::CAPACITY);
        // The answer to a question of ours still gets in, and stays through the storm.
        let peer: IpAddr = "10.0.0.9".parse().unwrap();
        assert_eq!(n.learn(peer, m, Nanos(1), false), Learnt::Refused);
        assert_eq!(n.learn(peer, m, Nanos(2), true), Learnt::New);
        for i in 0..100u32 {
            n.learn(
                IpAddr::from(((i + 1) << 20).to_be_bytes()),
                m,
                Nanos(3),
                true,
            );
        }
        assert_eq!(n.get(peer, Nanos(4)), Some(m));
        // Once the storm's entries expire, a real neighbour gets in again.
        let later = Neighbors::TTL + Nanos(10);
        assert_eq!(
            n.learn("10.0.0.2".parse().unwrap(), m, later, false),
            Learnt::New
        );
        assert_eq!(n.len(), 1);
    }

    #[test]
    fn pinned_entries_are_bounded_and_the_oldest_go_first() {
        let mut n = Neighbors::default();
        let m = Mac([2, 0, 0, 0, 0, 2]);
        let peer: IpAddr = "10.0.0.2".parse().unwrap();
        n.pin(peer, m);
        for i in 0..20_000u32 {
            n.pin(IpAddr::from((0x0a80_0000 + i).to_be_bytes()), m);
            if i % 100 == 0 {
                n.pin(peer, m);
            }
            assert!(n.len() <= Neighbors::CAPACITY);
        }
        assert_eq!(n.pinned(peer), Some(m));
        // The newest flood entries are there, the oldest gone.
        assert_eq!(
            n.pinned(IpAddr::from((0x0a80_0000u32 + 19_999).to_be_bytes())),
            Some(m)
        );
        assert_eq!(n.pinned(IpAddr::from(0x0a80_0000u32.to_be_bytes())), None);
    }
}
