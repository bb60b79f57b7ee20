//! Typed transport values. Raw integers do not cross a module boundary: a PSN is a [`Psn`], with
//! the 24-bit serial-number arithmetic of IBTA 9.7.1 (unverified) built in.
use core::fmt;

const MASK24: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number (IBTA 9.2: BTH PSN). Comparison is modulo 2^24: `a` is before
/// `b` when `b - a` (mod 2^24) lies in `1 ..= 2^23 - 1`, the half-window rule of 9.7.1
/// (unverified).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// Half the PSN space: the largest distance that still orders two PSNs.
    pub const HALF: u32 = 1 << 23;

    /// Takes the low 24 bits of `v`.
    pub const fn new(v: u32) -> Psn {
        Psn(v & MASK24)
    }
    pub const fn value(self) -> u32 {
        self.0
    }
    /// `self + n` modulo 2^24.
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & MASK24)
    }
    /// `self - n` modulo 2^24.
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & MASK24)
    }
    pub const fn next(self) -> Psn {
        self.add(1)
    }
    /// Forward distance from `from` to `self` modulo 2^24, in `0 .. 2^24`.
    pub const fn distance_from(self, from: Psn) -> u32 {
        self.0.wrapping_sub(from.0) & MASK24
    }
    /// Signed difference `self - other` in `-2^23 .. 2^23`.
    pub const fn diff(self, other: Psn) -> i32 {
        let d = self.distance_from(other);
        if d >= Self::HALF {
            d as i32 - Self::MODULUS as i32
        } else {
            d as i32
        }
    }
    /// True when `self` comes strictly before `other` in serial-number order.
    pub const fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }
    /// True when `self` comes strictly after `other`.
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
    /// True when `self` lies in the window of `len` PSNs that starts at `start` (across the wrap).
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        self.distance_from(start) < len
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

macro_rules! newtype24 {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
        pub struct $name(u32);
        impl $name {
            /// Takes the low 24 bits of `v`.
            pub const fn new(v: u32) -> $name {
                $name(v & MASK24)
            }
            pub const fn value(self) -> u32 {
                self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "0x{:06x}", self.0)
            }
        }
    };
}

newtype24!(
    /// A 24-bit queue pair number (BTH DestQP, DETH SrcQP).
    Qpn
);
newtype24!(
    /// The 24-bit message sequence number carried in the AETH (IBTA 9.3.5; C9-148 as rxe numbers
    /// the rule).
    Msn
);

impl Qpn {
    /// QP0, the subnet management QP (unused on RoCE).
    pub const SMI: Qpn = Qpn(0);
    /// QP1, the general services QP that carries MADs (IB CM).
    pub const GSI: Qpn = Qpn(1);
    /// The destination QP of a CNP per Annex A17.9.3 (Figure 6) is the QP being throttled; 0xFFFFFF
    /// is the multicast QPN (IBTA 9.2, unverified).
    pub const MULTICAST: Qpn = Qpn(MASK24);
}

impl Msn {
    pub const fn next(self) -> Msn {
        Msn(self.0.wrapping_add(1) & MASK24)
    }
}

macro_rules! newtype32 {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
        pub struct $name(pub u32);
        impl $name {
            pub const fn value(self) -> u32 {
                self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "0x{:08x}", self.0)
            }
        }
    };
}

newtype32!(
    /// A remote key, naming a memory region to a remote requester (RETH, AtomicETH, IETH).
    RKey
);
newtype32!(
    /// A UD queue key (DETH). Keys with the high bit set are controlled keys (IBTA 3.5.3 in 1.2.1,
    /// as pib cites it): a requester may not use them from a work request, only from its QP
    /// attribute.
    QKey
);

impl QKey {
    /// True for a controlled Q_Key (high-order bit set).
    pub const fn is_controlled(self) -> bool {
        self.0 & 0x8000_0000 != 0
    }
    /// The Q_Key of QP1 (general services), IBTA 13.5.3.3 (unverified).
    pub const GSI: QKey = QKey(0x8001_0000);
}

