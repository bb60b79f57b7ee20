//! The body of the `parse_frame` fuzz target, here so that its corpus also runs as a plain test
//! (`wire/tests/corpus.rs`). Panics are the findings.
//!
//! Built only with the `fuzzing` feature: fuzz/ turns it on, and so do this crate's own tests
//! (through its dev-dependency on itself); a plain build of the library leaves it out.
use crate::frame::{parse_ip_packet, FrameRepr, IpRepr};
use crate::parse_frame;

/// Any bytes as an Ethernet frame (and as a bare IP packet): parse returns a value or an
/// error, never panics; a frame that parses rebuilds into a frame that parses to the same
/// values, and into the same bytes when nothing the builder normalises was set.
pub fn parse_frame_target(data: &[u8]) {
    let _ = parse_ip_packet(data).map(|p| p.icrc_ok());
    // The receive path's parse (the ICRC checked in place, before the parse): the same
    // verdict as the plain parse and check, and the frame left as it was.
    let mut copy = data.to_vec();
    let in_place = crate::frame::with_frame_in_place(&mut copy, |r| {
        r.map(|(p, ok)| (p.bth, p.ext, p.payload.to_vec(), ok))
    });
    assert_eq!(copy, data, "the in-place check left the frame changed");
    let plain = parse_frame(data).map(|p| (p.bth, p.ext, p.payload.to_vec(), p.icrc_ok()));
    assert_eq!(in_place, plain, "the in-place parse differs");
    let Ok(p) = parse_frame(data) else { return };
    let ok = p.icrc_ok();
    let _ = p.ip_checksum_ok();
    let _ = p.pad_bytes();
    let l3 = p.eth.header_len();
    let normalised = match p.ip {
        // The builder writes IPv4 without options, with only the DF flag.
        IpRepr::V4(r) => r.header_len == 20 && data[l3 + 6] & 0x80 == 0,
        IpRepr::V6(_) => true,
    };
    if !normalised {
        return;
    }
    let repr = FrameRepr::from_parsed(&p);
    let mut buf = vec![0u8; repr.frame_len(p.payload.len())];
    let n = repr
        .emit_with_payload(&mut buf, p.payload)
        .expect("a parsed frame rebuilds");
    let q = parse_frame(&buf[..n]).expect("a rebuilt frame parses");
    assert!(q.icrc_ok());
    assert_eq!(q.bth, p.bth);
    assert_eq!(q.ext, p.ext);
    assert_eq!(q.payload, p.payload);
    // The rebuild zeroes pad bytes and the UDP checksum and recomputes the IPv4 checksum and
    // the ICRC; when those were already so, it matches byte for byte.
    if ok && p.pad_bytes().iter().all(|&b| b == 0) && p.udp.checksum == 0 && p.ip_checksum_ok() {
        assert_eq!(&buf[..n], &data[..n], "rebuild differs");
    }
}

/// Any bytes as a CM MAD (and as rdma_cm private data): a value or an error, never a panic; a
/// MAD that parses rebuilds into the same 256 bytes.
pub fn cm_mad_target(data: &[u8]) {
    let _ = crate::cm::CmaHdr::parse(data).map(|h| (h.src(), h.dst_ip()));
    let _ = crate::mad::MadRepr::parse(data);
    let Ok(m) = crate::cm::CmMadRepr::parse(data) else {
        return;
    };
    let mut buf = [0u8; crate::mad::MAD_LEN];
    m.emit(&mut buf).expect("a 256-byte buffer holds a MAD");
    assert_eq!(&buf[..], data, "rebuild differs");
    if let crate::cm::CmMessage::Req(r) = m.msg {
        let _ = r.cma_hdr();
    }
}
