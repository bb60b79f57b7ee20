//! RoCEv2 on the wire.
//!
//! Invariants, in the spirit of smoltcp's `wire` module:
//!
//! * Untrusted bytes enter through a checked constructor ([`parse_frame`], `*::new_checked`). Once
//!   that has succeeded, no accessor of the returned view panics, whatever the bytes hold.
//! * Any byte string given to [`parse_frame`] returns a value or a typed [`Error`]; nothing panics.
//! * Parsing and building never allocate. Builders write in place into the caller's buffer and take
//!   the payload as a closure.
//! * Field values that disagree with each other (a RETH length that differs from the payload, a bad
//!   IPv4 checksum, a wrong ICRC) are reported as they stand; only structure is an error.
//!
//! The transport headers follow IBTA Vol. 1 chapter 9 (9.2 BTH, 9.3 extension headers, table 35,
//! unverified, for the opcodes); the RoCEv2 encapsulation and the ICRC masking follow Annex A17.
#![deny(unsafe_code)] // allowed in one module: icrc's carry-less-multiply kernel

pub mod arp;
pub mod capture;
pub mod cm;
mod error;
pub mod eth;
pub mod frame;
// The fuzz targets' bodies: only with the `fuzzing` feature (fuzz/, and the corpus tests).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;
pub mod icrc;
pub mod ip;
pub mod mad;
pub mod nd;
pub mod opcode;
pub mod pfc;
pub mod template;
pub mod types;

pub use cm::{CmMadRepr, CmMessage, CmaHdr};
pub use error::{BuildError, Error, Layer};
pub use frame::{
    flow_label_for, icrc_ok_in_place, parse_frame, parse_frame_in_place, udp_sport_for_flow,
    udp_sport_for_qpn, FrameRepr, IpRepr, ParsedFrame, ROCEV2_UDP_PORT,
};
pub use headers::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, FethRepr, RethRepr,
};
pub use mad::{MadError, MadRepr};
pub use opcode::{Opcode, OpcodeInfo, Position, Transport};
pub use template::HeaderTemplate;
pub use types::{Msn, NakCode, PKey, Psn, QKey, Qpn, RKey, Syndrome, SyndromeKind};
