//! perftest 4.5-0.17's out-of-band exchange (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`,
//! `ib_atomic_bw`, `*_lat`): the messages here, the steps in [`PerftestXchg`] and the TCP
//! carrier [`PerftestConn`] (`conn.rs`); perftest's `-R` carries the same steps over an RC QP
//! (`crate::perftest_cm`).
//!
//! Invariants: each message has perftest's exact size and bytes (a version of 16 bytes, sys data
//! of 4 + 4, an MTU of 2, addresses of 108, 59 or 56 bytes, reports of 8-byte fields); the steps
//! come in the order each test's `main` does them ([`PerftestXchg::setup_qps`] knows the
//! order per [`PerftestTest`]); a peer older than 5.70 is refused as perftest refuses it.
//!
//! Plain Ethernet/RoCE socket exchange only (no `-R` / rdma_cm, no `-b` bidirectional, RC).
//!
//! # The exchange primitive
//!
//! Every message goes through the same step, `ctx_xchg_data_ethernet` / `ctx_hand_shake`, written
//! `xchg(n)` below: **the client writes n bytes, then reads n; the server reads n, then writes
//! n.** Every `read` in perftest is a single `read(fd, buf, n)` that must return exactly n (a short
//! read is a failure), so each message here is written with one `write` call
//! ([`PerftestConn`] itself reads robustly).
//!
//! Messages:
//! - version: `char version[16]`, `strncpy(version, "6.06", 16)` → `"6.06"` and 12 NULs
//!   ([`PERFTEST_VERSION`]). Each side then does `atof(remote) < 5.70` → `exit(1)` ("Current
//!   implementation is not compatible with versions older than 5.70").
//! - sys data (`check_sys_data`, only when remote ≥ 5.32, always here): `int cycle_buffer`
//!   (`sysconf(_SC_PAGESIZE)`, 4096) then `int cache_line_size` (`_SC_LEVEL1_DCACHE_LINESIZE`,
//!   default 64), each 4 bytes big-endian; each side keeps the **max** of the two.
//! - MTU (`check_mtu`, when remote ≥ 5.1; 2 bytes since remote ≥ 5.31): `sprintf("%d", mtu)` of
//!   the `enum ibv_mtu` value (1 = 256 … 5 = 4096), i.e. one ASCII digit and a NUL. Each side uses
//!   the **min** of its own and the remote's if the remote's parses (`strtol`) to 1..=5. Its own
//!   is `-m` clamped to the port's active MTU, or the active MTU without `-m`.
//!
//!   Those three are the "26 bytes" (16 + 4 + 4 + 2) each way before the first address.
//!   `--dont_xchg_versions` skips all three, but then 4.5-0.17 fails its own version check
//!   (its remote version stays empty, `atof` = 0 < 5.70), so that flag is unusable there.
//! - address (`ethernet_write_keys`, [`PerftestDest::to_wire`]), 108 bytes whenever a GID index
//!   is in use, which is always the case on RoCE (`check_link` sets `gid_index = 0` on an Ethernet
//!   link and `set_up_connection` then picks the best GID, preferring IPv4-mapped RoCEv2 ones):
//!   `"%04x:%04x:%06x:%06x:%08x:%016llx:"` lid:out_reads:qpn:psn:rkey:vaddr, then 16 × `"%02x:"`
//!   (the GID's raw bytes in order), then `"%08x:"` srqn, then NUL = 107 characters + NUL. The
//!   reader (`ethernet_read_keys`) walks the `:` separators with `strtol`/`strtoull`, so the
//!   trailing `:` after srqn is needed. On InfiniBand (gid index -1) the message is 59 bytes,
//!   `"%04x:%04x:%06x:%06x:%08x:%016llx:%08x"` + NUL, without GID
//!   ([`PerftestDest::to_wire_no_gid`], [`PerftestConn::set_dests_with_gid`]).
//! - report (`xchg_bw_reports`): one `xchg(8)` per field, in this order: `size` (`unsigned
//!   long`, u64 big-endian), `iters` (u64 big-endian since the remote is ≥ 5.33), `bw_peak`,
//!   `bw_avg`, `msgRate_avg` (IEEE-754 doubles, big-endian bit pattern), and with
//!   `--report_per_port` also `bw_avg_p1`, `msgRate_avg_p1`, `bw_avg_p2`, `msgRate_avg_p2`.
//!   Bandwidths are in MB/s of 2^20 bytes (Gb/s of 10^9 bits with `--report_gbits`), message
//!   rate in Mpps, `iters` is the total over all QPs. See [`BwReport`].
//! - close (`ctx_close_connection`): an `xchg(108)` of QP 0's address, then each side writes
//!   `"done\0"` (5 bytes) and closes **without reading the peer's "done"**.
//!
//! # Sequences (client C, server S; each `xchg` as above; q = `-q`, default 1)
//!
//! `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw` (`main` in `write_bw.c`, `read_bw.c`, `atomic_bw.c`):
//! 1. C connects (`ethernet_client_connect`, AF_INET only); S accepts one connection on
//!    0.0.0.0:`-p` (default 18515) and closes the listener. `ib_write_bw` then sleeps 1 s.
//! 2. `exchange_versions` xchg(16); `check_version_compatibility`; `check_sys_data` xchg(4),
//!    xchg(4); `check_mtu` xchg(2).
//! 3. Locally: buffers, MR, CQ, QPs (INIT), `set_up_connection` (PSNs).
//! 4. For each QP i: xchg(108) of address i.
//! 5. Locally: `ctx_check_gid_compatibility` (both GIDs IPv4-mapped or both not, else it stops)
//!    and `ctx_connect`: RTR on both, **RTS only on the client** (the server's QPs stay in RTR).
//! 6. For each QP i: xchg(108) of address i again (then printed as "remote address").
//! 7. xchg(108) of address 0 ("an additional handshake is required after moving qp to RTR").
//! 8. C runs the test (`run_iter_bw`); S just waits in step 9.
//! 9. xchg(108) of address 0.
//! 10. Report exchange (above). S prints the **client's** numbers as its result; what S sends is
//!     an uninitialised struct, which C ignores.
//! 11. Close: xchg(108) of address 0, `"done\0"` each way, close.
//!
//! With `-a` the client loops over sizes between 8 and 9 with no socket traffic.
//!
//! `ib_send_bw` (`send_bw.c`): 1 (no sleep), 2, 3, then q × xchg(108); `ctx_connect` (S: RTR only);
//! xchg(108) of address 0; q × xchg(108); S posts its receives (C prepares its WRs); xchg(108) of
//! address 0; both run (`run_iter_bw` / `run_iter_bw_server`) and each prints its **own**
//! result; **no report exchange**; close. With `-a`, per size: S posts receives, xchg(108), run,
//! xchg(108); then close.
//!
//! Latency tests (both ends go to RTS): `ib_write_lat`, `ib_read_lat`, `ib_atomic_lat`:
//! 1, 2, 3, xchg(108) of address 0, q × xchg(108), `ctx_connect`, q × xchg(108), xchg(108) of
//! address 0, then: write_lat runs on both ends and exits without any close message; read_lat
//! and atomic_lat servers go straight to close (which completes only when the client, after its
//! run, does its close). `ib_send_lat`: q × xchg(108), `ctx_connect`, xchg(108) of address 0,
//! q × xchg(108), receives posted, xchg(108) of address 0 (once per size with `-a`), run, close.
//! No report exchange in any latency test.
//!
//! [`PerftestConn::preamble`], [`PerftestConn::setup_qps`] (steps 4–7 in the right order for
//! each [`PerftestTest`]), [`PerftestConn::sync`] and [`PerftestConn::finish`] (steps 9–11)
//! implement these; the single steps are public too.
//!
//! # Data path a peer must match
//!
//! - Defaults (`init_perftest_params`, `force_dependecies`): size 65536 for BW tests, 2 for
//!   latency tests, always 8 for atomics (other sizes are refused); iterations **5000 for
//!   `ib_write_bw`**, 1000 for every other test; `-a` runs sizes 2^1…2^23 (buffers sized for
//!   8 MiB); tx depth 128 for BW (capped at iters), 1 for latency; rx depth (send tests) 512
//!   capped at iters; `-q` QPs, default 1 (BW tests only); CQ moderation 100, disabled for sizes
//!   above 8192 (completion signalling only, nothing on the wire); `-D` duration mode sets iters to
//!   0 and runs for the given seconds.
//! - Both ends must be given the same `-s`, `-n`, `-q`, `-a` and `--report_per_port`: none of them
//!   is exchanged (only the MTU, page size and cache-line size are).
//! - PSN: `lrand48() & 0xffffff` per QP after `srand48(getpid() * time(NULL))`. LID: the port's LID
//!   (0 on RoCE). `out_reads`: 1 for write and send tests; for read and atomic tests `-o` or the
//!   device's `max_qp_rd_atom` (capped to it).
//! - QP attributes (`ctx_modify_qp_to_init/_rtr/_rts`): INIT access flags `REMOTE_WRITE` (write),
//!   `REMOTE_READ` (read), `REMOTE_ATOMIC` (atomic), `REMOTE_WRITE | LOCAL_WRITE` (send); pkey index
//!   0. RTR: `path_mtu` = negotiated MTU, `dest_qp_num`, `rq_psn` = remote PSN,
//!   `max_dest_rd_atomic` = **own** out_reads, `min_rnr_timer = 12`, AV `dlid` = remote LID,
//!   `sl` (`-S`, 0), GRH with `dgid` = remote GID, `sgid_index`, `hop_limit = 0xff` (IP TTL 255),
//!   traffic class 0. RTS: `sq_psn` = own PSN, `timeout = 14` (`-u`), `retry_cnt = 7`,
//!   `rnr_retry = 7`, `max_rd_atomic` = the **remote's** out_reads.
//! - Memory: one buffer, one MR, per QP a region at the advertised `vaddr`/`rkey` of at least
//!   `max(size, cycle_buffer)` bytes (cycle_buffer = negotiated page size), filled with `rand()`
//!   bytes (zeros for write_lat); the MR has `LOCAL_WRITE` plus the test's remote right.
//! - Addresses: for size ≤ cycle_buffer / 2 each successive WR on a QP moves both the local and
//!   the remote address on by `INC(size) = max(roundup(size, cache_line), cache_line)` and wraps to
//!   the region start every `cycle_buffer / INC` WRs; larger sizes always use the region start.
//! - `ib_write_bw`: the client posts `IBV_WR_RDMA_WRITE` (no immediate) of `size` bytes to the
//!   server's vaddr/rkey, up to tx depth outstanding per QP, iters per QP, round-robin over QPs. The
//!   server is passive: nothing posted, QPs left in RTR, it only ACKs.
//! - `ib_read_bw`: the client posts `IBV_WR_RDMA_READ` of `size` bytes from the server's region,
//!   at most `max_rd_atomic` (= the server's advertised out_reads) in flight per QP; the server
//!   only answers, from RTR.
//! - `ib_atomic_bw`: the client posts 8-byte `IBV_WR_ATOMIC_FETCH_AND_ADD` with add value 1
//!   (default `-A FETCH_AND_ADD`) or `IBV_WR_ATOMIC_CMP_AND_SWP` with compare 0 and swap 0, at
//!   addresses stepping by the cache line (64) through the server's cycle buffer (4096 / 64 = 64
//!   words, wrapping), limited like reads; the server only answers.
//! - `ib_send_bw`: the client posts `IBV_WR_SEND` (no immediate) of `size` bytes, iters per QP; the
//!   server posts rx depth receives of `size` bytes per QP before the pre-run sync, re-posts one per
//!   completion until iters per QP have been posted, and expects exactly iters messages per QP
//!   (with a 60 s no-progress watchdog). The client's `rnr_retry` 7 makes RNR harmless.
//! - Latency: `ib_write_lat` is a ping-pong of RDMA WRITEs: the client writes first; each write's
//!   last byte carries the sender's running count (as a `char`) and each side spins on the last
//!   byte of its own region (`vaddr + size - 1`) until it equals its receive count, then writes
//!   back. `ib_read_lat` / `ib_atomic_lat`: one READ / atomic at a time from the client, the server
//!   is passive. `ib_send_lat`: a SEND ping-pong with pre-posted receives.
//! - Output: the server of write/read/atomic BW tests prints the report it received from the
//!   client; send_bw's server prints its own receive-side measurement.
use super::{
    c_text, check_len, hex_field, invalid, malformed, show, OobError, OobErrorKind, OobResult,
    MASK24,
};

