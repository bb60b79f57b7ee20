//! Ports move whole Ethernet frames. The in-process wire lives in [`wire`].
pub mod wire;
