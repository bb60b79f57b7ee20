//! The XDP program that hands RoCEmu its frames: RoCEv2 datagrams (UDP 4791) to RoCEmu's own
//! addresses go to the XSKMAP (and so to the AF_XDP socket of their receive queue); everything
//! else goes on to the kernel (`XDP_PASS`), so SSH, ping and the out-of-band TCP exchange keep
//! working on the same interface.
//!
//! ARP and IPv6 neighbour discovery are passed too: the kernel needs them for its own
//! neighbours (its replies and the requests for its addresses, which may be RoCEmu's as well),
//! and the engine needs them for its own (it answers for its addresses and learns its peers'
//! MACs from their replies). XDP cannot clone a frame, so the port reads a copy of them through
//! a packet socket beside the AF_XDP socket (see the parent module).
//!
//! Like the tcx program of `af_packet`, it is assembled here (the matcher is the same code,
//! [`match_roce`]) and loaded with `bpf(2)`: a few dozen instructions need no compiler, and
//! the build needs no clang. It is attached with a bpf link (`BPF_LINK_CREATE`, `BPF_XDP`),
//! which the kernel detaches when its last descriptor is closed: with the port, or with the
//! process however it dies.
#![allow(unsafe_code)]

use super::super::af_packet::tcx::{bpf, match_roce, Asm, EXIT, LDX_W, LD_IMM64, MOV64_K};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

// bpf(2) commands, map, program and attach types, XDP flags (<linux/bpf.h>, <linux/if_link.h>).
const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_PASS: i32 = 2;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const CALL: u8 = 0x85;

// `struct xdp_md`: data, data_end, rx_queue_index.
const XDP_DATA: i16 = 0;
const XDP_DATA_END: i16 = 4;
const XDP_RX_QUEUE: i16 = 16;

/// The program, with the XSKMAP `map` (a descriptor) for the redirect. A frame on a queue
/// with no socket in the map is passed (`bpf_redirect_map`'s fallback verdict).
fn program(addrs: &[IpAddr], map: i32) -> Option<Vec<super::super::af_packet::tcx::Insn>> {
    let (r0, r1, r2, r3) = (0, 1, 2, 3);
    let mut p = Asm::default();
    match_roce(&mut p, addrs, (XDP_DATA, XDP_DATA_END), "xsk", "pass");
    p.label("pass");
    p.op(MOV64_K, r0, 0, 0, XDP_PASS);
    p.op(EXIT, 0, 0, 0, 0);
    p.label("xsk");
    p.op(LDX_W, r2, r1, XDP_RX_QUEUE, 0); // key: the receive queue
    p.op(LD_IMM64, r1, BPF_PSEUDO_MAP_FD, 0, map); // r1 = the map
    p.op(0, 0, 0, 0, 0); // (the upper half of the 64-bit immediate)
    p.op(MOV64_K, r3, 0, 0, XDP_PASS); // flags: the verdict when the lookup fails
    p.op(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP);
    p.op(EXIT, 0, 0, 0, 0);
    p.finish()
}

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (veth and most NIC drivers).
    Native,
    /// After the driver, on the socket buffer (any interface; slower).
    Generic,
}

/// The attached program and its map; dropping it detaches the program.
#[derive(Debug)]
pub(super) struct Redirect {
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
    pub(super) mode: XdpMode,
}

fn err(e: io::Error, what: &str) -> io::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (loading an XDP program needs CAP_BPF and CAP_NET_ADMIN: run as root)"
        }
        Some(libc::EBUSY) | Some(libc::EEXIST) => {
            " (another XDP program is attached to the interface)"
        }
        Some(libc::ENOSYS) => " (a kernel without bpf(2))",
        _ => "",
    };
    io::Error::new(e.kind(), format!("{what}: {e}{hint}"))
}

impl Redirect {
    /// Puts socket `xsk` in the map at index `queue`: the program then redirects that queue's
    /// frames to it (a device's later shard, each on a queue of its own).
    pub(super) fn add(&self, queue: u32, xsk: &OwnedFd) -> io::Result<()> {
        map_put(&self._map, queue, xsk)
    }
}

fn map_put(map: &OwnedFd, queue: u32, xsk: &OwnedFd) -> io::Result<()> {
    // map_fd; key; value; flags (BPF_MAP_UPDATE_ELEM).
    let key = queue;
    let value = xsk.as_raw_fd() as u32;
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u64;
    attr[1] = &key as *const u32 as u64;
    attr[2] = &value as *const u32 as u64;
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map_err(|e| err(e, "XSKMAP update"))?;
    Ok(())
}

