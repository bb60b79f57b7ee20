//! perftest's exchange steps ([`PerftestXchg`]: the `xchg(n)` primitive and the steps built on
//! it) and their TCP carrier ([`PerftestConn`]).
//!
//! Invariants: in every `xchg(n)` the client writes then reads and the server reads then writes,
//! n bytes each way; a close writes `"done\0"` and does not wait for the peer's (perftest
//! closes without reading it), but drains briefly so that the close is a clean FIN.
use super::*;
use crate::oob::{accept_stream, connect_stream, MsgStream, OobConfig};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

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
    msgs: MsgStream,
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

    /// Server: accepts one perftest client on `listener` (see [`listen`](crate::oob::listen)).
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
            msgs: MsgStream::new(stream, cfg.io_timeout),
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
        self.msgs.stream.peer_addr().ok()
    }

    /// The deadline for each following message; `None` waits forever. A server of
    /// write/read/atomic BW tests waits in [`finish`](Self::finish) for the client's whole run, so
    /// set this to more than the run's length (or `None`) before calling it.
    pub fn set_io_timeout(&mut self, timeout: Option<Duration>) {
        self.msgs.timeout = timeout;
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
                self.msgs.send(mine, &format!("our {what}"))?;
                self.msgs.recv(mine.len(), &format!("the server's {what}"))
            }
            Role::Server => {
                let theirs = self
                    .msgs
                    .recv(mine.len(), &format!("the client's {what}"))?;
                self.msgs.send(mine, &format!("our {what}"))?;
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
        self.msgs.send(PERFTEST_DONE, "\"done\"")?;
        let _ = self.msgs.stream.shutdown(Shutdown::Write);
        let limit = self
            .msgs
            .timeout
            .unwrap_or(Duration::from_secs(2))
            .min(Duration::from_secs(2));
        let _ = self.msgs.drain(limit);
        let _ = self.msgs.stream.shutdown(Shutdown::Both);
        Ok(())
    }

    fn hang_up(&mut self) {
        let _ = self.msgs.stream.shutdown(Shutdown::Both);
    }
}
