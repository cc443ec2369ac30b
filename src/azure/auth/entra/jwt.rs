//! The little of JWTs this crate needs: base64url, and the claims of a token it did
//! not make (to know when a federated token or a CLI token expires). Nothing here
//! checks a signature: the service that accepts the token does that.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::Value;

pub fn b64url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The claims (payload) of a compact JWT, if it is one.
pub fn claims(token: &str) -> Option<Value> {
    let payload = token.trim().split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The `exp` claim (seconds since the epoch).
pub fn expiry(token: &str) -> Option<u64> {
    claims(token)?.get("exp")?.as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_exp_of_a_compact_token() {
        let t = format!(
            "{}.{}.sig",
            b64url(br#"{"alg":"none"}"#),
            b64url(br#"{"exp":1800000000,"aud":"x"}"#)
        );
        assert_eq!(expiry(&t), Some(1_800_000_000));
        assert_eq!(expiry("not a token"), None);
        assert_eq!(expiry("a.!!!.c"), None);
    }
}
