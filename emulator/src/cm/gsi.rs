//! QP1 on an RNIC, for a [`CmAgent`](super::CmAgent): the UD GSI QP, its CQ and one MR holding
//! `recvs` receive slots (the 40-byte GRH area, then a MAD) followed by `sends` send slots of a
//! MAD each. The agent stays sans-IO; this is the part every user of it on a real RNIC needs
//! (`rocemu-tools`' rdmacm, the drop-in librdmacm).
use crate::rnic::mr::MrInfo;
use crate::rnic::*;
use rocemu_wire::eth::Mac;
use rocemu_wire::mad::MAD_LEN;
use rocemu_wire::{QKey, Qpn};
use std::net::IpAddr;

/// The GRH area at the head of every UD receive (IBTA 11.4.1.2, Annex A17.4.5.2; rdma-core's RoCE
/// v2 layout).
pub const GRH: usize = 40;

/// QP1 and its buffers.
#[derive(Debug, Clone, Copy)]
pub struct Gsi {
    pub qpn: Qpn,
    pub cq: CqId,
    pub mr: MrInfo,
    pub sends: usize,
    pub recvs: usize,
}

impl Gsi {
    /// Makes QP1 (ready to send and receive) with room for `sends` send and `recvs` receive
    /// WQEs, and a CQ with room for a completion of every one at once (a CQ that overflows goes
    /// to error and takes QP1 with it). No receive is posted yet.
    pub fn open(r: &mut Rnic, sends: usize, recvs: usize) -> Result<Gsi, VerbsError> {
        let pd = r.try_alloc_pd()?;
        let cq = r.create_cq(sends + recvs + 8)?;
        let mr = r.reg_mr(
            pd,
            recvs * (GRH + MAD_LEN) + sends * MAD_LEN,
            Access::LOCAL_WRITE,
        )?;
        let init = QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: sends as u32,
                max_recv_wr: recvs as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        };
        let qpn = r.create_gsi_qp(pd, init)?;
        r.ready_gsi_qp(qpn)?;
        Ok(Gsi {
            qpn,
            cq,
            mr,
            sends,
            recvs,
        })
    }

    /// Posts receive slot `slot` (below `recvs`) with work request id `wr_id`.
    pub fn post_recv(&self, r: &mut Rnic, slot: usize, wr_id: u64) -> Result<(), VerbsError> {
        r.post_recv(
            self.qpn,
            RecvWr {
                wr_id,
                sg_list: [Sge {
                    addr: self.mr.addr + (slot * (GRH + MAD_LEN)) as u64,
                    length: (GRH + MAD_LEN) as u32,
                    lkey: self.mr.lkey,
                }]
                .into(),
            },
        )
    }

    /// What receive slot `slot` holds after its completion `wc`: the sender's address (from the
    /// GRH area) and the MAD. None for an error completion, a short one, or a GRH area that
    /// names no address.
    pub fn received(&self, r: &Rnic, slot: usize, wc: &Wc) -> Option<(IpAddr, [u8; MAD_LEN])> {
        if wc.status != WcStatus::Success || (wc.byte_len as usize) < GRH + MAD_LEN {
            return None;
        }
        let b = r.mr_bytes(self.mr.lkey)?;
        let buf = b.get(slot * (GRH + MAD_LEN)..(slot + 1) * (GRH + MAD_LEN))?;
        let from = grh_source(&buf[..GRH])?;
        Some((from, buf[GRH..].try_into().ok()?))
    }

    /// Copies `mad` into send slot `slot` (below `sends`) and sends it to `to`'s QP1 (at `mac`,
    /// from our GID `sgid_index`) with the GSI Q_Key, as work request `wr_id`.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &self,
        r: &mut Rnic,
        slot: usize,
        wr_id: u64,
        to: IpAddr,
        mac: Mac,
        sgid_index: u8,
        mad: &[u8; MAD_LEN],
    ) -> Result<(), VerbsError> {
        if slot >= self.sends {
            return Err(VerbsError::Invalid(format!(
                "GSI send slot {slot} of {}",
                self.sends
            )));
        }
        let off = self.recvs * (GRH + MAD_LEN) + slot * MAD_LEN;
        if let Some(b) = r.mr_bytes_mut(self.mr.lkey) {
            b[off..off + MAD_LEN].copy_from_slice(mad);
        }
        let mut wr = SendWr::new(
            wr_id,
            WrOpcode::Send,
            vec![Sge {
                addr: self.mr.addr + off as u64,
                length: MAD_LEN as u32,
                lkey: self.mr.lkey,
            }],
        );
        wr.ud = Some(UdDest {
            ah: AhAttr {
                sgid_index,
                ..AhAttr::to(to, mac)
            },
            remote_qpn: Qpn::new(1),
            remote_qkey: QKey::GSI,
        });
        r.post_send(self.qpn, wr)
    }
}
