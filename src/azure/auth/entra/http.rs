//! HTTP calls to token endpoints: a few quick retries for what is worth it, answers
//! read as JSON, and failures described without URLs' queries or any secret.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde_json::Value;
use url::Url;

use super::{jwt, AccessToken};
use crate::azure::http::{body_prefix, certificate_message, client_builder, describe, Transport};
use crate::azure::text::service_text;

/// Attempts per call: token endpoints are either there or not, and a sign-in that
/// finds nothing must say so within seconds.
const ATTEMPTS: u32 = 3;

/// A client for token endpoints.
#[derive(Debug, Clone)]
pub struct TokenHttp {
    client: reqwest::Client,
}

/// An answer with a status.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// The body as JSON, or `Value::String` of its first line when it is not JSON.
    pub body: Value,
}

/// A call that got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Nothing answered (refused, timed out, reset); the message names the
    /// endpoint (scheme, host, port) and the cause.
    Unreachable(String),
    /// The endpoint's TLS certificate is not trusted; final.
    Certificate(String),
}

impl CallError {
    pub fn message(&self) -> &str {
        match self {
            CallError::Unreachable(m) | CallError::Certificate(m) => m,
        }
    }
}

/// `scheme://host:port` of a URL, for messages.
pub fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

impl TokenHttp {
    /// `connect_timeout` is short where a missing endpoint is the normal case (the
    /// managed identity probe on a machine outside Azure).
    pub fn new(connect_timeout: Duration, request_timeout: Duration) -> TokenHttp {
        TokenHttp::build(client_builder(connect_timeout), request_timeout)
    }

    /// [`TokenHttp::new`], never through a proxy: for the host's own identity
    /// endpoint (link-local IMDS, App Service's localhost), which a proxy cannot
    /// reach and must never see the request for.
    pub fn direct(connect_timeout: Duration, request_timeout: Duration) -> TokenHttp {
        TokenHttp::build(client_builder(connect_timeout).no_proxy(), request_timeout)
    }

    fn build(builder: reqwest::ClientBuilder, request_timeout: Duration) -> TokenHttp {
        let client = builder
            .timeout(request_timeout)
            // A token endpoint never redirects; following one could send a secret
            // somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the HTTP client configuration is static and valid");
        TokenHttp { client }
    }

    /// Sends a request (a form body when `form` is given), retrying connection
    /// failures, 429 and 5xx a few times, and returns the answer.
    pub async fn call(
        &self,
        method: Method,
        url: &Url,
        headers: &[(&str, &str)],
        form: Option<&[(&str, &str)]>,
    ) -> Result<Reply, CallError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut req = self.client.request(method.clone(), url.clone());
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            if let Some(form) = form {
                req = req.form(form);
            }
            let last = attempt >= ATTEMPTS;
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let retry = status == 429 || status >= 500;
                    if retry && !last {
                        pause(attempt).await;
                        continue;
                    }
                    // At most TOKEN_BODY_MAX bytes: a longer answer is cut, which
                    // leaves it unparseable and so an error.
                    let text = body_prefix(resp, TOKEN_BODY_MAX)
                        .await
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                        .unwrap_or_default();
                    let body = serde_json::from_str(&text).unwrap_or_else(|_| {
                        Value::String(text.lines().next().unwrap_or("").trim().to_string())
                    });
                    return Ok(Reply { status, body });
                }
                Err(e) => match describe(e) {
                    Transport::Certificate(reason) => {
                        return Err(CallError::Certificate(certificate_message(url, &reason)))
                    }
                    Transport::Other(detail) if last => {
                        return Err(CallError::Unreachable(format!(
                            "token endpoint {} unreachable ({detail})",
                            origin(url)
                        )))
                    }
                    Transport::Other(_) => pause(attempt).await,
                },
            }
        }
    }
}

/// The most of a token endpoint's answer that is read: a token answer is a few
/// KiB; a hostile endpoint's endless one must not fill memory.
const TOKEN_BODY_MAX: usize = 64 << 10;

async fn pause(attempt: u32) {
    tokio::time::sleep(Duration::from_millis(300 * u64::from(attempt))).await;
}

/// The longest a token is taken to live, whatever its answer says.
const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// The shortest a token must still live when it comes. Entra ID's live an hour
/// or more; one that expires at once (`expires_in: 0`, an `expires_on` in the
/// past) would be due for renewal at once, and was asked for again and again
/// (173 times in 15 s by one `info`). It is a failed answer instead, which the
/// keeper retries with backoff.
pub const MIN_TOKEN_LIFETIME: Duration = Duration::from_secs(60);

