//! EAL arguments that cannot work give an `Err` that says why, and leave the process able to
//! try again (DPDK allows another rte_eal_init after it rejected its arguments).
mod common;

use rocemu_dpdk::{DpdkPort, Eal};

#[test]
fn bad_eal_arguments_are_errors_with_a_reason() {
    // Refused before DPDK sees them.
    let e = Eal::init("--no-huge --vdev='net_ring0").unwrap_err();
    assert_eq!(e.function(), "rte_eal_init");
    assert!(e.to_string().contains("unterminated ' quote"), "{e}");
    let e = Eal::init("--no-huge --help").unwrap_err();
    assert!(e.to_string().contains("exit the process"), "{e}");
    let e = Eal::init_words(["--file-prefix=a\0b"]).unwrap_err();
    assert!(e.to_string().contains("NUL"), "{e}");

    // An option the EAL does not know.
    let (args, _rundir) = common::eal_args("badargs", "--vdev=net_ring0 --no-such-option");
    let e = DpdkPort::open(&args).unwrap_err();
    assert_eq!(e.function(), "rte_eal_init");
    assert_eq!(e.errno(), Some(22), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("Invalid argument"), "{msg}");
    assert!(
        msg.contains("--no-such-option"),
        "the message shows the arguments: {msg}"
    );
    assert!(Eal::current().is_none());

    // A value the EAL cannot parse.
    let (args, _rundir2) = common::eal_args("badargs2", "--iova-mode=sideways");
    let e = Eal::init(&args).unwrap_err();
    assert_eq!(e.errno(), Some(22), "{e}");

    // After rejected arguments the EAL can still start, once. (DPDK keeps the devices named
    // before the bad option, net_ring0 here, and probes them too.)
    let (args, _rundir3) = common::eal_args("badargs3", "--vdev=net_null0");
    let eal = Eal::init(&args).unwrap_or_else(|e| panic!("{e}"));
    let id = eal.port_by_name("net_null0").unwrap();
    let port = DpdkPort::open_port(&eal, id, &Default::default()).unwrap();
    assert_eq!(port.eth().driver(), "net_null");
    drop(port);
}
