//! The peer plane's credential: the secret every router replica of one fleet shares, presented
//! in [`PEER_KEY`] on every request between replicas and checked by the peer listener.
//!
//! Owns reading it (`peer_secret_file`), presenting it and checking it in constant time. The
//! secret never leaves the process except towards a member's peer listener: the peer front
//! removes the header before anything else reads the request, so it never reaches a worker, a
//! log line or a metric, and `Debug` prints no part of it.

use std::path::Path;

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};
use subtle::ConstantTimeEq;

/// The header a replica presents the peer secret in.
pub static PEER_KEY: HeaderName = HeaderName::from_static("x-program-router-peer-key");

/// Shortest secret accepted (the operator generates 64 hex digits).
pub const MIN_SECRET_LEN: usize = 32;

/// Largest secret file read.
const MAX_SECRET_BYTES: u64 = 4096;

/// The shared secret of a router fleet's peer plane.
pub struct PeerKey {
    secret: Box<str>,
    header: HeaderValue,
}

impl std::fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerKey(<redacted>)")
    }
}

impl PeerKey {
    /// The secret `s` (trimmed); the error says what is wrong with it, never what it is.
    pub fn new(s: &str) -> Result<PeerKey, String> {
        let s = s.trim();
        if s.len() < MIN_SECRET_LEN {
            return Err(format!(
                "the peer secret must be at least {MIN_SECRET_LEN} characters (got {})",
                s.len()
            ));
        }
        if !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the peer secret must be printable ASCII without spaces".into());
        }
        let mut header =
            HeaderValue::from_str(s).map_err(|_| "the peer secret is not a header value")?;
        header.set_sensitive(true);
        Ok(PeerKey {
            secret: s.into(),
            header,
        })
    }

    /// Reads the secret from `path`; the error names the file.
    pub fn load(path: &Path) -> Result<PeerKey, String> {
        let shown = path.display();
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("cannot read the peer secret file {shown}: {e}"))?;
        if meta.len() > MAX_SECRET_BYTES {
            return Err(format!(
                "the peer secret file {shown} is larger than {MAX_SECRET_BYTES} bytes"
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the peer secret file {shown}: {e}"))?;
        PeerKey::new(&text).map_err(|e| format!("{shown}: {e}"))
    }

    /// Adds the credential to a request for a member.
    pub fn present(&self, h: &mut HeaderMap) {
        h.insert(PEER_KEY.clone(), self.header.clone());
    }

    /// Whether `h` carries this secret (compared in constant time), taking the header out so
    /// that nothing after the check can forward or log it.
    pub fn check_and_remove(&self, h: &mut HeaderMap) -> bool {
        let Some(v) = h.remove(&PEER_KEY) else {
            return false;
        };
        bool::from(v.as_bytes().ct_eq(self.secret.as_bytes()))
    }

    /// The secret as text, for keys derived from it (member-list signatures).
    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn checks_in_constant_time_and_removes_the_header() {
        let k = PeerKey::new(&format!(" {S}\n")).expect("valid");
        let mut h = HeaderMap::new();
        k.present(&mut h);
        assert!(h.get(&PEER_KEY).is_some_and(HeaderValue::is_sensitive));
        assert!(k.check_and_remove(&mut h));
        assert!(h.get(&PEER_KEY).is_none(), "taken out");
        assert!(!k.check_and_remove(&mut h), "absent");
        let mut wrong = HeaderMap::new();
        wrong.insert(
            PEER_KEY.clone(),
            HeaderValue::from_static("0123456789abcdef"),
        );
        assert!(!k.check_and_remove(&mut wrong));
        assert!(wrong.is_empty());
    }

    #[test]
    fn refuses_short_or_unprintable_secrets_without_printing_them() {
        let short = PeerKey::new("short-secret").expect_err("short");
        assert!(!short.contains("short-secret"), "{short}");
        assert!(PeerKey::new(&format!("{S} {S}")).is_err());
        assert_eq!(
            format!("{:?}", PeerKey::new(S).expect("ok")),
            "PeerKey(<redacted>)"
        );
    }

    #[test]
    fn loads_a_file_and_names_it_on_error() {
        let dir = std::env::temp_dir().join(format!("peer-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("secret");
        std::fs::write(&f, format!("{S}\n")).expect("write");
        assert!(PeerKey::load(&f).is_ok());
        let missing = PeerKey::load(&dir.join("none")).expect_err("missing");
        assert!(missing.contains("none"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
