//! The BTH opcode table (IBTA Vol. 1 table 35, unverified; plus FLUSH and ATOMIC WRITE from IBA 1.5
//! and the RoCEv2 CNP of Annex A17.9.3, Figure 6): for each opcode, which extension headers follow
//! the BTH and in which order, whether a payload follows, and where the packet sits in its message.
//!
//! Header order on the wire is always: BTH, FETH, RETH, AtomicETH, DETH, AETH, AtomicAckETH,
//! ImmDt, IETH (each when present), payload, pad, ICRC — no opcode carries two headers whose
//! order this would get wrong (FLUSH: FETH then RETH; UD SEND with immediate: DETH then ImmDt;
//! RDMA WRITE ONLY with immediate: RETH then ImmDt; ATOMIC ACKNOWLEDGE: AETH then AtomicAckETH).
use crate::error::Error;
use core::fmt;

/// The transport service an opcode belongs to (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Rc,
    Uc,
    Ud,
    /// Congestion notification packet (RoCEv2 Annex A17.9.3, CA17-44 and Figure 6).
    Cnp,
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

impl Position {
    pub const fn is_first(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    pub const fn is_last(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// What an opcode does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Send,
    RdmaWrite,
    RdmaReadRequest,
    RdmaReadResponse,
    Acknowledge,
    AtomicAcknowledge,
    CompareSwap,
    FetchAdd,
    Flush,
    AtomicWrite,
    Cnp,
}

/// Layout bits: which headers an opcode carries.
pub mod hdr {
    pub const RETH: u16 = 1 << 0;
    pub const AETH: u16 = 1 << 1;
    pub const ATOMIC_ETH: u16 = 1 << 2;
    pub const ATOMIC_ACK_ETH: u16 = 1 << 3;
    pub const IMM: u16 = 1 << 4;
    pub const IETH: u16 = 1 << 5;
    pub const DETH: u16 = 1 << 6;
    pub const FETH: u16 = 1 << 7;
    /// A payload may follow the headers.
    pub const PAYLOAD: u16 = 1 << 8;
    /// The 16 reserved bytes of a CNP.
    pub const CNP_RESERVED: u16 = 1 << 9;
    /// Every extension header's bit (not the payload's, not the CNP's reserved bytes).
    pub const EXT: u16 = FETH | RETH | ATOMIC_ETH | DETH | AETH | ATOMIC_ACK_ETH | IMM | IETH;
}

/// Header sizes in bytes (IBTA 9.3).
pub mod len {
    pub const BTH: usize = 12;
    pub const RETH: usize = 16;
    pub const AETH: usize = 4;
    pub const ATOMIC_ETH: usize = 28;
    pub const ATOMIC_ACK_ETH: usize = 8;
    pub const IMM: usize = 4;
    pub const IETH: usize = 4;
    pub const DETH: usize = 8;
    pub const FETH: usize = 4;
    pub const CNP_RESERVED: usize = 16;
    pub const ICRC: usize = 4;
}

/// Everything the table says about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    pub opcode: u8,
    /// `TRANSPORT_NAME` as in the IBTA table, e.g. `RC_RDMA_WRITE_FIRST`.
    pub name: &'static str,
    pub transport: Transport,
    pub operation: Operation,
    pub position: Position,
    /// Bit set of [`hdr`] constants.
    pub headers: u16,
    /// Bytes of extension headers after the BTH.
    pub ext_len: usize,
}

impl OpcodeInfo {
    pub const fn has(&self, h: u16) -> bool {
        self.headers & h != 0
    }
    pub const fn has_payload(&self) -> bool {
        self.has(hdr::PAYLOAD)
    }
    /// Requests travel requester → responder; responses (ACK, read response, atomic ACK) back.
    pub const fn is_request(&self) -> bool {
        !matches!(
            self.operation,
            Operation::RdmaReadResponse
                | Operation::Acknowledge
                | Operation::AtomicAcknowledge
                | Operation::Cnp
        )
    }
    pub const fn is_response(&self) -> bool {
        matches!(
            self.operation,
            Operation::RdmaReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge
        )
    }
    pub const fn has_immediate(&self) -> bool {
        self.has(hdr::IMM)
    }
}

const fn ext_len(h: u16) -> usize {
    let mut n = 0;
    if h & hdr::RETH != 0 {
        n += len::RETH;
    }
    if h & hdr::AETH != 0 {
        n += len::AETH;
    }
    if h & hdr::ATOMIC_ETH != 0 {
        n += len::ATOMIC_ETH;
    }
    if h & hdr::ATOMIC_ACK_ETH != 0 {
        n += len::ATOMIC_ACK_ETH;
    }
    if h & hdr::IMM != 0 {
        n += len::IMM;
    }
    if h & hdr::IETH != 0 {
        n += len::IETH;
    }
    if h & hdr::DETH != 0 {
        n += len::DETH;
    }
    if h & hdr::FETH != 0 {
        n += len::FETH;
    }
    if h & hdr::CNP_RESERVED != 0 {
        n += len::CNP_RESERVED;
    }
    n
}

const fn info(
    opcode: u8,
    name: &'static str,
    transport: Transport,
    operation: Operation,
    position: Position,
    headers: u16,
) -> Option<OpcodeInfo> {
    Some(OpcodeInfo {
        opcode,
        name,
        transport,
        operation,
        position,
        headers,
        ext_len: ext_len(headers),
    })
}

use hdr::*;
use Operation as O;
use Position as P;
use Transport as T;

const P_: u16 = PAYLOAD;

/// Operations 0x00..=0x0B are shared by RC and UC (sends and writes).
macro_rules! send_write {
    ($t:expr, $base:expr, $pfx:literal) => {
        [
            info(
                $base,
                concat!($pfx, "_SEND_FIRST"),
                $t,
                O::Send,
                P::First,
                P_,
            ),
            info(
                $base + 1,
                concat!($pfx, "_SEND_MIDDLE"),
                $t,
                O::Send,
                P::Middle,
                P_,
            ),
            info(
                $base + 2,
                concat!($pfx, "_SEND_LAST"),
                $t,
                O::Send,
                P::Last,
                P_,
            ),
            info(
                $base + 3,
                concat!($pfx, "_SEND_LAST_WITH_IMMEDIATE"),
                $t,
                O::Send,
                P::Last,
                IMM | P_,
            ),
            info(
                $base + 4,
                concat!($pfx, "_SEND_ONLY"),
                $t,
                O::Send,
                P::Only,
                P_,
            ),
            info(
                $base + 5,
                concat!($pfx, "_SEND_ONLY_WITH_IMMEDIATE"),
                $t,
                O::Send,
                P::Only,
                IMM | P_,
            ),
            info(
                $base + 6,
                concat!($pfx, "_RDMA_WRITE_FIRST"),
                $t,
                O::RdmaWrite,
                P::First,
                RETH | P_,
            ),
            info(
                $base + 7,
                concat!($pfx, "_RDMA_WRITE_MIDDLE"),
                $t,
                O::RdmaWrite,
                P::Middle,
                P_,
            ),
            info(
                $base + 8,
                concat!($pfx, "_RDMA_WRITE_LAST"),
                $t,
                O::RdmaWrite,
                P::Last,
                P_,
            ),
            info(
                $base + 9,
                concat!($pfx, "_RDMA_WRITE_LAST_WITH_IMMEDIATE"),
                $t,
                O::RdmaWrite,
                P::Last,
                IMM | P_,
            ),
            info(
                $base + 10,
                concat!($pfx, "_RDMA_WRITE_ONLY"),
                $t,
                O::RdmaWrite,
                P::Only,
                RETH | P_,
            ),
            info(
                $base + 11,
                concat!($pfx, "_RDMA_WRITE_ONLY_WITH_IMMEDIATE"),
                $t,
                O::RdmaWrite,
                P::Only,
                RETH | IMM | P_,
            ),
        ]
    };
}

const fn build_table() -> [Option<OpcodeInfo>; 256] {
    let mut t: [Option<OpcodeInfo>; 256] = [None; 256];
    let rc = send_write!(T::Rc, 0x00, "RC");
    let uc = send_write!(T::Uc, 0x20, "UC");
    let mut i = 0;
    while i < 12 {
        t[i] = rc[i];
        t[0x20 + i] = uc[i];
        i += 1;
    }
    t[0x0c] = info(
        0x0c,
        "RC_RDMA_READ_REQUEST",
        T::Rc,
        O::RdmaReadRequest,
        P::Only,
        RETH,
    );
    t[0x0d] = info(
        0x0d,
        "RC_RDMA_READ_RESPONSE_FIRST",
        T::Rc,
        O::RdmaReadResponse,
        P::First,
        AETH | P_,
    );
    t[0x0e] = info(
        0x0e,
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        T::Rc,
        O::RdmaReadResponse,
        P::Middle,
        P_,
    );
    t[0x0f] = info(
        0x0f,
        "RC_RDMA_READ_RESPONSE_LAST",
        T::Rc,
        O::RdmaReadResponse,
        P::Last,
        AETH | P_,
    );
    t[0x10] = info(
        0x10,
        "RC_RDMA_READ_RESPONSE_ONLY",
        T::Rc,
        O::RdmaReadResponse,
        P::Only,
        AETH | P_,
    );
    t[0x11] = info(0x11, "RC_ACKNOWLEDGE", T::Rc, O::Acknowledge, P::Only, AETH);
    t[0x12] = info(
        0x12,
        "RC_ATOMIC_ACKNOWLEDGE",
        T::Rc,
        O::AtomicAcknowledge,
        P::Only,
        AETH | ATOMIC_ACK_ETH,
    );
    t[0x13] = info(
        0x13,
        "RC_COMPARE_SWAP",
        T::Rc,
        O::CompareSwap,
        P::Only,
        ATOMIC_ETH,
    );
    t[0x14] = info(
        0x14,
        "RC_FETCH_ADD",
        T::Rc,
        O::FetchAdd,
        P::Only,
        ATOMIC_ETH,
    );
    t[0x16] = info(
        0x16,
        "RC_SEND_LAST_WITH_INVALIDATE",
        T::Rc,
        O::Send,
        P::Last,
        IETH | P_,
    );
    t[0x17] = info(
        0x17,
        "RC_SEND_ONLY_WITH_INVALIDATE",
        T::Rc,
        O::Send,
        P::Only,
        IETH | P_,
    );
    // IBA 1.5: FLUSH carries FETH then RETH and no payload; ATOMIC WRITE carries RETH and an
    // 8-byte payload.
    t[0x1c] = info(0x1c, "RC_FLUSH", T::Rc, O::Flush, P::Only, FETH | RETH);
    t[0x1d] = info(
        0x1d,
        "RC_ATOMIC_WRITE",
        T::Rc,
        O::AtomicWrite,
        P::Only,
        RETH | P_,
    );
    t[0x64] = info(0x64, "UD_SEND_ONLY", T::Ud, O::Send, P::Only, DETH | P_);
    t[0x65] = info(
        0x65,
        "UD_SEND_ONLY_WITH_IMMEDIATE",
        T::Ud,
        O::Send,
        P::Only,
        DETH | IMM | P_,
    );
    t[0x81] = info(0x81, "CNP", T::Cnp, O::Cnp, P::Only, CNP_RESERVED);
    t
}

static TABLE: [Option<OpcodeInfo>; 256] = build_table();

/// A BTH opcode known to this crate. Construct with [`Opcode::new`]: an unknown byte is an error.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(u8);

#[allow(missing_docs)]
impl Opcode {
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x03);
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0a);
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0b);
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0c);
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0x16);
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0x17);
    pub const RC_FLUSH: Opcode = Opcode(0x1c);
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1d);
    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x23);
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x25);
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(0x26);
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x27);
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(0x28);
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x29);
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(0x2a);
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x2b);
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);
    pub const CNP: Opcode = Opcode(0x81);

    /// A known opcode, or [`Error::UnknownOpcode`] (reserved codes, RD and XRC, which RoCE does
    /// not carry, and the manufacturer-specific range).
    #[inline]
    pub fn new(byte: u8) -> Result<Opcode, Error> {
        match TABLE[byte as usize] {
            Some(_) => Ok(Opcode(byte)),
            None => Err(Error::UnknownOpcode(byte)),
        }
    }
    pub const fn value(self) -> u8 {
        self.0
    }
    /// The table entry. Infallible: an `Opcode` is always in the table.
    #[inline]
    pub fn info(self) -> &'static OpcodeInfo {
        match &TABLE[self.0 as usize] {
            Some(i) => i,
            None => unreachable!("Opcode values are checked at construction"),
        }
    }
    pub fn name(self) -> &'static str {
        self.info().name
    }
    #[inline]
    pub fn transport(self) -> Transport {
        self.info().transport
    }
    /// Every known opcode, in numeric order.
    pub fn all() -> impl Iterator<Item = Opcode> {
        (0u16..256).filter_map(|b| Opcode::new(b as u8).ok())
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(0x{:02x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_rc_uc_ud_opcode_and_nothing_else() {
        let known: Vec<u8> = Opcode::all().map(|o| o.value()).collect();
        let mut want: Vec<u8> = (0x00..=0x14).chain([0x16, 0x17, 0x1c, 0x1d]).collect();
        want.extend(0x20..=0x2b);
        want.extend([0x64, 0x65, 0x81]);
        assert_eq!(known, want);
        for b in [
            0x15u8, 0x18, 0x1f, 0x2c, 0x40, 0x4c, 0x60, 0x66, 0x80, 0xa0, 0xc0, 0xff,
        ] {
            assert_eq!(Opcode::new(b), Err(Error::UnknownOpcode(b)));
        }
    }

    #[test]
    fn layouts_match_ibta_table_35() {
        let l = |o: Opcode| (o.info().ext_len, o.info().has_payload());
        assert_eq!(l(Opcode::RC_SEND_ONLY), (0, true));
        assert_eq!(l(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE), (4, true));
        assert_eq!(l(Opcode::RC_RDMA_WRITE_FIRST), (16, true));
        assert_eq!(l(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE), (20, true));
        assert_eq!(l(Opcode::RC_RDMA_READ_REQUEST), (16, false));
        assert_eq!(l(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE), (0, true));
        assert_eq!(l(Opcode::RC_RDMA_READ_RESPONSE_LAST), (4, true));
        assert_eq!(l(Opcode::RC_ACKNOWLEDGE), (4, false));
        assert_eq!(l(Opcode::RC_ATOMIC_ACKNOWLEDGE), (12, false));
        assert_eq!(l(Opcode::RC_COMPARE_SWAP), (28, false));
        assert_eq!(l(Opcode::RC_SEND_LAST_WITH_INVALIDATE), (4, true));
        assert_eq!(l(Opcode::RC_FLUSH), (20, false));
        assert_eq!(l(Opcode::RC_ATOMIC_WRITE), (16, true));
        assert_eq!(l(Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE), (4, true));
        assert_eq!(l(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE), (12, true));
        assert_eq!(l(Opcode::CNP), (16, false));
        assert_eq!(Opcode::UC_RDMA_WRITE_FIRST.name(), "UC_RDMA_WRITE_FIRST");
        assert_eq!(Opcode::RC_COMPARE_SWAP.name(), "RC_COMPARE_SWAP");
        assert!(Opcode::RC_ACKNOWLEDGE.info().is_response());
        assert!(Opcode::RC_FETCH_ADD.info().is_request());
        assert_eq!(Opcode::UC_SEND_FIRST.transport(), Transport::Uc);
    }
}
