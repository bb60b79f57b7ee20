//! Logs: `tracing` events at the rare points of the transport, and the one place that turns
//! them on from the environment.
//!
//! Invariants:
//! * Off by default and free when off. Nothing is printed unless [`init_from_env`] found
//!   `ROCEMU_LOG` or `RUST_LOG`. Events are emitted only where something rare happens — a QP's
//!   state change, a NAK sent or received, a go-back-N retransmission and why, an RNR wait, a
//!   work request failing, a CM state change, REJ or timeout, an address not resolved — never
//!   once per packet on the path a healthy transfer takes; each first tests the level against
//!   the global maximum (one relaxed atomic load: the `qp_event!` macro does nothing else when off).
//! * Every QP has a span (`qp{dev=… qpn=0x… type=…}`, made at `create_qp`, kept across RESET,
//!   closed with the QP); its events are emitted inside it, so a filter can pick one QP:
//!   `RUST_LOG='[qp{qpn=0x00a3f1}]=debug'`. With no subscriber the span is an empty handle.
//! * Logs never change what the core does: no event reads anything the core would not, and the
//!   core stays sans-IO (the subscriber, outside it, reads the clock and writes stderr).
//!
//! Levels: `warn` for what ends a QP or a connection (a work request failed, a fatal NAK, the
//! CM giving up, an address not resolved), `debug` for state changes, NAKs, retransmissions and
//! RNR waits, `trace` for the CM's retransmitted MADs.

/// An event about one QP, inside the QP's span: `qp_event!(qp, DEBUG, psn = %p, "NAK sent")`.
/// When the level is off (no subscriber: always) it costs the level test and nothing else: the
/// span is not entered and no field is evaluated.
macro_rules! qp_event {
    ($qp:expr, $lvl:ident, $($arg:tt)+) => {
        if ::tracing::level_enabled!(::tracing::Level::$lvl) {
            let _in = $qp.span.enter();
            ::tracing::event!(::tracing::Level::$lvl, $($arg)+);
        }
    };
}
pub(crate) use qp_event;

/// The environment variables read, first found first: `ROCEMU_LOG` (a program under `rocemu
/// exec` may use `RUST_LOG` for itself), then `RUST_LOG`.
pub const ENV_VARS: [&str; 2] = ["ROCEMU_LOG", "RUST_LOG"];

/// Installs a subscriber that writes the events to stderr, filtered as `RUST_LOG` filters
/// (`tracing_subscriber::EnvFilter`: `debug`, `rocemu_emulator=debug`,
/// `rocemu_emulator::rnic::completer=debug,warn`, `[qp{qpn=0x00a3f1}]=trace`), when
/// `ROCEMU_LOG` or `RUST_LOG` is set and not empty; otherwise does nothing. Never fails: a
/// directive that does not parse is reported on stderr and left out, and when the process
/// already has a global subscriber that one stays. Returns true when it installed one.
pub fn init_from_env() -> bool {
    let Some(spec) = ENV_VARS
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
    else {
        return false;
    };
    init_with(&spec)
}

/// [`init_from_env`] with the filter given: installs the stderr subscriber with the directives
/// of `spec` (those that parse). Returns false when a global subscriber was already set.
pub fn init_with(spec: &str) -> bool {
    use tracing_subscriber::EnvFilter;
    let mut filter = EnvFilter::default();
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        match d.parse() {
            Ok(dir) => filter = filter.add_directive(dir),
            Err(e) => eprintln!("rocemu: log filter: ignoring {d:?}: {e}"),
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init()
        .is_ok()
}

/// The span of a QP's events: its device's first address, its QPN (as `0x` and six hex
/// digits, the way the tools print it) and its transport. An empty handle, made at the cost of
/// one test, when nothing listens. At level ERROR so that it exists whenever any of its events
/// may be printed.
pub(crate) fn qp_span(
    dev: Option<&std::net::IpAddr>,
    qpn: rocemu_wire::Qpn,
    ty: crate::rnic::QpType,
) -> tracing::Span {
    use crate::rnic::QpType;
    let transport = match ty {
        QpType::Rc => "RC",
        QpType::Uc => "UC",
        QpType::Ud => "UD",
    };
    match dev {
        Some(ip) => tracing::error_span!("qp", dev = %ip, qpn = %qpn, r#type = %transport),
        None => tracing::error_span!("qp", qpn = %qpn, r#type = %transport),
    }
}
