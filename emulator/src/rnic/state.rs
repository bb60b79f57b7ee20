//! The QP state machine of IBTA 10.3 (unverified) and `ibv_modify_qp`'s attribute rules: which
//! transitions exist, and for each QP type which attributes a transition requires and which it
//! allows (the table rdma-core and the kernel's `ib_modify_qp_is_ok` enforce).
use super::verbs::{QpAttrMask as M, QpState as S, QpType as T, VerbsError};

struct Rule {
    req: [M; 3],
    opt: [M; 3],
}

const fn m(bits: &[M]) -> M {
    let mut v = 0;
    let mut i = 0;
    while i < bits.len() {
        v |= bits[i].0;
        i += 1;
    }
    M(v)
}

const NONE: M = M(0);

fn idx(t: T) -> usize {
    match t {
        T::Ud => 0,
        T::Uc => 1,
        T::Rc => 2,
    }
}

/// The rule for `cur → new`, or `None` when IBTA has no such transition.
fn rule(cur: S, new: S) -> Option<Rule> {
    use M as A;
    let r = |req: [M; 3], opt: [M; 3]| Some(Rule { req, opt });
    match (cur, new) {
        (_, S::Reset) | (_, S::Err) => r([NONE; 3], [NONE; 3]),
        (S::Reset, S::Init) => r(
            [
                m(&[A::PKEY_INDEX, A::PORT, A::QKEY]),
                m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
                m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            ],
            [NONE; 3],
        ),
        (S::Init, S::Init) => r(
            [NONE; 3],
            [
                m(&[A::PKEY_INDEX, A::PORT, A::QKEY]),
                m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
                m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            ],
        ),
        (S::Init, S::Rtr) => r(
            [
                NONE,
                m(&[A::AV, A::PATH_MTU, A::DEST_QPN, A::RQ_PSN]),
                m(&[
                    A::AV,
                    A::PATH_MTU,
                    A::DEST_QPN,
                    A::RQ_PSN,
                    A::MAX_DEST_RD_ATOMIC,
                    A::MIN_RNR_TIMER,
                ]),
            ],
            [
                m(&[A::PKEY_INDEX, A::QKEY]),
                m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
                m(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            ],
        ),
        (S::Rtr, S::Rts) => r(
            [
                m(&[A::SQ_PSN]),
                m(&[A::SQ_PSN]),
                m(&[
                    A::TIMEOUT,
                    A::RETRY_CNT,
                    A::RNR_RETRY,
                    A::SQ_PSN,
                    A::MAX_QP_RD_ATOMIC,
                ]),
            ],
            [
                m(&[A::CUR_STATE, A::QKEY]),
                m(&[
                    A::CUR_STATE,
                    A::ALT_PATH,
                    A::ACCESS_FLAGS,
                    A::PATH_MIG_STATE,
                ]),
                m(&[
                    A::CUR_STATE,
                    A::ALT_PATH,
                    A::ACCESS_FLAGS,
                    A::MIN_RNR_TIMER,
                    A::PATH_MIG_STATE,
                ]),
            ],
        ),
        (S::Rts, S::Rts) | (S::Sqd, S::Rts) => r(
            [NONE; 3],
            [
                m(&[A::CUR_STATE, A::QKEY]),
                m(&[
                    A::CUR_STATE,
                    A::ACCESS_FLAGS,
                    A::ALT_PATH,
                    A::PATH_MIG_STATE,
                ]),
                m(&[
                    A::CUR_STATE,
                    A::ACCESS_FLAGS,
                    A::ALT_PATH,
                    A::PATH_MIG_STATE,
                    A::MIN_RNR_TIMER,
                ]),
            ],
        ),
        (S::Rts, S::Sqd) => r([NONE; 3], [A::EN_SQD_ASYNC_NOTIFY; 3]),
        (S::Sqd, S::Sqd) => r(
            [NONE; 3],
            [
                m(&[A::PKEY_INDEX, A::QKEY]),
                m(&[
                    A::AV,
                    A::ALT_PATH,
                    A::ACCESS_FLAGS,
                    A::PKEY_INDEX,
                    A::PATH_MIG_STATE,
                ]),
                m(&[
                    A::PORT,
                    A::AV,
                    A::TIMEOUT,
                    A::RETRY_CNT,
                    A::RNR_RETRY,
                    A::MAX_QP_RD_ATOMIC,
                    A::MAX_DEST_RD_ATOMIC,
                    A::ALT_PATH,
                    A::ACCESS_FLAGS,
                    A::PKEY_INDEX,
                    A::MIN_RNR_TIMER,
                    A::PATH_MIG_STATE,
                ]),
            ],
        ),
        // SQE exists for UD and UC only (IBTA 10.3.1.6, unverified); RC send errors go straight to
        // ERR.
        (S::Sqe, S::Rts) => r(
            [NONE; 3],
            [
                m(&[A::CUR_STATE, A::QKEY]),
                m(&[A::CUR_STATE, A::ACCESS_FLAGS]),
                NONE,
            ],
        ),
        _ => None,
    }
}

/// Checks a `modify_qp` call: the transition `cur → new` exists for `qp_type` and `mask`
/// holds every required attribute and nothing it does not allow. `mask` includes `STATE`.
pub fn check_transition(qp_type: T, cur: S, new: S, mask: M) -> Result<(), VerbsError> {
    if qp_type == T::Rc && (cur == S::Sqe || new == S::Sqe) {
        return Err(VerbsError::Invalid(format!(
            "{cur:?} -> {new:?}: RC QPs have no SQE state"
        )));
    }
    let Some(r) = rule(cur, new) else {
        return Err(VerbsError::Invalid(format!(
            "no transition {cur:?} -> {new:?}"
        )));
    };
    let i = idx(qp_type);
    let given = mask.minus(M::STATE);
    let missing = r.req[i].minus(given);
    if missing.0 != 0 {
        return Err(VerbsError::Invalid(format!(
            "{qp_type:?} QP {cur:?} -> {new:?} requires {}",
            missing.names().join(" | ")
        )));
    }
    let extra = given.minus(r.req[i]).minus(r.opt[i]);
    if extra.0 != 0 {
        return Err(VerbsError::Invalid(format!(
            "{qp_type:?} QP {cur:?} -> {new:?} does not allow {}",
            extra.names().join(" | ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_STATES: [S; 7] = [S::Reset, S::Init, S::Rtr, S::Rts, S::Sqd, S::Sqe, S::Err];

    #[test]
    fn transition_table() {
        // (from, to) pairs IBTA allows for RC, with the minimal required mask.
        let rc_ok = [
            (S::Reset, S::Init),
            (S::Init, S::Init),
            (S::Init, S::Rtr),
            (S::Rtr, S::Rts),
            (S::Rts, S::Rts),
            (S::Rts, S::Sqd),
            (S::Sqd, S::Rts),
            (S::Sqd, S::Sqd),
        ];
        for from in ALL_STATES {
            for to in ALL_STATES {
                let exists = rule(from, to).is_some();
                let expected = to == S::Reset
                    || to == S::Err
                    || rc_ok.contains(&(from, to))
                    || (from, to) == (S::Sqe, S::Rts);
                assert_eq!(exists, expected, "{from:?} -> {to:?}");
            }
        }
        let rtr_rc = m(&[
            M::STATE,
            M::AV,
            M::PATH_MTU,
            M::DEST_QPN,
            M::RQ_PSN,
            M::MAX_DEST_RD_ATOMIC,
            M::MIN_RNR_TIMER,
        ]);
        assert!(check_transition(T::Rc, S::Init, S::Rtr, rtr_rc).is_ok());
        let e =
            check_transition(T::Rc, S::Init, S::Rtr, rtr_rc.minus(M::MIN_RNR_TIMER)).unwrap_err();
        assert!(e.to_string().contains("requires MIN_RNR_TIMER"), "{e}");
        // UC does not take MIN_RNR_TIMER or MAX_DEST_RD_ATOMIC.
        let e = check_transition(T::Uc, S::Init, S::Rtr, rtr_rc).unwrap_err();
        assert!(e.to_string().contains("does not allow"), "{e}");
        // UD needs nothing for RTR, and a Q_Key for INIT.
        assert!(check_transition(T::Ud, S::Init, S::Rtr, M::STATE).is_ok());
        assert!(check_transition(
            T::Ud,
            S::Reset,
            S::Init,
            m(&[M::STATE, M::PKEY_INDEX, M::PORT])
        )
        .is_err());
        assert!(check_transition(
            T::Ud,
            S::Reset,
            S::Init,
            m(&[M::STATE, M::PKEY_INDEX, M::PORT, M::QKEY])
        )
        .is_ok());
        // Skipping states is an error.
        assert!(check_transition(T::Rc, S::Reset, S::Rts, M::STATE).is_err());
        assert!(check_transition(T::Rc, S::Init, S::Rts, M::STATE).is_err());
        // Any state to ERR or RESET.
        for s in ALL_STATES {
            assert!(check_transition(T::Ud, s, S::Err, M::STATE).is_ok());
            assert!(check_transition(T::Ud, s, S::Reset, M::STATE).is_ok());
        }
        // SQE is UD/UC only.
        assert!(check_transition(T::Uc, S::Sqe, S::Rts, M::STATE).is_ok());
        assert!(check_transition(T::Rc, S::Sqe, S::Rts, M::STATE).is_err());
        // RC RTR -> RTS requires the retry attributes.
        let rts = m(&[
            M::STATE,
            M::TIMEOUT,
            M::RETRY_CNT,
            M::RNR_RETRY,
            M::SQ_PSN,
            M::MAX_QP_RD_ATOMIC,
        ]);
        assert!(check_transition(T::Rc, S::Rtr, S::Rts, rts).is_ok());
        assert!(check_transition(T::Rc, S::Rtr, S::Rts, rts.minus(M::RETRY_CNT)).is_err());
    }
}
