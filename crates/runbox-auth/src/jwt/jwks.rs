//! Fetching the authorization server's signing keys: discovery, the JWKS document, and the
//! checks on both.

use std::net::IpAddr;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use reqwest::Url;
use serde::Deserialize;

/// How long one HTTP request to the authorization server may take, body included.
pub(super) const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest metadata or JWKS document accepted.
pub(super) const MAX_BODY: usize = 1024 * 1024;

/// The algorithms accepted, ever. No `none`, and no HMAC: a resource server has no business
/// holding the authorization server's shared secret, and accepting HS* next to public keys
/// invites the classic confusion of a public key used as an HMAC secret.
pub(super) const ACCEPTED: [Algorithm; 7] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// A signing key from the JWKS, with the algorithms it may verify.
pub(super) struct VerifyKey {
    pub(super) kid: Option<String>,
    pub(super) algorithms: Vec<Algorithm>,
    pub(super) key: DecodingKey,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyKey")
            .field("kid", &self.kid)
            .field("algorithms", &self.algorithms)
            .finish_non_exhaustive()
    }
}

/// Checks a URL the validator will fetch from (or the issuer): `https://`, or `http://` to
/// a loopback host (for tests and an authorization server on the same machine); no
/// credentials in it.
pub(super) fn check_url(what: &str, value: &str) -> Result<Url, String> {
    let url = Url::parse(value).map_err(|e| format!("{what} {value:?} is not a URL: {e}"))?;
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(&url) => {}
        _ => {
            return Err(format!(
                "{what} {value:?} must use https:// (http:// is allowed only for localhost, 127.0.0.0/8 and ::1)"
            ));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{what} {value:?} has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("{what} {value:?} must not contain credentials"));
    }
    Ok(url)
}

/// Whether the URL's host is `localhost`, in 127.0.0.0/8, or `::1`.
pub(super) fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// Where the authorization server's metadata may be, in the order the MCP authorization
/// specification gives: RFC 8414 (`/.well-known/oauth-authorization-server`), then OpenID
/// Connect discovery. For an issuer with a path (`https://idp/tenant1`) the well-known
/// segment goes before the path (RFC 8414 §3.1), and OpenID's appended form
/// (`https://idp/tenant1/.well-known/openid-configuration`) is tried last.
pub(super) fn discovery_urls(issuer: &Url) -> Vec<Url> {
    let path = issuer.path().trim_end_matches('/').to_owned();
    let at = |p: String| {
        let mut url = issuer.clone();
        url.set_path(&p);
        url.set_query(None);
        url.set_fragment(None);
        url
    };
    if path.is_empty() {
        vec![
            at("/.well-known/oauth-authorization-server".into()),
            at("/.well-known/openid-configuration".into()),
        ]
    } else {
        vec![
            at(format!("/.well-known/oauth-authorization-server{path}")),
            at(format!("/.well-known/openid-configuration{path}")),
            at(format!("{path}/.well-known/openid-configuration")),
        ]
    }
}

/// The fields of the authorization server metadata this crate reads.
#[derive(Deserialize)]
pub(super) struct Metadata {
    pub(super) issuer: String,
    pub(super) jwks_uri: Option<String>,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<serde_json::Value>,
}

/// Parses a JWKS document into the keys usable for verification. Keys that are not for
/// signatures, of an unsupported type or curve, or malformed are skipped (one odd key must
/// not take the others down); an error only if the document itself is not a JWKS.
pub(super) fn parse_jwks(body: &[u8]) -> Result<Vec<VerifyKey>, String> {
    let raw: RawJwks =
        serde_json::from_slice(body).map_err(|e| format!("the JWKS document is not valid: {e}"))?;
    let mut keys = Vec::new();
    for value in raw.keys {
        let jwk: Jwk = match serde_json::from_value(value) {
            Ok(jwk) => jwk,
            Err(e) => {
                tracing::debug!(error = %e, "skipping a JWKS key that does not parse");
                continue;
            }
        };
        match usable_key(&jwk) {
            Some(key) => keys.push(key),
            None => {
                tracing::debug!(kid = ?jwk.common.key_id, "skipping a JWKS key runbox cannot verify with")
            }
        }
    }
    Ok(keys)
}

