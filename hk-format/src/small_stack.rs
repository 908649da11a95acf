//! A test helper: code run on a thread with the default 2 MiB stack, for the tests that prove
//! a deep tree (a contract expression from a manifest or an index) is refused or walked without
//! recursion, where unbounded recursion would overflow.

/// Runs `f` on a thread with a 2 MiB stack and returns its result (a panic in `f` fails the
/// calling test).
pub(crate) fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}
