//! Where the specification states the rules the scenarios check, and what confirms each number.
//!
//! The IBTA's specification is for members only, and its numbering moves between releases
//! (Modify QP is 11.2.4.2 in 1.2.1 and 11.2.5.2 later), so a section number nobody can check
//! is worth little. Every citation here says which release its number belongs to and names a
//! public text that ties the number to the rule — the Annex A17 text, which is public in full,
//! or the specification's own words and numbers as Linux's drivers, the linux-rdma list or
//! python-rdma's tables quote them. A number no source confirmed stays, as the best guess, but
//! is marked [`Source::Unverified`], and every report says so.
//!
//! Invariant: every scenario has at least one citation, and every citation has a release from
//! [`RELEASES`] and either a named source or the explicit unverified mark (the test below).

/// One rule a scenario checks, and where it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cite {
    /// A section, compliance statement or table: `9.7.4.1.5`, `C9-88`, `A17.3.4`, `Table 45`.
    pub clause: &'static str,
    /// What the clause says, in a few words.
    pub rule: &'static str,
    /// The document and release the number belongs to: one of [`RELEASES`].
    pub release: &'static str,
    pub source: Source,
}

/// What confirms a citation's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A public text that ties the number to the rule, named so that a reader can find it.
    Checked(&'static str),
    /// No public text that confirms the number was found: the catalogue's best guess, never to
    /// be presented as checked.
    Unverified,
}

/// The releases a citation may name. `not stated`: the source confirms the number but names no
/// release (its date is in the source's text), or, for an unverified citation, nothing does.
pub const RELEASES: &[&str] = &[
    "1.2.1",
    "1.3",
    "1.4",
    "1.5",
    "A17 (2014)",
    "ReDMArk (2021)",
    "not stated",
];

impl Cite {
    pub fn verified(&self) -> bool {
        matches!(self.source, Source::Checked(_))
    }

    /// The citation in a few words, for the reports' `spec` column: clause, rule, and the
    /// release, or `unverified`.
    pub fn short(&self) -> String {
        let doc = if self.clause.starts_with("A17") {
            "IBTA Annex "
        } else if self.clause.starts_with("ReDMArk") {
            ""
        } else {
            "IBTA Vol.1 "
        };
        match self.source {
            Source::Checked(_) => format!("{doc}{} {} [{}]", self.clause, self.rule, self.release),
            Source::Unverified => format!("{doc}{} {} [unverified]", self.clause, self.rule),
        }
    }
}

/// The `spec` text of a scenario's citations, as the reports have always carried it.
pub fn spec_text(cites: &[Cite]) -> String {
    cites.iter().map(Cite::short).collect::<Vec<_>>().join("; ")
}

// The sources, once each.

const A17_TEXT: &str = "the Annex A17 text (RoCEv2, supplement to Vol. 1 Release 1.2.1, \
    September 2, 2014), public in full";

const fn a17(clause: &'static str, rule: &'static str) -> Cite {
    Cite {
        clause,
        rule,
        release: "A17 (2014)",
        source: Source::Checked(A17_TEXT),
    }
}

/// A number no source confirmed: kept as the best guess, marked as such.
const fn guess(clause: &'static str, rule: &'static str) -> Cite {
    Cite {
        clause,
        rule,
        release: "not stated",
        source: Source::Unverified,
    }
}

// Annex A17 (RoCEv2).

pub const A17_IPV4: Cite = a17(
    "A17.3.1.1",
    "RoCEv2 with IPv4: the IPv4 header per RFC 791 (CA17-3 … CA17-12)",
);
pub const A17_UDP_DPORT: Cite = a17(
    "A17.3.2.2",
    "CA17-20: UDP destination port, the IANA value for RoCEv2 (4791)",
);
pub const A17_ICRC: Cite = a17(
    "A17.3.3",
    "CA17-22: the ICRC, with the variant IP fields and the UDP checksum masked",
);
pub const A17_VALIDATE: Cite = a17(
    "A17.3.4",
    "CA17-23: inbound RoCEv2 packets validated as the base specification says",
);
pub const A17_DROP: Cite = a17(
    "A17.3.4",
    "CA17-24: a packet breaking the IP, UDP or ICRC rules is silently dropped",
);
pub const A17_ADDR: Cite = a17(
    "A17.4.4.2",
    "address validation of base 9.6.1.2.3 on the IP addresses as GIDs",
);
pub const A17_PKEY: Cite = a17(
    "A17.4.7",
    "the BTH P_Key is validated as chapter 9 requires",
);
pub const A17_UD_GRH: Cite = a17(
    "A17.4.5.2",
    "a UD receive buffer starts with the 40-byte GRH area (base 11.4.1.2)",
);

