//! An EAL that finds no device: opening a port says how to give it one; the EAL is cleaned up
//! with the failed open and cannot be initialised again in this process.
mod common;

use rocemu_dpdk::{DpdkPort, Eal};

#[test]
fn no_device_is_an_error_that_says_what_to_do() {
    let (args, _rundir) = common::eal_args("noport", "");
    let e = DpdkPort::open(&args).unwrap_err();
    assert_eq!(e.function(), "rte_eth_find_next");
    let msg = e.to_string();
    assert!(msg.contains("no DPDK port"), "{msg}");
    assert!(msg.contains("--vdev"), "{msg}");
    assert!(msg.contains(rocemu_dpdk::PMD_DIR), "{msg}");

    assert!(
        Eal::current().is_none(),
        "the EAL went with the failed open"
    );
    let (args, _rundir2) = common::eal_args("noport2", "--vdev=net_ring0");
    let e = Eal::init(&args).unwrap_err();
    assert!(e.to_string().contains("cleaned up"), "{e}");
}
