//! Reading captures (pcap with micro- or nanosecond timestamps in either byte order, and
//! pcapng) and writing pcap, through the `pcap-file` crate. Not a hot path: frames are copied
//! out of the reader.
use core::fmt;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, TsResolution};
use std::io::{BufReader, Read, Write};
use std::path::Path;
use std::time::Duration;

/// What the bytes of a captured frame start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    Ethernet,
    /// A bare IPv4 or IPv6 packet.
    RawIp,
    Other(u32),
}

impl LinkType {
    fn from_datalink(d: DataLink) -> LinkType {
        match d {
            DataLink::ETHERNET => LinkType::Ethernet,
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => LinkType::RawIp,
            other => LinkType::Other(u32::from(other)),
        }
    }
}

/// One frame of a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedFrame {
    /// 1-based position in the capture, counting packets only (Wireshark's frame number).
    pub number: usize,
    pub timestamp: Duration,
    pub link: LinkType,
    /// Length on the wire; more than `data.len()` when the capture was cut short (snaplen).
    pub orig_len: u32,
    pub data: Vec<u8>,
}

/// Why a capture could not be read.
#[derive(Debug)]
pub enum CaptureError {
    Io(std::io::Error),
    /// Not a pcap or pcapng file, or a corrupt one.
    Format(String),
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::Io(e) => write!(f, "{e}"),
            CaptureError::Format(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for CaptureError {}

impl From<std::io::Error> for CaptureError {
    fn from(e: std::io::Error) -> Self {
        CaptureError::Io(e)
    }
}

enum Inner<R: Read> {
    Pcap(PcapReader<R>, LinkType),
    PcapNg(PcapNgReader<R>),
}

/// Reads pcap or pcapng, telling them apart by their magic number.
pub struct CaptureReader<R: Read> {
    inner: Inner<ChainRead<R>>,
    number: usize,
}

impl<R: Read> fmt::Debug for CaptureReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureReader")
            .field("number", &self.number)
            .finish_non_exhaustive()
    }
}

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

impl CaptureReader<BufReader<std::fs::File>> {
    /// Opens a capture file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        let path = path.as_ref();
        let f = std::fs::File::open(path).map_err(|e| {
            CaptureError::Io(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", path.display()),
            ))
        })?;
        CaptureReader::new(BufReader::new(f))
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads the capture's header from `r`.
    pub fn new(mut r: R) -> Result<Self, CaptureError> {
        let mut magic = [0u8; 4];
        r.read_exact(&mut magic).map_err(|_| {
            CaptureError::Format("not a capture: shorter than a pcap header".into())
        })?;
        let chained = std::io::Cursor::new(magic).chain(r);
        // Both readers take the magic again; give it back with a chain.
        let inner = if magic == PCAPNG_MAGIC {
            Inner::PcapNg(
                PcapNgReader::new(ChainRead(chained))
                    .map_err(|e| CaptureError::Format(format!("not a valid pcapng file: {e}")))?,
            )
        } else {
            let rd = PcapReader::new(ChainRead(chained)).map_err(|_| {
                CaptureError::Format(format!(
                    "not a capture: magic number {:02x}{:02x}{:02x}{:02x} is neither pcap nor pcapng",
                    magic[0], magic[1], magic[2], magic[3]
                ))
            })?;
            let link = LinkType::from_datalink(rd.header().datalink);
            Inner::Pcap(rd, link)
        };
        Ok(CaptureReader { inner, number: 0 })
    }

    /// The next frame, `None` at the end, an error for a corrupt record.
    pub fn next_frame(&mut self) -> Option<Result<CapturedFrame, CaptureError>> {
        loop {
            match &mut self.inner {
                Inner::Pcap(r, link) => {
                    let link = *link;
                    let p = match r.next_packet()? {
                        Ok(p) => p,
                        Err(e) => {
                            return Some(Err(CaptureError::Format(format!(
                                "corrupt pcap record: {e}"
                            ))))
                        }
                    };
                    self.number += 1;
                    return Some(Ok(CapturedFrame {
                        number: self.number,
                        timestamp: p.timestamp,
                        link,
                        orig_len: p.orig_len,
                        data: p.data.into_owned(),
                    }));
                }
                Inner::PcapNg(r) => {
                    let block = match r.next_block()? {
                        Ok(b) => b,
                        Err(e) => {
                            return Some(Err(CaptureError::Format(format!(
                                "corrupt pcapng block: {e}"
                            ))))
                        }
                    };
                    let (iface, ts, orig_len, data) = match block {
                        Block::EnhancedPacket(p) => (
                            p.interface_id,
                            p.timestamp,
                            p.original_len,
                            p.data.into_owned(),
                        ),
                        Block::SimplePacket(p) => {
                            (0, Duration::ZERO, p.original_len, p.data.into_owned())
                        }
                        Block::Packet(p) => (
                            p.interface_id as u32,
                            Duration::ZERO,
                            p.original_len,
                            p.data.into_owned(),
                        ),
                        _ => continue,
                    };
                    let link = r
                        .interfaces()
                        .get(iface as usize)
                        .map(|i| LinkType::from_datalink(i.linktype))
                        .unwrap_or(LinkType::Other(u32::MAX));
                    self.number += 1;
                    return Some(Ok(CapturedFrame {
                        number: self.number,
                        timestamp: ts,
                        link,
                        orig_len,
                        data,
                    }));
                }
            }
        }
    }
}

impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<CapturedFrame, CaptureError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_frame()
    }
}

/// The reader type after the magic number was put back in front.
type Chained<R> = std::io::Chain<std::io::Cursor<[u8; 4]>, R>;

struct ChainRead<R: Read>(Chained<R>);

impl<R: Read> Read for ChainRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

/// Writes an Ethernet pcap with nanosecond timestamps.
pub struct CaptureWriter<W: Write> {
    inner: PcapWriter<W>,
}

impl<W: Write> fmt::Debug for CaptureWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureWriter").finish_non_exhaustive()
    }
}

impl CaptureWriter<std::io::BufWriter<std::fs::File>> {
    pub fn create(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        let path = path.as_ref();
        let f = std::fs::File::create(path).map_err(|e| {
            CaptureError::Io(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", path.display()),
            ))
        })?;
        CaptureWriter::new(std::io::BufWriter::new(f))
    }
}

impl<W: Write> CaptureWriter<W> {
    pub fn new(w: W) -> Result<Self, CaptureError> {
        let header = PcapHeader {
            ts_resolution: TsResolution::NanoSecond,
            datalink: DataLink::ETHERNET,
            snaplen: 65535,
            ..Default::default()
        };
        let inner =
            PcapWriter::with_header(w, header).map_err(|e| CaptureError::Format(e.to_string()))?;
        Ok(CaptureWriter { inner })
    }

    /// Appends one Ethernet frame.
    pub fn write(&mut self, timestamp: Duration, frame: &[u8]) -> Result<(), CaptureError> {
        let p = PcapPacket::new(timestamp, frame.len() as u32, frame);
        self.inner
            .write_packet(&p)
            .map(|_| ())
            .map_err(|e| CaptureError::Format(e.to_string()))
    }

    /// Flushes and returns the writer.
    pub fn into_inner(self) -> W {
        self.inner.into_writer()
    }
}
