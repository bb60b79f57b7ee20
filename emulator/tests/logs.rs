//! Logs (`rocemu_emulator::logs`): the events a NAK, a local ACK timeout, an RNR wait and the QP
//! state machine produce, each inside its QP's span (the QPN and the device's address), caught
//! by a collecting subscriber in virtual time; and the level filter (`logs_init.rs`: installing
//! the stderr subscriber).
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::inproc::IP_A;
use rocemu_emulator::rnic::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::{Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

const PSN_A: u32 = 0x123;

/// One event as caught: its level, message, fields, and the fields of the spans it is in
/// (innermost last, so a QP's `qpn` and `dev` are there).
#[derive(Debug, Clone)]
struct Ev {
    level: Level,
    msg: String,
    f: BTreeMap<String, String>,
    span: BTreeMap<String, String>,
}

impl Ev {
    fn field(&self, k: &str) -> &str {
        self.f.get(k).map(String::as_str).unwrap_or("")
    }
    fn qpn(&self) -> &str {
        self.span.get("qpn").map(String::as_str).unwrap_or("")
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

/// A layer that keeps every event it sees.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<Ev>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Collect {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        if let Some(s) = ctx.span(id) {
            s.extensions_mut().insert(f);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let msg = f.0.remove("message").unwrap_or_default();
        let mut span = BTreeMap::new();
        if let Some(scope) = ctx.event_scope(event) {
            for s in scope.from_root() {
                if let Some(sf) = s.extensions().get::<Fields>() {
                    span.extend(sf.0.clone());
                }
            }
        }
        self.0.lock().unwrap().push(Ev {
            level: *event.metadata().level(),
            msg,
            f: f.0,
            span,
        });
    }
}

/// Runs `f` with a collecting subscriber at `max` as this thread's default; returns what `f`
/// returns and the events.
fn caught<R>(max: Level, f: impl FnOnce() -> R) -> (R, Vec<Ev>) {
    let c = Collect::default();
    let sub = tracing_subscriber::registry()
        .with(c.clone())
        .with(tracing_subscriber::filter::LevelFilter::from_level(max));
    let r = tracing::subscriber::with_default(sub, f);
    let evs = c.0.lock().unwrap().clone();
    (r, evs)
}

fn named<'a>(evs: &'a [Ev], msg: &str) -> Vec<&'a Ev> {
    evs.iter().filter(|e| e.msg == msg).collect()
}

fn hex(q: rocemu_wire::Qpn) -> String {
    format!("0x{:06x}", q.value())
}

#[test]
fn state_changes_carry_the_qpn_and_the_reason() {
    let (qpns, evs) = caught(Level::DEBUG, || {
        let mut t = BedCfg::new(QpType::Rc).build();
        let (qa, qb) = (t.qpn(A), t.qpn(B));
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        t.p.a.modify_qp(qa, &attr, QpAttrMask::STATE).unwrap();
        (qa, qb)
    });
    let (qa, qb) = (hex(qpns.0), hex(qpns.1));
    let created = named(&evs, "QP created");
    assert_eq!(
        created.iter().map(|e| e.qpn()).collect::<Vec<_>>(),
        vec![qa.as_str(), qb.as_str()]
    );
    assert_eq!(created[0].span.get("type").map(String::as_str), Some("RC"));
    assert_eq!(
        created[0].span.get("dev").map(String::as_str),
        Some(IP_A.to_string().as_str())
    );
    let changes = |q: &str| {
        named(&evs, "QP state changed")
            .iter()
            .filter(|e| e.qpn() == q)
            .map(|e| (e.field("from").to_string(), e.field("to").to_string()))
            .collect::<Vec<_>>()
    };
    let up = vec![
        ("Reset".to_string(), "Init".to_string()),
        ("Init".to_string(), "Rtr".to_string()),
        ("Rtr".to_string(), "Rts".to_string()),
    ];
    assert_eq!(changes(&qa), up);
    assert_eq!(changes(&qb), up);
    let err = named(&evs, "QP to ERR");
    assert_eq!(err.len(), 1, "{err:?}");
    assert_eq!(err[0].qpn(), qa);
    assert_eq!(err[0].level, Level::DEBUG, "asked for: not a warning");
    assert_eq!(err[0].field("reason"), "modify_qp");
    assert_eq!(err[0].field("from"), "Rts");
}