// Base specification, confirmed.

pub const BTH: Cite = Cite {
    clause: "9.2",
    rule: "BTH: PadCnt, TVer, P_Key, 24-bit PSN",
    release: "1.2.1",
    source: Source::Checked("python-rdma (jgunthorpe/python-rdma), codegen/iba_transport.xml, January 2011 (1.2.1 was then the newest release): sect=\"9.2\" for HdrBTH (padCnt, TVer, PKey, a 24-bit PSN)"),
};
pub const DETH: Cite = Cite {
    clause: "9.3.2",
    rule: "DETH: Q_Key and source QP",
    release: "1.2.1",
    source: Source::Checked("python-rdma (jgunthorpe/python-rdma), codegen/iba_transport.xml, January 2011 (1.2.1 was then the newest release): sect=\"9.3.2\" for HdrDETH (QKey, srcQP)"),
};
pub const ATOMIC_ETH: Cite = Cite {
    clause: "9.3.4",
    rule: "AtomicETH",
    release: "1.2.1",
    source: Source::Checked("python-rdma (jgunthorpe/python-rdma), codegen/iba_transport.xml, January 2011 (1.2.1 was then the newest release): sect=\"9.3.4\" for HdrAtomicETH"),
};
pub const AETH: Cite = Cite {
    clause: "9.3.5",
    rule: "AETH: syndrome and MSN",
    release: "1.2.1",
    source: Source::Checked("python-rdma (jgunthorpe/python-rdma), codegen/iba_transport.xml, January 2011 (1.2.1 was then the newest release): sect=\"9.3.5\" for HdrAETH (syndrome, MSN)"),
};
pub const IMMDT: Cite = Cite {
    clause: "9.3.6",
    rule: "ImmDt",
    release: "1.2.1",
    source: Source::Checked("python-rdma (jgunthorpe/python-rdma), codegen/iba_transport.xml, January 2011 (1.2.1 was then the newest release): sect=\"9.3.6\" for HdrImmDt (its sect=\"9.3.7\" is HdrIETH)"),
};
pub const ATOMIC_ACK_ETH: Cite = Cite {
    clause: "9.5.3",
    rule: "AtomicAckETH: the original value",
    release: "1.2.1",
    source: Source::Checked("python-rdma (jgunthorpe/python-rdma), codegen/iba_transport.xml, January 2011 (1.2.1 was then the newest release): sect=\"9.5.3\" for HdrAtomicAckETH"),
};
pub const READ_RETRY: Cite = Cite {
    clause: "9.4.4",
    rule: "RDMA READ: a retried READ need not start at the same address nor have the same length",
    release: "1.2.1",
    source: Source::Checked(
        "pib (github nminoru/pib), driver/pib_rc.c, 2013: \"IBA Spec. Vol.1 9.4.4 states … \
         Retried RDMA READ Requests need not start at the same address nor have the same \
         length as the original RDMA READ\"",
    ),
};
pub const PKEY_C9_43: Cite = Cite {
    clause: "C9-43",
    rule: "the P_Key of a packet to a QP other than QP0/QP1 must match the QP's",
    release: "1.2.1",
    source: Source::Checked(
        "pib (github nminoru/pib), driver/pib_thread.c, 2014: the check of the QP's P_Key \
         under \"C9-43\", after \"C9-41\" (QP0) and \"C9-42\" (QP1)",
    ),
};
pub const ADDR_VALIDATION: Cite = Cite {
    clause: "9.6.1.2.3",
    rule: "L3 address validation of inbound packets",
    release: "1.2.1",
    source: Source::Checked(
        "the Annex A17 text, A17.4.4.2: \"L3 Address validation rules for inbound packets \
         (InfiniBand Specification Vol. 1 Rev 1.2.1 Section 9.6.1.2.3)\"",
    ),
};
pub const RESPONDER_CHECKS: Cite = Cite {
    clause: "9.7.4.1",
    rule: "the responder's checks of a request (opcode sequence among them)",
    release: "1.5",
    source: Source::Checked(
        "the linux-rdma list, Daisuke Matsuda, 2022, on rxe's check_rkey(): \"I referred to IB \
         Specification Vol 1-Release-1.5-2021-08-06b. The behaviour of responder on receiving \
         a packet is described in 9.7.4.1\"",
    ),
};
pub const RKEY_VALIDATION: Cite = Cite {
    clause: "9.7.4.1.5",
    rule: "responder R_Key validation: key, PD, access, bounds",
    release: "1.5",
    source: Source::Checked(
        "the linux-rdma list, Li Zhijian, 2022, review of \"RDMA/rxe: Make responder handle \
         RDMA Read failures\" (written against Revision 1.5): \"9.7.4.1.5 RESPONDER R_KEY \
         VALIDATION\"",
    ),
};
pub const ZERO_LENGTH_C9_88: Cite = Cite {
    clause: "9.7.4.1.5, C9-88",
    rule: "a zero-length RDMA READ or WRITE does not validate the R_Key",
    release: "1.5",
    source: Source::Checked(
        "Linux drivers/infiniband/ulp/srpt/ib_srpt.c, srpt_zerolength_write(): \"A quote from \
         the InfiniBand specification: C9-88: For an HCA responder using Reliable Connection \
         service, for each zero-length RDMA READ or WRITE request, the R_Key shall not be \
         validated, even if the request includes Immediate data\"; the linux-rdma list, \
         Daisuke Matsuda, 2022: \"justified by 9.7.4.1.5 C9-88\" in Release 1.5",
    ),
};
pub const LENGTH_VALIDATION: Cite = Cite {
    clause: "9.7.4.1.6",
    rule: "responder packet length validation: payload and DMA length",
    release: "1.5",
    source: Source::Checked(
        "the linux-rdma list, Daisuke Matsuda, \"[PATCH] RDMA/rxe: Implement packet length \
         validation on responder\", October 2022: \"I referred to IB Specification Vol \
         1-Revision-1.5 to create this patch. Please see 9.7.4.1.6 (page.330)\"",
    ),
};
pub const LENGTH_C9_92: Cite = Cite {
    clause: "C9-92",
    rule: "FIRST and MIDDLE carry exactly the path MTU, ONLY and LAST at most",
    release: "1.5",
    source: Source::Checked(
        "Linux drivers/infiniband/sw/rxe/rxe_resp.c, rxe_resp_check_length() (2022, fixing the \
         1.5-based patch above): \"See IBA C9-92\" over the checks \"first or middle packet \
         not mtu\", \"only packet too long\", \"last packet zero or too long\"",
    ),
};
pub const COALESCED_ACK: Cite = Cite {
    clause: "9.7.5.1.2",
    rule: "coalesced acknowledge: a response acknowledges every earlier request",
    release: "1.2.1",
    source: Source::Checked(
        "pib (github nminoru/pib), driver/pib_rc.c, 2013: \"IBA Spec. Vol.1 9.7.5.1.2. \
         Coalesced Acknowledge Messages\"; the linux-rdma list, Bob Pearson: \"look at IBA \
         9.7.5.1.2 Coalesced Acknowledge Messages. Any response carrying a packet sequence \
         number implicitly acks all request packets with a PSN smaller than the one carried\"",
    ),
};
pub const DUP_C9_105: Cite = Cite {
    clause: "C9-105",
    rule: "a duplicate SEND or WRITE is acknowledged again, not executed again",
    release: "not stated",
    source: Source::Checked(
        "Linux drivers/infiniband/sw/rxe/rxe_resp.c, duplicate_request(): \"SEND. Ack again \
         and cleanup. C9-105.\" for duplicate SENDs and WRITEs",
    ),
};
pub const MSN_C9_148: Cite = Cite {
    clause: "C9-148",
    rule: "the MSN counts messages (an RDMA READ counts when it is executed)",
    release: "not stated",
    source: Source::Checked(
        "Linux drivers/infiniband/sw/rxe/rxe_resp.c, execute(): \"For RDMA Read we can \
         increment the msn now. See C9-148.\"",
    ),
};
pub const REMOTE_ACCESS_NAK: Cite = Cite {
    clause: "9.7.5.2.4",
    rule: "NAK remote access error",
    release: "1.5",
    source: Source::Checked(
        "the linux-rdma list, Li Zhijian, 2022 (Revision 1.5): \"see 9.7.5.2.4 REMOTE ACCESS \
         ERROR\"; Daisuke Matsuda's patch: \"Please see Ch.9.7.5.2.4, Ch.9.7.4.1.5\"",
    ),
};
pub const LOCAL_ACK_TIMEOUT: Cite = Cite {
    clause: "9.7.6.1.3",
    rule: "local ACK timeout: 4.096 µs × 2^timeout, 0 for none",
    release: "1.2.1",
    source: Source::Checked(
        "pib (github nminoru/pib), driver/pib_lib.c, 2013: \"IBA Spec. Vol.1 9.7.6.1.3\" over \
         its table of local ACK timeouts (8192 ns for 1, doubling; 0 is infinity)",
    ),
};
pub const RNR_TIMER_TABLE: Cite = Cite {
    clause: "Table 45",
    rule: "encoding for the RNR NAK timer field",
    release: "not stated",
    source: Source::Checked(
        "Linux drivers/infiniband/core/cma.c, rdma_set_min_rnr_timer() (2021): \"5-bit value \
         encoded as Table 45: \\\"Encoding for RNR NAK Timer Field\\\" in the IBTA \
         specification\"",
    ),
};
pub const WRITE_NO_IMM_C10_87: Cite = Cite {
    clause: "10.7.2.2, C10-87",
    rule: "an RDMA WRITE consumes a receive WQE only when it carries immediate data",
    release: "1.2.1",
    source: Source::Checked(
        "pib (github nminoru/pib), driver/pib_rc.c, 2013: \"IBA Spec. Vol.1 10.7.2.2 states … \
         C10-87: The responder's Receive Queue shall not consume a Work Request when Immediate \
         Data is not specified in an incoming RDMA Write\"",
    ),
};
pub const MODIFY_QP: Cite = Cite {
    clause: "11.2.4.2",
    rule: "Modify Queue Pair: the attributes each transition requires (table 91)",
    release: "1.2.1",
    source: Source::Checked(
        "Linux drivers/infiniband/ulp/srp/ib_srp.c, srp_compute_rq_tmo(): \"According to \
         section 11.2.4.2 in the IBTA spec (Modify Queue Pair, table 91)\"; the Annex A17 text \
         (a supplement to 1.2.1) cites \"Section 11.2.4.2\" with the Address Vector. Issue 20: \
         11.2.5.2 in later releases",
    ),
};
pub const POST_RECV: Cite = Cite {
    clause: "11.4.1.2",
    rule: "Post Receive Request (the verb whose QP-state rule is checked)",
    release: "1.2.1",
    source: Source::Checked(
        "the Annex A17 text, A17.4.5.2: the receive buffers posted to a UD QP \"(as per the \
         InfiniBand Spec Section 11.4.1.2)\"",
    ),
};
pub const POLL_CQ: Cite = Cite {
    clause: "11.4.2.1",
    rule: "Poll for Completion: what a completion holds",
    release: "1.2.1",
    source: Source::Checked(
        "the Annex A17 text, A17.4.5.1: \"the Completion Queue Entry (CQE) includes remote \
         address information (InfiniBand Specification Vol. 1 Rev 1.2.1 Section 11.4.2.1)\"",
    ),
};

