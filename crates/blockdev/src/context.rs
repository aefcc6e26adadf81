//! Who issued the request a layer is running: the per-request
//! [`IoContext`].
//!
//! The [`BlockDev`](crate::BlockDev) operations carry no caller, so that a
//! layer that does not care (almost all of them) has nothing to pass on. The
//! front end that receives requests (the NBD server, `roamdisk replay`)
//! runs each one inside [`with_context`]; a layer that does care (the
//! `trace` recorder writes the client id into every record) asks
//! [`current`].
//!
//! The context lives in a thread-local and is set for the duration of one
//! call, which is exact because a request runs from start to finish on the
//! thread that called the stack (the NBD server runs it inline on the
//! connection's thread or whole on one thread of its blocking pool). The
//! rule that follows: **a layer that hands part of a request to another
//! thread carries the context there itself**:
//!
//! ```
//! use roamdisk_blockdev::context::{self, IoContext};
//! let ctx = context::current();
//! let seen = std::thread::spawn(move || context::with_context(ctx, context::current))
//!     .join()
//!     .unwrap();
//! assert_eq!(seen, ctx);
//! ```
//!
//! Work a layer does on its own account (a background write-back, garbage
//! collection, a prefetch) has no client and sees [`IoContext::NONE`].
//!
//! Cost: setting and reading it is a thread-local access of a few bytes
//! without a destructor (a couple of nanoseconds); nothing is allocated.

use std::cell::Cell;

/// What is known about the request being run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct IoContext {
    /// The client (for the NBD server: the connection, numbered per export
    /// from 1) that issued the request; `None` outside any request.
    pub client: Option<u32>,
}

impl IoContext {
    /// No request: what [`current`] returns outside [`with_context`].
    pub const NONE: IoContext = IoContext { client: None };

    /// The context of a request issued by `client`.
    pub const fn for_client(client: u32) -> IoContext {
        IoContext {
            client: Some(client),
        }
    }
}

thread_local! {
    static CURRENT: Cell<IoContext> = const { Cell::new(IoContext::NONE) };
}

/// The context of the request running on this thread ([`IoContext::NONE`]
/// outside one).
#[inline]
pub fn current() -> IoContext {
    CURRENT.with(Cell::get)
}

/// Run `f` with `ctx` as this thread's context, then restore the previous
/// one (also when `f` panics). Calls nest.
#[inline]
pub fn with_context<R>(ctx: IoContext, f: impl FnOnce() -> R) -> R {
    struct Restore(IoContext);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(ctx)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_nested_and_restored_after_a_panic() {
        assert_eq!(current(), IoContext::NONE);
        with_context(IoContext::for_client(1), || {
            assert_eq!(current().client, Some(1));
            with_context(IoContext::for_client(2), || {
                assert_eq!(current().client, Some(2));
            });
            assert_eq!(current().client, Some(1));
            let r = std::panic::catch_unwind(|| {
                with_context(IoContext::for_client(3), || panic!("layer bug"))
            });
            assert!(r.is_err());
            assert_eq!(current().client, Some(1));
        });
        assert_eq!(current(), IoContext::NONE);
    }

    #[test]
    fn other_threads_do_not_inherit_it() {
        with_context(IoContext::for_client(5), || {
            let seen = std::thread::spawn(current).join().unwrap();
            assert_eq!(seen, IoContext::NONE);
        });
    }
}
