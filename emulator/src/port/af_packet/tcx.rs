//! Keeps the kernel's IP stack from processing the RoCEv2 datagrams that the packet socket has
//! already read: a tiny eBPF program on the interface's ingress (tcx, Linux 6.6+) drops UDP to
//! port 4791 for RoCEmu's own addresses.
//!
//! The kernel hands a received frame to the packet sockets bound to the interface ("taps")
//! before the ingress hook runs (`__netif_receive_skb_core`: the `ptype_all` lists, then
//! `sch_handle_ingress`), so dropping it there loses nothing for RoCEmu. Without it, the kernel
//! routes each datagram, looks up a UDP socket and drops it at the guard's full buffer
//! ([`super::KernelGuard`]): about a fifth of a veth sender's time at 64-byte messages. The
//! guard stays, for kernels without tcx and for frames the program lets by (IPv4 with options,
//! fragments, VLAN tags left in the frame).
//!
//! The program is assembled here, a few dozen instructions, and loaded with `bpf(2)`; the link
//! that attaches it lives as long as its descriptor, so it goes with the port (or the process)
//! and never outlives RoCEmu. Other programs on the same hook run after ours (tcx's "next").
#![allow(unsafe_code)]

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

// bpf(2) commands, program and attach types (<linux/bpf.h>).
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;

// Verdicts on the tcx hook.
const TCX_NEXT: i32 = -1;
const TCX_DROP: i32 = 2;

// `struct __sk_buff`: offsets of `data` and `data_end`.
const SKB_DATA: i16 = 76;
const SKB_DATA_END: i16 = 80;

// eBPF opcodes (class | size/op | source).
pub(crate) const LDX_W: u8 = 0x61; // dst = *(u32 *)(src + off)
const LDX_H: u8 = 0x69; // dst = *(u16 *)(src + off)
const LDX_B: u8 = 0x71; // dst = *(u8 *)(src + off)
pub(crate) const MOV64_X: u8 = 0xbf; // dst = src
pub(crate) const MOV64_K: u8 = 0xb7; // dst = imm
const ADD64_K: u8 = 0x07; // dst += imm
const AND32_K: u8 = 0x54; // dst &= imm (32 bits)
const JGT_X: u8 = 0x2d; // if dst > src (64 bits, unsigned) goto
const JEQ32_K: u8 = 0x16; // if dst == imm (32 bits) goto
const JNE32_K: u8 = 0x56; // if dst != imm (32 bits) goto
pub(crate) const JA: u8 = 0x05; // goto
pub(crate) const EXIT: u8 = 0x95;
pub(crate) const LD_IMM64: u8 = 0x18; // dst = imm64 (two instructions)

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Insn {
    pub(crate) code: u8,
    pub(crate) regs: u8, // dst in the low nibble, src in the high
    pub(crate) off: i16,
    pub(crate) imm: i32,
}

/// A program with forward jumps to named labels.
#[derive(Debug, Default)]
pub(crate) struct Asm {
    ins: Vec<(Insn, Option<String>)>,
    labels: Vec<(String, usize)>,
}

impl Asm {
    pub(crate) fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        let i = Insn {
            code,
            regs: dst | (src << 4),
            off,
            imm,
        };
        self.ins.push((i, None));
    }
    pub(crate) fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: impl Into<String>) {
        let i = Insn {
            code,
            regs: dst | (src << 4),
            off: 0,
            imm,
        };
        self.ins.push((i, Some(to.into())));
    }
    pub(crate) fn label(&mut self, name: impl Into<String>) {
        self.labels.push((name.into(), self.ins.len()));
    }
    /// The program, or `None` when a jump's label is missing or too far for a 16-bit offset.
    pub(crate) fn finish(self) -> Option<Vec<Insn>> {
        let at = |name: &str| self.labels.iter().find(|l| l.0 == name).map(|l| l.1);
        self.ins
            .iter()
            .enumerate()
            .map(|(i, (insn, to))| {
                let mut insn = *insn;
                if let Some(to) = to.as_deref() {
                    insn.off = i16::try_from(at(to)? as isize - i as isize - 1).ok()?;
                }
                Some(insn)
            })
            .collect()
    }
}

/// A 16- or 32-bit value in network order as a little-endian load sees it (the machines RoCEmu
/// builds for are little-endian).
fn be16(v: u16) -> i32 {
    i32::from(u16::from_le_bytes(v.to_be_bytes()))
}
fn be32(b: [u8; 4]) -> i32 {
    i32::from_le_bytes(b)
}

