//! Parse and build errors. Every parse error means "drop the frame silently" to a responder (IBTA
//! 9.6, unverified: packets that fail header checks are discarded without a NAK); errors that call
//! for a NAK are decided by the transport, which sees well-formed frames only.
use core::fmt;

/// The layer a length problem was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Ethernet,
    Vlan,
    Ipv4,
    Ipv6,
    Udp,
    Bth,
    /// The extension headers the opcode's layout requires, plus the ICRC.
    Transport,
    Arp,
    Icmpv6,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layer::Ethernet => "Ethernet header",
            Layer::Vlan => "802.1Q tag",
            Layer::Ipv4 => "IPv4 header",
            Layer::Ipv6 => "IPv6 header",
            Layer::Udp => "UDP header",
            Layer::Bth => "BTH",
            Layer::Transport => "transport headers and ICRC",
            Layer::Arp => "ARP packet",
            Layer::Icmpv6 => "ICMPv6 message",
        })
    }
}

/// Why a byte string is not a well-formed RoCEv2 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Fewer bytes than a header needs.
    Truncated {
        layer: Layer,
        need: usize,
        have: usize,
    },
    /// The IPv4 total length or IPv6 payload length claims more bytes than were captured.
    IpLengthExceedsFrame {
        v6: bool,
        claimed: usize,
        captured: usize,
    },
    /// The EtherType is neither IPv4 nor IPv6 (after an optional 802.1Q tag).
    NotIp { ethertype: u16 },
    /// The version nibble does not match the EtherType.
    IpVersion { ethertype: u16, version: u8 },
    /// IPv4 IHL below 5, or a total length shorter than the header.
    BadIpv4HeaderLength { ihl: u8, total_len: u16 },
    /// A fragment: RoCEv2 never fragments (the DF bit is set by senders), and fragments are not
    /// reassembled here.
    Ipv4Fragment { offset: u16, more: bool },
    /// An IPv6 extension header sits between the IPv6 header and UDP.
    Ipv6ExtensionHeader { next_header: u8 },
    /// The IP payload is not UDP.
    NotUdp { protocol: u8 },
    /// UDP, but not to the RoCEv2 port 4791.
    NotRocePort { dport: u16 },
    /// The UDP length field disagrees with the IP payload length.
    UdpLength { udp_len: u16, ip_payload: usize },
    /// The BTH opcode is not in the RC / UC / UD table, nor CNP.
    UnknownOpcode(u8),
    /// The pad count is larger than the payload that carries it.
    PadExceedsPayload { pad: u8, payload: usize },
    /// ARP for something other than IPv4 over Ethernet.
    NotArpForIpv4 { htype: u16, ptype: u16 },
    /// Not a well-formed IPv6 neighbour solicitation or advertisement.
    NotNd,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { layer, need, have } => {
                write!(f, "truncated: {layer} needs {need} bytes, {have} captured")
            }
            Error::IpLengthExceedsFrame {
                v6,
                claimed,
                captured,
            } => {
                if v6 {
                    write!(
                        f,
                        "truncated: IPv6 payload length {claimed} > {captured} captured"
                    )
                } else {
                    write!(
                        f,
                        "truncated: IPv4 total length {claimed} > {captured} captured"
                    )
                }
            }
            Error::NotIp { ethertype } => write!(f, "not IP (ethertype 0x{ethertype:04x})"),
            Error::IpVersion { ethertype, version } => {
                write!(
                    f,
                    "not IP (ethertype 0x{ethertype:04x} but IP version {version})"
                )
            }
            Error::BadIpv4HeaderLength { ihl, total_len } => {
                write!(f, "bad IPv4 header: IHL {ihl}, total length {total_len}")
            }
            Error::Ipv4Fragment { offset, more } => write!(
                f,
                "IPv4 fragment (offset {}{}) not reassembled",
                offset as u32 * 8,
                if more { ", more fragments" } else { "" }
            ),
            Error::Ipv6ExtensionHeader { next_header } => {
                write!(f, "IPv6 extension header {next_header} not supported")
            }
            Error::NotUdp { protocol } => write!(f, "not UDP 4791 (IP protocol {protocol})"),
            Error::NotRocePort { dport } => write!(f, "not UDP 4791 (port {dport})"),
            Error::UdpLength {
                udp_len,
                ip_payload,
            } => {
                if (udp_len as usize) < 8 {
                    write!(f, "bad UDP length {udp_len}")
                } else if (udp_len as usize) > ip_payload {
                    write!(
                        f,
                        "truncated: UDP length {udp_len} > IP payload {ip_payload}"
                    )
                } else {
                    write!(f, "UDP length {udp_len} < IP payload {ip_payload}")
                }
            }
            Error::UnknownOpcode(op) => write!(f, "unknown opcode 0x{op:02x}"),
            Error::PadExceedsPayload { pad, payload } => {
                write!(f, "pad count {pad} > {payload} payload bytes")
            }
            Error::NotArpForIpv4 { htype, ptype } => {
                write!(
                    f,
                    "ARP for hardware type {htype}, protocol 0x{ptype:04x}: not Ethernet/IPv4"
                )
            }
            Error::NotNd => f.write_str("not an IPv6 neighbour solicitation or advertisement"),
        }
    }
}

impl std::error::Error for Error {}

/// Why a frame could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// The caller's buffer is smaller than the frame.
    BufferTooSmall { need: usize, have: usize },
    /// The frame would not fit the 16-bit IP or UDP length fields.
    TooLong { len: usize },
    /// The extension headers given do not match the opcode's layout.
    LayoutMismatch { opcode: u8, header: &'static str },
    /// The opcode is not one this crate knows.
    UnknownOpcode(u8),
    /// IPv4 and IPv6 addresses mixed, or a pad count above 3.
    Invalid(&'static str),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::BufferTooSmall { need, have } => {
                write!(
                    f,
                    "buffer too small: frame needs {need} bytes, buffer has {have}"
                )
            }
            BuildError::TooLong { len } => {
                write!(f, "frame too long for IP/UDP length fields: {len}")
            }
            BuildError::LayoutMismatch { opcode, header } => {
                write!(
                    f,
                    "opcode 0x{opcode:02x}: {header} does not match its layout"
                )
            }
            BuildError::UnknownOpcode(op) => write!(f, "unknown opcode 0x{op:02x}"),
            BuildError::Invalid(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for BuildError {}
