//! The out-of-band TCP exchanges of rdma-core's `ibv_rc_pingpong` and of perftest's `ib_*_bw` /
//! `ib_*_lat`, byte for byte, so that RoCEmu can be either end against the real tools.
//!
//! Reference versions (Debian 12): rdma-core 44.0 (`ibverbs-utils 44.0-2`) and perftest
//! `4.5+0.17-1` (upstream tag `v4.5-0.17`; its binaries call themselves version **6.06**, the
//! `VERSION` that `configure.ac`'s `AC_INIT` sets, and that string is what goes on the wire).
//! Written from a reading of `libibverbs/examples/{rc_pingpong,pingpong}.c` and of perftest's
//! `src/{perftest_communication,perftest_parameters,perftest_resources}.c` and
//! `src/{write,read,send,atomic}_{bw,lat}.c`; none of their code is used here.
//!
//! Std only: blocking [`std::net`] sockets. Every read and write has a deadline
//! ([`OobConfig::io_timeout`], changeable per connection), so a dead peer gives
//! [`OobErrorKind::Timeout`] instead of a hang; every failure is an [`OobError`] with a readable
//! message, never a panic.
//!
//! # `ibv_rc_pingpong` (rdma-core 44)
//!
//! ## The exchange (`pp_client_exch_dest` / `pp_server_exch_dest`)
//!
//! One message format, [`PingpongDest::to_wire`]: `sprintf("%04x:%06x:%06x:%s", lid, qpn, psn,
//! wire_gid)` into `char msg[sizeof "0000:000000:000000:" + 32 zeros]`, i.e. 51 characters and a
//! NUL, always **52 bytes**, sent with one `write(fd, msg, 52)`. `wire_gid` comes from
//! `gid_to_wire_gid`: the 16 GID bytes are copied into four `uint32_t`, each printed with
//! `"%08x"` after `htobe32`, which on any host is simply the 16 raw bytes in order as 32 lowercase
//! hex digits (`::ffff:10.99.0.2` → `00000000000000000000ffff0a630002`). The reader does
//! `sscanf(msg, "%x:%x:%x:%s")` and `wire_gid_to_gid` (the inverse).
//!
//! Order on the TCP connection (port `-p`, default 18515):
//! 1. the client connects and writes its 52 bytes;
//! 2. the server reads 52 bytes (a single `read` that must return exactly 52), parses them and
//!    **moves its QP to RTR and RTS** (`pp_connect_ctx`) before it answers; if that fails it
//!    closes the socket without answering;
//! 3. the server writes its 52 bytes;
//! 4. the client reads 52 bytes (again one `read` that must return 52), writes `"done"` with its
//!    NUL (5 bytes), parses the answer and closes; only then does it move its own QP to RTR/RTS;
//! 5. the server reads and requires a 5-byte read (it checks the length only), then closes.
//!
//! [`pingpong_client`] and [`pingpong_server`] implement the two sides; the server's `connect`
//! closure runs between 2 and 3. Here the `"done\0"` is checked byte for byte.
//!
//! ## Data path a peer must match (`main`, `pp_post_send`, `parse_single_wc`)
//!
//! - Defaults: `-s` 4096 bytes, `-n` 1000 iterations, `-m` path MTU 1024 (**not** exchanged:
//!   both ends must be given the same `-m`), `-r` rx depth 500, `-l` SL 0, `-g` GID index none.
//! - PSN: `lrand48() & 0xffffff` after `srand48(getpid() * time(NULL))`. LID is 0 on RoCE.
//! - GID: without `-g` it sends an all-zero GID. The remote QP's AV gets a GRH only when the
//!   remote GID's interface id (bytes 8..16) is non-zero, so on RoCE both ends need `-g` (and
//!   RoCEmu must send a real GID such as `::ffff:a.b.c.d`, and expect one).
//! - `modify_qp`: INIT with `qp_access_flags = 0` (no remote access at all), pkey index 0;
//!   RTR with `path_mtu`, `dest_qp_num`, `rq_psn` = remote PSN, `max_dest_rd_atomic = 1`,
//!   `min_rnr_timer = 12`, AV `dlid`, `sl`, `src_path_bits 0`, GRH `hop_limit = 1` (so RoCEv2
//!   frames from it have IP TTL 1), `sgid_index = -g`, traffic class 0, flow label 0;
//!   RTS with `timeout = 14`, `retry_cnt = 7`, `rnr_retry = 7` (infinite), `sq_psn` = own PSN,
//!   `max_rd_atomic = 1`.
//! - QP: RC, `max_send_wr = 1`, `max_recv_wr = rx_depth`, one SGE. Both sides post `rx_depth`
//!   receives of `size` bytes **before** the exchange and top them back up when at most one is
//!   left, so a peer never meets RNR.
//! - Traffic: plain `IBV_WR_SEND` (no immediate, signaled; inline when the size fits), `size`
//!   bytes from the one buffer that is also the receive buffer (initially filled with `0x7b`, so
//!   what a side sends is what it last received). The client posts the first SEND right after its
//!   RTS. Each side then posts its next SEND only when **both** its previous SEND has completed
//!   (the peer's ACK arrived) and a new receive has completed; the server starts on its first
//!   receive. Each side sends exactly `iters` messages and receives `iters`. A peer therefore has
//!   to ACK every SEND promptly (the ACK-request bit is set on each message's last packet).
//! - `-c` (validate): the client writes 0 at every page-start offset (`i / page_size %
//!   sizeof(char)` is always 0) before sending; the server, at the end, checks that the byte at
//!   every 4096-byte page start of its buffer is 0 (prints `invalid data in page N` otherwise).
//!   A RoCEmu client facing `ibv_rc_pingpong -c` must therefore send 0 at offsets 0, 4096, ….
//! - Output: `  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s`, the same with
//!   `remote address: `, then `%lld bytes in %.2f seconds = %.2f Mbit/sec` (bytes = size × iters
//!   × 2) and `%d iters in %.2f seconds = %.2f usec/iter`.
//!
//! # perftest 4.5-0.17 (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw`, `*_lat`)
//!
//! Plain Ethernet/RoCE socket exchange only (no `-R` / rdma_cm, no `-b` bidirectional, RC).
//!
//! ## The exchange primitive
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
//! ## Sequences (client C, server S; each `xchg` as above; q = `-q`, default 1)
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
//! ## Data path a peer must match
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

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Port both tools use when `-p` is not given.
pub const DEFAULT_PORT: u16 = 18515;

// --------------------------------------------------------------------------------------------
// Errors and configuration
// --------------------------------------------------------------------------------------------

/// What went wrong in an out-of-band exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OobErrorKind {
    /// A socket error (connect, accept, read, write).
    Io,
    /// A deadline passed ([`OobConfig`]).
    Timeout,
    /// The peer closed (or reset) the connection before the exchange finished.
    Closed,
    /// The peer sent something that is not the expected message.
    Malformed,
    /// The peer is a version this exchange refuses (perftest < 5.70).
    Incompatible,
    /// An argument given to this module is out of range (for example an MTU that is not a power
    /// of two between 256 and 4096).
    InvalidInput,
    /// The caller's callback (for example moving the QP to RTR/RTS) reported an error.
    Callback,
}

/// An out-of-band exchange error: a kind and a readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OobError {
    kind: OobErrorKind,
    message: String,
}

impl OobError {
    pub(crate) fn new(kind: OobErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> OobErrorKind {
        self.kind
    }

    /// The readable message (also what `Display` prints).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OobError {}

/// Result of this module's operations.
pub type OobResult<T> = Result<T, OobError>;

fn malformed(message: impl Into<String>) -> OobError {
    OobError::new(OobErrorKind::Malformed, message)
}

fn invalid(message: impl Into<String>) -> OobError {
    OobError::new(OobErrorKind::InvalidInput, message)
}

/// Timeouts of the out-of-band exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OobConfig {
    /// Deadline for each message (a whole read or a whole write); `None` waits forever.
    /// Default 60 s. A perftest server waits in a read for the whole duration of the client's
    /// run, see [`PerftestConn::set_io_timeout`].
    pub io_timeout: Option<Duration>,
    /// How long a server waits for a client to connect; `None` (the default) waits forever,
    /// like the C tools.
    pub accept_timeout: Option<Duration>,
    /// How long a client keeps trying to connect (a refused connection is retried every 50 ms
    /// until then; the C tools try once). At least one attempt is always made. Default 10 s.
    pub connect_timeout: Duration,
}

impl Default for OobConfig {
    fn default() -> Self {
        Self {
            io_timeout: Some(Duration::from_secs(60)),
            accept_timeout: None,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl OobConfig {
    /// The same deadline for every message, accept and connect.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            io_timeout: Some(timeout),
            accept_timeout: Some(timeout),
            connect_timeout: timeout,
        }
    }
}

/// Binds the TCP listener a server uses: `0.0.0.0:port` (perftest binds AF_INET only).
/// `port` 0 picks a free port.
pub fn listen(port: u16) -> OobResult<TcpListener> {
    TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
        OobError::new(
            OobErrorKind::Io,
            format!("couldn't listen on TCP port {port}: {e}"),
        )
    })
}

