//! `ibv_rc_pingpong`'s out-of-band exchange (rdma-core 44): [`pingpong_client`] and
//! [`pingpong_server`], and the address message [`PingpongDest`].
//!
//! Invariants: the address message is always 52 bytes of text, written in one `write`; the
//! server moves its QP to RTR and RTS (its `connect` closure) before it answers, and closes
//! without answering when that fails; the client's `"done\0"` is checked byte for byte.
//!
//! # The exchange (`pp_client_exch_dest` / `pp_server_exch_dest`)
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
//! # Data path a peer must match (`main`, `pp_post_send`, `parse_single_wc`)
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
use super::{
    accept_stream, c_text, check_len, connect_stream, hex_field, malformed, show, MsgStream,
    OobConfig, OobError, OobErrorKind, OobResult, MASK24,
};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};

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
    let mut msgs = MsgStream::new(stream, cfg.io_timeout);
    msgs.send(&my.to_wire(), "our pingpong address")?;
    let msg = msgs
        .recv(PINGPONG_MSG_LEN, "the server's pingpong address")
        .map_err(|e| match e.kind() {
            // The real server closes unanswered when it cannot move its QP to RTR with our
            // address ("Failed to modify QP to RTR"): most often a GID of the other IP version.
            OobErrorKind::Closed => OobError::new(
                OobErrorKind::Closed,
                format!(
                    "{}: the server could not connect its QP to ours (its output says why; \
                     \"Failed to modify QP to RTR\" there is most often GIDs of two IP \
                     versions). {}",
                    e.message(),
                    rocemu_emulator::GID_INDEX_HINT
                ),
            ),
            _ => e,
        })?;
    msgs.send(PINGPONG_DONE, "\"done\"")?;
    let _ = msgs.stream.shutdown(Shutdown::Both);
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
    let mut msgs = MsgStream::new(stream, cfg.io_timeout);
    let msg = msgs.recv(PINGPONG_MSG_LEN, "the client's pingpong address")?;
    let rem = PingpongDest::from_wire(&msg)?;
    connect(&rem).map_err(|e| {
        OobError::new(
            OobErrorKind::Callback,
            format!("couldn't connect to the remote QP: {e}"),
        )
    })?;
    msgs.send(&my.to_wire(), "our pingpong address")?;
    let done = msgs.recv(PINGPONG_DONE.len(), "the client's \"done\"")?;
    if done != PINGPONG_DONE {
        return Err(malformed(format!(
            "expected \"done\\0\" from the client, got \"{}\"",
            show(&done)
        )));
    }
    let _ = msgs.stream.shutdown(Shutdown::Both);
    Ok(rem)
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::thread;
    use std::time::{Duration, Instant};

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
}
