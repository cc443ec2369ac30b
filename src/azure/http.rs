//! The HTTP client every request of this crate goes through (blob service and token
//! endpoints alike), and how its transport failures are told apart.
//!
//! TLS is rustls with the system's trust store (`/etc/ssl/certs`, or `SSL_CERT_FILE`
//! / `SSL_CERT_DIR` when set, as OpenSSL does), so private clouds, Azure Stack Hub
//! and TLS-inspecting proxies work once their CA is trusted by the machine. The
//! compiled-in Mozilla roots are used only when the system store holds nothing at
//! all (a minimal container without ca-certificates), so public Azure still works
//! there.
//!
//! A certificate that is not trusted is not an outage: no retry will change it.
//! [`describe`] sets it apart so callers fail at once and say how to trust a CA.

use std::sync::OnceLock;
use std::time::Duration;

use url::Url;

/// The system trust store (or `SSL_CERT_FILE`/`SSL_CERT_DIR`), read once per
/// process. A mount's root part reads it before its worker exists, so the
/// worker, which may read neither a CA file only root can nor (Landlock) one
/// outside the usual places, trusts what the operator's configuration names.
fn system_roots() -> &'static [reqwest::Certificate] {
    static ROOTS: OnceLock<Vec<reqwest::Certificate>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        rustls_native_certs::load_native_certs()
            .certs
            .iter()
            .filter_map(|c| reqwest::Certificate::from_der(c.as_ref()).ok())
            .collect()
    })
}

/// Reads the trust store now (see [`system_roots`]).
pub fn load_trust_store() {
    let _ = system_roots();
}

/// A client builder with this crate's TLS roots, user agent and proxy rule.
pub fn client_builder(connect_timeout: Duration) -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder()
        // Not the HTTP library's own reading of the environment, which would send
        // plain http through `http_proxy` too: see `https_proxy_from_env`.
        .no_proxy();
    let builder = match https_proxy_from_env() {
        Some(proxy) => builder.proxy(proxy),
        None => builder,
    };
    let roots = system_roots();
    let builder = roots
        .iter()
        .fold(builder, |b, c| b.add_root_certificate(c.clone()));
    builder
        .use_rustls_tls()
        .tls_built_in_native_certs(false)
        .tls_built_in_webpki_certs(roots.is_empty())
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .user_agent(concat!("blobdrive/", env!("CARGO_PKG_VERSION")))
        // Azure Storage and Entra ID never redirect these requests; following one
        // would send a signed request, SAS or token included, wherever the answer
        // points. A 3xx is an error (see `redirect_message`), and no `Referer`
        // (which would carry the SAS) is ever sent.
        .redirect(reqwest::redirect::Policy::none())
        .referer(false)
}

/// The variables that name a proxy for plain http: never used (see
/// [`https_proxy_from_env`]), and a command that meets one says so.
pub const PLAIN_PROXY_VARS: [&str; 4] = ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"];

/// The proxy for https requests: `https_proxy` (or `HTTPS_PROXY`, then
/// `all_proxy`/`ALL_PROXY`), except for hosts in `no_proxy`/`NO_PROXY`.
///
/// Plain http never goes through a proxy. It is allowed only to this machine's
/// loopback (an emulator), and a request there carries a Shared Key signature or
/// a SAS in the clear: through `http_proxy` it would cross the network to
/// whatever host that names. Over https a proxy sees only a tunnel.
fn https_proxy_from_env() -> Option<reqwest::Proxy> {
    let url = ["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))?;
    match reqwest::Proxy::https(url.trim()) {
        Ok(proxy) => Some(proxy.no_proxy(reqwest::NoProxy::from_env())),
        Err(_) => {
            tracing::warn!("https_proxy is not a URL; connecting directly");
            None
        }
    }
}

/// The first `max` bytes of `resp`'s body; the rest, if any, is never read (the
/// connection is dropped with it). For answers whose start is all that matters:
/// an error's code and message, a token.
pub async fn body_prefix(
    mut resp: reqwest::Response,
    max: usize,
) -> Result<bytes::Bytes, reqwest::Error> {
    let mut body = bytes::BytesMut::new();
    while body.len() < max {
        match resp.chunk().await? {
            Some(chunk) => {
                let room = max - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            None => break,
        }
    }
    Ok(body.freeze())
}

/// What a 3xx answer says, as an error: its status and where it pointed (scheme,
/// host and port only: a query may carry someone's SAS).
pub fn redirect_message(status: u16, location: Option<&str>) -> String {
    let to = location
        .and_then(|l| url::Url::parse(l).ok())
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_else(|| "an unreadable location".to_string());
    format!("the endpoint answered {status}, a redirect to {to}, which is not followed (Azure Storage never redirects)")
}

/// A transport failure (no HTTP answer), described without its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// The server's certificate was refused: final, retrying cannot help.
    /// Holds rustls's reason, e.g. `UnknownIssuer`.
    Certificate(String),
    /// Anything else (refused, reset, timed out): worth retrying.
    Other(String),
}

/// Describes a reqwest error by its kind and root cause, never with its URL (a
/// URL may carry a SAS).
pub fn describe(e: reqwest::Error) -> Transport {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "connection broke while receiving"
    } else if e.is_request() {
        "request failed"
    } else {
        "transport error"
    };
    let e = e.without_url();
    let mut chain = Vec::new();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(&e);
    while let Some(s) = src {
        chain.push(s.to_string());
        src = s.source();
    }
    chain.dedup();
    // rustls says "invalid peer certificate: REASON" for every refused certificate
    // (unknown issuer, wrong name, expired, ...); its error type is not ours to
    // downcast to across the io::Error reqwest wraps it in, so its text decides.
    if let Some(reason) = chain
        .iter()
        .find_map(|c| c.split_once("invalid peer certificate: ").map(|x| x.1))
    {
        return Transport::Certificate(reason.to_string());
    }
    match chain.last() {
        Some(root) => Transport::Other(format!("{kind}: {root}")),
        None => Transport::Other(kind.to_string()),
    }
}

/// The one-line explanation of a refused certificate of `url`'s host.
pub fn certificate_message(url: &Url, reason: &str) -> String {
    let host = match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        _ => "the server".to_string(),
    };
    format!(
        "TLS certificate of {host} not trusted ({reason}); to trust a private CA, add it to the system store (e.g. copy it to /usr/local/share/ca-certificates/ and run update-ca-certificates) or set SSL_CERT_FILE=/path/to/ca.pem (which then replaces the system store)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_message_names_the_host_and_both_ways_to_trust_a_ca() {
        let u = Url::parse("https://127.0.0.1:8443/devstoreaccount1?sv=1&sig=SECRET").unwrap();
        let m = certificate_message(&u, "UnknownIssuer");
        assert!(m.starts_with("TLS certificate of 127.0.0.1:8443 not trusted (UnknownIssuer)"));
        assert!(m.contains("update-ca-certificates") && m.contains("SSL_CERT_FILE="));
        assert!(!m.contains("SECRET"));
    }
}

#[cfg(test)]
mod redirect_tests {
    use super::redirect_message;

    #[test]
    fn a_redirect_names_the_host_never_the_query() {
        let m = redirect_message(
            307,
            Some("http://198.51.100.7:8080/acct/c/b.vhd?sv=1&sig=SECRET"),
        );
        assert!(
            m.contains("307") && m.contains("http://198.51.100.7:8080"),
            "{m}"
        );
        assert!(!m.contains("SECRET") && !m.contains("sig="), "{m}");
        assert!(redirect_message(302, None).contains("unreadable"));
    }
}
