//! A response body that holds something until the response is done.

/// A response body that keeps `T` alive until it is done or dropped: how a request's
/// activity (on its connection, in a front's session) lasts as long as its answer streams.
pub struct HeldBody<T> {
    body: axum::body::Body,
    _held: T,
}

impl<T> std::fmt::Debug for HeldBody<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBody").finish_non_exhaustive()
    }
}

impl<T> HeldBody<T> {
    /// `body`, holding `held` until it ends.
    pub fn new(body: axum::body::Body, held: T) -> Self {
        Self { body, _held: held }
    }
}

impl<T: Unpin> http_body::Body for HeldBody<T> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
