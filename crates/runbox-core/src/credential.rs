//! A caller's own credential for a remote backend's provider (an E2B or Novita API key
//! passed through from the caller's `Authorization: Bearer`), carried from the front end to
//! the backend with the request that creates a sandbox.

use std::fmt;
use std::sync::Arc;

/// A secret the backend presents to its provider on the caller's behalf. It is never
/// printed: `Debug` shows only that there is one, and it is not serialized.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(Arc<str>);

impl Credential {
    /// Wraps a secret.
    pub fn new(secret: impl Into<Arc<str>>) -> Self {
        Self(secret.into())
    }

    /// The secret itself, for the header that carries it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret() {
        let c = Credential::new("sk_live_secret");
        assert_eq!(format!("{c:?}"), "Credential(***)");
        assert_eq!(format!("{:?}", Some(c.clone())), "Some(Credential(***))");
        assert_eq!(c.expose(), "sk_live_secret");
    }
}
