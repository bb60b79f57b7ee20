//! The gate between the EAL's interrupt thread and the bursts of a driver that remaps its
//! queues there.
//!
//! `net_memif` does its control work on the EAL's interrupt thread: when the peer goes away
//! (its process exits, or it sends DISCONNECT), `memif_disconnect` unmaps the shared regions
//! the rings live in (`memif_free_regions`, DPDK 22.11) with no lock against the thread in
//! `rte_eth_rx_burst` / `rte_eth_tx_burst`. The burst checks that the link is connected when
//! it starts; a thread preempted just after that check finds the ring unmapped when it resumes,
//! and the process dies of SIGSEGV. It happened in CI (stop 30): `rocemu perf` over memif
//! crashed while it answered for its last 100 ms after perftest's end had exited.
//!
//! The gate makes the two exclusive. An interrupt callback of ours (on an eventfd) parks the
//! interrupt thread: while it is parked, bursts run under the gate's read side. Every [`PARK`]
//! it takes the write side (waiting for bursts in flight to end), re-arms its eventfd and
//! returns, so the EAL runs whatever became ready meanwhile (memif's connect and disconnect
//! among it) with no burst running, and comes straight back into the callback, which lets
//! go of the write side. Drivers' control events wait at most [`PARK`] (a memif connection takes
//! some 10 messages); a burst pays an uncontended read lock, and only on ports whose driver
//! needs it ([`needs_gate`]): 64-byte WRITEs over memif ran at 0.97 of their ungated rate
//! (median of 10 interleaved pairs, 2026-12-06), a crash ruled out for 3 %.
//!
//! Rule for callers: a thread inside the gate must not wait for another thread that may need
//! the gate (the interrupt thread, once it waits for the write side, holds up new readers). The
//! steering between shards waits for room in another shard's ring; it never wraps a gated port,
//! because memif ports have one queue (`DevInfo::check_queues`).
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use rocemu_dpdk_sys as sys;

use crate::error::{Error, Result};

/// How long the interrupt thread stays parked between two rounds of the EAL's events.
pub const PARK: Duration = Duration::from_millis(5);

/// How long [`install`] waits for the interrupt thread to park the first time.
const FIRST_PARK: Duration = Duration::from_secs(2);

static LOCK: RwLock<()> = RwLock::new(());
static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
static PARKED_ONCE: AtomicBool = AtomicBool::new(false);
static CLOSING: AtomicBool = AtomicBool::new(false);
static CLOSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// How deep this thread is in [`enter`].
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The write side, held by the interrupt thread between two of its visits to the callback.
    static HELD: RefCell<Option<RwLockWriteGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// Whether bursts on a port of driver `driver` must run under the gate. `ROCEMU_DPDK_UNGATED`
/// (set, any value) turns the gate off, to show what it prevents (tests/memif_peer_leaves.rs).
pub(crate) fn needs_gate(driver: &str) -> bool {
    std::env::var_os("ROCEMU_DPDK_UNGATED").is_none() && driver == "net_memif"
}

/// The callback, on the EAL's interrupt thread, each time the eventfd `arg` is readable.
extern "C" fn park(arg: *mut c_void) {
    let fd = arg as usize as libc::c_int;
    let mut v = 0u64;
    // SAFETY: `fd` is the gate's eventfd, open for the life of the process; `v` is 8 writable
    // bytes. Nonblocking: a spurious wake-up reads nothing, which is harmless.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    // Let bursts run, and stay out of the EAL for a while.
    HELD.with(|h| h.borrow_mut().take());
    PARKED_ONCE.store(true, Ordering::Release);
    std::thread::sleep(PARK);
    if CLOSING.load(Ordering::Acquire) {
        // The EAL is being cleaned up: its memory goes away under the interrupt thread, which
        // stays here, touching none of it, until the process ends.
        CLOSED.store(true, Ordering::Release);
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    // Wait for the bursts in flight; hold the write side while the EAL runs the events that
    // became ready, then be called again at once (the eventfd is readable).
    let g = LOCK.write().unwrap_or_else(PoisonError::into_inner);
    HELD.with(|h| *h.borrow_mut() = Some(g));
    let one = 1u64;
    // SAFETY: as above; 8 readable bytes. An eventfd's counter cannot overflow from one write
    // per read.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Sets the gate up (once per process; later calls return the first one's outcome) and waits
/// until the interrupt thread has parked once: from then on it runs drivers' callbacks only
/// while no burst runs under [`enter`].
pub(crate) fn install() -> Result<()> {
    INSTALLED
        .get_or_init(|| {
            // SAFETY: plain syscall; the descriptor is checked below and kept forever.
            let fd = unsafe { libc::eventfd(1, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            if fd < 0 {
                return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
            }
            // SAFETY: `park` is a valid callback for the life of the process and its argument
            // is the descriptor, not a pointer; the EAL is initialised (an EthPort exists only
            // under a live Eal).
            let ret = unsafe { sys::rocemu_intr_watch(fd, Some(park), fd as usize as *mut c_void) };
            if ret < 0 {
                // SAFETY: ours, registered nowhere.
                unsafe { libc::close(fd) };
                return Err(format!(
                    "rte_intr_callback_register: {}",
                    crate::error::strerror(-ret)
                ));
            }
            let until = Instant::now() + FIRST_PARK;
            while !PARKED_ONCE.load(Ordering::Acquire) {
                if Instant::now() > until {
                    return Err(format!(
                        "the EAL's interrupt thread did not run RoCEmu's callback within {FIRST_PARK:?}"
                    ));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            Ok(())
        })
        .clone()
        .map_err(|m| Error::other("rte_intr_callback_register", m))
}

/// Before `rte_eal_cleanup`: parks the interrupt thread for good, if the gate was set up, and
/// waits (a little) for it. `rte_eal_cleanup` (DPDK 22.11) unmaps the EAL's memory but leaves
/// that thread running; woken every [`PARK`], it would walk its interrupt sources in freed
/// memory (a SIGSEGV in `rte_intr_fd_get` seen while testing the gate).
pub(crate) fn close() {
    if !matches!(INSTALLED.get(), Some(Ok(()))) {
        return;
    }
    CLOSING.store(true, Ordering::Release);
    let until = Instant::now() + Duration::from_secs(1);
    while !CLOSED.load(Ordering::Acquire) && Instant::now() < until {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The read side, held while it lives: across one call into a gated driver's queues and the
/// use of what it returned. Re-entrant on a thread (a burst on one memif port inside another's
/// callback takes nothing more), so a waiting writer cannot deadlock a thread with itself.
pub(crate) fn enter() -> Entered {
    let depth = DEPTH.with(|d| d.replace(d.get() + 1));
    Entered(if depth == 0 {
        Some(LOCK.read().unwrap_or_else(PoisonError::into_inner))
    } else {
        None
    })
}

/// See [`enter`].
pub(crate) struct Entered(Option<RwLockReadGuard<'static, ()>>);

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.take();
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}