/// The token in a successful answer: `access_token` (or the CLI's `accessToken`),
/// expiring at `expires_on` (seconds since the epoch, number or string),
/// else after `expires_in` seconds, else at the token's own `exp` claim.
pub fn token_from(body: &Value) -> Result<AccessToken, String> {
    let secret = body
        .get("access_token")
        .or_else(|| body.get("accessToken"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or("the answer holds no access_token")?;
    let number = |v: &Value| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
    };
    // Checked and capped: an answer is untrusted input, and an expiry near 2^64
    // seconds would overflow the time arithmetic (a panic in the renewal thread).
    // No Entra ID token lives longer than a day; one claiming more than a year is
    // taken to end then (and a 401 renews one that ends sooner).
    let now = SystemTime::now();
    let longest = now + MAX_TOKEN_LIFETIME;
    let after = |base: SystemTime, secs: u64| {
        base.checked_add(Duration::from_secs(secs))
            .map_or(longest, |t| t.min(longest))
    };
    let expires_on = if let Some(on) = body.get("expires_on").and_then(number) {
        after(UNIX_EPOCH, on)
    } else if let Some(secs) = body.get("expires_in").and_then(number) {
        after(now, secs)
    } else if let Some(exp) = jwt::expiry(secret) {
        after(UNIX_EPOCH, exp)
    } else {
        return Err("the answer does not say when the token expires".to_string());
    };
    short_lived(expires_on, now)?;
    Ok(AccessToken::new(secret.to_string(), expires_on))
}

/// Refuses a token expiring at `expires_on` if it lives less than
/// [`MIN_TOKEN_LIFETIME`] from `now`, saying how long it had.
fn short_lived(expires_on: SystemTime, now: SystemTime) -> Result<(), String> {
    let least = MIN_TOKEN_LIFETIME.as_secs();
    match expires_on.duration_since(now) {
        Ok(left) if left >= MIN_TOKEN_LIFETIME => Ok(()),
        Ok(left) => Err(format!(
            "the token it gave expires in {} s; a token must be valid for at least {least} s",
            left.as_secs()
        )),
        Err(ago) => Err(format!(
            "the token it gave expired {} s before it came; a token must be valid for at least {least} s",
            ago.duration().as_secs()
        )),
    }
}

/// The reason in an error answer, on one line: OAuth's `error_description` (its
/// first line; Entra appends trace ids), App Service's `message`, or the body.
pub fn error_text(reply: &Reply) -> String {
    let b = &reply.body;
    let described = b
        .get("error_description")
        .or_else(|| b.get("message"))
        .or_else(|| b.get("Message"))
        .and_then(Value::as_str);
    let code = b.get("error").and_then(|e| {
        e.as_str()
            .map(str::to_string)
            .or_else(|| e.get("code").and_then(Value::as_str).map(str::to_string))
    });
    // The endpoint's words: escaped and cut before they reach a terminal.
    let code = code.as_deref().map(service_text);
    let described = described.map(service_text);
    let text = match (code, described) {
        (Some(c), Some(d)) => format!("{c}: {d}"),
        (Some(c), None) => c,
        (None, Some(d)) => d,
        (None, None) => match b {
            Value::String(s) if !s.is_empty() => service_text(s),
            _ => String::new(),
        },
    };
    if text.is_empty() {
        format!("HTTP {}", reply.status)
    } else {
        format!("HTTP {} {text}", reply.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::azure::auth::entra::epoch;
    use serde_json::json;

    #[test]
    fn expiry_from_any_of_the_three_spellings() {
        // Two hours from now, in seconds since the epoch.
        let on = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 7200;
        let t = token_from(&json!({"access_token": "x", "expires_on": on.to_string()})).unwrap();
        assert_eq!(t.expires_on, epoch(on));
        let t = token_from(&json!({"accessToken": "x", "expires_on": on + 1})).unwrap();
        assert_eq!(t.expires_on, epoch(on + 1));
        let t = token_from(&json!({"access_token": "x", "expires_in": 3599})).unwrap();
        assert!(t.lifetime() > Duration::from_secs(3590));
        let claims = format!(r#"{{"exp":{}}}"#, on + 2);
        let jwt = format!("a.{}.c", jwt::b64url(claims.as_bytes()));
        let t = token_from(&json!({ "accessToken": jwt })).unwrap();
        assert_eq!(t.expires_on, epoch(on + 2));
        // A token that expires at once, or has already, is a failed answer.
        let e = token_from(&json!({"access_token": "x", "expires_in": 0})).unwrap_err();
        assert!(
            e.contains("expires in 0 s; a token must be valid for at least 60 s"),
            "{e}"
        );
        let e = token_from(&json!({"access_token": "x", "expires_in": "59"})).unwrap_err();
        assert!(e.contains("expires in 5"), "{e}");
        let e = token_from(&json!({"access_token": "x", "expires_on": on - 9000})).unwrap_err();
        assert!(e.contains("expired 1800 s before it came"), "{e}");
        assert!(token_from(&json!({"access_token": "x", "expires_in": 61})).is_ok());
        assert!(token_from(&json!({"access_token": "x"})).is_err());
        assert!(token_from(&json!({"expires_in": 1})).is_err());
        // Hostile expiries are capped, never overflow.
        let longest = SystemTime::now() + MAX_TOKEN_LIFETIME;
        for body in [
            json!({"access_token": "x", "expires_on": u64::MAX}),
            json!({"access_token": "x", "expires_in": u64::MAX}),
            json!({"access_token": "x", "expires_on": "18446744073709551615"}),
        ] {
            let t = token_from(&body).unwrap();
            assert!(t.expires_on <= longest + Duration::from_secs(5), "{body}");
            let _ = t.renew_at();
        }
    }

    #[test]
    fn error_text_is_one_line() {
        let r = Reply {
            status: 401,
            body: json!({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret provided.\r\nTrace ID: 1"}),
        };
        assert_eq!(
            error_text(&r),
            "HTTP 401 invalid_client: AADSTS7000215: Invalid client secret provided."
        );
        let r = Reply {
            status: 500,
            body: Value::String(String::new()),
        };
        assert_eq!(error_text(&r), "HTTP 500");
    }
}