/// The program: TCX_DROP for an untagged IPv4 (header of 20 bytes, not a fragment) or IPv6
/// (UDP right after the fixed header) UDP datagram to port 4791 for one of `addrs`; TCX_NEXT
/// for anything else. `None` when the addresses are too many for the program's jumps.
fn program(addrs: &[IpAddr]) -> Option<Vec<Insn>> {
    let r0 = 0;
    let mut p = Asm::default();
    match_roce(&mut p, addrs, (SKB_DATA, SKB_DATA_END), "drop", "next");
    p.label("next");
    p.op(MOV64_K, r0, 0, 0, TCX_NEXT);
    p.op(EXIT, 0, 0, 0, 0);
    p.label("drop");
    p.op(MOV64_K, r0, 0, 0, TCX_DROP);
    p.op(EXIT, 0, 0, 0, 0);
    p.finish()
}

/// The matcher shared with the XDP program (`port::af_xdp`): with the context in r1, whose
/// `data` and `data_end` are 32-bit fields at offsets `ctx.0` and `ctx.1`, jumps to `hit` for
/// an untagged IPv4 (header of 20 bytes, not a fragment) or IPv6 (UDP right after the fixed
/// header) UDP datagram to port 4791 for one of `addrs`, and to `miss` for anything else.
/// Leaves r1 as it was; uses r2 to r5. The caller places both labels.
pub(crate) fn match_roce(p: &mut Asm, addrs: &[IpAddr], ctx: (i16, i16), hit: &str, miss: &str) {
    let (r1, r2, r3, r4, r5) = (1, 2, 3, 4, 5);
    let (next, drop) = (miss, hit);
    p.op(LDX_W, r2, r1, ctx.0, 0);
    p.op(LDX_W, r3, r1, ctx.1, 0);
    // The IPv4 case needs 38 bytes (Ethernet 14, IPv4 20, UDP ports 4).
    p.op(MOV64_X, r4, r2, 0, 0);
    p.op(ADD64_K, r4, 0, 0, 38);
    p.jump(JGT_X, r4, r3, 0, next);
    p.op(LDX_H, r5, r2, 12, 0); // EtherType
    p.jump(JEQ32_K, r5, 0, be16(0x86dd), format!("{miss}_v6"));
    p.jump(JNE32_K, r5, 0, be16(0x0800), next);
    p.op(LDX_B, r5, r2, 14, 0); // version and IHL
    p.jump(JNE32_K, r5, 0, 0x45, next);
    p.op(LDX_B, r5, r2, 23, 0); // protocol
    p.jump(JNE32_K, r5, 0, 17, next);
    p.op(LDX_H, r5, r2, 20, 0); // flags and fragment offset: MF or an offset is a fragment
    p.op(AND32_K, r5, 0, 0, be16(0x3fff));
    p.jump(JNE32_K, r5, 0, 0, next);
    p.op(LDX_H, r5, r2, 36, 0); // UDP destination port
    p.jump(JNE32_K, r5, 0, be16(4791), next);
    p.op(LDX_W, r5, r2, 30, 0); // destination address
    for a in addrs {
        if let IpAddr::V4(a) = a {
            p.jump(JEQ32_K, r5, 0, be32(a.octets()), drop);
        }
    }
    p.jump(JA, 0, 0, 0, next);

    p.label(format!("{miss}_v6"));
    // 58 bytes: Ethernet 14, IPv6 40, UDP ports 4.
    p.op(MOV64_X, r4, r2, 0, 0);
    p.op(ADD64_K, r4, 0, 0, 58);
    p.jump(JGT_X, r4, r3, 0, next);
    p.op(LDX_B, r5, r2, 20, 0); // next header
    p.jump(JNE32_K, r5, 0, 17, next);
    p.op(LDX_H, r5, r2, 56, 0); // UDP destination port
    p.jump(JNE32_K, r5, 0, be16(4791), next);
    // Each address: four words compared in turn; a mismatch goes on to the next address.
    let v6 = addrs.iter().filter_map(|a| match a {
        IpAddr::V6(a) => Some(a.octets()),
        IpAddr::V4(_) => None,
    });
    for (k, o) in v6.enumerate() {
        for w in 0..4 {
            p.op(LDX_W, r5, r2, 38 + 4 * w as i16, 0);
            let word = [o[4 * w], o[4 * w + 1], o[4 * w + 2], o[4 * w + 3]];
            p.jump(JNE32_K, r5, 0, be32(word), format!("{miss}_miss{k}"));
        }
        p.jump(JA, 0, 0, 0, drop);
        p.label(format!("{miss}_miss{k}"));
    }
    p.jump(JA, 0, 0, 0, next);
}