/// Connects to `addr`, retrying refused attempts until `cfg.connect_timeout`.
fn connect_stream(addr: impl ToSocketAddrs, cfg: &OobConfig) -> OobResult<TcpStream> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| {
            OobError::new(
                OobErrorKind::Io,
                format!("couldn't resolve the server address: {e}"),
            )
        })?
        .collect();
    if addrs.is_empty() {
        return Err(OobError::new(
            OobErrorKind::Io,
            "the server address resolved to nothing",
        ));
    }
    let deadline = Instant::now() + cfg.connect_timeout;
    loop {
        let mut last = None;
        for a in &addrs {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(200));
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => {
                    // Small messages, one write each: don't let Nagle hold any of them back.
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last = Some((*a, e)),
            }
        }
        if Instant::now() >= deadline {
            let (a, e) = last.expect("at least one address was tried");
            let kind = if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) {
                OobErrorKind::Timeout
            } else {
                OobErrorKind::Io
            };
            return Err(OobError::new(kind, format!("couldn't connect to {a}: {e}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Accepts one connection, waiting at most `cfg.accept_timeout`.
fn accept_stream(listener: &TcpListener, cfg: &OobConfig) -> OobResult<TcpStream> {
    let io = |e: std::io::Error| OobError::new(OobErrorKind::Io, format!("accept() failed: {e}"));
    let stream = match cfg.accept_timeout {
        None => listener.accept().map_err(io)?.0,
        Some(t) => {
            listener.set_nonblocking(true).map_err(io)?;
            let deadline = Instant::now() + t;
            let got = loop {
                match listener.accept() {
                    Ok((s, _)) => break Ok(s),
                    Err(e)
                        if e.kind() == ErrorKind::WouldBlock
                            || e.kind() == ErrorKind::Interrupted =>
                    {
                        if Instant::now() >= deadline {
                            break Err(OobError::new(
                                OobErrorKind::Timeout,
                                format!("no client connected within {:.1} s", t.as_secs_f64()),
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => break Err(io(e)),
                }
            };
            let _ = listener.set_nonblocking(false);
            got?
        }
    };
    stream.set_nonblocking(false).map_err(io)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A connected socket with a per-message deadline.
#[derive(Debug)]
struct Wire {
    stream: TcpStream,
    timeout: Option<Duration>,
}

impl Wire {
    fn new(stream: TcpStream, timeout: Option<Duration>) -> Self {
        Self { stream, timeout }
    }

    fn timeout_text(&self) -> String {
        match self.timeout {
            Some(t) => format!("{:.1} s", t.as_secs_f64()),
            None => "ever".to_string(),
        }
    }

    /// Writes `msg` with a single `write_all` (one `write` call for these small messages).
    fn send(&mut self, msg: &[u8], what: &str) -> OobResult<()> {
        // A zero timeout is an error for the socket: use the smallest real one instead.
        let set = self.timeout.map(|t| t.max(Duration::from_millis(1)));
        self.stream
            .set_write_timeout(set)
            .map_err(|e| OobError::new(OobErrorKind::Io, format!("sending {what}: {e}")))?;
        let r = self
            .stream
            .write_all(msg)
            .and_then(|()| self.stream.flush());
        r.map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => OobError::new(
                OobErrorKind::Timeout,
                format!(
                    "timed out after {} sending {what} ({} bytes)",
                    self.timeout_text(),
                    msg.len()
                ),
            ),
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => {
                OobError::new(
                    OobErrorKind::Closed,
                    format!("the peer closed the connection before {what} could be sent: {e}"),
                )
            }
            _ => OobError::new(OobErrorKind::Io, format!("sending {what}: {e}")),
        })
    }

    /// Reads exactly `len` bytes before the deadline.
    fn recv(&mut self, len: usize, what: &str) -> OobResult<Vec<u8>> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let mut buf = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let read_timeout = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(self.recv_timeout(what, got, len));
                    }
                    Some(d - now)
                }
                None => None,
            };
            self.stream
                .set_read_timeout(read_timeout)
                .map_err(|e| OobError::new(OobErrorKind::Io, format!("reading {what}: {e}")))?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(OobError::new(
                        OobErrorKind::Closed,
                        format!("the peer closed the connection after {got} of the {len} bytes of {what}"),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(self.recv_timeout(what, got, len))
                }
                Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => {
                    return Err(OobError::new(
                        OobErrorKind::Closed,
                        format!("the peer reset the connection after {got} of the {len} bytes of {what}: {e}"),
                    ))
                }
                Err(e) => return Err(OobError::new(OobErrorKind::Io, format!("reading {what}: {e}"))),
            }
        }
        Ok(buf)
    }

    fn recv_timeout(&self, what: &str, got: usize, len: usize) -> OobError {
        OobError::new(
            OobErrorKind::Timeout,
            format!(
                "timed out after {} waiting for {what} ({got} of {len} bytes received)",
                self.timeout_text()
            ),
        )
    }

    /// Reads whatever the peer still sends until it closes, for at most `limit` (errors ignored):
    /// lets a closing side consume the peer's "done" so that its own close is a clean FIN.
    fn drain(&mut self, limit: Duration) -> Vec<u8> {
        let deadline = Instant::now() + limit;
        let mut out = Vec::new();
        let mut buf = [0u8; 64];
        while out.len() < 4096 {
            let now = Instant::now();
            if now >= deadline || self.stream.set_read_timeout(Some(deadline - now)).is_err() {
                break;
            }
            match self.stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        out
    }
}

// --------------------------------------------------------------------------------------------
// Small text helpers
// --------------------------------------------------------------------------------------------

/// Shows a received message in an error: printable ASCII as is, the rest escaped.
fn show(msg: &[u8]) -> String {
    let mut s = String::new();
    for &b in msg.iter().take(160) {
        match b {
            0 => s.push_str("\\0"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    if msg.len() > 160 {
        s.push('…');
    }
    s
}

/// The text of a C string message: the bytes before the first NUL, which must be ASCII.
fn c_text<'a>(msg: &'a [u8], what: &str) -> OobResult<&'a str> {
    let end = msg
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| malformed(format!("{what} has no terminating NUL: \"{}\"", show(msg))))?;
    let text = &msg[..end];
    if !text.iter().all(|b| b.is_ascii_graphic()) {
        return Err(malformed(format!(
            "{what} is not printable text: \"{}\"",
            show(msg)
        )));
    }
    // All bytes are ASCII graphic characters, so this cannot fail.
    std::str::from_utf8(text).map_err(|_| malformed(format!("{what} is not text")))
}

/// One hexadecimal field (1 to 16 digits, no prefix) not above `max`.
fn hex_field(field: &str, max: u64, name: &str, what: &str, msg: &[u8]) -> OobResult<u64> {
    let bad = || {
        malformed(format!(
            "{what}: {name} \"{field}\" is not a hex number up to {max:#x} in \"{}\"",
            show(msg)
        ))
    };
    if field.is_empty() || field.len() > 16 || !field.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let v = u64::from_str_radix(field, 16).map_err(|_| bad())?;
    if v > max {
        return Err(bad());
    }
    Ok(v)
}

fn check_len(msg: &[u8], len: usize, what: &str) -> OobResult<()> {
    if msg.len() != len {
        return Err(malformed(format!(
            "{what} must be {len} bytes, got {}: \"{}\"",
            msg.len(),
            show(msg)
        )));
    }
    Ok(())
}

const MASK24: u32 = 0x00ff_ffff;

// --------------------------------------------------------------------------------------------
// ibv_rc_pingpong
// --------------------------------------------------------------------------------------------

/// Size of `ibv_rc_pingpong`'s address message: `sizeof "0000:000000:000000:" + 32 digits`.
pub const PINGPONG_MSG_LEN: usize = 52;

/// What an `ibv_rc_pingpong` client writes after reading the server's address (with its NUL).
pub const PINGPONG_DONE: &[u8; 5] = b"done\0";

/// `struct pingpong_dest` of `ibv_rc_pingpong`: what each side tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct PingpongDest {
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN the sender will use (24 bits).
    pub psn: u32,
    /// GID, raw bytes (all zero when the tool runs without `-g`).
    pub gid: [u8; 16],
}

impl PingpongDest {
    /// The 52-byte message: `"%04x:%06x:%06x:%s"` with the GID as 32 hex digits of its raw
    /// bytes in order, then a NUL. QPN and PSN are 24-bit quantities; higher bits are dropped.
    pub fn to_wire(&self) -> [u8; PINGPONG_MSG_LEN] {
        let mut text = format!(
            "{:04x}:{:06x}:{:06x}:",
            self.lid,
            self.qpn & MASK24,
            self.psn & MASK24
        );
        for b in self.gid {
            text.push_str(&format!("{b:02x}"));
        }
        let mut out = [0u8; PINGPONG_MSG_LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses a 52-byte message as `ibv_rc_pingpong` does (`"%x:%x:%x:%s"`, then 32 hex digits
    /// of GID); field widths are not enforced, values and the GID length are.
    pub fn from_wire(msg: &[u8]) -> OobResult<Self> {
        const WHAT: &str = "the ibv_rc_pingpong address message";
        check_len(msg, PINGPONG_MSG_LEN, WHAT)?;
        let text = c_text(msg, WHAT)?;
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() != 4 {
            return Err(malformed(format!(
                "{WHAT} needs 4 fields lid:qpn:psn:gid, got {}: \"{}\"",
                fields.len(),
                show(msg)
            )));
        }
        let lid = hex_field(fields[0], 0xffff, "LID", WHAT, msg)? as u16;
        let qpn = hex_field(fields[1], MASK24.into(), "QPN", WHAT, msg)? as u32;
        let psn = hex_field(fields[2], MASK24.into(), "PSN", WHAT, msg)? as u32;
        let g = fields[3];
        if g.len() != 32 || !g.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed(format!(
                "{WHAT}: the GID \"{g}\" is not 32 hex digits: \"{}\"",
                show(msg)
            )));
        }
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&g[2 * i..2 * i + 2], 16)
                .map_err(|_| malformed(format!("{WHAT}: bad GID \"{g}\"")))?;
        }
        Ok(Self { lid, qpn, psn, gid })
    }

    /// Whether `ibv_rc_pingpong` gives the QP talking to this destination a GRH (it does when the
    /// GID's interface id, bytes 8..16, is non-zero); on RoCE it must.
    pub fn has_global_gid(&self) -> bool {
        self.gid[8..].iter().any(|&b| b != 0)
    }
}

