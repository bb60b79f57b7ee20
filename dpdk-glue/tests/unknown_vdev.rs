//! A `--vdev` no driver knows is an `Err` naming the device, not a crash or a silent success.
mod common;

use rocemu_dpdk::DpdkPort;

#[test]
fn an_unknown_vdev_is_an_error() {
    let (args, _rundir) = common::eal_args("unknownvdev", "--vdev=net_nosuchdriver0");
    let e = DpdkPort::open(&args).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("net_nosuchdriver0"),
        "the message names the device: {msg}"
    );
    assert_eq!(e.errno(), Some(19), "ENODEV: {e}");
    assert!(msg.contains("no driver"), "{msg}");
}