/// A 16-bit partition key (BTH). The top bit is the membership bit: 1 = full member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PKey(pub u16);

impl PKey {
    /// The default partition, full membership (what rxe and ConnectX send).
    pub const DEFAULT: PKey = PKey(0xffff);
    pub const fn value(self) -> u16 {
        self.0
    }
    pub const fn is_full_member(self) -> bool {
        self.0 & 0x8000 != 0
    }
    /// The 15-bit partition number.
    pub const fn base(self) -> u16 {
        self.0 & 0x7fff
    }
    /// P_Key matching per IBTA 10.9.3 (unverified): same partition, at least one full member, and
    /// the invalid P_Key (base 0) matches nothing.
    pub const fn matches(self, other: PKey) -> bool {
        self.base() != 0
            && self.base() == other.base()
            && (self.is_full_member() || other.is_full_member())
    }
}

impl fmt::Display for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}", self.0)
    }
}

/// NAK codes of the AETH syndrome (IBTA table 44, unverified).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    /// Codes 5..=31, reserved.
    Reserved(u8),
}

impl NakCode {
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
    pub const fn from_code(c: u8) -> NakCode {
        match c & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

/// The meaning of an AETH syndrome byte (IBTA 9.3.5; tables 42–44 unverified, Table 45 the RNR
/// timer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyndromeKind {
    /// A positive acknowledgement with an end-to-end credit count; 31 means "credits invalid".
    Ack { credits: u8 },
    /// Receiver not ready: retry after the time `timer` stands for.
    RnrNak { timer: u8 },
    /// A negative acknowledgement.
    Nak(NakCode),
    /// Bit 7 set, or the reserved type 0b10.
    Reserved(u8),
}

/// The 8-bit AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Syndrome(pub u8);

/// RNR NAK timer values in microseconds, indexed by the 5-bit timer code (IBTA Table 45, "Encoding
/// for RNR NAK Timer Field", as Linux's cma.c names it).
pub const RNR_TIMER_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl Syndrome {
    /// The credit count that means "no credit information" (what rxe sends).
    pub const CREDITS_INVALID: u8 = 31;

    pub const fn ack(credits: u8) -> Syndrome {
        Syndrome(credits & 0x1f)
    }
    pub const fn rnr_nak(timer: u8) -> Syndrome {
        Syndrome(0x20 | (timer & 0x1f))
    }
    pub const fn nak(code: NakCode) -> Syndrome {
        Syndrome(0x60 | code.code())
    }
    pub const fn value(self) -> u8 {
        self.0
    }
    pub const fn kind(self) -> SyndromeKind {
        if self.0 & 0x80 != 0 {
            return SyndromeKind::Reserved(self.0);
        }
        let v = self.0 & 0x1f;
        match (self.0 >> 5) & 3 {
            0 => SyndromeKind::Ack { credits: v },
            1 => SyndromeKind::RnrNak { timer: v },
            3 => SyndromeKind::Nak(NakCode::from_code(v)),
            _ => SyndromeKind::Reserved(self.0),
        }
    }
    pub const fn is_ack(self) -> bool {
        matches!(self.kind(), SyndromeKind::Ack { .. })
    }
    /// For an RNR NAK, the delay it asks for, in microseconds.
    pub const fn rnr_delay_micros(self) -> Option<u32> {
        match self.kind() {
            SyndromeKind::RnrNak { timer } => Some(RNR_TIMER_MICROS[timer as usize]),
            _ => None,
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            SyndromeKind::Ack { credits } => write!(f, "ACK credits={credits}"),
            SyndromeKind::RnrNak { timer } => {
                write!(
                    f,
                    "RNR-NAK timer={timer} ({}us)",
                    RNR_TIMER_MICROS[timer as usize]
                )
            }
            SyndromeKind::Nak(code) => match code {
                NakCode::PsnSequenceError => f.write_str("NAK PSN-sequence-error"),
                NakCode::InvalidRequest => f.write_str("NAK invalid-request"),
                NakCode::RemoteAccessError => f.write_str("NAK remote-access-error"),
                NakCode::RemoteOperationalError => f.write_str("NAK remote-operational-error"),
                NakCode::InvalidRdRequest => f.write_str("NAK invalid-RD-request"),
                NakCode::Reserved(c) => write!(f, "NAK reserved-code-{c}"),
            },
            SyndromeKind::Reserved(v) => write!(f, "reserved-syndrome-0x{v:02x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_wraps_and_orders_across_2_pow_24() {
        let top = Psn::new(0xff_ffff);
        assert_eq!(top.next(), Psn::new(0));
        assert!(top.is_before(Psn::new(0)));
        assert!(Psn::new(0).is_after(top));
        assert_eq!(Psn::new(2).diff(top), 3);
        assert_eq!(top.diff(Psn::new(2)), -3);
        assert_eq!(Psn::new(5).sub(7), Psn::new(0xff_fffe));
        assert!(Psn::new(1).in_window(Psn::new(0xff_fff0), 32));
        assert!(!Psn::new(17).in_window(Psn::new(0xff_fff0), 32));
        assert_eq!(Psn::new(0x1ff_ffff), top);
    }

    #[test]
    fn psn_half_window_boundary() {
        let a = Psn::new(0);
        assert!(a.is_before(Psn::new(Psn::HALF - 1)));
        // Exactly half way is "before" in neither direction's positive range: diff is -2^23.
        assert_eq!(Psn::new(Psn::HALF).diff(a), -(Psn::HALF as i32));
        assert!(Psn::new(Psn::HALF).is_before(a));
    }

    #[test]
    fn syndromes_decode_per_ibta_tables_42_to_45() {
        assert_eq!(Syndrome(0x1f).kind(), SyndromeKind::Ack { credits: 31 });
        assert_eq!(Syndrome(0x00).kind(), SyndromeKind::Ack { credits: 0 });
        assert_eq!(Syndrome(0x20).rnr_delay_micros(), Some(655_360));
        assert_eq!(Syndrome(0x2e).kind(), SyndromeKind::RnrNak { timer: 14 });
        assert_eq!(Syndrome(0x2e).rnr_delay_micros(), Some(1_280));
        assert_eq!(Syndrome(0x3f).rnr_delay_micros(), Some(491_520));
        assert_eq!(
            Syndrome(0x60).kind(),
            SyndromeKind::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome(0x61).kind(),
            SyndromeKind::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            Syndrome(0x62).kind(),
            SyndromeKind::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome(0x63).kind(),
            SyndromeKind::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(
            Syndrome(0x64).kind(),
            SyndromeKind::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(
            Syndrome(0x65).kind(),
            SyndromeKind::Nak(NakCode::Reserved(5))
        );
        assert_eq!(Syndrome(0x40).kind(), SyndromeKind::Reserved(0x40));
        assert_eq!(Syndrome(0x80).kind(), SyndromeKind::Reserved(0x80));
        for code in 0..32u8 {
            assert_eq!(Syndrome::nak(NakCode::from_code(code)).0, 0x60 | code);
            assert_eq!(
                Syndrome::rnr_nak(code).rnr_delay_micros(),
                Some(RNR_TIMER_MICROS[code as usize])
            );
        }
        assert_eq!(Syndrome::ack(31), Syndrome(0x1f));
        assert_eq!(Syndrome(0x62).to_string(), "NAK remote-access-error");
    }

    #[test]
    fn pkey_matching() {
        assert!(PKey(0xffff).matches(PKey(0xffff)));
        assert!(PKey(0xffff).matches(PKey(0x7fff)));
        assert!(!PKey(0x7fff).matches(PKey(0x7fff)));
        assert!(!PKey(0xffff).matches(PKey(0x8001)));
        assert!(!PKey(0x8000).matches(PKey(0x8000)));
    }

    #[test]
    fn qkey_controlled_bit() {
        assert!(QKey::GSI.is_controlled());
        assert!(!QKey(0x1111_1111).is_controlled());
    }
}