// ReDMArk (Rothenberger, Taranov, Perrig, Hoefler: "ReDMArk: Bypassing RDMA Security
// Mechanisms", USENIX Security 2021).

const REDMARK: &str = "the ReDMArk paper (USENIX Security 2021; its text at docslib.org): \
    \"any entity that obtains or guesses [access tokens] can read and write memory\", \
    \"attacks such as packet injection using impersonation, unauthorized memory access\"";

const fn redmark(rule: &'static str) -> Cite {
    Cite {
        clause: "ReDMArk",
        rule,
        release: "ReDMArk (2021)",
        source: Source::Checked(REDMARK),
    }
}

pub const REDMARK_KEYS: Cite = redmark("guessed memory keys read and write memory");
pub const REDMARK_INJECT: Cite = redmark("packet injection by impersonation (QPN, PSN)");
pub const REDMARK_ACCESS: Cite = redmark("unauthorized memory access");

// Unverified: the catalogue's numbers that no public source confirmed. Where a source shows the
// number to mean something else, the rule says so.

pub const HDR_VALIDATION: Cite = guess("9.6.1.1", "transport header validation");
pub const PKEY_CHECK: Cite = guess("10.9.1", "P_Key check");
pub const PKEY_MATCHING: Cite = guess("10.9.3", "P_Key matching: one full member suffices");
pub const OPCODE_SEQUENCE: Cite = guess("C9-91", "opcode sequence of a message");
pub const WRITE_LENGTH: Cite = guess("C9-95", "the payload completes the RETH length");
pub const RECV_TOO_SHORT: Cite = guess(
    "9.7.5.1.6",
    "a SEND longer than its receive is a length error (the old C9-140: issue 20 says that is the transport timer)",
);
pub const LOCAL_LENGTH_ERROR: Cite = guess("10.10.2.2", "the completion error and the QP to ERR");
pub const NAK_ONCE: Cite = guess("C9-112", "one NAK per sequence error, re-armed by progress");
pub const DUP_READ: Cite = guess("C9-106", "a duplicate READ is executed again");
pub const DUP_ATOMIC: Cite = guess(
    "C9-107",
    "a duplicate atomic is answered from its saved result",
);
pub const ATOMICS: Cite = guess("9.4.5", "atomic operations");
pub const ATOMIC_ALIGN: Cite = guess("C9-68", "atomics are 8-byte aligned");
pub const PSN_MODULO: Cite = guess("9.7.1", "PSNs compared modulo 2^24");
pub const RESPONSE_PSNS: Cite = guess("9.7.2", "a READ response takes one PSN per packet");
pub const READ_RESPONSES: Cite = guess("9.7.5.1.5", "read responses, AETH on FIRST, LAST, ONLY");
pub const QP_ACCESS: Cite = guess("10.2.3", "the QP's remote access flags");
pub const MR_ACCESS: Cite = guess("10.6.3.1", "the MR's access rights");
pub const RKEY_CHECKS: Cite = guess("9.4.4.3", "R_Key checks of RDMA operations");
pub const ERROR_CLASSES: Cite = guess("9.9.3.1", "responder error classes; the QP to ERR");
pub const COMPLETION_STATUS: Cite = guess("11.6.2", "completion status codes");
pub const IMPLIED_NAK: Cite = guess("9.7.5.2.1", "implied NAK");
pub const BAD_RESPONSE: Cite = guess("9.7.5.2.5", "responses out of sequence");
pub const RNR_NAK: Cite = guess("9.7.5.2.8", "RNR NAK: timer and retry counter");
pub const ACK_GENERATION: Cite = guess("9.7.5.1.1", "generating acknowledgements");
pub const MSN_SECTION: Cite = guess("9.7.7.1", "the MSN (issue 20's number; read in no source)");
pub const QKEY: Cite = guess("10.2.4", "Q_Key check of a datagram");
pub const ACK_COVERS: Cite = guess("9.7.5.2.2", "an ACK acknowledges every earlier request");
pub const SEQ_NAK_GO_BACK: Cite = guess("9.7.5.2.3", "NAK sequence error: resend from its PSN");
pub const RETRY_COUNTER: Cite = guess(
    "9.7.6.1.3",
    "retry_cnt: retries after the timeout, then RETRY_EXC_ERR (pib ties 9.7.6.1.3 to the timeout only)",
);
pub const QP_STATES: Cite = guess("10.3.1", "QP state transitions");
pub const POST_SEND: Cite = guess("11.4.1.1", "Post Send Request: QP state");
pub const DEREGISTER: Cite = guess("11.2.8.3", "deregistration invalidates the keys");
pub const RKEY_VALUE: Cite = guess(
    "10.6.3.3",
    "the R_Key's value is the device's choice (pib names 10.6.3.3 \"Local Access Keys\")",
);
pub const QPN_VALUE: Cite = guess("10.2.1", "the QPN is the device's choice");
pub const REP_PSN: Cite = guess("12.6.8", "the REP's Starting PSN");
pub const IMM_RECEIVE: Cite = guess("9.4.4.1, 9.7.5.1.7", "RDMA WRITE with immediate data");
pub const SEND_ZERO: Cite = guess("9.4.1", "SEND: a message may carry zero bytes");
pub const GHOST_RESPONSE: Cite = guess(
    "C9-117",
    "a response whose PSN matches no outstanding request (a ghost) is ignored",
);
pub const UC_NO_ACK: Cite = guess("9.8.2", "UC: no acknowledgements, no retransmissions");
pub const UC_DROP: Cite = guess(
    "9.8.2.2",
    "UC: a PSN gap or an opcode out of sequence drops the message in progress; the next FIRST or ONLY starts anew",
);
pub const UC_ERROR_SILENT: Cite = guess(
    "9.8.2.2",
    "UC: a request in error is dropped silently; the QP stays in RTS",
);
pub const UD_RULES: Cite = guess(
    "9.8.3",
    "UD: one packet a message, the DETH's Q_Key and source QP",
);
pub const CONTROLLED_QKEY: Cite = guess(
    "C10-15",
    "a UD send whose Q_Key has the high bit set sends the QP's own Q_Key (issue 20's number)",
);