/// Client side of `ibv_rc_pingpong`'s exchange: connects to `addr`, sends `my`, reads the
/// server's address, sends `"done\0"` and closes. Returns the server's address; the caller then
/// moves its QP to RTR/RTS and posts the first SEND.
pub fn pingpong_client(
    addr: impl ToSocketAddrs,
    my: &PingpongDest,
    cfg: &OobConfig,
) -> OobResult<PingpongDest> {
    let stream = connect_stream(addr, cfg)?;
    pingpong_client_on(stream, my, cfg)
}

/// [`pingpong_client`] on an already connected stream.
pub fn pingpong_client_on(
    stream: TcpStream,
    my: &PingpongDest,
    cfg: &OobConfig,
) -> OobResult<PingpongDest> {
    let mut wire = Wire::new(stream, cfg.io_timeout);
    wire.send(&my.to_wire(), "our pingpong address")?;
    let msg = wire.recv(PINGPONG_MSG_LEN, "the server's pingpong address")?;
    wire.send(PINGPONG_DONE, "\"done\"")?;
    let _ = wire.stream.shutdown(Shutdown::Both);
    PingpongDest::from_wire(&msg)
}

/// Server side of `ibv_rc_pingpong`'s exchange: accepts one client on `listener`, reads its
/// address, runs `connect` (which must move the QP to RTR and RTS, as the real server does
/// before answering; on `Err` the connection is closed unanswered, like the real server), sends
/// `my`, then reads the client's `"done\0"`. Returns the client's address.
pub fn pingpong_server(
    listener: &TcpListener,
    my: &PingpongDest,
    cfg: &OobConfig,
    connect: impl FnOnce(&PingpongDest) -> Result<(), String>,
) -> OobResult<PingpongDest> {
    let stream = accept_stream(listener, cfg)?;
    pingpong_server_on(stream, my, cfg, connect)
}

/// [`pingpong_server`] on an already accepted stream.
pub fn pingpong_server_on(
    stream: TcpStream,
    my: &PingpongDest,
    cfg: &OobConfig,
    connect: impl FnOnce(&PingpongDest) -> Result<(), String>,
) -> OobResult<PingpongDest> {
    let mut wire = Wire::new(stream, cfg.io_timeout);
    let msg = wire.recv(PINGPONG_MSG_LEN, "the client's pingpong address")?;
    let rem = PingpongDest::from_wire(&msg)?;
    connect(&rem).map_err(|e| {
        OobError::new(
            OobErrorKind::Callback,
            format!("couldn't connect to the remote QP: {e}"),
        )
    })?;
    wire.send(&my.to_wire(), "our pingpong address")?;
    let done = wire.recv(PINGPONG_DONE.len(), "the client's \"done\"")?;
    if done != PINGPONG_DONE {
        return Err(malformed(format!(
            "expected \"done\\0\" from the client, got \"{}\"",
            show(&done)
        )));
    }
    let _ = wire.stream.shutdown(Shutdown::Both);
    Ok(rem)
}

// --------------------------------------------------------------------------------------------
// perftest
// --------------------------------------------------------------------------------------------

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

/// How an address message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestForm {
    /// 108 bytes of text with the GID (RoCE, over TCP).
    Text,
    /// 59 bytes of text without GID (InfiniBand without a GID index, over TCP).
    TextNoGid,
    /// 56 bytes of binary `struct pingpong_dest` (perftest `-R`, over the rdma_cm QP).
    Binary,
}

/// perftest's exchange steps, over whatever carries them: a TCP connection ([`PerftestConn`])
/// or, with perftest's `-R`, SENDs on an RC QP connected through rdma_cm
/// (`crate::perftest_cm`). An implementation provides the `xchg(n)` primitive; the steps are
/// the same on both carriers.
pub trait PerftestXchg {
    /// One `xchg(n)`: the client writes then reads, the server reads then writes.
    fn xchg(&mut self, mine: &[u8], what: &str) -> OobResult<Vec<u8>>;

    /// The form address messages take on this carrier.
    fn dest_form(&self) -> DestForm;

    /// `exchange_versions` + `check_version_compatibility`: 16 bytes each way, [`PERFTEST_VERSION`]
    /// NUL-padded. Returns the peer's version; a peer below 5.70 is
    /// [`OobErrorKind::Incompatible`] (perftest 4.5-0.17 exits in that case too).
    fn exchange_versions(&mut self) -> OobResult<String> {
        let mut mine = [0u8; PERFTEST_VERSION_LEN];
        mine[..PERFTEST_VERSION.len()].copy_from_slice(PERFTEST_VERSION.as_bytes());
        let theirs = self.xchg(&mine, "perftest version")?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(theirs.len());
        let version = String::from_utf8_lossy(&theirs[..end]).into_owned();
        let number = version_number(&version);
        if number < PERFTEST_MIN_PEER_VERSION {
            return Err(OobError::new(
                OobErrorKind::Incompatible,
                format!(
                    "the peer's perftest version \"{}\" is older than {PERFTEST_MIN_PEER_VERSION:.2}, which perftest 4.5 (6.06) refuses",
                    show(&theirs[..end])
                ),
            ));
        }
        Ok(version)
    }

    /// `check_sys_data`: our page size, then our cache-line size, each 4 bytes big-endian.
    /// Returns what the peer sent; perftest then uses the max of each (see [`preamble`](Self::preamble)).
    fn exchange_sys_data(&mut self, ours: SysData) -> OobResult<SysData> {
        let c = self.xchg(&ours.cycle_buffer.to_be_bytes(), "page size (cycle_buffer)")?;
        let l = self.xchg(&ours.cache_line_size.to_be_bytes(), "cache line size")?;
        let as_c_int = |b: &[u8]| i32::from_be_bytes([b[0], b[1], b[2], b[3]]).max(0) as u32;
        Ok(SysData {
            cycle_buffer: as_c_int(&c),
            cache_line_size: as_c_int(&l),
        })
    }

    /// `check_mtu`: our `enum ibv_mtu` as one decimal digit and a NUL (2 bytes). Returns the
    /// peer's MTU in bytes if it is valid; perftest then uses the smaller one.
    fn exchange_mtu(&mut self, mtu: u32) -> OobResult<Option<u32>> {
        let e = mtu_to_enum(mtu).ok_or_else(|| {
            invalid(format!(
                "MTU {mtu} is not one of 256, 512, 1024, 2048, 4096"
            ))
        })?;
        let mine = [b'0' + e, 0];
        let theirs = self.xchg(&mine, "MTU")?;
        Ok(mtu_from_enum(c_strtol(&theirs)))
    }

