//! Two ports joined back to back in memory: what one sends the other receives, in order, with
//! nothing lost. For tests of the engine (ARP, neighbour discovery, the threaded mode) that need
//! no root and no kernel interface.
use super::{Port, PortStats};
use rocemu_wire::eth::Mac;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

type Queue = Arc<Mutex<VecDeque<Vec<u8>>>>;

/// One end of a [`pipe`].
#[derive(Debug)]
pub struct PipePort {
    mac: Mac,
    mtu: usize,
    rx: Queue,
    tx: Queue,
    buf: Vec<u8>,
    stats: PortStats,
}

/// Two ports with MACs `a` and `b` and the given MTU, joined back to back.
pub fn pipe(a: Mac, b: Mac, mtu: usize) -> (PipePort, PipePort) {
    let (ab, ba): (Queue, Queue) = Default::default();
    let end = |mac, rx: &Queue, tx: &Queue| PipePort {
        mac,
        mtu,
        rx: rx.clone(),
        tx: tx.clone(),
        buf: vec![0; mtu + 18],
        stats: PortStats::default(),
    };
    (end(a, &ba, &ab), end(b, &ab, &ba))
}

impl PipePort {
    /// Puts a frame on this port's receive queue as if it came off the wire.
    pub fn inject(&self, frame: &[u8]) {
        self.rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(frame.to_vec());
    }
}

impl Port for PipePort {
    fn rx_burst(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> usize {
        let mut n = 0;
        while n < max {
            let Some(mut fr) = self
                .rx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front()
            else {
                break;
            };
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += fr.len() as u64;
            f(&mut fr);
            n += 1;
        }
        n
    }

    fn tx_burst(&mut self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> usize {
        let mut n = 0;
        while n < max {
            let Some(len) = fill(&mut self.buf) else {
                break;
            };
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
            self.tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(self.buf[..len].to_vec());
            n += 1;
        }
        n
    }

    fn mac(&self) -> Mac {
        self.mac
    }

    fn frame_capacity(&self) -> usize {
        self.mtu + 18
    }

    fn stats(&self) -> PortStats {
        self.stats
    }

    fn name(&self) -> String {
        format!("pipe:{}", self.mac)
    }
}