// ---- RC responder, UC and UD (issue 20) ----

const PYRDMA: &str =
    "python-rdma (jgunthorpe/python-rdma), codegen/iba_transport.xml, January 2011 \
    (1.2.1 was then the newest release)";

pub const BTH_SE: Cite = Cite {
    clause: "9.2",
    rule: "BTH SE: the solicited event bit",
    release: "1.2.1",
    source: Source::Checked(
        "python-rdma (jgunthorpe/python-rdma), codegen/iba_transport.xml, January 2011 (1.2.1 \
         was then the newest release): sect=\"9.2\" for HdrBTH, its 1-bit field \"SE\"; Linux \
         rxe_req.c init_req_packet() sets it on the last packet of a SEND or a WRITE with \
         immediate posted with IB_SEND_SOLICITED",
    ),
};
pub const IETH: Cite = Cite {
    clause: "9.3.7",
    rule: "IETH: the R_Key a SEND with invalidate invalidates",
    release: "1.2.1",
    source: Source::Checked(PYRDMA),
};
pub const E2E_CREDITS: Cite = Cite {
    clause: "9.7.7.2",
    rule: "end-to-end (message-based) credits in the AETH: the receive WQEs left, or the invalid code 31 from a responder that gives none",
    release: "not stated",
    source: Source::Checked(
        "rdma-core, providers/mlx5/man/mlx5dv_create_qp.3.md: \"end-to-end packet-based credit, \
         instead of the default message-based credits (IB spec. section 9.7.7.2)\"; the \
         encoding and the invalid code as Linux drivers/infiniband/sw/rdmavt/rc.c \
         (credit_table[], rvt_compute_aeth(): \"Shared receive queues don't generate credits. \
         Set the credit field to the invalid value\", IB_AETH_CREDIT_INVAL 0x1F)",
    ),
};
pub const UD_OVER_MTU: Cite = Cite {
    clause: "C10-93.1.1",
    rule: "a UD message longer than the port MTU: no packet is emitted and no error reported",
    release: "not stated",
    source: Source::Checked(
        "Linux drivers/infiniband/sw/rxe/rxe_req.c, rxe_requester(): \"C10-93.1.1: If the \
         total sum of all the buffer lengths specified for a UD message exceeds the MTU of the \
         port as returned by QueryHCA, the CI shall not emit any packets for this message. \
         Further, the CI shall not generate an error due to this condition.\"",
    ),
};
pub const RD_ATOMIC_RESOURCES: Cite = guess(
    "C9-150",
    "more RDMA READs and atomics outstanding than the responder's max_dest_rd_atomic: NAK invalid request (rxe's check_resource(): RESPST_ERR_TOO_MANY_RDMA_ATM_REQ, class C)",
);
pub const SEND_INV_ERROR: Cite = guess(
    "10.6.6.2",
    "a SEND with invalidate of an R_Key that cannot be invalidated: NAK invalid request, the QP to ERR",
);
pub const UC_NO_READ_ATOMIC: Cite = guess(
    "9.8.2",
    "UC carries no RDMA READ and no atomics: their opcodes are invalid on a UC QP, dropped silently",
);

