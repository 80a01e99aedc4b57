//! What every outgoing HTTP client of the binary shares (the CLI's, the installer's, the OTLP
//! exporter's): plain `http://` never needs CA certificates, a client that cannot be built says
//! why (the CA files looked for, when that is the cause), and every error names its cause.
//!
//! reqwest's rustls backend loads the system's CA roots when a client is built and refuses to
//! build without any, even for a client that only ever speaks plain HTTP — so a minimal image
//! without `ca-certificates` could not reach a daemon on loopback. A client for an `http://`
//! address is therefore built with no roots at all ([`plain_http`]); one for `https://` loads
//! them and, when there are none, [`build_error`] names where they were looked for.

use std::error::Error;

/// The builder for a client that only speaks plain HTTP: no CA roots are loaded (an `https://`
/// URL then fails its handshake as untrusted, which such a client never asks for).
pub fn plain_http(builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
    builder.tls_certs_only(std::iter::empty())
}

/// The blocking twin of [`plain_http`] (the OTLP exporter's client, in builds with traces).
#[cfg(feature = "otel")]
pub fn plain_http_blocking(
    builder: reqwest::blocking::ClientBuilder,
) -> reqwest::blocking::ClientBuilder {
    builder.tls_certs_only(std::iter::empty())
}

/// True when `url` is plain HTTP (so its client needs no CA certificates).
pub fn is_plain_http(url: &str) -> bool {
    url.get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
}

/// An error and its causes, outermost first, joined by `: `; a layer whose text is already
/// contained in the text so far (wrappers that repeat their source) is left out. reqwest's
/// own text is often only "builder error" or "error sending request": the cause is below.
pub fn chain(e: &(dyn Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Why a client could not be built, in words a user can act on: when the system has no CA
/// certificates (the usual cause) the message says so and names the places they were looked
/// for; otherwise the error's whole chain.
pub fn build_error(e: &reqwest::Error) -> String {
    let text = chain(e);
    if !text.contains("CA certificates") {
        return text;
    }
    format!("{text}; {}", ca_search())
}

/// Where the CA certificates were looked for, from the same loader reqwest's verifier uses:
/// `SSL_CERT_FILE`/`SSL_CERT_DIR` when set (each failure with its path), else the system's
/// usual bundle files and directories.
pub fn ca_search() -> String {
    let found = rustls_native_certs::load_native_certs();
    let mut s = String::from("no CA certificates were found");
    if found.errors.is_empty() {
        s.push_str(
            " (looked in SSL_CERT_FILE and SSL_CERT_DIR when set, else in the system's usual \
             places: /etc/ssl/certs/ca-certificates.crt, /etc/ssl/certs, /etc/pki/tls/certs …)",
        );
    } else {
        let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
        s.push_str(&format!(" ({})", errors.join("; ")));
    }
    s.push_str(
        "; install the ca-certificates package, or set SSL_CERT_FILE to a PEM bundle; plain \
         http:// addresses need none",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);
    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    #[test]
    fn the_chain_names_every_cause_once() {
        let e = Layer(
            "builder error",
            Some(Box::new(Layer(
                "No CA certificates were loaded from the system",
                Some(Box::new(Layer("CA certificates", None))),
            ))),
        );
        assert_eq!(
            chain(&e),
            "builder error: No CA certificates were loaded from the system"
        );
    }

    #[test]
    fn plain_http_is_told_apart_from_https() {
        assert!(is_plain_http("http://127.0.0.1:2468"));
        assert!(is_plain_http("HTTP://x"));
        assert!(!is_plain_http("https://127.0.0.1:2468"));
        assert!(!is_plain_http("http:/x"));
    }
}
