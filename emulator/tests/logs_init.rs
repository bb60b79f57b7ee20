//! `rocemu_emulator::logs::init_with`: the stderr subscriber installs once per process, and a
//! second attempt (a program that installed its own, a library initialised twice) is refused
//! without failing. Its own test binary: it sets the process-wide default.

#[test]
fn installing_the_stderr_subscriber_twice_does_not_fail() {
    // "off": the first install takes the process-wide default and prints nothing; the second,
    // with a directive that does not parse among them, finds one and leaves it.
    assert!(
        rocemu_emulator::logs::init_with("off"),
        "the first install succeeds"
    );
    assert!(
        !rocemu_emulator::logs::init_with("debug,not=a=directive"),
        "a second install is refused, quietly"
    );
    assert!(
        !tracing::enabled!(tracing::Level::ERROR),
        "the first one stays: everything off"
    );
}
