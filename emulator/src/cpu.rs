//! Pinning a polling thread to a CPU of its own, as DPDK pins an lcore: a new thread starts on
//! its parent's CPU and shares it with its sibling until the scheduler's load balancing moves
//! one of them, and a polling thread that the scheduler moves loses its caches.
#![allow(unsafe_code)]

/// Pins the calling thread to the `k`-th CPU (modulo their number) of the CPUs the calling
/// thread may run on; returns that CPU, or `None` (nothing changed) when the set could not be
/// read or set.
pub fn pin_to_nth_allowed(k: usize) -> Option<usize> {
    // SAFETY: cpu_set_t is a plain bit array (zeroes: the empty set); sched_getaffinity writes
    // at most its size into it, and CPU_ISSET reads within it.
    let allowed: Vec<usize> = unsafe {
        let mut c: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut c) != 0 {
            return None;
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&i| libc::CPU_ISSET(i, &c))
            .collect()
    };
    let cpu = *allowed.get(k % allowed.len().max(1))?;
    // SAFETY: as above; CPU_SET writes within the set, sched_setaffinity reads it.
    unsafe {
        let mut c: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut c);
        (libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &c) == 0).then_some(cpu)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_thread_is_pinned_to_an_allowed_cpu() {
        std::thread::spawn(|| {
            let cpu = super::pin_to_nth_allowed(1).expect("the affinity can be set");
            // SAFETY: sched_getcpu takes nothing.
            assert_eq!(unsafe { libc::sched_getcpu() } as usize, cpu);
        })
        .join()
        .unwrap();
    }
}
