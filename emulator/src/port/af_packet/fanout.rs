//! One device on several threads over one interface: each thread's shard of the device has a
//! packet socket of its own, and the sockets form a fanout group (`PACKET_FANOUT`) whose eBPF
//! program hands each received frame to the socket of the shard that has its QP, as a NIC's
//! flow steering would: nothing is steered in software afterwards.
//!
//! The program reads the BTH's DestQP of an IPv4 (20-byte header) or IPv6 UDP datagram to port
//! 4791 and returns the shard that [`QpnSteering::shard_of`] names: the QPN permutation run
//! backwards (six rounds of a 64-bit multiply-xorshift mix under the device's keys), the slot
//! modulo the shard count. Anything else (ARP, neighbour discovery, QP1's MADs, a frame too
//! short) is shard 0's, which answers for the device. The kernel takes the program's return
//! value modulo the group's size (`fanout_demux_bpf`), and a group's members are numbered in the
//! order they joined, so shard k joins k-th.
//!
//! The program is a socket filter, loaded with `bpf(2)` and handed to the group with
//! `PACKET_FANOUT_DATA` (Linux 4.3+); the group ignores outgoing frames
//! (`PACKET_FANOUT_FLAG_IGNORE_OUTGOING`: posted to net-next in October 2022, so Linux 6.2+,
//! unverified), as each socket does on its own. Needs CAP_NET_ADMIN and CAP_BPF (root).
#![allow(unsafe_code)]

use super::tcx::{load, Asm, Insn, EXIT, JA, LD_IMM64, MOV64_K, MOV64_X};
use crate::rnic::{QpnSteering, QPN_MIX};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

// <linux/if_packet.h>
const PACKET_FANOUT: libc::c_int = 18;
const PACKET_FANOUT_DATA: libc::c_int = 22;
const PACKET_FANOUT_EBPF: u32 = 7;
const PACKET_FANOUT_FLAG_UNIQUEID: u32 = 0x2000;
const PACKET_FANOUT_FLAG_IGNORE_OUTGOING: u32 = 0x4000;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;

// eBPF opcodes not in `tcx` (class | size/op | source).
const LD_ABS_B: u8 = 0x30; // r0 = *(u8 *)(skb + imm)
const LD_ABS_H: u8 = 0x28; // r0 = ntohs(*(u16 *)(skb + imm))
const LD_ABS_W: u8 = 0x20; // r0 = ntohl(*(u32 *)(skb + imm))
const XOR64_X: u8 = 0xaf;
const OR64_X: u8 = 0x4f;
const MUL64_X: u8 = 0x2f;
const RSH64_K: u8 = 0x77;
const LSH64_K: u8 = 0x67;
const AND64_K: u8 = 0x57;
const MOD64_K: u8 = 0x97;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
/// `SKF_NET_OFF`: a load at this offset plus n reads byte n of the network header, wherever
/// the packet's data starts.
const NET: i32 = -0x10_0000;

/// The fanout program for `s` (see the module's text).
pub(crate) fn program(s: &QpnSteering) -> Option<Vec<Insn>> {
    let (r0, r1, r2, r3, r6, r7, r8) = (0, 1, 2, 3, 6, 7, 8);
    let mut p = Asm::default();
    let imm64 = |p: &mut Asm, dst: u8, v: u64| {
        p.op(LD_IMM64, dst, 0, 0, v as u32 as i32);
        p.op(0, 0, 0, 0, (v >> 32) as u32 as i32);
    };
    // The legacy loads read the packet through r6, the context.
    p.op(MOV64_X, r6, r1, 0, 0);
    p.op(LD_ABS_B, 0, 0, 0, NET);
    p.jump(JEQ_K, r0, 0, 0x45, "v4");
    p.op(AND64_K, r0, 0, 0, 0xf0);
    p.jump(JEQ_K, r0, 0, 0x60, "v6");
    p.jump(JA, 0, 0, 0, "zero");
    for (v, ip_len, proto_at) in [("v4", 20, 9), ("v6", 40, 6)] {
        p.label(v);
        p.op(LD_ABS_B, 0, 0, 0, NET + proto_at);
        p.jump(JNE_K, r0, 0, 17, "zero");
        p.op(LD_ABS_H, 0, 0, 0, NET + ip_len + 2);
        p.jump(JNE_K, r0, 0, 4791, "zero");
        // BTH bytes 4..8: a reserved byte and the DestQP.
        p.op(LD_ABS_W, 0, 0, 0, NET + ip_len + 8 + 4);
        p.jump(JA, 0, 0, 0, "qpn");
    }
    p.label("qpn");
    p.op(AND64_K, r0, 0, 0, 0xff_ffff);
    p.jump(JEQ_K, r0, 0, 1, "zero");
    // l in r7, r in r8; each round backwards: (l, r) = (r ^ f(l, k), l).
    p.op(MOV64_X, r7, r0, 0, 0);
    p.op(RSH64_K, r7, 0, 0, 12);
    p.op(MOV64_X, r8, r0, 0, 0);
    p.op(AND64_K, r8, 0, 0, 0xfff);
    for &k in s.keys.iter().rev() {
        p.op(MOV64_X, r2, r7, 0, 0);
        imm64(&mut p, r3, k);
        p.op(XOR64_X, r2, r3, 0, 0);
        for (shift, mul) in [(30, Some(QPN_MIX[0])), (27, Some(QPN_MIX[1])), (31, None)] {
            p.op(MOV64_X, r3, r2, 0, 0);
            p.op(RSH64_K, r3, 0, 0, shift);
            p.op(XOR64_X, r2, r3, 0, 0);
            if let Some(m) = mul {
                imm64(&mut p, r3, m);
                p.op(MUL64_X, r2, r3, 0, 0);
            }
        }
        p.op(AND64_K, r2, 0, 0, 0xfff);
        p.op(XOR64_X, r2, r8, 0, 0);
        p.op(MOV64_X, r8, r7, 0, 0);
        p.op(MOV64_X, r7, r2, 0, 0);
    }
    p.op(MOV64_X, r0, r7, 0, 0);
    p.op(LSH64_K, r0, 0, 0, 12);
    p.op(OR64_X, r0, r8, 0, 0);
    p.op(AND64_K, r0, 0, 0, QpnSteering::SLOT_MASK as i32);
    p.op(MOD64_K, r0, 0, 0, s.shards.max(1) as i32);
    p.op(EXIT, 0, 0, 0, 0);
    p.label("zero");
    p.op(MOV64_K, r0, 0, 0, 0);
    p.op(EXIT, 0, 0, 0, 0);
    p.finish()
}