/// Creates the XSKMAP (room for queues 0 to `queues` - 1, and `queue`) with the socket `xsk`
/// at index `queue`, loads the program for `addrs` and attaches it to interface `ifindex`:
/// natively where the driver can, otherwise generic.
pub(super) fn attach(
    ifindex: u32,
    addrs: &[IpAddr],
    xsk: &OwnedFd,
    queue: u32,
    queues: u32,
) -> io::Result<Redirect> {
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no address of ours to redirect datagrams for",
        ));
    }
    // map_type, key_size; value_size, max_entries (`struct bpf_attr`, BPF_MAP_CREATE).
    let mut attr = [0u64; 16];
    attr[0] = u64::from(BPF_MAP_TYPE_XSKMAP) | (4 << 32);
    attr[1] = 4 | (u64::from((queue + 1).max(queues)) << 32);
    let map = bpf(BPF_MAP_CREATE, &mut attr).map_err(|e| err(e, "XSKMAP"))?;
    map_put(&map, queue, xsk)?;

    let insns = program(addrs, map.as_raw_fd()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many addresses for the XDP program's jumps",
        )
    })?;
    let license = c"GPL";
    let mut attr = [0u64; 16];
    // prog_type, insn_cnt; insns; license; …; prog_name; prog_ifindex, expected_attach_type.
    attr[0] = u64::from(BPF_PROG_TYPE_XDP) | ((insns.len() as u64) << 32);
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    let name = b"rocemu_xdp\0\0\0\0\0\0";
    attr[6] = u64::from_le_bytes(name[..8].try_into().expect("8 bytes"));
    attr[7] = u64::from_le_bytes(name[8..].try_into().expect("8 bytes"));
    attr[8] = u64::from(BPF_XDP) << 32;
    let prog = match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(p) => p,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            // The verifier refused it: once more with its log, for the message.
            let mut log = vec![0u8; 16 << 10];
            attr[3] = 1 | ((log.len() as u64) << 32);
            attr[4] = log.as_mut_ptr() as u64;
            let again = bpf(BPF_PROG_LOAD, &mut attr);
            let end = log.iter().position(|&b| b == 0).unwrap_or(0);
            let text = String::from_utf8_lossy(&log[..end])
                .lines()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
                .join(" / ");
            again.map_err(|_| {
                io::Error::new(
                    e.kind(),
                    format!("XDP program: {e}: the verifier said: {text}"),
                )
            })?
        }
        Err(e) => return Err(err(e, "XDP program")),
    };
    // prog_fd, target_ifindex; attach_type, flags (BPF_LINK_CREATE).
    let mut last = None;
    for (mode, flags) in [
        (XdpMode::Native, XDP_FLAGS_DRV_MODE),
        (XdpMode::Generic, XDP_FLAGS_SKB_MODE),
    ] {
        let mut attr = [0u64; 16];
        attr[0] = prog.as_raw_fd() as u64 | (u64::from(ifindex) << 32);
        attr[1] = u64::from(BPF_XDP) | (u64::from(flags) << 32);
        match bpf(BPF_LINK_CREATE, &mut attr) {
            Ok(link) => {
                return Ok(Redirect {
                    _link: link,
                    _prog: prog,
                    _map: map,
                    mode,
                })
            }
            Err(e) => last = Some(e),
        }
    }
    Err(err(
        last.expect("two tries"),
        "attaching the XDP program (bpf link)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every jump lands inside the program, forward; the redirect's 64-bit load names the map.
    #[test]
    fn the_program_is_well_formed() {
        let addrs: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        let p = program(&addrs, 7).unwrap();
        for (i, insn) in p.iter().enumerate() {
            if insn.code & 0x07 == 0x05 && insn.code != CALL && insn.code != EXIT {
                let to = i as isize + 1 + insn.off as isize;
                assert!(
                    insn.off >= 0 && (to as usize) < p.len(),
                    "insn {i}: {insn:?}"
                );
            }
        }
        let ld = p.iter().position(|i| i.code == LD_IMM64).unwrap();
        assert_eq!((p[ld].imm, p[ld].regs), (7, 1 | (BPF_PSEUDO_MAP_FD << 4)));
        assert_eq!(p[ld + 3].imm, BPF_FUNC_REDIRECT_MAP);
        assert_eq!(p.last().unwrap().code, EXIT);
    }
}