mod conn;
#[cfg(test)]
mod tests;

pub use conn::{DestForm, PerftestConn, PerftestXchg};

/// The version string perftest 4.5-0.17 sends (its `VERSION`), and that RoCEmu sends.
pub const PERFTEST_VERSION: &str = "6.06";
/// perftest 4.5-0.17 refuses a peer whose version `atof`s below this.
pub const PERFTEST_MIN_PEER_VERSION: f64 = 5.70;
/// `sizeof(user_param->version)` (`MAX_VERSION`).
pub const PERFTEST_VERSION_LEN: usize = 16;
/// `KEY_MSG_SIZE_GID`: the address message with GID.
pub const PERFTEST_DEST_LEN: usize = 108;
/// `KEY_MSG_SIZE`: the address message without GID (InfiniBand without a GID index).
pub const PERFTEST_DEST_LEN_NO_GID: usize = 59;
/// Size of the binary address message perftest `-R` sends over its rdma_cm QP.
pub const PERFTEST_DEST_LEN_BINARY: usize = 56;
/// Bytes of the MTU message (`sizeof(char[2])`).
pub const PERFTEST_MTU_LEN: usize = 2;
/// What each side writes at the very end (`write(fd, "done", sizeof "done")`).
pub const PERFTEST_DONE: &[u8; 5] = b"done\0";