    /// Versions, sys data and MTU, in perftest's order (the 26 bytes each way before the
    /// first address). `mtu` is ours in bytes (perftest: `-m` clamped to the port's active MTU).
    fn preamble(&mut self, sys: SysData, mtu: u32) -> OobResult<Negotiated> {
        if mtu_to_enum(mtu).is_none() {
            return Err(invalid(format!(
                "MTU {mtu} is not one of 256, 512, 1024, 2048, 4096"
            )));
        }
        let remote_version = self.exchange_versions()?;
        let remote_sys = self.exchange_sys_data(sys)?;
        let remote_mtu = self.exchange_mtu(mtu)?;
        Ok(Negotiated {
            remote_version,
            remote_sys,
            sys: SysData {
                cycle_buffer: sys.cycle_buffer.max(remote_sys.cycle_buffer),
                cache_line_size: sys.cache_line_size.max(remote_sys.cache_line_size),
            },
            remote_mtu,
            mtu: remote_mtu.map_or(mtu, |r| r.min(mtu)),
        })
    }

    /// `ctx_hand_shake`: one address each way (108 bytes, 59 without GID, 56 binary over rdma_cm).
    fn hand_shake(&mut self, my: &PerftestDest) -> OobResult<PerftestDest> {
        match self.dest_form() {
            DestForm::Text => PerftestDest::from_wire(&self.xchg(&my.to_wire(), "QP address")?),
            DestForm::TextNoGid => {
                PerftestDest::from_wire_no_gid(&self.xchg(&my.to_wire_no_gid(), "QP address")?)
            }
            DestForm::Binary => {
                PerftestDest::from_binary(&self.xchg(&my.to_binary(), "QP address")?)
            }
        }
    }

    /// One [`hand_shake`](Self::hand_shake) per QP, in order.
    fn exchange_dests(&mut self, my: &[PerftestDest]) -> OobResult<Vec<PerftestDest>> {
        my.iter().map(|d| self.hand_shake(d)).collect()
    }

    /// A synchronisation point: a [`hand_shake`](Self::hand_shake) of QP 0's address whose answer
    /// is not needed.
    fn sync(&mut self, my0: &PerftestDest) -> OobResult<()> {
        self.hand_shake(my0).map(|_| ())
    }

    /// All address exchanges from the first one up to the data phase, in `test`'s order (module
    /// docs, "Sequences"), calling `connect` with the peer's addresses where perftest calls
    /// `ctx_connect`. `connect` must move the QPs to RTR (and RTS: the client always, both ends in
    /// latency tests) and, in send tests, on the receiving side also post the receives. Returns
    /// the peer's addresses as last received.
    ///
    /// Send tests then need one [`sync`](Self::sync) right before the run (with `-a`,
    /// `ib_send_bw` does a sync before and after each size's run; `ib_send_lat` one before each).
    fn setup_qps(
        &mut self,
        test: PerftestTest,
        my: &[PerftestDest],
        connect: impl FnOnce(&[PerftestDest]) -> Result<(), String>,
    ) -> OobResult<Vec<PerftestDest>> {
        let Some(my0) = my.first() else {
            return Err(invalid("at least one QP address is needed"));
        };
        let connected = |r: Result<(), String>| {
            r.map_err(|e| {
                OobError::new(
                    OobErrorKind::Callback,
                    format!("couldn't connect the QPs to the peer: {e}"),
                )
            })
        };
        match test {
            PerftestTest::WriteBw | PerftestTest::ReadBw | PerftestTest::AtomicBw => {
                let rem = self.exchange_dests(my)?;
                connected(connect(&rem))?;
                let mut rem = self.exchange_dests(my)?;
                rem[0] = self.hand_shake(my0)?;
                Ok(rem)
            }
            PerftestTest::SendBw | PerftestTest::SendLat => {
                let rem = self.exchange_dests(my)?;
                connected(connect(&rem))?;
                self.hand_shake(my0)?;
                self.exchange_dests(my)
            }
            PerftestTest::WriteLat | PerftestTest::ReadLat | PerftestTest::AtomicLat => {
                self.hand_shake(my0)?;
                let rem = self.exchange_dests(my)?;
                connected(connect(&rem))?;
                let mut rem = self.exchange_dests(my)?;
                rem[0] = self.hand_shake(my0)?;
                Ok(rem)
            }
        }
    }

    /// `xchg_bw_reports`: size, iters, bw_peak, bw_avg, msgRate_avg (and the 4 per-port values
    /// when `my.per_port` is set), each an 8-byte big-endian `xchg`. Returns the peer's report
    /// (from a perftest server of a unidirectional test it is uninitialised memory).
    fn exchange_reports(&mut self, my: &BwReport) -> OobResult<BwReport> {
        let size = u64::from_be_bytes(self.xchg8(my.size.to_be_bytes(), "report: size")?);
        let iters = u64::from_be_bytes(self.xchg8(my.iters.to_be_bytes(), "report: iters")?);
        let bw_peak = self.xchg_f64(my.bw_peak, "report: bw_peak")?;
        let bw_avg = self.xchg_f64(my.bw_avg, "report: bw_avg")?;
        let msg_rate_avg = self.xchg_f64(my.msg_rate_avg, "report: msgRate_avg")?;
        let per_port = match my.per_port {
            None => None,
            Some(p) => Some(PerPortReport {
                bw_avg_p1: self.xchg_f64(p.bw_avg_p1, "report: bw_avg_p1")?,
                msg_rate_avg_p1: self.xchg_f64(p.msg_rate_avg_p1, "report: msgRate_avg_p1")?,
                bw_avg_p2: self.xchg_f64(p.bw_avg_p2, "report: bw_avg_p2")?,
                msg_rate_avg_p2: self.xchg_f64(p.msg_rate_avg_p2, "report: msgRate_avg_p2")?,
            }),
        };
        Ok(BwReport {
            size,
            iters,
            bw_peak,
            bw_avg,
            msg_rate_avg,
            per_port,
        })
    }

    fn xchg8(&mut self, mine: [u8; 8], what: &str) -> OobResult<[u8; 8]> {
        let theirs = self.xchg(&mine, what)?;
        let mut out = [0u8; 8];
        out.copy_from_slice(&theirs);
        Ok(out)
    }

    fn xchg_f64(&mut self, mine: f64, what: &str) -> OobResult<f64> {
        Ok(f64::from_bits(u64::from_be_bytes(
            self.xchg8(mine.to_bits().to_be_bytes(), what)?,
        )))
    }

    /// `ctx_close_connection`: a [`sync`](Self::sync) (over TCP also `"done\0"` and the close).
    fn close(&mut self, my0: &PerftestDest) -> OobResult<()> {
        self.sync(my0)
    }

    /// Ends the exchange without a closing step (`ib_write_lat` just exits).
    fn hang_up(&mut self) {}

    /// Everything after the data phase, per test (module docs, "Sequences"):
    /// write/read/atomic BW: sync, report exchange, close — returns the peer's report (on a
    /// server: the client's result, which perftest's server prints); send tests, `ib_read_lat`,
    /// `ib_atomic_lat`: close only; `ib_write_lat`: nothing (perftest just exits). `my` is sent in
    /// the report exchange (a server may send [`BwReport::default`], only its `per_port`
    /// presence matters).
    fn finish(
        &mut self,
        test: PerftestTest,
        my0: &PerftestDest,
        my: &BwReport,
    ) -> OobResult<Option<BwReport>> {
        match test {
            PerftestTest::WriteBw | PerftestTest::ReadBw | PerftestTest::AtomicBw => {
                self.sync(my0)?;
                let rem = self.exchange_reports(my)?;
                self.close(my0)?;
                Ok(Some(rem))
            }
            PerftestTest::SendBw
            | PerftestTest::SendLat
            | PerftestTest::ReadLat
            | PerftestTest::AtomicLat => {
                self.close(my0)?;
                Ok(None)
            }
            PerftestTest::WriteLat => {
                self.hang_up();
                Ok(None)
            }
        }
    }
}

/// One end of a perftest socket connection (non-rdma_cm), with one method per exchange step.
///
/// Typical use, either role: [`connect`](Self::connect) or [`accept`](Self::accept) →
/// [`preamble`](Self::preamble) → [`setup_qps`](Self::setup_qps) (its closure moves the QPs to
/// RTR/RTS, and posts the receives in send tests) → [`sync`](Self::sync) in send tests → the data
/// phase → [`finish`](Self::finish).
#[derive(Debug)]
pub struct PerftestConn {
    wire: Wire,
    role: Role,
    with_gid: bool,
}