// ---- RoCEv2 headers, IPv6, ECN and CNP (issue 20) ----

pub const A17_BOTH_IP: Cite = a17(
    "A17.3.1",
    "CA17-1: RoCEv2 ports support both RoCEv2 with IPv4 and with IPv6",
);
pub const A17_IPV6: Cite = a17(
    "A17.3.1.2",
    "RoCEv2 with IPv6: the IPv6 header per RFC 2460 (CA17-13 … CA17-19)",
);
pub const A17_IP_VERSION: Cite = a17(
    "A17.4.4.1",
    "CA17-27: an IP version other than the Ethertype's (4 or 6) is silently dropped",
);
pub const A17_IPV4_NO_FRAGMENT: Cite = a17(
    "A17.3.1.1.5, A17.3.1.1.6",
    "CA17-7, CA17-8: IPv4 flags '010' (don't fragment) and fragment offset 0",
);
pub const A17_QP0: Cite = a17(
    "A17.6",
    "CA17-33: a packet whose BTH destination QP is QP0 is silently dropped",
);
pub const A17_FECN_BECN: Cite = a17(
    "A17.4.8",
    "CA17-29: the BTH FECN and BECN bits are unused and ignored by a RoCEv2 port",
);
pub const A17_IHL: Cite = a17("A17.3.1.1.1", "CA17-3: IPv4 IHL 5");
pub const A17_HOP_LIMIT: Cite = a17(
    "A17.3.1.1.7, A17.3.1.2.5",
    "CA17-9, CA17-17: IPv4 TTL / IPv6 Hop Limit from the address vector's hop limit",
);
pub const A17_DSCP: Cite = a17(
    "A17.3.1.1.2, A17.3.1.2.1",
    "CA17-4, CA17-13: the DSCP from the address vector's traffic class",
);
pub const A17_ECN_SENT: Cite = a17(
    "A17.3.1.1.3, A17.3.1.2.2",
    "CA17-5, CA17-14: ECN '00' without congestion management; '01' or '10' with it",
);
pub const A17_LENGTHS: Cite = a17(
    "A17.3.1.1.4, A17.3.1.2.3, A17.3.2.3",
    "CA17-6, CA17-15, CA17-21: IP total / payload length and UDP length up to the ICRC",
);
pub const A17_UDP_CHECKSUM: Cite = a17("A17.3.2.4", "the UDP checksum should be 0");
pub const A17_UDP_SPORT: Cite = a17(
    "A17.3.2.1, A17.9.4",
    "a fixed UDP source port across the packets of a connected QP (should)",
);
pub const A17_CNP: Cite = a17(
    "A17.9.3",
    "CA17-44: a valid packet with IP.ECN '11' is answered by a CNP to its source; one CNP may \
     cover several marked packets of a QP",
);
pub const A17_CNP_FORMAT: Cite = a17(
    "A17.9.3, Figure 6",
    "the CNP: opcode 0x81, DestQP the QP it is generated for, PSN 0, SE 0, M 0, the marked \
     packet's P_Key, 16 reserved bytes set to 0",
);
pub const A17_CNP_REACTION: Cite = a17(
    "A17.9.3",
    "CA17-45: a received CNP reduces the injection rate of the QP it names",
);