/// Which end of the perftest connection this is (perftest: client = has a server name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Connects, and writes first in every exchange.
    Client,
    /// Accepts, and reads first in every exchange.
    Server,
}

/// The perftest program on the other end (each has its own handshake order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PerftestTest {
    /// `ib_write_bw`.
    WriteBw,
    /// `ib_read_bw`.
    ReadBw,
    /// `ib_send_bw`.
    SendBw,
    /// `ib_atomic_bw`.
    AtomicBw,
    /// `ib_write_lat`.
    WriteLat,
    /// `ib_read_lat`.
    ReadLat,
    /// `ib_send_lat`.
    SendLat,
    /// `ib_atomic_lat`.
    AtomicLat,
}

impl PerftestTest {
    /// Whether this is a latency test.
    pub fn is_latency(self) -> bool {
        matches!(
            self,
            Self::WriteLat | Self::ReadLat | Self::SendLat | Self::AtomicLat
        )
    }

    /// Whether this is a SEND test (the receiver posts receives; a sync precedes the run).
    pub fn is_send(self) -> bool {
        matches!(self, Self::SendBw | Self::SendLat)
    }

    /// Whether a report exchange ends the test (write/read/atomic bandwidth tests).
    pub fn exchanges_reports(self) -> bool {
        matches!(self, Self::WriteBw | Self::ReadBw | Self::AtomicBw)
    }