impl PerftestConn {
    /// Client: connects to a perftest server (`ib_*_bw` without a server name) at `addr`.
    pub fn connect(addr: impl ToSocketAddrs, cfg: &OobConfig) -> OobResult<Self> {
        Ok(Self::from_stream(
            connect_stream(addr, cfg)?,
            Role::Client,
            cfg,
        ))
    }

    /// Server: accepts one perftest client on `listener` (see [`listen`]).
    pub fn accept(listener: &TcpListener, cfg: &OobConfig) -> OobResult<Self> {
        Ok(Self::from_stream(
            accept_stream(listener, cfg)?,
            Role::Server,
            cfg,
        ))
    }

    /// Wraps an already connected stream.
    pub fn from_stream(stream: TcpStream, role: Role, cfg: &OobConfig) -> Self {
        let _ = stream.set_nodelay(true);
        Self {
            wire: Wire::new(stream, cfg.io_timeout),
            role,
            with_gid: true,
        }
    }

    /// Which end this is.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The peer's socket address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.wire.stream.peer_addr().ok()
    }

    /// The deadline for each following message; `None` waits forever. A server of
    /// write/read/atomic BW tests waits in [`finish`](Self::finish) for the client's whole run, so
    /// set this to more than the run's length (or `None`) before calling it.
    pub fn set_io_timeout(&mut self, timeout: Option<Duration>) {
        self.wire.timeout = timeout;
    }

    /// Whether address messages carry the GID (108 bytes, the default, always the case on RoCE)
    /// or not (59 bytes, InfiniBand without a GID index).
    pub fn set_dests_with_gid(&mut self, with_gid: bool) {
        self.with_gid = with_gid;
    }
}

impl PerftestXchg for PerftestConn {
    /// One `xchg(n)`: the client writes then reads, the server reads then writes.
    fn xchg(&mut self, mine: &[u8], what: &str) -> OobResult<Vec<u8>> {
        match self.role {
            Role::Client => {
                self.wire.send(mine, &format!("our {what}"))?;
                self.wire.recv(mine.len(), &format!("the server's {what}"))
            }
            Role::Server => {
                let theirs = self
                    .wire
                    .recv(mine.len(), &format!("the client's {what}"))?;
                self.wire.send(mine, &format!("our {what}"))?;
                Ok(theirs)
            }
        }
    }

    fn dest_form(&self) -> DestForm {
        if self.with_gid {
            DestForm::Text
        } else {
            DestForm::TextNoGid
        }
    }

    /// `ctx_close_connection`: a [`sync`](Self::sync), then `"done\0"`, then close. perftest
    /// never reads the peer's `"done"`; this side reads it (briefly, ignoring failures) before
    /// closing so that its close is clean.
    fn close(&mut self, my0: &PerftestDest) -> OobResult<()> {
        self.sync(my0)?;
        self.wire.send(PERFTEST_DONE, "\"done\"")?;
        let _ = self.wire.stream.shutdown(Shutdown::Write);
        let limit = self
            .wire
            .timeout
            .unwrap_or(Duration::from_secs(2))
            .min(Duration::from_secs(2));
        let _ = self.wire.drain(limit);
        let _ = self.wire.stream.shutdown(Shutdown::Both);
        Ok(())
    }

    fn hang_up(&mut self) {
        let _ = self.wire.stream.shutdown(Shutdown::Both);
    }
}