// ---- RC requester (issue 20) ----
// The behaviour each rule describes is what Linux's rxe (rxe_comp.c, rxe_req.c), hfi1 and qib
// (rc.c) do, as quoted in the scenarios' comments; none of them names the clause, so the numbers
// stay unverified.

pub const RNR_RETRY_INFINITE: Cite = guess(
    "9.7.5.2.8",
    "rnr_retry 7: an RNR NAK is retried forever (qib/hfi1 spend the count only below 7)",
);
pub const RETRY_CNT_FINITE: Cite = guess(
    "9.7.6.1.3",
    "retry_cnt counts retries after the local ACK timeout; 7 is seven, not infinite",
);
pub const FENCE: Cite = guess(
    "11.4.1.1",
    "Post Send: the fence indicator holds a WR until earlier READs and atomics complete",
);
pub const INITIATOR_DEPTH: Cite = guess(
    "11.2.4.2",
    "max_rd_atomic, the initiator depth: no more READs and atomics outstanding",
);
pub const UNSIGNALED_ERROR: Cite = guess(
    "11.4.1.1",
    "an unsignaled WR that completes in error still generates a completion",
);
pub const SQ_DRAIN: Cite = guess(
    "10.3.1",
    "SQ drain (SQD): WRs under way complete, none starts until back in RTS",
);
pub const UNEXPECTED_RESPONSE: Cite = guess(
    "9.7.5.2",
    "a response whose opcode the request at its PSN does not expect: bad response error",
);
pub const READ_NAK_MIDWAY: Cite = guess(
    "9.7.5.2",
    "a NAK amid READ responses: a sequence error resumes the READ, an error NAK ends it",
);