    /// The perftest program's name.
    pub fn program(self) -> &'static str {
        match self {
            Self::WriteBw => "ib_write_bw",
            Self::ReadBw => "ib_read_bw",
            Self::SendBw => "ib_send_bw",
            Self::AtomicBw => "ib_atomic_bw",
            Self::WriteLat => "ib_write_lat",
            Self::ReadLat => "ib_read_lat",
            Self::SendLat => "ib_send_lat",
            Self::AtomicLat => "ib_atomic_lat",
        }
    }
}

/// perftest's `struct pingpong_dest` as exchanged (`gid_index` is local and not sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct PerftestDest {
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA reads/atomics this side accepts as responder (its
    /// `max_dest_rd_atomic`); the peer uses it as its `max_rd_atomic`. 1 for write/send tests.
    pub out_reads: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// R_Key of the region at `vaddr`.
    pub rkey: u32,
    /// Start of this QP's remotely accessible region.
    pub vaddr: u64,
    /// GID, raw bytes.
    pub gid: [u8; 16],
    /// XRC/DC SRQ number; 0 for RC.
    pub srqn: u32,
}

impl PerftestDest {
    /// The 108-byte message: `"%04x:%04x:%06x:%06x:%08x:%016llx:"` + 16 × `"%02x:"` + `"%08x:"` +
    /// NUL. QPN and PSN are 24-bit quantities; higher bits are dropped.
    pub fn to_wire(&self) -> [u8; PERFTEST_DEST_LEN] {
        let mut text = self.head_text();
        for b in self.gid {
            text.push_str(&format!("{b:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; PERFTEST_DEST_LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// The 59-byte message without GID: `"%04x:%04x:%06x:%06x:%08x:%016llx:%08x"` + NUL.
    pub fn to_wire_no_gid(&self) -> [u8; PERFTEST_DEST_LEN_NO_GID] {
        let text = format!("{}{:08x}", self.head_text(), self.srqn);
        let mut out = [0u8; PERFTEST_DEST_LEN_NO_GID];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// The 56-byte binary `struct pingpong_dest` that perftest sends over its rdma_cm QP
    /// (`rdma_write_keys`): lid, out_reads, qpn, psn, rkey as big-endian 32-bit words, 4 bytes of
    /// padding, vaddr big-endian, the GID's raw bytes, srqn and gid_index big-endian. The reader
    /// (`rdma_read_keys`) ignores srqn and gid_index; RoCEmu sends 0 for both and for the padding.
    pub fn to_binary(&self) -> [u8; PERFTEST_DEST_LEN_BINARY] {
        let mut out = [0u8; PERFTEST_DEST_LEN_BINARY];
        out[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        out[4..8].copy_from_slice(&u32::from(self.out_reads).to_be_bytes());
        out[8..12].copy_from_slice(&(self.qpn & MASK24).to_be_bytes());
        out[12..16].copy_from_slice(&(self.psn & MASK24).to_be_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        out[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        out[32..48].copy_from_slice(&self.gid);
        out[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        out
    }

    /// Parses the 56-byte binary form ([`to_binary`](Self::to_binary)) as `rdma_read_keys`
    /// does: srqn and the trailing gid_index are not read; LID and out_reads must fit 16 bits,
    /// QPN and PSN 24.
    pub fn from_binary(msg: &[u8]) -> OobResult<Self> {
        const WHAT: &str = "the perftest (rdma_cm) address message";
        check_len(msg, PERFTEST_DEST_LEN_BINARY, WHAT)?;
        let w = |i: usize| u32::from_be_bytes([msg[i], msg[i + 1], msg[i + 2], msg[i + 3]]);
        let field = |i: usize, max: u32, name: &str| {
            let v = w(i);
            if v > max {
                Err(malformed(format!("{WHAT}: {name} {v:#x} is out of range")))
            } else {
                Ok(v)
            }
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&msg[32..48]);
        Ok(Self {
            lid: field(0, 0xffff, "LID")? as u16,
            out_reads: field(4, 0xffff, "out_reads")? as u16,
            qpn: field(8, MASK24, "QPN")?,
            psn: field(12, MASK24, "PSN")?,
            rkey: w(16),
            vaddr: u64::from_be_bytes(msg[24..32].try_into().expect("8 bytes")),
            gid,
            srqn: 0,
        })
    }

    fn head_text(&self) -> String {
        format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & MASK24,
            self.psn & MASK24,
            self.rkey,
            self.vaddr
        )
    }

    /// Parses a 108-byte message: 23 `:`-terminated hex fields (lid, out_reads, qpn, psn, rkey,
    /// vaddr, 16 GID bytes, srqn), then NUL.
    pub fn from_wire(msg: &[u8]) -> OobResult<Self> {
        const WHAT: &str = "the perftest address message";
        check_len(msg, PERFTEST_DEST_LEN, WHAT)?;
        let text = c_text(msg, WHAT)?;
        let body = text.strip_suffix(':').ok_or_else(|| {
            malformed(format!(
                "{WHAT} must end with ':' before its NUL: \"{}\"",
                show(msg)
            ))
        })?;
        let fields: Vec<&str> = body.split(':').collect();
        if fields.len() != 23 {
            return Err(malformed(format!(
                "{WHAT} needs 23 fields (lid, out_reads, qpn, psn, rkey, vaddr, 16 GID bytes, srqn), got {}: \"{}\"",
                fields.len(),
                show(msg)
            )));
        }
        let mut d = Self::head_from(&fields, WHAT, msg)?;
        for (i, byte) in d.gid.iter_mut().enumerate() {
            *byte = hex_field(fields[6 + i], 0xff, "GID byte", WHAT, msg)? as u8;
        }
        d.srqn = hex_field(fields[22], u32::MAX.into(), "SRQN", WHAT, msg)? as u32;
        Ok(d)
    }

    /// Parses a 59-byte message without GID (7 `:`-separated hex fields, then NUL).
    pub fn from_wire_no_gid(msg: &[u8]) -> OobResult<Self> {
        const WHAT: &str = "the perftest address message (without GID)";
        check_len(msg, PERFTEST_DEST_LEN_NO_GID, WHAT)?;
        let text = c_text(msg, WHAT)?;
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() != 7 {
            return Err(malformed(format!(
                "{WHAT} needs 7 fields (lid, out_reads, qpn, psn, rkey, vaddr, srqn), got {}: \"{}\"",
                fields.len(),
                show(msg)
            )));
        }
        let mut d = Self::head_from(&fields, WHAT, msg)?;
        d.srqn = hex_field(fields[6], u32::MAX.into(), "SRQN", WHAT, msg)? as u32;
        Ok(d)
    }

    fn head_from(fields: &[&str], what: &str, msg: &[u8]) -> OobResult<Self> {
        Ok(Self {
            lid: hex_field(fields[0], 0xffff, "LID", what, msg)? as u16,
            out_reads: hex_field(fields[1], 0xffff, "out_reads", what, msg)? as u16,
            qpn: hex_field(fields[2], MASK24.into(), "QPN", what, msg)? as u32,
            psn: hex_field(fields[3], MASK24.into(), "PSN", what, msg)? as u32,
            rkey: hex_field(fields[4], u32::MAX.into(), "rkey", what, msg)? as u32,
            vaddr: hex_field(fields[5], u64::MAX, "vaddr", what, msg)?,
            gid: [0; 16],
            srqn: 0,
        })
    }

    /// Whether the GID is IPv4-mapped (`::ffff:a.b.c.d`, or the `ff0e::ffff:a.b.c.d` multicast
    /// form): perftest refuses to connect unless both ends agree on this (`ctx_check_gid_compatibility`).
    pub fn gid_is_ipv4_mapped(&self) -> bool {
        gid_is_ipv4_mapped(&self.gid)
    }
}

/// `ipv6_addr_v4mapped` of perftest: `::ffff:0:0/96`, or `ff0e::ffff:0:0/96`.
pub fn gid_is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    let v4 = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    let mc = gid[..4] == [0xff, 0x0e, 0, 0]
        && gid[4..10].iter().all(|&b| b == 0)
        && gid[10] == 0xff
        && gid[11] == 0xff;
    v4 || mc
}

/// Page size and cache-line size, as exchanged by `check_sys_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SysData {
    /// `cycle_buffer`: the page size (4096 on x86-64 Linux).
    pub cycle_buffer: u32,
    /// L1 data cache line size (64 when unknown).
    pub cache_line_size: u32,
}

impl Default for SysData {
    fn default() -> Self {
        Self {
            cycle_buffer: 4096,
            cache_line_size: 64,
        }
    }
}

/// What the preamble (versions, sys data, MTU) settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// The peer's version string (e.g. "6.06").
    pub remote_version: String,
    /// What the peer sent in `check_sys_data` (values ≤ 0 as a C `int` are reported as 0).
    pub remote_sys: SysData,
    /// Max of ours and the peer's, field by field: what both sides now use.
    pub sys: SysData,
    /// The peer's MTU in bytes, if its message parsed to a valid `enum ibv_mtu`.
    pub remote_mtu: Option<u32>,
    /// Path MTU in bytes both sides now use: the smaller of the two (ours if the peer's is invalid).
    pub mtu: u32,
}

/// Per-port part of a bandwidth report (only with `--report_per_port`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PerPortReport {
    /// `bw_avg_p1`.
    pub bw_avg_p1: f64,
    /// `msgRate_avg_p1`.
    pub msg_rate_avg_p1: f64,
    /// `bw_avg_p2`.
    pub bw_avg_p2: f64,
    /// `msgRate_avg_p2`.
    pub msg_rate_avg_p2: f64,
}

/// perftest's `struct bw_report_data` as exchanged by `xchg_bw_reports` (`sl` is not sent).
/// Units: bandwidths in MB/s of 2^20 bytes (Gb/s with `--report_gbits`), message rate in Mpps.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// Message size in bytes.
    pub size: u64,
    /// Messages completed, summed over all QPs.
    pub iters: u64,
    /// Peak bandwidth.
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Average message rate.
    pub msg_rate_avg: f64,
    /// Present iff `--report_per_port` (both ends must agree; it decides whether 4 more fields
    /// are exchanged).
    pub per_port: Option<PerPortReport>,
}

/// `enum ibv_mtu` (1..=5) of an MTU in bytes.
pub fn mtu_to_enum(mtu: u32) -> Option<u8> {
    match mtu {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// MTU in bytes of an `enum ibv_mtu` value (1..=5).
pub fn mtu_from_enum(v: i64) -> Option<u32> {
    (1..=5).contains(&v).then(|| 128u32 << v)
}

/// C `atof` of a NUL-padded version string: the longest leading decimal number, 0 if none.
fn version_number(v: &str) -> f64 {
    let t = v.trim_start();
    let mut end = 0;
    let mut dot = false;
    for (i, c) in t.char_indices() {
        if c.is_ascii_digit() || (c == '.' && !dot) || (i == 0 && (c == '+' || c == '-')) {
            dot |= c == '.';
            end = i + c.len_utf8();
        } else {
            break;
        }
    }
    t[..end].parse().unwrap_or(0.0)
}

/// C `strtol(s, NULL, 10)` of the NUL-terminated MTU message.
fn c_strtol(bytes: &[u8]) -> i64 {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let s = String::from_utf8_lossy(&bytes[..end]);
    let t = s.trim_start();
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let n: String = digits
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .take(18)
        .collect();
    let v: i64 = n.parse().unwrap_or(0);
    if neg {
        -v
    } else {
        v
    }
}