pub(crate) fn bpf(cmd: libc::c_int, attr: &mut [u64; 16]) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a zeroed `union bpf_attr` of 128 bytes with the command's fields set;
    // the kernel reads at most the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr) as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor (close-on-exec) that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as libc::c_int) })
}

/// Loads program `insns` of type `prog_type` under `name` (15 bytes and a NUL at most); a
/// program the verifier refuses is refused with the last lines of the verifier's log.
pub(crate) fn load(prog_type: u32, insns: &[Insn], name: &[u8; 16]) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut attr = [0u64; 16];
    // prog_type, insn_cnt; insns; license (`struct bpf_attr`, BPF_PROG_LOAD).
    attr[0] = u64::from(prog_type) | ((insns.len() as u64) << 32);
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    attr[6] = u64::from_le_bytes(name[..8].try_into().expect("8 bytes"));
    attr[7] = u64::from_le_bytes(name[8..].try_into().expect("8 bytes"));
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(p) => Ok(p),
        Err(e)
            if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::EACCES) =>
        {
            // The verifier refused it: once more with its log, for the message.
            let mut log = vec![0u8; 16 << 10];
            attr[3] = 1 | ((log.len() as u64) << 32); // log_level 1, log_size
            attr[4] = log.as_mut_ptr() as u64;
            let again = bpf(BPF_PROG_LOAD, &mut attr);
            let text =
                String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
                    .lines()
                    .rev()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" / ");
            match again {
                Ok(p) => Ok(p),
                Err(_) => Err(io::Error::new(
                    e.kind(),
                    format!("{e}: the verifier said: {text}"),
                )),
            }
        }
        Err(e) => Err(e),
    }
}

/// The attached program; dropping it detaches it.
#[derive(Debug)]
pub(super) struct IngressDrop {
    _link: OwnedFd,
    _prog: OwnedFd,
}

/// Loads the program for `addrs` and attaches it to interface `ifindex`'s tcx ingress. Fails
/// on kernels without tcx (before 6.6), without the privilege to load programs (CAP_BPF and
/// CAP_NET_ADMIN), or with no address to drop for.
pub(super) fn attach(ifindex: u32, addrs: &[IpAddr]) -> io::Result<IngressDrop> {
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no address of ours to drop datagrams for",
        ));
    }
    let insns = program(addrs).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many addresses for the ingress program's jumps",
        )
    })?;
    let prog = load(BPF_PROG_TYPE_SCHED_CLS, &insns, b"rocemu_ingress\0\0")?;
    // prog_fd, target_ifindex; attach_type, flags (BPF_LINK_CREATE).
    let mut attr = [0u64; 16];
    attr[0] = prog.as_raw_fd() as u64 | (u64::from(ifindex) << 32);
    attr[1] = u64::from(BPF_TCX_INGRESS);
    let link = bpf(BPF_LINK_CREATE, &mut attr)?;
    Ok(IngressDrop {
        _link: link,
        _prog: prog,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every jump lands inside the program, forward, and the program ends with an exit.
    #[test]
    fn jumps_resolve_forward_within_the_program() {
        let addrs: Vec<IpAddr> = vec![
            "10.0.0.1".parse().unwrap(),
            "fd00::1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "fd00::2".parse().unwrap(),
        ];
        let p = program(&addrs).unwrap();
        for (i, insn) in p.iter().enumerate() {
            if matches!(insn.code, JGT_X | JEQ32_K | JNE32_K | JA) {
                let to = i as isize + 1 + insn.off as isize;
                assert!(
                    insn.off >= 0 && (to as usize) < p.len(),
                    "insn {i}: {insn:?}"
                );
            }
        }
        assert_eq!(p.last().unwrap().code, EXIT);
        // Too many addresses for 16-bit jumps: refused, not a panic.
        let many: Vec<IpAddr> = (0..7000u32)
            .map(|i| IpAddr::V6(std::net::Ipv6Addr::from(u128::from(i) + 1)))
            .collect();
        assert!(program(&many).is_none());
        assert_eq!(be16(4791), 0xb712);
    }
}
