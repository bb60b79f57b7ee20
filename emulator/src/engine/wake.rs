//! Sleeping until there is work: the engine's doorbell and its wait on file descriptors, as a
//! NIC driver sleeps on its interrupt and a program rings the NIC's doorbell.
//!
//! An idle engine that polls with backoff delays what arrives while it sleeps by up to the
//! sleep, and on a machine whose cores are all taken by spinning program threads, a `yield`
//! can hand the core away for a whole time slice (milliseconds). An engine that blocks in
//! `ppoll(2)` on its port's descriptor and on a [`Doorbell`] is woken by the kernel the moment
//! a frame arrives or a program posts work, and costs nothing while it waits.
//!
//! The doorbell protocol (no wake-up is lost):
//! * the engine sets `sleeping` *before* its last turn, then blocks only if that turn found
//!   nothing to do; it clears `sleeping` after a turn that did work;
//! * a program makes its work visible to the RNIC (under the RNIC's lock), then [`rings`]
//!   (`Doorbell::ring`): if `sleeping` is set, it adds 1 to the eventfd.
//!
//! Either the program's work was there for the engine's last turn (it took the lock after the
//! program released it), or the program took the lock after that turn, and then saw `sleeping`
//! set (the store precedes the turn's lock; the mutex orders the two), rang, and the eventfd
//! is readable when the engine blocks. While the engine is busy, ringing costs one atomic load.
//!
//! [`rings`]: Doorbell::ring
// Unsafe code: eventfd(2), read(2)/write(2) of 8 bytes and ppoll(2), on descriptors we own or
// were lent for the call.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// What a program rings when it gives the engine work (see the module docs).
#[derive(Debug)]
pub struct Doorbell {
    efd: OwnedFd,
    sleeping: AtomicBool,
    rung: AtomicU64,
}

impl Doorbell {
    /// A doorbell over a fresh non-blocking eventfd.
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a descriptor we own.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is an open descriptor nobody else owns.
        let efd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Doorbell {
            efd,
            sleeping: AtomicBool::new(false),
            rung: AtomicU64::new(0),
        })
    }

    /// Wakes the engine if it sleeps (or is about to); call it after the work is visible to the
    /// RNIC. Costs one atomic load while the engine is awake.
    pub fn ring(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            self.rung.fetch_add(1, Ordering::Relaxed);
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a local u64 to our own eventfd. It cannot block
            // (EFD_NONBLOCK); a full counter (EAGAIN) already wakes the engine.
            let _ = unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// How many times the bell was rung while the engine slept (or was about to).
    pub fn rung(&self) -> u64 {
        self.rung.load(Ordering::Relaxed)
    }

    pub(crate) fn set_sleeping(&self, s: bool) {
        // SeqCst: a store before the last turn that the program's load after its post must
        // see, whichever of the two took the RNIC's lock first.
        self.sleeping.store(s, Ordering::SeqCst);
    }

    pub(crate) fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    /// Empties the eventfd (after a wait that it ended).
    pub(crate) fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a local u64 from our own non-blocking eventfd.
        let _ = unsafe { libc::read(self.efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

/// Blocks until one of `fds` is readable (or, with `first_writable`, the first one is writable)
/// or `timeout` passes. Returns which were ready (a bit per index; none on timeout or an
/// interrupted wait, which the caller treats alike: it turns the engine once more).
pub(crate) fn wait_ready(fds: &[RawFd], first_writable: bool, timeout: Duration) -> u32 {
    let mut set = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 4];
    let n = fds.len().min(set.len());
    for (p, &fd) in set.iter_mut().zip(fds) {
        p.fd = fd;
        p.events = libc::POLLIN;
    }
    if first_writable {
        set[0].events |= libc::POLLOUT;
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `set[..n]` is a live array of n pollfds; `ts` lives across the call; no signal
    // mask is given.
    let r = unsafe { libc::ppoll(set.as_mut_ptr(), n as libc::nfds_t, &ts, std::ptr::null()) };
    if r <= 0 {
        return 0;
    }
    set[..n]
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .fold(0, |m, (i, _)| m | 1 << i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_ring_wakes_a_sleeper_at_once_and_costs_nothing_when_awake() {
        let d = Arc::new(Doorbell::new().unwrap());
        // Awake: ringing writes nothing, so a wait times out.
        d.ring();
        assert_eq!(d.rung(), 0);
        let t = Instant::now();
        assert_eq!(wait_ready(&[d.fd()], false, Duration::from_millis(20)), 0);
        assert!(t.elapsed() >= Duration::from_millis(15));
        // Asleep: a ring from another thread ends a 10 s wait.
        d.set_sleeping(true);
        let d2 = d.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            d2.ring();
        });
        let t = Instant::now();
        assert_eq!(
            wait_ready(&[-1, d.fd()], false, Duration::from_secs(10)),
            0b10
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        h.join().unwrap();
        assert_eq!(d.rung(), 1);
        d.clear();
        // Cleared: waiting times out again.
        assert_eq!(wait_ready(&[d.fd()], false, Duration::from_millis(1)), 0);
    }
}