// --------------------------------------------------------------------------------------------
// Tests
// --------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::thread;

    fn cfg() -> OobConfig {
        OobConfig::with_timeout(Duration::from_secs(10))
    }

    fn local_listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    fn v4_gid(a: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    /// A scripted raw peer: what a C tool would write and read, byte for byte.
    enum Step {
        Send(Vec<u8>),
        Expect(Vec<u8>),
        ExpectEof,
    }

    fn run_script(mut s: TcpStream, steps: Vec<Step>) -> Result<(), String> {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Step::Send(b) => s
                    .write_all(&b)
                    .map_err(|e| format!("step {i}: write: {e}"))?,
                Step::Expect(b) => {
                    let mut got = vec![0u8; b.len()];
                    s.read_exact(&mut got)
                        .map_err(|e| format!("step {i}: read {} bytes: {e}", b.len()))?;
                    if got != b {
                        return Err(format!(
                            "step {i}: expected \"{}\", got \"{}\"",
                            show(&b),
                            show(&got)
                        ));
                    }
                }
                Step::ExpectEof => {
                    let mut b = [0u8; 16];
                    match s.read(&mut b) {
                        Ok(0) => {}
                        Ok(n) => {
                            return Err(format!(
                                "step {i}: expected EOF, got \"{}\"",
                                show(&b[..n])
                            ))
                        }
                        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
                        Err(e) => return Err(format!("step {i}: expected EOF: {e}")),
                    }
                }
            }
        }
        Ok(())
    }

    // ---- pingpong ----------------------------------------------------------------------------

    #[test]
    fn pingpong_golden_message() {
        // The values of rxe-peer/hostpeer.py: LID 0, QPN 0x123, PSN 0xabcd, GID ::ffff:10.99.0.2.
        let d = PingpongDest {
            lid: 0,
            qpn: 0x000123,
            psn: 0x00abcd,
            gid: v4_gid([10, 99, 0, 2]),
        };
        let w = d.to_wire();
        assert_eq!(w.len(), 52);
        assert_eq!(
            &w[..],
            b"0000:000123:00abcd:00000000000000000000ffff0a630002\0"
        );
        assert_eq!(PingpongDest::from_wire(&w).unwrap(), d);

        let gid: [u8; 16] = std::array::from_fn(|i| (0x10 * i + i) as u8);
        let d = PingpongDest {
            lid: 0x1a2b,
            qpn: 0xfedcba,
            psn: 0x000001,
            gid,
        };
        assert_eq!(
            &d.to_wire()[..],
            b"1a2b:fedcba:000001:00112233445566778899aabbccddeeff\0"
        );
        assert_eq!(PingpongDest::from_wire(&d.to_wire()).unwrap(), d);
        assert!(d.has_global_gid());
        assert!(!PingpongDest::default().has_global_gid());
        // 24-bit fields: higher bits dropped, never a longer message.
        let d = PingpongDest {
            lid: 0xffff,
            qpn: 0x1ff_ffff,
            psn: u32::MAX,
            gid: [0xff; 16],
        };
        assert_eq!(&d.to_wire()[..19], b"ffff:ffffff:ffffff:");
    }

    #[test]
    fn pingpong_parse_is_lenient_on_widths_like_sscanf() {
        let mut m = [0u8; 52];
        let t = b"0:123:abcd:00000000000000000000ffff0a630002";
        m[..t.len()].copy_from_slice(t);
        let d = PingpongDest::from_wire(&m).unwrap();
        assert_eq!((d.lid, d.qpn, d.psn), (0, 0x123, 0xabcd));
    }

    #[test]
    fn pingpong_malformed_messages_are_errors() {
        let good = PingpongDest {
            lid: 0,
            qpn: 1,
            psn: 2,
            gid: v4_gid([1, 2, 3, 4]),
        }
        .to_wire();
        let e = PingpongDest::from_wire(&good[..51]).unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Malformed);
        assert!(e.message().contains("52 bytes"), "{e}");
        let mut no_nul = good;
        no_nul[51] = b'0';
        assert!(PingpongDest::from_wire(&no_nul)
            .unwrap_err()
            .message()
            .contains("NUL"));
        let mut bad_hex = good;
        bad_hex[2] = b'g';
        assert_eq!(
            PingpongDest::from_wire(&bad_hex).unwrap_err().kind(),
            OobErrorKind::Malformed
        );
        let mut short_gid = good;
        short_gid[50] = 0;
        assert!(PingpongDest::from_wire(&short_gid)
            .unwrap_err()
            .message()
            .contains("GID"));
        let mut extra_field = good;
        extra_field[30] = b':';
        assert!(PingpongDest::from_wire(&extra_field).is_err());
        assert!(PingpongDest::from_wire(&[0u8; 52]).is_err());
        let mut big_qpn = [0u8; 52];
        let t = b"0:1000000:0:00000000000000000000ffff0a630002";
        big_qpn[..t.len()].copy_from_slice(t);
        assert!(PingpongDest::from_wire(&big_qpn)
            .unwrap_err()
            .message()
            .contains("QPN"));
    }

    #[test]
    fn pingpong_both_ends_agree_and_server_connects_before_answering() {
        let (listener, addr) = local_listener();
        let cli = PingpongDest {
            lid: 0,
            qpn: 0x11,
            psn: 0x123456,
            gid: v4_gid([10, 0, 0, 1]),
        };
        let srv = PingpongDest {
            lid: 0,
            qpn: 0x22,
            psn: 0x654321,
            gid: v4_gid([10, 0, 0, 2]),
        };
        let events = Arc::new(Mutex::new(Vec::<&str>::new()));
        let ev = events.clone();
        let server = thread::spawn(move || {
            pingpong_server(&listener, &srv, &cfg(), |rem| {
                assert_eq!(rem.qpn, 0x11);
                thread::sleep(Duration::from_millis(50));
                ev.lock().unwrap().push("server connected");
                Ok(())
            })
        });
        let got = pingpong_client(addr, &cli, &cfg()).unwrap();
        events.lock().unwrap().push("client got answer");
        assert_eq!(got, srv);
        assert_eq!(server.join().unwrap().unwrap(), cli);
        assert_eq!(
            *events.lock().unwrap(),
            vec!["server connected", "client got answer"]
        );
    }

    #[test]
    fn pingpong_server_bytes_match_a_c_client() {
        // A raw client doing exactly what pp_client_exch_dest does.
        let (listener, addr) = local_listener();
        let srv = PingpongDest {
            lid: 0,
            qpn: 0xabc,
            psn: 0x42,
            gid: v4_gid([192, 168, 0, 9]),
        };
        let server = thread::spawn(move || pingpong_server(&listener, &srv, &cfg(), |_| Ok(())));
        let s = TcpStream::connect(addr).unwrap();
        run_script(
            s,
            vec![
                Step::Send(b"0000:000017:00ffff:00000000000000000000ffff0a000001\0".to_vec()),
                Step::Expect(b"0000:000abc:000042:00000000000000000000ffffc0a80009\0".to_vec()),
                Step::Send(b"done\0".to_vec()),
                Step::ExpectEof,
            ],
        )
        .unwrap();
        let rem = server.join().unwrap().unwrap();
        assert_eq!(
            (rem.qpn, rem.psn, rem.gid),
            (0x17, 0xffff, v4_gid([10, 0, 0, 1]))
        );
    }

    #[test]
    fn pingpong_client_bytes_match_a_c_server() {
        // A raw server doing exactly what pp_server_exch_dest does.
        let (listener, addr) = local_listener();
        let raw = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            run_script(
                s,
                vec![
                    Step::Expect(b"0000:000001:000002:00000000000000000000ffff7f000001\0".to_vec()),
                    Step::Send(b"0000:000003:000004:00000000000000000000ffff7f000002\0".to_vec()),
                    Step::Expect(b"done\0".to_vec()),
                    Step::ExpectEof,
                ],
            )
        });
        let my = PingpongDest {
            lid: 0,
            qpn: 1,
            psn: 2,
            gid: v4_gid([127, 0, 0, 1]),
        };
        let rem = pingpong_client(addr, &my, &cfg()).unwrap();
        assert_eq!((rem.qpn, rem.psn), (3, 4));
        raw.join().unwrap().unwrap();
    }

    #[test]
    fn pingpong_callback_failure_closes_unanswered() {
        let (listener, addr) = local_listener();
        let server = thread::spawn(move || {
            pingpong_server(&listener, &PingpongDest::default(), &cfg(), |_| {
                Err("RTR refused".into())
            })
        });
        let e = pingpong_client(addr, &PingpongDest::default(), &cfg()).unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Closed, "{e}");
        assert!(e.message().contains("0 of the 52 bytes"), "{e}");
        let e = server.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Callback);
        assert!(e.message().contains("RTR refused"), "{e}");
    }

    #[test]
    fn pingpong_peer_closing_early_or_silent_gives_errors() {
        // Peer sends 20 bytes and closes.
        let (listener, addr) = local_listener();
        let server = thread::spawn(move || {
            pingpong_server(&listener, &PingpongDest::default(), &cfg(), |_| Ok(()))
        });
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&[b'0'; 20]).unwrap();
        drop(s);
        let e = server.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Closed);
        assert!(e.message().contains("after 20 of the 52 bytes"), "{e}");

        // Silent peer: the server times out instead of hanging.
        let (listener, addr) = local_listener();
        let quick = OobConfig::with_timeout(Duration::from_millis(300));
        let server = thread::spawn(move || {
            pingpong_server(&listener, &PingpongDest::default(), &quick, |_| Ok(()))
        });
        let s = TcpStream::connect(addr).unwrap();
        let t0 = Instant::now();
        let e = server.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Timeout, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        drop(s);

        // Silent server: the client times out.
        let (listener, addr) = local_listener();
        let hold = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            thread::sleep(Duration::from_millis(800));
            drop(s);
        });
        let e = pingpong_client(addr, &PingpongDest::default(), &quick).unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Timeout, "{e}");
        hold.join().unwrap();

        // Wrong "done".
        let (listener, addr) = local_listener();
        let server = thread::spawn(move || {
            pingpong_server(&listener, &PingpongDest::default(), &cfg(), |_| Ok(()))
        });
        let s = TcpStream::connect(addr).unwrap();
        run_script(
            s,
            vec![
                Step::Send(PingpongDest::default().to_wire().to_vec()),
                Step::Expect(PingpongDest::default().to_wire().to_vec()),
                Step::Send(b"nope\0".to_vec()),
            ],
        )
        .unwrap();
        let e = server.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Malformed);

        // Nobody connects: accept times out.
        let (listener, _) = local_listener();
        let e =
            pingpong_server(&listener, &PingpongDest::default(), &quick, |_| Ok(())).unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Timeout);

        // Nobody listens: connect gives up after connect_timeout.
        let (listener, addr) = local_listener();
        drop(listener);
        let e = pingpong_client(addr, &PingpongDest::default(), &quick).unwrap_err();
        assert!(
            matches!(e.kind(), OobErrorKind::Io | OobErrorKind::Timeout),
            "{e}"
        );
    }

    // ---- perftest messages -------------------------------------------------------------------

    #[test]
    fn perftest_golden_messages() {
        let d = PerftestDest {
            lid: 0,
            out_reads: 0x10,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x7f00_1234_5678,
            gid: v4_gid([192, 168, 1, 5]),
            srqn: 0,
        };
        let w = d.to_wire();
        let expect: &[u8] = b"0000:0010:000011:abcdef:00001234:00007f0012345678:\
00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:01:05:00000000:\0";
        assert_eq!(expect.len(), 108);
        assert_eq!(&w[..], expect);
        assert_eq!(PerftestDest::from_wire(&w).unwrap(), d);
        assert!(d.gid_is_ipv4_mapped());

        let n = d.to_wire_no_gid();
        let expect: &[u8] = b"0000:0010:000011:abcdef:00001234:00007f0012345678:00000000\0";
        assert_eq!(expect.len(), 59);
        assert_eq!(&n[..], expect);
        let mut no_gid = d;
        no_gid.gid = [0; 16];
        assert_eq!(PerftestDest::from_wire_no_gid(&n).unwrap(), no_gid);

        let full = PerftestDest {
            lid: 0xffff,
            out_reads: 0xffff,
            qpn: 0xffffff,
            psn: 0xffffff,
            rkey: u32::MAX,
            vaddr: u64::MAX,
            gid: [0xfe; 16],
            srqn: u32::MAX,
        };
        assert_eq!(PerftestDest::from_wire(&full.to_wire()).unwrap(), full);
        assert_eq!(full.to_wire()[107], 0);
        assert!(!full.gid_is_ipv4_mapped());
    }

    #[test]
    fn perftest_malformed_messages_are_errors() {
        let good = PerftestDest {
            qpn: 5,
            gid: v4_gid([1, 1, 1, 1]),
            ..Default::default()
        }
        .to_wire();
        assert!(PerftestDest::from_wire(&good[..107])
            .unwrap_err()
            .message()
            .contains("108 bytes"));
        let mut no_colon = good;
        no_colon[106] = 0;
        assert_eq!(
            PerftestDest::from_wire(&no_colon).unwrap_err().kind(),
            OobErrorKind::Malformed
        );
        let mut bad = good;
        bad[60] = b'x';
        assert!(PerftestDest::from_wire(&bad)
            .unwrap_err()
            .message()
            .contains("GID byte"));
        let mut garbage = [b'z'; 108];
        garbage[107] = 0;
        assert!(PerftestDest::from_wire(&garbage).is_err());
        assert!(PerftestDest::from_wire(&[0u8; 108]).is_err());
        assert!(PerftestDest::from_wire_no_gid(&[0u8; 59]).is_err());
        let mut nonprint = good;
        nonprint[3] = 0x07;
        assert!(PerftestDest::from_wire(&nonprint)
            .unwrap_err()
            .message()
            .contains("\\x07"));
    }

    #[test]
    fn helpers_mirror_c() {
        assert_eq!(version_number("6.06"), 6.06);
        assert_eq!(version_number("5.70abc"), 5.70);
        assert_eq!(version_number(""), 0.0);
        assert_eq!(version_number("x"), 0.0);
        assert_eq!(c_strtol(b"3\0"), 3);
        assert_eq!(c_strtol(b"5\0"), 5);
        assert_eq!(c_strtol(b"\0\0"), 0);
        assert_eq!(mtu_from_enum(3), Some(1024));
        assert_eq!(mtu_from_enum(6), None);
        assert_eq!(mtu_to_enum(4096), Some(5));
        assert_eq!(mtu_to_enum(1500), None);
    }

    // ---- perftest sessions -------------------------------------------------------------------

    fn dests(base_qpn: u32, n: usize, ip: [u8; 4]) -> Vec<PerftestDest> {
        (0..n)
            .map(|i| PerftestDest {
                lid: 0,
                out_reads: 16,
                qpn: base_qpn + i as u32,
                psn: 0x1000 * (i as u32 + 1),
                rkey: 0x100 + i as u32,
                vaddr: 0x5555_0000_0000 + 0x10000 * i as u64,
                gid: v4_gid(ip),
                srqn: 0,
            })
            .collect()
    }

    /// Runs `test` with both ends of this module over 127.0.0.1; returns (client, server)
    /// (negotiated, remote dests, remote report) and the order of events.
    #[allow(clippy::type_complexity)]
    fn session(
        test: PerftestTest,
        qps: usize,
    ) -> (
        (Negotiated, Vec<PerftestDest>, Option<BwReport>),
        (Negotiated, Vec<PerftestDest>, Option<BwReport>),
    ) {
        let (listener, addr) = local_listener();
        let srv_d = dests(0x200, qps, [10, 0, 0, 2]);
        let cli_d = dests(0x100, qps, [10, 0, 0, 1]);
        let (sd, cd) = (srv_d.clone(), cli_d.clone());
        let server = thread::spawn(move || {
            let mut c = PerftestConn::accept(&listener, &cfg()).unwrap();
            assert_eq!(c.role(), Role::Server);
            let neg = c
                .preamble(
                    SysData {
                        cycle_buffer: 4096,
                        cache_line_size: 128,
                    },
                    4096,
                )
                .unwrap();
            let rem = c
                .setup_qps(test, &sd, |r| {
                    if r.len() == sd.len() {
                        Ok(())
                    } else {
                        Err("n".into())
                    }
                })
                .unwrap();
            if test.is_send() {
                c.sync(&sd[0]).unwrap();
            }
            let rep = c.finish(test, &sd[0], &BwReport::default()).unwrap();
            (neg, rem, rep)
        });
        let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
        let neg = c
            .preamble(
                SysData {
                    cycle_buffer: 65536,
                    cache_line_size: 64,
                },
                1024,
            )
            .unwrap();
        assert_eq!(neg.remote_version, "6.06");
        let rem = c.setup_qps(test, &cd, |_| Ok(())).unwrap();
        if test.is_send() {
            c.sync(&cd[0]).unwrap();
        }
        let mine = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1234.5,
            bw_avg: 1000.25,
            msg_rate_avg: 0.016,
            per_port: None,
        };
        let rep = c.finish(test, &cd[0], &mine).unwrap();
        let client = (neg, rem, rep);
        let server = server.join().unwrap();
        assert_eq!(client.1, srv_d);
        assert_eq!(server.1, cli_d);
        (client, server)
    }

    #[test]
    fn perftest_sessions_agree_for_every_test() {
        let (c, s) = session(PerftestTest::WriteBw, 3);
        for neg in [&c.0, &s.0] {
            assert_eq!(neg.remote_version, "6.06");
            assert_eq!(
                neg.sys,
                SysData {
                    cycle_buffer: 65536,
                    cache_line_size: 128
                }
            );
            assert_eq!(neg.mtu, 1024);
        }
        assert_eq!(c.0.remote_mtu, Some(4096));
        assert_eq!(s.0.remote_mtu, Some(1024));
        assert_eq!(c.2, Some(BwReport::default()));
        let srv_rep = s.2.unwrap();
        assert_eq!(
            (srv_rep.size, srv_rep.iters, srv_rep.bw_avg),
            (65536, 5000, 1000.25)
        );
        for test in [
            PerftestTest::ReadBw,
            PerftestTest::AtomicBw,
            PerftestTest::SendBw,
            PerftestTest::WriteLat,
            PerftestTest::ReadLat,
            PerftestTest::SendLat,
            PerftestTest::AtomicLat,
        ] {
            let (c, s) = session(test, if test.is_latency() { 1 } else { 2 });
            assert_eq!(
                c.2.is_some(),
                test.exchanges_reports(),
                "{}",
                test.program()
            );
            assert_eq!(
                s.2.is_some(),
                test.exchanges_reports(),
                "{}",
                test.program()
            );
        }
    }

    fn version_msg(v: &str) -> Vec<u8> {
        let mut m = vec![0u8; 16];
        m[..v.len()].copy_from_slice(v.as_bytes());
        m
    }

    /// The exact byte sequence a C `ib_write_bw` (2 QPs) exchanges, from the side that is not ours.
    fn write_bw_transcript(
        we_are: Role,
        ours: &[PerftestDest],
        theirs: &[PerftestDest],
        rep: &BwReport,
    ) -> Vec<Step> {
        // Their side's (the raw peer's) steps for one xchg: a C client writes first, a C server reads first.
        let x = |mine: Vec<u8>, expect: Vec<u8>| -> Vec<Step> {
            match we_are {
                Role::Server => vec![Step::Send(mine), Step::Expect(expect)],
                Role::Client => vec![Step::Expect(expect), Step::Send(mine)],
            }
        };
        let mut s = Vec::new();
        s.extend(x(version_msg("6.06"), version_msg("6.06")));
        s.extend(x(
            4096u32.to_be_bytes().to_vec(),
            4096u32.to_be_bytes().to_vec(),
        ));
        s.extend(x(
            64u32.to_be_bytes().to_vec(),
            64u32.to_be_bytes().to_vec(),
        ));
        s.extend(x(b"3\0".to_vec(), b"5\0".to_vec()));
        for _round in 0..2 {
            for (t, o) in theirs.iter().zip(ours) {
                s.extend(x(t.to_wire().to_vec(), o.to_wire().to_vec()));
            }
        }
        s.extend(x(theirs[0].to_wire().to_vec(), ours[0].to_wire().to_vec())); // after RTR
        s.extend(x(theirs[0].to_wire().to_vec(), ours[0].to_wire().to_vec())); // end of run
        let f = |v: f64| v.to_bits().to_be_bytes().to_vec();
        let zero = vec![0u8; 8];
        let (their_rep, our_rep): (Vec<Vec<u8>>, Vec<Vec<u8>>) = match we_are {
            // The raw peer is a C client: it sends its results, we (server) send zeros.
            Role::Server => (
                vec![
                    65536u64.to_be_bytes().to_vec(),
                    10000u64.to_be_bytes().to_vec(),
                    f(2.5),
                    f(2.0),
                    f(0.5),
                ],
                vec![zero.clone(), zero.clone(), zero.clone(), zero.clone(), zero],
            ),
            // The raw peer is a C server: it sends garbage, we (client) send our report.
            Role::Client => (
                vec![
                    vec![0xaa; 8],
                    vec![0xbb; 8],
                    vec![0xcc; 8],
                    vec![0xdd; 8],
                    vec![0xee; 8],
                ],
                vec![
                    rep.size.to_be_bytes().to_vec(),
                    rep.iters.to_be_bytes().to_vec(),
                    f(rep.bw_peak),
                    f(rep.bw_avg),
                    f(rep.msg_rate_avg),
                ],
            ),
        };
        for (t, o) in their_rep.into_iter().zip(our_rep) {
            s.extend(x(t, o));
        }
        s.extend(x(theirs[0].to_wire().to_vec(), ours[0].to_wire().to_vec())); // close
        s.push(Step::Send(b"done\0".to_vec()));
        s.push(Step::Expect(b"done\0".to_vec()));
        s.push(Step::ExpectEof);
        s
    }

    #[test]
    fn perftest_server_bytes_match_a_c_write_bw_client() {
        let (listener, addr) = local_listener();
        let ours = dests(0x300, 2, [10, 1, 1, 2]);
        let theirs = dests(0x400, 2, [10, 1, 1, 1]);
        let script = write_bw_transcript(Role::Server, &ours, &theirs, &BwReport::default());
        let o = ours.clone();
        let server = thread::spawn(
            move || -> OobResult<(Negotiated, Vec<PerftestDest>, Option<BwReport>)> {
                let mut c = PerftestConn::accept(&listener, &cfg())?;
                let neg = c.preamble(SysData::default(), 4096)?;
                let rem = c.setup_qps(PerftestTest::WriteBw, &o, |_| Ok(()))?;
                let rep = c.finish(PerftestTest::WriteBw, &o[0], &BwReport::default())?;
                Ok((neg, rem, rep))
            },
        );
        run_script(TcpStream::connect(addr).unwrap(), script).unwrap();
        let (neg, rem, rep) = server.join().unwrap().unwrap();
        assert_eq!(neg.mtu, 1024);
        assert_eq!(rem, theirs);
        let rep = rep.unwrap();
        assert_eq!(
            (
                rep.size,
                rep.iters,
                rep.bw_peak,
                rep.bw_avg,
                rep.msg_rate_avg
            ),
            (65536, 10000, 2.5, 2.0, 0.5)
        );
    }

    #[test]
    fn perftest_client_bytes_match_a_c_write_bw_server() {
        let (listener, addr) = local_listener();
        let ours = dests(0x500, 2, [10, 2, 2, 1]);
        let theirs = dests(0x600, 2, [10, 2, 2, 2]);
        let rep = BwReport {
            size: 65536,
            iters: 10000,
            bw_peak: 11.0,
            bw_avg: 10.5,
            msg_rate_avg: 0.25,
            per_port: None,
        };
        let script = write_bw_transcript(Role::Client, &ours, &theirs, &rep);
        let raw = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            run_script(s, script)
        });
        let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
        let neg = c.preamble(SysData::default(), 4096).unwrap();
        assert_eq!(neg.mtu, 1024);
        let rem = c
            .setup_qps(PerftestTest::WriteBw, &ours, |_| Ok(()))
            .unwrap();
        assert_eq!(rem, theirs);
        let got = c
            .finish(PerftestTest::WriteBw, &ours[0], &rep)
            .unwrap()
            .unwrap();
        assert_eq!(got.size, 0xaaaa_aaaa_aaaa_aaaa);
        raw.join().unwrap().unwrap();
    }

    #[test]
    fn perftest_send_bw_order_matches_c() {
        // ib_send_bw as the C client: q × addr, [connect], addr0, q × addr, addr0 (pre-run), close.
        let (listener, addr) = local_listener();
        let ours = dests(0x700, 2, [10, 3, 3, 2]);
        let theirs = dests(0x800, 2, [10, 3, 3, 1]);
        let mut script = vec![
            Step::Send(version_msg("6.06")),
            Step::Expect(version_msg("6.06")),
            Step::Send(vec![0, 0, 0x10, 0]),
            Step::Expect(vec![0, 0, 0x10, 0]),
            Step::Send(vec![0, 0, 0, 64]),
            Step::Expect(vec![0, 0, 0, 64]),
            Step::Send(b"3\0".to_vec()),
            Step::Expect(b"3\0".to_vec()),
        ];
        let mut x = |t: &PerftestDest, o: &PerftestDest| {
            script.push(Step::Send(t.to_wire().to_vec()));
            script.push(Step::Expect(o.to_wire().to_vec()));
        };
        for i in 0..2 {
            x(&theirs[i], &ours[i]);
        }
        x(&theirs[0], &ours[0]);
        for i in 0..2 {
            x(&theirs[i], &ours[i]);
        }
        x(&theirs[0], &ours[0]); // pre-run sync
        x(&theirs[0], &ours[0]); // close
        script.push(Step::Send(b"done\0".to_vec()));
        script.push(Step::Expect(b"done\0".to_vec()));
        script.push(Step::ExpectEof);
        let o = ours.clone();
        let server = thread::spawn(move || -> OobResult<()> {
            let mut c = PerftestConn::accept(&listener, &cfg())?;
            c.preamble(SysData::default(), 1024)?;
            let connected = std::cell::Cell::new(false);
            c.setup_qps(PerftestTest::SendBw, &o, |_| {
                connected.set(true);
                Ok(())
            })?;
            assert!(connected.get());
            c.sync(&o[0])?;
            assert_eq!(
                c.finish(PerftestTest::SendBw, &o[0], &BwReport::default())?,
                None
            );
            Ok(())
        });
        run_script(TcpStream::connect(addr).unwrap(), script).unwrap();
        server.join().unwrap().unwrap();
    }

    #[test]
    fn perftest_rejects_old_versions_and_bad_peers() {
        // A peer claiming 5.60 is refused, like perftest refuses it.
        let (listener, addr) = local_listener();
        let raw = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            run_script(
                s,
                vec![
                    Step::Expect(version_msg("6.06")),
                    Step::Send(version_msg("5.60")),
                ],
            )
        });
        let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
        let e = c.exchange_versions().unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Incompatible);
        assert!(e.message().contains("5.60"), "{e}");
        raw.join().unwrap().unwrap();

        // A malformed address from the peer.
        let (listener, addr) = local_listener();
        let raw = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            run_script(
                s,
                vec![
                    Step::Expect(PerftestDest::default().to_wire().to_vec()),
                    Step::Send(vec![b'?'; 108]),
                ],
            )
        });
        let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
        let e = c.hand_shake(&PerftestDest::default()).unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Malformed, "{e}");
        raw.join().unwrap().unwrap();

        // Nobody connects: accept times out.
        let idle = TcpListener::bind("127.0.0.1:0").unwrap();
        let quick_accept = OobConfig {
            accept_timeout: Some(Duration::from_millis(100)),
            ..cfg()
        };
        let e = PerftestConn::accept(&idle, &quick_accept).unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Timeout, "{e}");

        // The peer goes away mid-message.
        let (listener, addr) = local_listener();
        let raw = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(&[b'0'; 50]).unwrap();
        });
        let mut srv =
            PerftestConn::from_stream(TcpStream::connect(addr).unwrap(), Role::Server, &cfg());
        raw.join().unwrap();
        let e = srv.hand_shake(&PerftestDest::default()).unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Closed);
        assert!(e.message().contains("50 of the 108 bytes"), "{e}");
        assert_eq!(e.to_string(), e.message());

        // A silent peer times out.
        let (listener, addr) = local_listener();
        let hold = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            thread::sleep(Duration::from_millis(700));
            drop(s);
        });
        let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
        c.set_io_timeout(Some(Duration::from_millis(200)));
        let e = c.exchange_versions().unwrap_err();
        assert_eq!(e.kind(), OobErrorKind::Timeout, "{e}");
        hold.join().unwrap();

        // Bad arguments.
        let (listener, addr) = local_listener();
        let keep = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            thread::sleep(Duration::from_millis(300));
            drop(s);
        });
        let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
        assert_eq!(
            c.preamble(SysData::default(), 1500).unwrap_err().kind(),
            OobErrorKind::InvalidInput
        );
        assert_eq!(
            c.setup_qps(PerftestTest::WriteBw, &[], |_| Ok(()))
                .unwrap_err()
                .kind(),
            OobErrorKind::InvalidInput
        );
        keep.join().unwrap();
    }

    #[test]
    fn perftest_reports_with_per_port_and_no_gid_dests() {
        let (listener, addr) = local_listener();
        let pp = PerPortReport {
            bw_avg_p1: 1.0,
            msg_rate_avg_p1: 2.0,
            bw_avg_p2: 3.0,
            msg_rate_avg_p2: 4.0,
        };
        let server = thread::spawn(move || -> OobResult<(BwReport, PerftestDest)> {
            let mut c = PerftestConn::accept(&listener, &cfg())?;
            c.set_dests_with_gid(false);
            let d = c.hand_shake(&PerftestDest {
                qpn: 9,
                ..Default::default()
            })?;
            let r = c.exchange_reports(&BwReport {
                per_port: Some(PerPortReport::default()),
                ..Default::default()
            })?;
            Ok((r, d))
        });
        let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
        c.set_dests_with_gid(false);
        let d = c
            .hand_shake(&PerftestDest {
                qpn: 8,
                rkey: 7,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(d.qpn, 9);
        let mine = BwReport {
            size: 8,
            iters: 1,
            bw_peak: -0.0,
            bw_avg: f64::MAX,
            msg_rate_avg: 1e-9,
            per_port: Some(pp),
        };
        let theirs = c.exchange_reports(&mine).unwrap();
        assert_eq!(theirs.per_port, Some(PerPortReport::default()));
        let (r, d) = server.join().unwrap().unwrap();
        assert_eq!(r, mine);
        assert_eq!((d.qpn, d.rkey), (8, 7));
    }
}
