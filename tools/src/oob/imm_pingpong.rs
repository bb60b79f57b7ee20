//! `imm_pingpong --op write`'s out-of-band exchange (`testbed/rxevm/imm_pingpong.c`):
//! `ibv_rc_pingpong`'s ([`super::rc_pingpong`]), with a [`WriteKey`] after each address message,
//! in the same direction: client → server 52 + 26 bytes, server → client 52 + 26, then the
//! client's `"done\0"`. (`rc_pingpong`'s functions speak the plain exchange only.)
//!
//! Invariants: as `rc_pingpong`'s — the server moves its QP to RTR and RTS (its `connect`
//! closure) before it answers; the client's `"done\0"` is checked byte for byte; every read
//! and write has a deadline.
use super::{PingpongDest, PINGPONG_DONE, PINGPONG_MSG_LEN};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// `imm_pingpong --op write`'s message (testbed/rxevm/imm_pingpong.c): `"%08x:%016llx"` of the
/// R_Key and address the peer may write into, and a NUL, 26 bytes. Each side sends it right
/// after its 52-byte `ibv_rc_pingpong` address message, in the same direction:
/// client → server 52 + 26 bytes, server → client 52 + 26, then the client's `"done\0"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteKey {
    pub rkey: u32,
    pub vaddr: u64,
}

impl WriteKey {
    pub const LEN: usize = 26;

    pub fn to_wire(self) -> [u8; Self::LEN] {
        let t = format!("{:08x}:{:016x}", self.rkey, self.vaddr);
        let mut out = [0u8; Self::LEN];
        out[..t.len()].copy_from_slice(t.as_bytes());
        out
    }

    pub fn from_wire(m: &[u8]) -> Result<Self, String> {
        let bad = || {
            format!(
                "the peer's rkey:vaddr message is not \"%08x:%016llx\" and a NUL: {:?}",
                String::from_utf8_lossy(m)
            )
        };
        let hex = |s: &[u8]| s.iter().all(u8::is_ascii_hexdigit);
        if m.len() != Self::LEN || m[8] != b':' || m[25] != 0 || !hex(&m[..8]) || !hex(&m[9..25]) {
            return Err(bad());
        }
        // Only hex digits: the conversions cannot fail.
        let text = std::str::from_utf8(&m[..25]).map_err(|_| bad())?;
        Ok(WriteKey {
            rkey: u32::from_str_radix(&text[..8], 16).map_err(|_| bad())?,
            vaddr: u64::from_str_radix(&text[9..], 16).map_err(|_| bad())?,
        })
    }
}

/// Per message, as `oob`'s default.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a client retries a refused connection (the server may be starting).
const CONNECT_FOR: Duration = Duration::from_secs(10);

fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn prepare(s: &TcpStream) -> Result<(), String> {
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| s.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(io("setting the socket's timeouts"))
}

fn send(s: &mut TcpStream, my: &PingpongDest, key: WriteKey) -> Result<(), String> {
    let mut m = my.to_wire().to_vec();
    m.extend_from_slice(&key.to_wire());
    s.write_all(&m)
        .map_err(io("sending our address and rkey:vaddr"))
}

fn recv(s: &mut TcpStream) -> Result<(PingpongDest, WriteKey), String> {
    let mut m = [0u8; PINGPONG_MSG_LEN + WriteKey::LEN];
    s.read_exact(&mut m)
        .map_err(io("reading the peer's address and rkey:vaddr"))?;
    let dest = PingpongDest::from_wire(&m[..PINGPONG_MSG_LEN]).map_err(|e| e.to_string())?;
    Ok((dest, WriteKey::from_wire(&m[PINGPONG_MSG_LEN..])?))
}

pub(crate) fn client(
    addr: (&str, u16),
    my: &PingpongDest,
    key: WriteKey,
) -> Result<(PingpongDest, WriteKey), String> {
    let until = Instant::now() + CONNECT_FOR;
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e)
                if Instant::now() < until && e.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(format!("couldn't connect to {}:{}: {e}", addr.0, addr.1)),
        }
    };
    prepare(&s)?;
    send(&mut s, my, key)?;
    let rem = recv(&mut s)?;
    s.write_all(PINGPONG_DONE).map_err(io("sending \"done\""))?;
    Ok(rem)
}

/// As `oob::pingpong_server`: `connect` moves the QP to RTR and RTS before the answer.
pub(crate) fn server(
    listener: &TcpListener,
    my: &PingpongDest,
    key: WriteKey,
    connect: impl FnOnce(&PingpongDest) -> Result<(), String>,
) -> Result<(PingpongDest, WriteKey), String> {
    let (mut s, _) = listener.accept().map_err(io("accept()"))?;
    prepare(&s)?;
    let rem = recv(&mut s)?;
    connect(&rem.0).map_err(|e| format!("couldn't connect to the remote QP: {e}"))?;
    send(&mut s, my, key)?;
    let mut done = [0u8; PINGPONG_DONE.len()];
    s.read_exact(&mut done)
        .map_err(io("reading the client's \"done\""))?;
    if &done != PINGPONG_DONE {
        return Err(format!(
            "expected \"done\\0\" from the client, got {:?}",
            String::from_utf8_lossy(&done)
        ));
    }
    Ok(rem)
}
