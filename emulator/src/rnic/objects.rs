//! The verbs that make and unmake objects — protection domains, memory regions, queue pairs
//! (QP1 among them) — the QP table's lookup by QPN, and the queries on a QP.
//!
//! Invariants: a PD is not deallocated while an MR, a QP or an SRQ of it lives (EBUSY); a QP is
//! found through its QPN only when the QP in the slot carries that very QPN (a destroyed QP's QPN
//! reaches nothing, [`super::qpn`]); at most `max_qp` QPs live at once and one QP1; an MR's access
//! flags obey IBTA 10.6.3.1 (unverified; remote write or atomic needs local write).
use super::mr::{Backing, MrInfo};
use super::qp::Qp;
use super::qpn::QpnSteering;
use super::verbs::*;
use super::Rnic;
use crate::dma::ForeignMem;
use crate::logs::qp_event;
use rocemu_wire::Qpn;

impl Rnic {
    /// `ibv_alloc_pd`, for callers that keep their PDs few (the in-process tools and tests):
    /// past `max_pd` live PDs it returns a [`PdId`] that names no PD, so that every verb on it
    /// fails with `NotFound`. [`Rnic::try_alloc_pd`] says so instead.
    pub fn alloc_pd(&mut self) -> PdId {
        self.try_alloc_pd().unwrap_or(PdId(u32::MAX))
    }

