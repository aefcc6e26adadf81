//! The byte stream a connection runs over (TCP, Unix, TLS), below the
//! handshake, the transmission phase and TLS, which all pass it along.

use tokio::io::{AsyncRead, AsyncWrite};

/// Any byte stream a connection runs over (TCP, Unix, TLS).
pub trait AsyncStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncStream for T {}
/// A boxed connection stream.
pub type BoxStream = Box<dyn AsyncStream>;
