// An ECN marker for the congestion-control test bed (scripts/cc-testbed), for kernels without
// the `red ... ecn` qdisc (CONFIG_NET_SCH_RED unset). Attached with tc to a router's egress
// (clsact, cls_bpf direct action) in front of an htb class shaped to RATE_BPS, it keeps a
// virtual queue that fills with every IPv4 packet's bytes and drains at RATE_BPS (the queue
// the htb class builds when its input exceeds the rate) and marks ECN-capable packets CE with
// RED's probability on that queue: 0 below KMIN bytes, rising linearly to PMAX_PCT % at KMAX,
// 100 % above (as DCQCN's switches and HPCC's simulator mark: instantaneous queue, no EWMA).
// The mark is the kernel's own `bpf_skb_ecn_set_ce` (IP checksum updated); packets are never
// dropped here: the htb leaf's byte limit does that. Built by the script with clang's BPF
// target: clang -O2 -g -target bpf -DRATE_BPS=... -DKMIN=... -DKMAX=... -DPMAX_PCT=...
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef RATE_BPS
#define RATE_BPS 200000000ULL
#endif
#ifndef KMIN
#define KMIN 30000ULL
#endif
#ifndef KMAX
#define KMAX 90000ULL
#endif
#ifndef PMAX_PCT
#define PMAX_PCT 20ULL
#endif

struct vq {
    __u64 bytes;   // virtual backlog
    __u64 last_ns; // when it was last drained
    __u64 marked;  // CE marks made
    __u64 seen;    // IPv4 packets seen
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct vq);
} vqueue SEC(".maps");

SEC("tc")
int ecn_mark(struct __sk_buff *skb)
{
    if (skb->protocol != bpf_htons(ETH_P_IP))
        return TC_ACT_OK;
    __u32 k = 0;
    struct vq *q = bpf_map_lookup_elem(&vqueue, &k);
    if (!q)
        return TC_ACT_OK;
    __u64 now = bpf_ktime_get_ns();
    __u64 drained = (now - q->last_ns) * (RATE_BPS / 8) / 1000000000ULL;
    q->bytes = drained >= q->bytes ? 0 : q->bytes - drained;
    q->last_ns = now;
    __u64 b = q->bytes;
    q->bytes += skb->len;
    q->seen++;
    int mark = 0;
    if (b >= KMAX)
        mark = 1;
    else if (b > KMIN) {
        // p = PMAX·(b − KMIN)/(KMAX − KMIN), compared with a uniform draw in 0…2^16 − 1
        __u64 p = PMAX_PCT * 65536ULL / 100 * (b - KMIN) / (KMAX - KMIN);
        mark = (bpf_get_prandom_u32() & 0xffff) < p;
    }
    if (mark && bpf_skb_ecn_set_ce(skb))
        q->marked++;
    return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