// ---- Verbs, states, CM, IBA 1.5 (issue 20) ----

pub const MODIFY_QP_MASKS: Cite = Cite {
    clause: "11.2.4.2, table 91",
    rule: "Modify QP: per transition and QP type, the attributes required and the ones allowed; \
           any other mask is refused and the QP keeps its state",
    release: "1.2.1",
    source: Source::Checked(
        "Linux drivers/infiniband/core/verbs.c: qp_state_table (req_param and opt_param per \
         transition and QP type) and ib_modify_qp_is_ok(), which rdma_rxe's rxe_qp_chk_attr() \
         and the hardware drivers call; the number is the one ib_srp.c's srp_compute_rq_tmo() \
         gives for Modify Queue Pair (\"section 11.2.4.2 ..., table 91\")",
    ),
};
pub const QP_TRANSITIONS: Cite = Cite {
    clause: "10.3.1",
    rule: "the QP state diagram: no RTS → RTR, SQE entered only on a send error (never by \
           Modify QP), SQD entered from RTS and left to RTS",
    release: "not stated",
    source: Source::Checked(
        "Linux drivers/infiniband/core/verbs.c qp_state_table: the transitions out of RTS are \
         RESET, ERR, RTS and SQD; out of SQE, RESET, ERR and RTS (the clause number itself read \
         in no source)",
    ),
};
pub const SQD_STATE: Cite = guess(
    "10.3.1.5",
    "Send Queue Drain: no new send WQE starts; the receive queue works on; SQD → RTS resumes",
);
pub const SQE_STATE: Cite = guess(
    "10.3.1.6",
    "Send Queue Error (UD, UC): a send error stops the send queue only; receives go on; \
     SQE → RTS by Modify QP",
);
pub const LOCAL_PROTECTION: Cite = guess(
    "11.6.2",
    "a send WR whose SGE names an invalid L_Key completes with Local Protection Error, and \
     nothing of it is sent",
);
pub const CQ_OVERRUN: Cite = guess(
    "11.4.2.1, 11.6.3",
    "a completion that finds its CQ full is a CQ overrun: a CQ error, the QPs on it to ERR \
     (rdma_rxe: rxe_cq_post raises IB_EVENT_CQ_ERR and fails, the responder goes to ERR)",
);
pub const REJ_INVALID_SID: Cite = Cite {
    clause: "12.6.7, REJ reason 8",
    rule: "a REQ whose Service ID nobody listens on is rejected with reason 8, Invalid Service ID",
    release: "not stated",
    source: Source::Checked(
        "Linux drivers/infiniband/core/cm.c cm_match_req(): no listener → \
         cm_issue_rej(IB_CM_REJ_INVALID_SERVICE_ID, CM_MSG_RESPONSE_REQ); \
         include/rdma/ib_cm.h: IB_CM_REJ_INVALID_SERVICE_ID = 8 (the section number 12.6.7 read \
         in no source)",
    ),
};
pub const CM_DUPLICATE_REQ: Cite = Cite {
    clause: "12.9.7",
    rule: "a duplicate REQ (same Local Communication ID and CA GUID) makes no second connection: \
           dropped, or answered for the existing one",
    release: "not stated",
    source: Source::Checked(
        "Linux drivers/infiniband/core/cm.c cm_dup_req_handler(): a duplicate REQ is counted \
         (CM_RECV_DUPLICATES) and, in REP_SENT, dropped (the REP's own retransmission answers \
         it); an MRA is resent in MRA_REQ_SENT, a REJ Stale Connection in TIMEWAIT (the section \
         number 12.9.7 read in no source)",
    ),
};
pub const FLUSH_OP: Cite = Cite {
    clause: "9.4.7",
    rule: "FLUSH: FETH and RETH, no payload; the responder makes the range persistent or \
           globally visible and answers at the request's PSN",
    release: "1.5",
    source: Source::Unverified,
};
pub const ATOMIC_WRITE_OP: Cite = Cite {
    clause: "9.4.8",
    rule: "ATOMIC WRITE: RETH and 8 bytes of payload written as one, answered at the request's \
           PSN",
    release: "1.5",
    source: Source::Unverified,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::catalogue;

    #[test]
    fn every_scenario_cites_with_a_release_and_a_source_or_the_unverified_mark() {
        for sc in catalogue() {
            assert!(!sc.cites.is_empty(), "{}: no citation", sc.id);
            for c in sc.cites {
                assert!(
                    !c.clause.trim().is_empty() && !c.rule.trim().is_empty(),
                    "{}: a citation without a clause or rule: {c:?}",
                    sc.id
                );
                assert!(
                    RELEASES.contains(&c.release),
                    "{}: {} names an unknown release {:?}",
                    sc.id,
                    c.clause,
                    c.release
                );
                match c.source {
                    Source::Checked(s) => assert!(
                        !s.trim().is_empty(),
                        "{}: {} is marked checked with no source",
                        sc.id,
                        c.clause
                    ),
                    Source::Unverified => {}
                }
            }
        }
    }

    #[test]
    fn the_list_and_the_reports_mark_what_is_unverified() {
        let all = catalogue();
        let list = crate::runner::list(&all);
        for sc in &all {
            let spec = spec_text(sc.cites);
            for c in sc.cites {
                let unverified = format!("{} {} [unverified]", c.clause, c.rule);
                assert_eq!(
                    spec.contains(&unverified),
                    !c.verified(),
                    "{}: {}",
                    sc.id,
                    c.clause
                );
            }
        }
        let unverified = all
            .iter()
            .flat_map(|s| s.cites)
            .filter(|c| !c.verified())
            .count();
        assert_eq!(list.matches("unverified: ").count(), unverified);
    }
}