fn usable_key(jwk: &Jwk) -> Option<VerifyKey> {
    match &jwk.common.public_key_use {
        None | Some(PublicKeyUse::Signature) => {}
        Some(_) => return None,
    }
    let by_type: &[Algorithm] = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => &[
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
        ],
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => &[Algorithm::ES256],
            EllipticCurve::P384 => &[Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(p) => match p.curve {
            EllipticCurve::Ed25519 => &[Algorithm::EdDSA],
            _ => return None,
        },
        // Symmetric (`oct`) keys and anything else: never.
        _ => return None,
    };
    // A key that names its algorithm may only be used with that algorithm.
    let algorithms: Vec<Algorithm> = match jwk.common.key_algorithm {
        None => by_type.to_vec(),
        Some(named) => {
            let named = Algorithm::try_from(named).ok()?;
            if !by_type.contains(&named) {
                return None;
            }
            vec![named]
        }
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(VerifyKey {
        kid: jwk.common.key_id.clone(),
        algorithms,
        key,
    })
}

/// GETs `url` and returns its body: a 2xx status, at most [`MAX_BODY`] bytes.
pub(super) async fn get(client: &reqwest::Client, url: &Url) -> Result<Vec<u8>, String> {
    let mut response = client
        .get(url.clone())
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| format!("GET {url} failed: {}", without_url(&e)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("GET {url} returned HTTP {}", status.as_u16()));
    }
    if response
        .content_length()
        .is_some_and(|n| n > MAX_BODY as u64)
    {
        return Err(format!("GET {url}: the response is larger than 1 MiB"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("GET {url} failed: {}", without_url(&e)))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(format!("GET {url}: the response is larger than 1 MiB"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A reqwest error's description without the URL it repeats.
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_redirect() {
        "bad redirect"
    } else if e.is_body() || e.is_decode() {
        "bad response body"
    } else {
        "request error"
    };
    let mut detail = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind} ({detail})")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_https_or_loopback_http() {
        for ok in [
            "https://idp.example.com",
            "https://idp.example.com/realms/x",
            "http://127.0.0.1:8080",
            "http://127.1.2.3",
            "http://localhost:9000/",
            "http://LOCALHOST",
            "http://[::1]:8443/x",
        ] {
            check_url("issuer", ok).unwrap();
        }
        for bad in [
            "http://idp.example.com",
            "http://10.0.0.1",
            "http://[::2]",
            "http://localhost.evil.com",
            "ftp://idp.example.com",
            "https://user:pw@idp.example.com",
            "not a url",
            "",
        ] {
            assert!(check_url("issuer", bad).is_err(), "{bad}");
        }
        let err = check_url("issuer", "http://idp.example.com").unwrap_err();
        assert!(err.contains("must use https://"), "{err}");
    }

    #[test]
    fn discovery_follows_rfc8414_then_openid() {
        let urls = |issuer: &str| -> Vec<String> {
            discovery_urls(&Url::parse(issuer).unwrap())
                .into_iter()
                .map(String::from)
                .collect()
        };
        assert_eq!(
            urls("https://idp.example.com"),
            [
                "https://idp.example.com/.well-known/oauth-authorization-server",
                "https://idp.example.com/.well-known/openid-configuration",
            ]
        );
        assert_eq!(
            urls("https://idp.example.com/realms/r1/"),
            [
                "https://idp.example.com/.well-known/oauth-authorization-server/realms/r1",
                "https://idp.example.com/.well-known/openid-configuration/realms/r1",
                "https://idp.example.com/realms/r1/.well-known/openid-configuration",
            ]
        );
    }

    #[test]
    fn jwks_parsing_keeps_only_signature_keys_it_can_use() {
        let body = serde_json::json!({"keys": [
            // Ed25519, usable.
            {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            // An encryption key: skipped.
            {"kty": "OKP", "crv": "Ed25519", "kid": "enc", "use": "enc", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            // A symmetric key: never.
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            // An algorithm that does not fit the key type: skipped.
            {"kty": "OKP", "crv": "Ed25519", "kid": "mismatch", "alg": "RS256", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            // Unknown key type and junk: skipped, not fatal.
            {"kty": "XYZ", "kid": "weird"},
            "not even an object",
            // RSA with a named algorithm: only that one.
            {"kty": "RSA", "kid": "rsa", "alg": "PS256", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB"},
            // P-521: unsupported curve.
            {"kty": "EC", "crv": "P-521", "kid": "p521", "x": "AA", "y": "AA"},
        ]});
        let keys = parse_jwks(body.to_string().as_bytes()).unwrap();
        let summary: Vec<_> = keys
            .iter()
            .map(|k| (k.kid.clone().unwrap(), k.algorithms.clone()))
            .collect();
        assert_eq!(
            summary,
            [
                ("ed".to_owned(), vec![Algorithm::EdDSA]),
                ("rsa".to_owned(), vec![Algorithm::PS256]),
            ]
        );
        assert!(parse_jwks(b"{\"nokeys\": []}").is_err());
        assert!(parse_jwks(b"<html>").is_err());
    }
}