/// How a socket takes part in a device's fanout group.
#[derive(Debug, Clone, Copy)]
pub enum Fanout {
    /// Shard 0: makes the group (its id chosen by the kernel) with the program for these keys.
    First(QpnSteering),
    /// Shard k > 0: joins the group of this id, k-th (after shards 0 to k - 1).
    Join(u16),
}

fn set_u32(fd: &OwnedFd, opt: libc::c_int, v: u32) -> io::Result<()> {
    // SAFETY: a u32 option value and its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            opt,
            (&v as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts the bound packet socket `fd` in the group `f` says; returns the group's id.
pub(super) fn join(fd: &OwnedFd, f: &Fanout) -> Result<u16, String> {
    let kind = PACKET_FANOUT_EBPF | PACKET_FANOUT_FLAG_IGNORE_OUTGOING;
    match f {
        Fanout::First(s) => {
            let insns = program(s).ok_or("the fanout program's jumps do not resolve")?;
            let prog = load(BPF_PROG_TYPE_SOCKET_FILTER, &insns, b"rocemu_fanout\0\0\0")
                .map_err(|e| format!("loading the fanout program (needs CAP_BPF): {e}"))?;
            set_u32(
                fd,
                PACKET_FANOUT,
                (kind | PACKET_FANOUT_FLAG_UNIQUEID) << 16,
            )
            .map_err(|e| format!("PACKET_FANOUT (Linux 6.2+ for its flags): {e}"))?;
            set_u32(fd, PACKET_FANOUT_DATA, prog.as_raw_fd() as u32)
                .map_err(|e| format!("PACKET_FANOUT_DATA (the fanout program): {e}"))?;
            // The group holds the program now; our descriptor may go.
            let mut v = 0u32;
            let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
            // SAFETY: a u32 buffer and its length.
            let r = unsafe {
                libc::getsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_PACKET,
                    PACKET_FANOUT,
                    (&mut v as *mut u32).cast(),
                    &mut len,
                )
            };
            if r != 0 {
                return Err(format!(
                    "PACKET_FANOUT (reading the group's id): {}",
                    io::Error::last_os_error()
                ));
            }
            Ok(v as u16)
        }
        Fanout::Join(id) => {
            set_u32(fd, PACKET_FANOUT, u32::from(*id) | kind << 16)
                .map_err(|e| format!("PACKET_FANOUT (joining group {id}): {e}"))?;
            Ok(*id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The program's jumps land forward inside it, it ends with an exit, and it stays well
    /// under the verifier's limits (six rounds of the mix).
    #[test]
    fn the_program_assembles() {
        let s = QpnSteering {
            keys: [1, 2, 3, 4, 5, u64::MAX],
            shards: 3,
        };
        let p = program(&s).expect("assembles");
        assert!(p.len() < 300, "{} instructions", p.len());
        assert_eq!(p.last().unwrap().code, EXIT);
        for (i, insn) in p.iter().enumerate() {
            if matches!(insn.code, JA | JEQ_K | JNE_K) {
                let to = i as isize + 1 + insn.off as isize;
                assert!(insn.off >= 0 && (to as usize) < p.len(), "insn {i}");
            }
        }
    }
}
