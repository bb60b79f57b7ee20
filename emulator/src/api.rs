//! The verbs API for applications: a [`Device`] handle that application code shares with the
//! engine thread that drives the RNIC, with synchronous verbs named after ibverbs and awaitable
//! completions for tokio.
//!
//! The sans-IO core ([`Rnic`]) does not move by itself: an engine moves its frames and serves its
//! timers. [`crate::inproc::Loopback`] is the in-process engine: two devices joined by an
//! in-process cable, driven in real time by one thread (the real datapaths bind a device to a
//! port the same way).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use rocemu_emulator::inproc::Loopback;
//! use rocemu_emulator::rnic::*;
//! let lo = Loopback::start(1, Default::default());
//! let pd = lo.a.alloc_pd();
//! let cq = lo.a.create_cq(64)?;
//! // … create and connect QPs (see examples/async_verbs.rs), then:
//! let wc = lo.a.next_wc(cq).await?;
//! assert_eq!(wc.status, WcStatus::Success);
//! # let _ = pd; Ok(()) }
//! ```
use crate::engine::Doorbell;
use crate::rnic::mr::MrInfo;
use crate::rnic::*;
use rocemu_wire::Qpn;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use tokio::sync::Notify;

struct Shared {
    rnic: Mutex<Rnic>,
    /// Woken whenever the engine moved frames or served timers: completions may have arrived.
    progress: Notify,
    /// The doorbell of the engine that drives the RNIC, when that engine sleeps while idle
    /// ([`crate::engine::IdleStrategy::Wake`]): rung after every verb.
    bell: OnceLock<Arc<Doorbell>>,
}

/// The RNIC locked by a verb: releasing it rings the engine's doorbell, if any.
pub(crate) struct Locked<'a> {
    g: Option<MutexGuard<'a, Rnic>>,
    bell: Option<&'a Doorbell>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Rnic;
    fn deref(&self) -> &Rnic {
        self.g.as_ref().expect("held until drop")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Rnic {
        self.g.as_mut().expect("held until drop")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Unlock first: the engine the ring wakes takes the lock next.
        drop(self.g.take());
        if let Some(b) = self.bell {
            b.ring();
        }
    }
}

/// A RoCEmu device: cheap to clone, safe to share between threads and tasks.
#[derive(Clone)]
pub struct Device {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").finish_non_exhaustive()
    }
}

impl Device {
    pub fn new(rnic: Rnic) -> Device {
        Device {
            shared: Arc::new(Shared {
                rnic: Mutex::new(rnic),
                progress: Notify::new(),
                bell: OnceLock::new(),
            }),
        }
    }

    pub(crate) fn lock(&self) -> Locked<'_> {
        // A panic while holding the lock leaves the RNIC as it was between two verbs.
        Locked {
            g: Some(self.shared.rnic.lock().unwrap_or_else(|p| p.into_inner())),
            bell: self.shared.bell.get().map(|b| &**b),
        }
    }

    /// For a verb that gives the RNIC no work (a query, polling a CQ, reading a region): no
    /// doorbell, so that a program spinning on a CQ does not keep a sleeping engine awake.
    /// The engine's own turn takes it too.
    pub(crate) fn lock_quiet(&self) -> MutexGuard<'_, Rnic> {
        self.shared.rnic.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Verbs ring `bell` from now on (the engine driving this device sleeps while idle).
    pub(crate) fn set_doorbell(&self, bell: Arc<Doorbell>) {
        let _ = self.shared.bell.set(bell);
    }

    /// Runs `f` on the RNIC: any verb, synchronously.
    pub fn with<R>(&self, f: impl FnOnce(&mut Rnic) -> R) -> R {
        f(&mut self.lock())
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        self.lock_quiet().query_device()
    }
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> PdId {
        self.lock().alloc_pd()
    }
    /// `ibv_reg_mr`.
    pub fn reg_mr(&self, pd: PdId, length: usize, access: Access) -> Result<MrInfo, VerbsError> {
        self.lock().reg_mr(pd, length, access)
    }
    /// `ibv_reg_mr` / `ibv_reg_mr_iova2` of the program's own memory ([`Rnic::reg_mr_foreign`]).
    pub fn reg_mr_foreign(
        &self,
        pd: PdId,
        mem: crate::dma::ForeignMem,
        iova: u64,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        self.lock().reg_mr_foreign(pd, mem, iova, access)
    }
    /// `ibv_create_cq`.
    pub fn create_cq(&self, cqe: usize) -> Result<CqId, VerbsError> {
        self.lock().create_cq(cqe)
    }
    /// `ibv_create_qp`.
    pub fn create_qp(&self, pd: PdId, init: QpInitAttr) -> Result<Qpn, VerbsError> {
        self.lock().create_qp(pd, init)
    }
    /// `ibv_modify_qp`.
    pub fn modify_qp(&self, qpn: Qpn, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        self.lock().modify_qp(qpn, attr, mask)
    }
    /// `ibv_query_qp`.
    pub fn query_qp(&self, qpn: Qpn) -> Result<QpAttr, VerbsError> {
        self.lock_quiet().query_qp(qpn)
    }
    /// `ibv_post_send`.
    pub fn post_send(&self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        self.lock().post_send(qpn, wr)
    }
    /// `ibv_post_recv`.
    pub fn post_recv(&self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        self.lock().post_recv(qpn, wr)
    }
    /// `ibv_poll_cq`: whatever is there now, without waiting.
    pub fn poll_cq(&self, cq: CqId, max: usize) -> Vec<Wc> {
        self.lock_quiet().poll_cq(cq, max)
    }
    /// Copies bytes out of a registered region (owned or foreign), `offset` bytes in.
    pub fn read_mr(&self, lkey: u32, offset: usize, out: &mut [u8]) -> Result<(), VerbsError> {
        self.lock_quiet().mr_read(lkey, offset as u64, out)
    }
    /// Copies bytes into a registered region (owned or foreign), `offset` bytes in.
    pub fn write_mr(&self, lkey: u32, offset: usize, data: &[u8]) -> Result<(), VerbsError> {
        self.lock().mr_write(lkey, offset as u64, data)
    }

    /// `ibv_get_async_event` without blocking: the oldest event not yet taken.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.lock_quiet().poll_async_event()
    }

    /// `ibv_get_async_event` without blocking, all at once: appends every event not yet taken.
    pub fn take_async_events(&self, out: &mut Vec<AsyncEvent>) {
        self.lock_quiet().take_async_events(out)
    }

    /// Waits for the next completion on `cq` (an awaitable `ibv_poll_cq`). Fails when the CQ
    /// is in error (it overflowed: no completion would ever come) or does not exist.
    pub async fn next_wc(&self, cq: CqId) -> Result<Wc, VerbsError> {
        let mut v = Vec::with_capacity(1);
        loop {
            // Registered before looking, so that a completion between the look and the wait
            // still wakes this task.
            let woken = self.shared.progress.notified();
            if self.lock_quiet().try_poll_cq(cq, 1, &mut v)? > 0 {
                if let Some(wc) = v.pop() {
                    return Ok(wc);
                }
            }
            woken.await;
        }
    }

    /// Waits for `n` completions on `cq`; fails as [`Device::next_wc`] does.
    pub async fn wait_wcs(&self, cq: CqId, n: usize) -> Result<Vec<Wc>, VerbsError> {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let woken = self.shared.progress.notified();
            let got = self.lock_quiet().try_poll_cq(cq, n - v.len(), &mut v)?;
            if got == 0 {
                woken.await;
            }
        }
        Ok(v)
    }

    pub(crate) fn wake(&self) {
        self.shared.progress.notify_waiters();
    }
}