#[test]
fn a_sequence_nak_is_logged_sent_received_and_retransmitted() {
    // As rc_naks.rs: the first of five SEND packets is lost; B NAKs once, A goes back.
    let ((qa, qb), evs) = caught(Level::DEBUG, || {
        let mut t = BedCfg::new(QpType::Rc).both(|o| o.mtu = Mtu::M256).build();
        t.post_recv(B, 7, 0x10000, 1280);
        let mut dropped = false;
        t.filter = Box::new(move |p| {
            if p.dir == Dir::AB && p.psn == PSN_A && !dropped {
                dropped = true;
                Verdict::Drop
            } else {
                Verdict::Pass
            }
        });
        t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 1280)]));
        let (wa, _) = t.settle();
        assert_eq!(st(&wa), vec![(1, WcStatus::Success)]);
        (t.qpn(A), t.qpn(B))
    });
    let (qa, qb) = (hex(qa), hex(qb));
    let sent = named(&evs, "NAK sent");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].qpn(), qb, "sent by the responder's QP");
    assert_eq!(sent[0].field("psn"), PSN_A.to_string());
    assert_eq!(sent[0].field("syndrome"), "NAK PSN-sequence-error");
    let got = named(&evs, "NAK received");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].qpn(), qa);
    assert_eq!(got[0].field("code"), "PsnSequenceError");
    let back = named(&evs, "go-back-N: retransmitting");
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0].qpn(), qa);
    assert_eq!(back[0].field("reason"), "Nak");
    assert_eq!(back[0].field("from_psn"), PSN_A.to_string());
    assert!(
        evs.iter().all(|e| e.level > Level::WARN),
        "nothing failed: no warning"
    );
}

#[test]
fn local_ack_timeouts_then_retry_exhaustion() {
    // As rc_retry.rs: everything A sends is lost; retry_cnt 3 gives three go-backs after
    // timeouts, then RETRY_EXC_ERR and ERR at the fourth timeout.
    let (qa, evs) = caught(Level::DEBUG, || {
        let mut t = BedCfg::new(QpType::Rc)
            .both(|o| {
                o.timeout = 10;
                o.retry_cnt = 3;
            })
            .build();
        t.filter = drop_dir(Dir::AB);
        t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
        let (wa, _) = t.settle();
        assert_eq!(st(&wa), vec![(1, WcStatus::RetryExcErr)]);
        t.qpn(A)
    });
    let qa = hex(qa);
    let back = named(&evs, "go-back-N: retransmitting");
    assert_eq!(
        back.iter()
            .map(|e| (e.qpn(), e.field("reason"), e.field("retry_left")))
            .collect::<Vec<_>>(),
        vec![
            (qa.as_str(), "Timeout", "2"),
            (qa.as_str(), "Timeout", "1"),
            (qa.as_str(), "Timeout", "0")
        ]
    );
    let failed = named(&evs, "send work request failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].level, Level::WARN);
    assert_eq!(failed[0].qpn(), qa);
    assert_eq!(failed[0].field("status"), "RetryExcErr");
    assert_eq!(failed[0].field("wr_id"), "1");
    let err = named(&evs, "QP to ERR");
    assert_eq!(err.len(), 1, "{err:?}");
    assert_eq!(err[0].level, Level::WARN);
    assert_eq!(
        err[0].field("reason"),
        "a send work request failed: RetryExcErr"
    );
}

#[test]
fn an_rnr_nak_is_a_wait_then_a_retransmission() {
    // No receive posted: B RNR-NAKs with min_rnr_timer 14 (1280 µs); A waits, then sends again.
    let ((qa, qb), evs) = caught(Level::DEBUG, || {
        let mut t = BedCfg::new(QpType::Rc)
            .both(|o| {
                o.min_rnr_timer = 14;
                o.rnr_retry = 3;
            })
            .build();
        t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 100)]));
        t.flush_now();
        t.post_recv(B, 9, 0, 1000);
        let w = t.wait_wcs(A, 1);
        assert_eq!(st(&w), vec![(1, WcStatus::Success)]);
        (t.qpn(A), t.qpn(B))
    });
    let (qa, qb) = (hex(qa), hex(qb));
    let sent = named(&evs, "NAK sent");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].qpn(), qb);
    assert_eq!(sent[0].field("syndrome"), "RNR-NAK timer=14 (1280us)");
    let wait = named(&evs, "RNR NAK received: waiting");
    assert_eq!(wait.len(), 1, "{wait:?}");
    assert_eq!(wait[0].qpn(), qa);
    assert_eq!(wait[0].field("wait_us"), "1280");
    assert_eq!(wait[0].field("rnr_left"), "2");
    let back = named(&evs, "go-back-N: retransmitting");
    assert_eq!(
        back.iter()
            .map(|e| (e.qpn(), e.field("reason")))
            .collect::<Vec<_>>(),
        vec![(qa.as_str(), "RnrWaitOver")]
    );
}

#[test]
fn the_level_filter_keeps_debug_events_out() {
    // The same timeout run at WARN: the failure and ERR only, no per-retransmission events.
    let (_, evs) = caught(Level::WARN, || {
        let mut t = BedCfg::new(QpType::Rc)
            .both(|o| {
                o.timeout = 10;
                o.retry_cnt = 1;
            })
            .build();
        t.filter = drop_dir(Dir::AB);
        t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
        t.settle();
    });
    assert_eq!(
        evs.iter().map(|e| e.msg.as_str()).collect::<Vec<_>>(),
        vec!["send work request failed", "QP to ERR"]
    );
    assert!(
        evs.iter().all(|e| !e.qpn().is_empty()),
        "the QP span exists at WARN too"
    );
}