    /// `ibv_alloc_pd`: refused with `NoSpace` (ENOMEM) when `max_pd` PDs live.
    pub fn try_alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        self.dev
            .mem
            .alloc_pd(self.attr.max_pd as usize)
            .ok_or(VerbsError::NoSpace("max_pd reached"))
    }

    /// `ibv_dealloc_pd`: refused with [`VerbsError::Busy`] (EBUSY, as the kernel's uverbs
    /// answers) while a memory region, a QP or an SRQ of the PD lives (address handles live in
    /// the caller's library, which counts them itself); then the PD's slot is free and its
    /// [`PdId`] names nothing any more (not the PD that reuses the slot).
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        self.pd_in_use(pd)?;
        self.dev.mem.dealloc_pd(pd);
        Ok(())
    }

    /// What [`Rnic::dealloc_pd`] would refuse for, without deallocating: for a device split
    /// into shards, whose PD is freed in every shard or in none.
    pub fn pd_in_use(&self, pd: PdId) -> Result<(), VerbsError> {
        if !self.dev.mem.pd_valid(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if self.dev.mem.mrs.iter().flatten().any(|m| m.info.pd == pd) {
            return Err(VerbsError::Busy("a memory region of the PD lives"));
        }
        if self.qps.iter().flatten().any(|q| q.pd == pd) {
            return Err(VerbsError::Busy("a QP of the PD lives"));
        }
        if self.dev.srqs.any_of_pd(pd) {
            return Err(VerbsError::Busy("an SRQ of the PD lives"));
        }
        Ok(())
    }

    /// `ibv_reg_mr` of `length` zeroed bytes owned by the RNIC, at a virtual address it picks.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        length: usize,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        let addr = self.pick_mr_addr();
        self.reg_mr_at(pd, addr, length, access)
    }

    /// A page-aligned virtual address for a region the RNIC places itself.
    fn pick_mr_addr(&mut self) -> u64 {
        0x7f00_0000_0000u64 + (self.dev.rng.below(1 << 28) << 12)
    }

    /// `ibv_reg_mr` at a virtual address the caller picks.
    pub fn reg_mr_at(
        &mut self,
        pd: PdId,
        addr: u64,
        length: usize,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        self.check_reg_mr(pd, addr, length, access)?;
        Ok(self
            .dev
            .mem
            .register(&mut self.dev.rng, pd, addr, length as u64, access))
    }

    /// A region of `length` bytes with no memory behind it: what is written into it is
    /// discarded and what is read from it is zeros. rdma-core's `ibv_alloc_null_mr` is one
    /// (mlx5 has it), without a length and with an lkey alone; this one has both keys, so that
    /// a peer can WRITE into it. Every check a region gets (its keys, PD, bounds and access)
    /// is made as for any other. The fabric simulator's hosts use it: no figure of a simulated
    /// run depends on the bytes, and each packet's copy out of a sender's region and into a
    /// receiver's would otherwise miss the cache (hundreds of hosts' buffers).
    pub fn reg_mr_null(
        &mut self,
        pd: PdId,
        length: usize,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        let addr = self.pick_mr_addr();
        self.check_reg_mr(pd, addr, length, access)?;
        Ok(self.dev.mem.register_backing(
            &mut self.dev.rng,
            pd,
            addr,
            Backing::Null(length as u64),
            access,
        ))
    }

    /// `ibv_reg_mr` / `ibv_reg_mr_iova2` of the program's own memory `mem`: the RNIC reads and
    /// writes it in place (as a NIC's DMA engine would) until [`Rnic::dereg_mr`]. The region's
    /// address space starts at `iova` (`ibv_reg_mr` passes the pointer's value, `ibv_reg_mr_iova2`
    /// another); RETH and SGE addresses are in that space. `iova + len` must not wrap. Every
    /// check of an owned region applies (key, PD, access, bounds).
    pub fn reg_mr_foreign(
        &mut self,
        pd: PdId,
        mem: ForeignMem,
        iova: u64,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        self.check_reg_mr(pd, iova, mem.len(), access)?;
        Ok(self.dev.mem.register_backing(
            &mut self.dev.rng,
            pd,
            iova,
            Backing::Foreign(mem),
            access,
        ))
    }

    /// [`Rnic::reg_mr_foreign`] under the keys `keys` (L_Key, R_Key) that shard 0 of the same
    /// device gave the same memory: on a device split into shards (one per polling thread) a
    /// program's region is registered in every shard, so that a QP on any of them finds it by
    /// the one pair of keys the program was given. Refused (`Invalid`) when a key is
    /// zero or names a live region of this shard; every check of [`Rnic::reg_mr_foreign`]
    /// applies.
    pub fn reg_mr_foreign_keyed(
        &mut self,
        pd: PdId,
        mem: ForeignMem,
        iova: u64,
        access: Access,
        keys: (u32, u32),
    ) -> Result<MrInfo, VerbsError> {
        self.check_reg_mr(pd, iova, mem.len(), access)?;
        self.dev
            .mem
            .register_backing_keyed(pd, iova, Backing::Foreign(mem), access, keys)
            .ok_or_else(|| {
                VerbsError::Invalid(format!(
                    "keys {:#x} / {:#x} are taken in this shard",
                    keys.0, keys.1
                ))
            })
    }

    /// `ibv_rereg_mr`: the region with L_Key `lkey` moves to protection domain `pd`, to the
    /// program's memory `translation` (the memory and its first address, as
    /// [`Rnic::reg_mr_foreign`] takes them) and to access `access`, each where given, the
    /// rest as it was; its keys stay (as mlx5's and rxe's re-registration keep them), and an
    /// R_Key a SEND with invalidate had invalidated is valid again, as after a new
    /// registration. Every check of a registration is made on the result first; a refused call
    /// changes nothing. The next packet and the next local access are checked against the
    /// new attributes; what was already moved stays moved.
    pub fn rereg_mr(
        &mut self,
        lkey: u32,
        pd: Option<PdId>,
        translation: Option<(ForeignMem, u64)>,
        access: Option<Access>,
    ) -> Result<MrInfo, VerbsError> {
        let place = translation.as_ref().map(|(mem, iova)| (*iova, mem.len()));
        let (pd, access) = self.check_rereg_mr(lkey, pd, place, access)?;
        let m = self
            .dev
            .mem
            .by_lkey_mut(lkey)
            .ok_or(VerbsError::NotFound("memory region"))?;
        m.info.pd = pd;
        m.info.access = access;
        if let Some((mem, iova)) = translation {
            m.info.addr = iova;
            m.info.length = mem.len() as u64;
            m.data = Backing::Foreign(mem);
        }
        m.rkey_valid = true;
        Ok(m.info)
    }

    /// What [`Rnic::rereg_mr`] would refuse for, without changing anything (`translation` as
    /// the first address and the length): for a device split into shards, whose region is
    /// re-registered in every shard or in none. Gives the PD and access the region would have.
    pub fn check_rereg_mr(
        &self,
        lkey: u32,
        pd: Option<PdId>,
        translation: Option<(u64, usize)>,
        access: Option<Access>,
    ) -> Result<(PdId, Access), VerbsError> {
        let cur = self
            .dev
            .mem
            .by_lkey(lkey)
            .ok_or(VerbsError::NotFound("memory region"))?
            .info;
        let pd = pd.unwrap_or(cur.pd);
        let access = access.unwrap_or(cur.access);
        let (addr, length) = translation.unwrap_or((cur.addr, cur.length as usize));
        self.check_reg_mr(pd, addr, length, access)?;
        Ok((pd, access))
    }

    fn check_reg_mr(
        &self,
        pd: PdId,
        addr: u64,
        length: usize,
        access: Access,
    ) -> Result<(), VerbsError> {
        if !self.dev.mem.pd_valid(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if length as u64 > self.attr.max_mr_size {
            return invalid(format!("MR of {length} bytes exceeds max_mr_size"));
        }
        if addr.checked_add(length as u64).is_none() {
            return invalid("MR wraps the address space");
        }
        // IBTA 10.6.3.1 (unverified): remote write or atomic access needs local write.
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return invalid("REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE");
        }
        if access.0 & !Access::ALL.0 != 0 {
            return invalid(format!("unknown access flags 0x{:x}", access.0));
        }
        Ok(())
    }

    /// `ibv_dereg_mr`, of an owned or a foreign region. A foreign region's memory is never
    /// touched again once this returns (the caller holds the RNIC exclusively: no datapath access
    /// is under way, and later ones find no region).
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), VerbsError> {
        self.dev
            .mem
            .deregister(lkey)
            .map(|_| ())
            .ok_or(VerbsError::NotFound("memory region"))
    }

    /// The bytes of a region the RNIC owns, for the application; None for a foreign region
    /// (the program has its memory) or no region. [`Rnic::mr_read`] serves both.
    pub fn mr_bytes(&self, lkey: u32) -> Option<&[u8]> {
        self.dev.mem.by_lkey(lkey).and_then(|m| m.data.owned())
    }
    pub fn mr_bytes_mut(&mut self, lkey: u32) -> Option<&mut [u8]> {
        self.dev
            .mem
            .by_lkey_mut(lkey)
            .and_then(|m| m.data.owned_mut())
    }

    /// Copies `out.len()` bytes from `off` bytes into the region (an offset, not an address)
    /// with L_Key `lkey` into `out`; owned or foreign. Outside the region: `Invalid`.
    pub fn mr_read(&self, lkey: u32, off: u64, out: &mut [u8]) -> Result<(), VerbsError> {
        let m = self
            .dev
            .mem
            .by_lkey(lkey)
            .ok_or(VerbsError::NotFound("memory region"))?;
        match usize::try_from(off) {
            Ok(o) if m.data.read(o, out) => Ok(()),
            _ => invalid(format!(
                "{} bytes at offset {off} lie outside the region of {} bytes",
                out.len(),
                m.info.length
            )),
        }
    }

    /// Copies `data` to `off` bytes into the region with L_Key `lkey`; owned or foreign.
    /// Outside the region: `Invalid`, and nothing is written.
    pub fn mr_write(&mut self, lkey: u32, off: u64, data: &[u8]) -> Result<(), VerbsError> {
        let m = self
            .dev
            .mem
            .by_lkey_mut(lkey)
            .ok_or(VerbsError::NotFound("memory region"))?;
        match usize::try_from(off) {
            Ok(o) if m.data.write(o, data) => Ok(()),
            _ => invalid(format!(
                "{} bytes at offset {off} lie outside the region of {} bytes",
                data.len(),
                m.info.length
            )),
        }
    }

    /// `ibv_create_qp`. The QPN looks random (never 0 or 1, which are reserved); see the
    /// `rnic::qpn` module.
    pub fn create_qp(&mut self, pd: PdId, init: QpInitAttr) -> Result<Qpn, VerbsError> {
        self.check_qp_init(pd, &init)?;
        self.insert_qp(pd, &init, None)
    }

    /// Puts a new QP in a slot (a free one, or a new one) with the slot's next QPN, or `fixed`.
    fn insert_qp(
        &mut self,
        pd: PdId,
        init: &QpInitAttr,
        fixed: Option<Qpn>,
    ) -> Result<Qpn, VerbsError> {
        let (slot, qpn) = self
            .slots
            .alloc(&self.qpn_map, fixed)
            .ok_or(VerbsError::NoSpace("max_qp reached"))?;
        if self.qps.len() < self.slots.len() {
            self.qps.resize_with(self.slots.len(), || None);
        }
        debug_assert!(self.qps[slot].is_none());
        let mut init = *init;
        if let Some(srq) = init.srq {
            // A QP with an SRQ has no receive queue of its own (post_recv is refused).
            init.cap.max_recv_wr = 0;
            init.cap.max_recv_sge = 0;
            self.srq_attach(srq, true);
        }
        self.qps[slot] = Some(Qp::new(qpn, pd, &init));
        if let Some(qp) = self.qps[slot].as_mut() {
            qp.span = crate::logs::qp_span(self.dev.cfg.ips.first(), qpn, init.qp_type);
            qp_event!(qp, DEBUG, "QP created");
        }
        self.live_qps += 1;
        if fixed == Some(Qpn::GSI) {
            self.gsi = Some(slot);
        }
        Ok(qpn)
    }

    /// QP1 to RTS as the kernel brings up its GSI QP: INIT with the well-known Q_Key
    /// ([`QKey::GSI`](rocemu_wire::QKey::GSI)) on port 1, then RTR and RTS.
    pub fn ready_gsi_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qkey: rocemu_wire::QKey::GSI,
            port_num: 1,
            ..Default::default()
        };
        use QpAttrMask as M;
        self.modify_qp(qpn, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)?;
        a.qp_state = QpState::Rtr;
        self.modify_qp(qpn, &a, M::STATE)?;
        a.qp_state = QpState::Rts;
        self.modify_qp(qpn, &a, M::STATE | M::SQ_PSN)
    }

    /// QP1, the general services interface (IBTA 13.5.1, unverified): a UD QP where management
    /// datagrams arrive (the IB CM's, for `rdma_cm`). Its Q_Key is the well-known 0x80010000, set
    /// as any UD QP's at INIT. One per device.
    pub fn create_gsi_qp(&mut self, pd: PdId, init: QpInitAttr) -> Result<Qpn, VerbsError> {
        if init.qp_type != QpType::Ud {
            return invalid("QP1 is a UD QP");
        }
        if self
            .gsi
            .is_some_and(|s| matches!(self.qps.get(s), Some(Some(_))))
        {
            return Err(VerbsError::NoSpace("QP1 exists already"));
        }
        self.check_qp_init(pd, &init)?;
        self.insert_qp(pd, &init, Some(Qpn::GSI))
    }

    fn check_qp_init(&self, pd: PdId, init: &QpInitAttr) -> Result<(), VerbsError> {
        if !self.dev.mem.pd_valid(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        for cq in [init.send_cq, init.recv_cq] {
            if self.dev.cqs.get(cq.0).is_none() {
                return Err(VerbsError::NotFound("completion queue"));
            }
        }
        let mut c = init.cap;
        if let Some(srq) = init.srq {
            // Receives come from the SRQ: the QP's own receive capacities are ignored.
            self.check_qp_srq(pd, srq)?;
            c.max_recv_wr = 0;
            c.max_recv_sge = 0;
        }
        if c.max_send_wr > self.attr.max_qp_wr || c.max_recv_wr > self.attr.max_qp_wr {
            return invalid(format!(
                "queue depth above max_qp_wr {}",
                self.attr.max_qp_wr
            ));
        }
        if c.max_send_sge > self.attr.max_sge || c.max_recv_sge > self.attr.max_sge {
            return invalid(format!("SGE count above max_sge {}", self.attr.max_sge));
        }
        if self.live_qps >= self.attr.max_qp as usize {
            return Err(VerbsError::NoSpace("max_qp reached"));
        }
        Ok(())
    }

    /// The slot of the live QP `qpn`: the one-entry cache inline, the rest out of line.
    #[inline]
    pub(super) fn slot_of(&self, qpn: Qpn) -> Option<usize> {
        let (last, s) = self.last_slot.get();
        if last == qpn
            && qpn != Qpn::GSI
            && matches!(self.qps.get(s), Some(Some(q)) if q.qpn == qpn)
        {
            return Some(s);
        }
        self.slot_of_slow(qpn)
    }

    #[inline(never)]
    fn slot_of_slow(&self, qpn: Qpn) -> Option<usize> {
        if qpn == Qpn::GSI {
            return self
                .gsi
                .filter(|&s| matches!(self.qps.get(s), Some(Some(q)) if q.qpn == qpn));
        }
        let (last, s) = self.last_slot.get();
        if last == qpn && matches!(self.qps.get(s), Some(Some(q)) if q.qpn == qpn) {
            return Some(s);
        }
        // The QP in the slot must carry this very QPN: a destroyed QP's QPN names its slot
        // still, where another generation may live now.
        let s = self.qpn_map.slot(qpn);
        match self.qps.get(s) {
            Some(Some(q)) if q.qpn == qpn => {
                self.last_slot.set((qpn, s));
                Some(s)
            }
            _ => None,
        }
    }

    #[inline]
    pub(super) fn slot(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        self.slot_of(qpn).ok_or(VerbsError::NotFound("queue pair"))
    }

    fn qp(&self, qpn: Qpn) -> Result<&Qp, VerbsError> {
        let s = self.slot(qpn)?;
        self.qps[s]
            .as_ref()
            .ok_or(VerbsError::NotFound("queue pair"))
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let s = self.slot(qpn)?;
        if let Some(qp) = self.qps[s].take() {
            qp_event!(qp, DEBUG, state = ?qp.state, "QP destroyed");
            self.forget_timers_of(&qp);
            if let Some(srq) = qp.srq {
                self.srq_attach(srq, false);
            }
        }
        if self.gsi == Some(s) {
            self.gsi = None;
        }
        self.slots.release(s);
        self.live_qps -= 1;
        Ok(())
    }

    /// `ibv_query_qp`: state and attributes.
    pub fn query_qp(&self, qpn: Qpn) -> Result<QpAttr, VerbsError> {
        let qp = self.qp(qpn)?;
        let mut a = qp.attr;
        a.qp_state = qp.state;
        a.cur_qp_state = qp.state;
        Ok(a)
    }

    /// A one-line description of a QP's transport state, for failure messages.
    pub fn debug_qp(&self, qpn: Qpn) -> String {
        match self.qp(qpn) {
            Ok(q) => format!(
                "qp {} {:?} sq={} sq_next={} req_psn={} acked={} high={} cwnd={} retry={} rnr={} ack_dl={:?} rnr_dl={:?} rd_out={} epsn={} resp_out={} sched={} front={:?}",
                q.qpn, q.state, q.sq.len(), q.sq_next, q.req_psn, q.acked_psn, q.psn_high(), q.cwnd, q.retry_left, q.rnr_left,
                q.ack_deadline, q.rnr_deadline, q.rd_outstanding, q.epsn, q.resp_out.len(), q.scheduled,
                q.sq.front().map(|w| (w.first_psn.value(), w.npkts, w.started, w.done, w.resp_pkts))
            ),
            Err(e) => e.to_string(),
        }
    }

    /// How many responses (ACKs, NAKs, read and atomic responses) a QP has queued for the wire.
    pub fn queued_responses(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        Ok(self.qp(qpn)?.resp_out.len())
    }

    /// Which shard of the device has `qpn` (0 on a device of one shard). QP1's frames, and
    /// every frame that is not a transport packet, are shard 0's.
    pub fn shard_of_qpn(&self, qpn: Qpn) -> usize {
        if qpn == Qpn::GSI {
            0
        } else {
            self.qpn_map.shard_of(qpn)
        }
    }

    /// What a datapath's flow steering needs to tell a QP's shard from its QPN (the QPN
    /// permutation's keys and the shard count; see [`QpnSteering`]): for the kernel's fanout
    /// program of a device on several threads. The same in every shard of a device.
    pub fn qpn_steering(&self) -> QpnSteering {
        self.qpn_map.steering()
    }

    /// Which shard of the device a received frame is for: its BTH's destination QP's
    /// ([`Rnic::shard_of_qpn`]), shard 0 for anything else (ARP, neighbour discovery, a frame
    /// too short or not RoCEv2: shard 0 drops and counts it as a one-shard device would). This
    /// reads fixed offsets only, as a NIC's flow steering does; the shard parses the frame.
    pub fn shard_of_frame(&self, frame: &[u8]) -> usize {
        match rocemu_wire::frame::dest_qpn(frame) {
            Some(q) => self.shard_of_qpn(q),
            None => 0,
        }
    }

    pub fn qp_type(&self, qpn: Qpn) -> Result<QpType, VerbsError> {
        Ok(self.qp(qpn)?.qp_type)
    }

    pub fn qp_state(&self, qpn: Qpn) -> Result<QpState, VerbsError> {
        Ok(self.qp(qpn)?.state)
    }
}
