//! Tests against a real (tiny) authorization server on loopback, with keys made here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::*;

const AUDIENCE: &str = "https://runbox.example.com/mcp";

/// A signing key made for the test, with its public JWK.
struct TestKey {
    kid: String,
    alg: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).unwrap();
    bytes
}

impl TestKey {
    /// An Ed25519 key: PKCS#8 v1 is a fixed 16-byte header and the 32-byte seed.
    fn ed25519(kid: &str) -> TestKey {
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        der.extend_from_slice(&random::<32>());
        Self::from_der(kid, Algorithm::EdDSA, EncodingKey::from_ed_der(&der))
    }

    /// A P-256 key: PKCS#8 around a SEC1 private key without the optional public key.
    fn p256(kid: &str) -> TestKey {
        let mut der = vec![
            0x30, 0x41, 0x02, 0x01, 0x00, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d,
            0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x04, 0x27,
            0x30, 0x25, 0x02, 0x01, 0x01, 0x04, 0x20,
        ];
        der.extend_from_slice(&random::<32>());
        Self::from_der(kid, Algorithm::ES256, EncodingKey::from_ec_der(&der))
    }

    /// An RSA key (2048 bits), made once per test run: generation is slow.
    fn rsa(kid: &str, alg: Algorithm) -> TestKey {
        use rsa::pkcs1::EncodeRsaPrivateKey as _;
        static DER: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let der = DER.get_or_init(|| {
            let key = rsa::RsaPrivateKey::new(&mut OsRng, 2048).unwrap();
            key.to_pkcs1_der().unwrap().as_bytes().to_vec()
        });
        Self::from_der(kid, alg, EncodingKey::from_rsa_der(der))
    }

    fn from_der(kid: &str, alg: Algorithm, encoding: EncodingKey) -> TestKey {
        let mut jwk = Jwk::from_encoding_key(&encoding, alg).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        TestKey {
            kid: kid.to_owned(),
            alg,
            encoding,
            jwk: serde_json::to_value(&jwk).unwrap(),
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }

    fn sign_with_kid(&self, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

/// The operating system's random numbers, for `rsa`'s key generation.
struct OsRng;

impl rsa::rand_core::RngCore for OsRng {
    fn next_u32(&mut self) -> u32 {
        u32::from_ne_bytes(random())
    }
    fn next_u64(&mut self) -> u64 {
        u64::from_ne_bytes(random())
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        getrandom::fill(dest).unwrap();
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rsa::rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

impl rsa::rand_core::CryptoRng for OsRng {}

fn now() -> i64 {
    i64::try_from(jsonwebtoken::get_current_timestamp()).unwrap()
}

/// A fake authorization server: metadata at the RFC 8414 path (unless disabled), OpenID
/// discovery, and the JWKS, with a count of requests per path.
struct Idp {
    addr: SocketAddr,
    state: Arc<Mutex<IdpState>>,
}

struct IdpState {
    jwks: Value,
    /// Serve `/.well-known/oauth-authorization-server` (else only OpenID discovery).
    rfc8414: bool,
    /// The `issuer` the metadata claims; the server's own URL when `None`.
    claimed_issuer: Option<String>,
    /// Replace the JWKS body with this many bytes of padding (to test the size cap).
    oversized_jwks: Option<usize>,
    hits: HashMap<String, usize>,
}

impl Idp {
    async fn start(keys: &[&TestKey]) -> Idp {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(IdpState {
            jwks: jwks(keys),
            rfc8414: true,
            claimed_issuer: None,
            oversized_jwks: None,
            hits: HashMap::new(),
        }));
        let served = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(stream, addr, Arc::clone(&served)));
            }
        });
        Idp { addr, state }
    }

    fn issuer(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn hits(&self, path: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .hits
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    fn set_keys(&self, keys: &[&TestKey]) {
        self.state.lock().unwrap().jwks = jwks(keys);
    }

    fn validator(&self) -> JwtValidator {
        JwtValidator::new(JwtConfig::new(self.issuer(), AUDIENCE)).unwrap()
    }

    fn claims(&self, sub: &str) -> Value {
        json!({
            "iss": self.issuer(),
            "aud": AUDIENCE,
            "sub": sub,
            "iat": now(),
            "exp": now() + 300,
        })
    }
}

fn jwks(keys: &[&TestKey]) -> Value {
    json!({ "keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>() })
}

async fn serve(mut stream: tokio::net::TcpStream, addr: SocketAddr, state: Arc<Mutex<IdpState>>) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&request);
    let path = text.split(' ').nth(1).unwrap_or("").to_owned();
    let (status, body) = {
        let mut state = state.lock().unwrap();
        *state.hits.entry(path.clone()).or_default() += 1;
        let metadata = json!({
            "issuer": state.claimed_issuer.clone().unwrap_or_else(|| format!("http://{addr}")),
            "jwks_uri": format!("http://{addr}/jwks"),
            "response_types_supported": ["code"],
        });
        match path.as_str() {
            "/.well-known/oauth-authorization-server" if state.rfc8414 => {
                ("200 OK", metadata.to_string())
            }
            "/.well-known/openid-configuration" => ("200 OK", metadata.to_string()),
            "/jwks" => match state.oversized_jwks {
                Some(n) => ("200 OK", " ".repeat(n)),
                None => ("200 OK", state.jwks.to_string()),
            },
            _ => ("404 Not Found", "{}".to_owned()),
        }
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[tokio::test]
async fn a_good_token_gives_the_subject_as_tenant() {
    let ed = TestKey::ed25519("ed-1");
    let ec = TestKey::p256("ec-1");
    let idp = Idp::start(&[&ed, &ec]).await;
    let validator = idp.validator();

    let principal = validator
        .validate(&ed.sign(&idp.claims("alice")))
        .await
        .unwrap();
    assert_eq!(
        principal,
        Principal {
            tenant: "alice".into(),
            limits: TenantLimits::default(),
            via: AuthMethod::Jwt,
        }
    );

    // ES256 too, with `aud` as an array containing the audience among others.
    let mut claims = idp.claims("auth0|bob");
    claims["aud"] = json!(["https://other.example.com", AUDIENCE]);
    assert_eq!(
        validator.validate(&ec.sign(&claims)).await.unwrap().tenant,
        "auth0|bob"
    );

    // Expired, but within the 60 s leeway.
    let mut claims = idp.claims("carol");
    claims["exp"] = json!(now() - 30);
    assert_eq!(
        validator.validate(&ed.sign(&claims)).await.unwrap().tenant,
        "carol"
    );

    // Discovery went through RFC 8414 metadata, and the JWKS was fetched once.
    assert_eq!(idp.hits("/.well-known/oauth-authorization-server"), 1);
    assert_eq!(idp.hits("/jwks"), 1);
}

#[tokio::test]
async fn rsa_keys_verify_rs256_and_ps256_only_as_published() {
    let rs = TestKey::rsa("rsa", Algorithm::RS256);
    let ps = TestKey::rsa("rsa-pss", Algorithm::PS256);
    let idp = Idp::start(&[&rs, &ps]).await;
    let validator = idp.validator();
    assert_eq!(
        validator
            .validate(&rs.sign(&idp.claims("r")))
            .await
            .unwrap()
            .tenant,
        "r"
    );
    assert_eq!(
        validator
            .validate(&ps.sign(&idp.claims("p")))
            .await
            .unwrap()
            .tenant,
        "p"
    );

    // The JWK says RS256, so the same key may not be used for RS512.
    let mut header = Header::new(Algorithm::RS512);
    header.kid = Some("rsa".into());
    let token = jsonwebtoken::encode(&header, &idp.claims("r"), &rs.encoding).unwrap();
    assert_eq!(
        validator.validate(&token).await,
        Err(JwtError::AlgorithmMismatch)
    );
}

#[tokio::test]
async fn time_issuer_audience_and_subject_are_checked() {
    let ed = TestKey::ed25519("k");
    let idp = Idp::start(&[&ed]).await;
    let validator = idp.validator();
    let with = |key: &str, value: Value| {
        let mut claims = idp.claims("alice");
        claims[key] = value;
        ed.sign(&claims)
    };
    let without = |key: &str| {
        let mut claims = idp.claims("alice");
        claims.as_object_mut().unwrap().remove(key);
        ed.sign(&claims)
    };
    let cases = [
        (with("exp", json!(now() - 3600)), JwtError::Expired),
        (with("nbf", json!(now() + 3600)), JwtError::NotYetValid),
        (
            with("aud", json!("https://elsewhere.example.com")),
            JwtError::WrongAudience,
        ),
        (with("aud", json!(["a", "b"])), JwtError::WrongAudience),
        (without("aud"), JwtError::WrongAudience),
        (
            with("iss", json!("https://evil.example.com")),
            JwtError::WrongIssuer,
        ),
        (
            with("iss", json!(format!("{}/", idp.issuer()))),
            JwtError::WrongIssuer,
        ),
        (without("iss"), JwtError::WrongIssuer),
        (without("sub"), JwtError::NoSubject),
        (with("sub", json!("")), JwtError::NoSubject),
        (with("sub", json!("x".repeat(257))), JwtError::NoSubject),
        (with("sub", json!("a\nb")), JwtError::NoSubject),
        (
            without("exp"),
            JwtError::Malformed("the token has no valid expiry (exp)"),
        ),
        (
            with("exp", json!("tomorrow")),
            JwtError::Malformed("the token has no valid expiry (exp)"),
        ),
        (with("aud", json!(7)), JwtError::WrongAudience),
    ];
    for (i, (token, expected)) in cases.into_iter().enumerate() {
        assert_eq!(validator.validate(&token).await, Err(expected), "case {i}");
    }
    // nbf in the past is fine; a 256-character subject is fine.
    assert!(
        validator
            .validate(&with("nbf", json!(now() - 10)))
            .await
            .is_ok()
    );
    assert!(
        validator
            .validate(&with("sub", json!("y".repeat(256))))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_signature_from_another_key_is_refused() {
    let real = TestKey::ed25519("shared-kid");
    let forger = TestKey::ed25519("shared-kid");
    let idp = Idp::start(&[&real]).await;
    let validator = idp.validator();
    let forged = forger.sign(&idp.claims("alice"));
    assert_eq!(
        validator.validate(&forged).await,
        Err(JwtError::BadSignature)
    );

    // A token tampered with after signing.
    let good = real.sign(&idp.claims("alice"));
    let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
    parts[1] = URL_SAFE_NO_PAD.encode(idp.claims("mallory").to_string());
    assert_eq!(
        validator.validate(&parts.join(".")).await,
        Err(JwtError::BadSignature)
    );
    assert!(validator.validate(&good).await.is_ok());
}

#[tokio::test]
async fn unknown_key_ids_refetch_at_most_once() {
    let real = TestKey::ed25519("real");
    let idp = Idp::start(&[&real]).await;
    let validator = idp.validator();
    for i in 0..10 {
        let stranger = TestKey::ed25519(&format!("bogus-{i}"));
        let token = stranger.sign(&idp.claims("alice"));
        assert_eq!(
            validator.validate(&token).await,
            Err(JwtError::UnknownKey),
            "token {i}"
        );
    }
    assert!(
        idp.hits("/jwks") <= 2,
        "JWKS fetched {} times",
        idp.hits("/jwks")
    );
    // The real key still works, without another fetch.
    let before = idp.hits("/jwks");
    assert!(
        validator
            .validate(&real.sign(&idp.claims("a")))
            .await
            .is_ok()
    );
    assert_eq!(idp.hits("/jwks"), before);
}

#[tokio::test]
async fn a_key_rotated_at_the_issuer_is_picked_up() {
    let old = TestKey::ed25519("2026-01");
    let idp = Idp::start(&[&old]).await;
    let validator = idp.validator();
    validator.refresh().await.unwrap();
    assert!(
        validator
            .validate(&old.sign(&idp.claims("a")))
            .await
            .is_ok()
    );

    let new = TestKey::p256("2026-02");
    idp.set_keys(&[&new]);
    assert_eq!(
        validator
            .validate(&new.sign(&idp.claims("b")))
            .await
            .unwrap()
            .tenant,
        "b"
    );
    assert_eq!(idp.hits("/jwks"), 2);
    // The old key is gone from the refetched set.
    assert_eq!(
        validator.validate(&old.sign(&idp.claims("a"))).await,
        Err(JwtError::UnknownKey)
    );
}

#[tokio::test]
async fn none_and_hmac_algorithms_are_refused() {
    let ed = TestKey::ed25519("k");
    let idp = Idp::start(&[&ed]).await;
    let validator = idp.validator();
    let claims = idp.claims("alice");
    let b64 = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string());

    // alg: none, with and without an (empty) signature.
    let none_header = json!({"alg": "none", "typ": "JWT", "kid": "k"});
    for token in [
        format!("{}.{}.", b64(&none_header), b64(&claims)),
        format!("{}.{}", b64(&none_header), b64(&claims)),
    ] {
        assert!(matches!(
            validator.validate(&token).await,
            Err(JwtError::Malformed(_))
        ));
    }

    // HS256, keyed with the public key's bytes (the classic confusion attack) or anything.
    let x = ed.jwk["x"].as_str().unwrap().to_owned();
    for secret in [x.as_bytes(), b"secret".as_slice()] {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k".into());
        let token =
            jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(secret)).unwrap();
        let err = validator.validate(&token).await.unwrap_err();
        assert_eq!(err, JwtError::UnsupportedAlgorithm("HS256"));
        assert!(
            err.to_string()
                .starts_with("token algorithm HS256 is not accepted")
        );
    }

    // A token claiming ES256 for an Ed25519 key.
    let mut header = json!({"alg": "ES256", "typ": "JWT", "kid": "k"});
    let token = format!("{}.{}.AAAA", b64(&header), b64(&claims));
    assert_eq!(
        validator.validate(&token).await,
        Err(JwtError::AlgorithmMismatch)
    );

    // A critical extension.
    header = json!({"alg": "EdDSA", "kid": "k", "crit": ["exp"], "exp": 1});
    let token = format!("{}.{}.AAAA", b64(&header), b64(&claims));
    assert!(matches!(
        validator.validate(&token).await,
        Err(JwtError::Malformed(_))
    ));

    for junk in ["", "abc", "a.b.c", "Bearer xyz", "rbx_notajwt"] {
        assert!(
            matches!(validator.validate(junk).await, Err(JwtError::Malformed(_))),
            "{junk}"
        );
    }
    // Nothing of the above was worth a fetch beyond the first.
    assert!(idp.hits("/jwks") <= 1);
}

#[tokio::test]
async fn tokens_without_kid_use_the_only_fitting_key() {
    let ed = TestKey::ed25519("ed");
    let ec = TestKey::p256("ec");
    let idp = Idp::start(&[&ed, &ec]).await;
    let validator = idp.validator();
    assert!(
        validator
            .validate(&ed.sign_with_kid(None, &idp.claims("a")))
            .await
            .is_ok()
    );
    assert!(
        validator
            .validate(&ec.sign_with_kid(None, &idp.claims("a")))
            .await
            .is_ok()
    );

    // Two Ed25519 keys: a token without kid is ambiguous.
    let ed2 = TestKey::ed25519("ed2");
    idp.set_keys(&[&ed, &ed2]);
    validator.refresh().await.unwrap();
    assert_eq!(
        validator
            .validate(&ed.sign_with_kid(None, &idp.claims("a")))
            .await,
        Err(JwtError::UnknownKey)
    );
}

#[tokio::test]
async fn discovery_falls_back_to_openid_and_checks_the_issuer() {
    let ed = TestKey::ed25519("k");
    let idp = Idp::start(&[&ed]).await;
    idp.state.lock().unwrap().rfc8414 = false;
    let validator = idp.validator();
    assert!(validator.validate(&ed.sign(&idp.claims("a"))).await.is_ok());
    assert_eq!(idp.hits("/.well-known/oauth-authorization-server"), 1);
    assert_eq!(idp.hits("/.well-known/openid-configuration"), 1);

    // Metadata that claims another issuer is not used.
    let idp = Idp::start(&[&ed]).await;
    idp.state.lock().unwrap().claimed_issuer = Some("https://evil.example.com".into());
    let validator = idp.validator();
    let err = validator.refresh().await.unwrap_err();
    assert!(err.is_server_side());
    assert!(err.to_string().contains("not the configured"), "{err}");
    assert!(!err.to_string().contains('"'), "{err}");
    assert_eq!(idp.hits("/jwks"), 0);

    // A configured JWKS URL skips discovery.
    let idp = Idp::start(&[&ed]).await;
    let mut config = JwtConfig::new(idp.issuer(), AUDIENCE);
    config.jwks_url = Some(format!("{}/jwks", idp.issuer()));
    let validator = JwtValidator::new(config).unwrap();
    assert!(validator.validate(&ed.sign(&idp.claims("a"))).await.is_ok());
    assert_eq!(idp.hits("/.well-known/oauth-authorization-server"), 0);
    assert_eq!(idp.hits("/jwks"), 1);
}

#[tokio::test]
async fn an_unreachable_or_oversized_jwks_is_a_server_side_error() {
    // Nothing listens on this port once the listener is dropped.
    let addr = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let validator = JwtValidator::new(JwtConfig::new(format!("http://{addr}"), AUDIENCE)).unwrap();
    let ed = TestKey::ed25519("k");
    let token = ed.sign(
        &json!({"iss": format!("http://{addr}"), "aud": AUDIENCE, "sub": "a", "exp": now() + 60}),
    );
    let err = validator.validate(&token).await.unwrap_err();
    assert!(matches!(err, JwtError::JwksUnavailable(_)), "{err}");
    assert!(err.is_server_side());
    // Retried no more than every few seconds: the second failure is immediate and the same.
    assert_eq!(validator.validate(&token).await.unwrap_err(), err);

    let idp = Idp::start(&[&ed]).await;
    idp.state.lock().unwrap().oversized_jwks = Some(jwks::MAX_BODY + 1);
    let err = idp.validator().refresh().await.unwrap_err();
    assert!(err.to_string().contains("larger than 1 MiB"), "{err}");
    idp.state.lock().unwrap().oversized_jwks = Some(jwks::MAX_BODY - 10);
    let err = idp.validator().refresh().await.unwrap_err();
    assert!(
        err.to_string().contains("JWKS document is not valid"),
        "{err}"
    );
}

#[test]
fn configuration_is_checked() {
    let bad = |issuer: &str, audience: &str, jwks: Option<&str>| {
        let mut config = JwtConfig::new(issuer, audience);
        config.jwks_url = jwks.map(Into::into);
        JwtValidator::new(config).unwrap_err().to_string()
    };
    assert!(bad("http://idp.example.com", "a", None).contains("must use https://"));
    assert!(bad("https://idp.example.com?x=1", "a", None).contains("query or fragment"));
    assert!(bad("https://idp.example.com", "", None).contains("audience is empty"));
    assert!(
        bad(
            "https://idp.example.com",
            "a",
            Some("http://idp.example.com/jwks")
        )
        .contains("JWKS URL")
    );
    let config = JwtConfig::new("https://idp.example.com", "a");
    assert_eq!(config.leeway, Duration::from_secs(60));
    assert_eq!(
        JwtValidator::new(config).unwrap().issuer(),
        "https://idp.example.com"
    );
}

#[test]
fn protected_resource_metadata_follows_rfc9728() {
    assert_eq!(
        protected_resource_metadata(AUDIENCE, "https://idp.example.com"),
        json!({
            "resource": "https://runbox.example.com/mcp",
            "authorization_servers": ["https://idp.example.com"],
            "bearer_methods_supported": ["header"],
        })
    );
}

#[test]
fn error_messages_carry_no_token_content() {
    for e in [
        JwtError::Malformed("x"),
        JwtError::UnknownKey,
        JwtError::BadSignature,
        JwtError::Expired,
        JwtError::WrongIssuer,
        JwtError::WrongAudience,
        JwtError::NoSubject,
    ] {
        let text = e.to_string();
        assert!(!text.contains('"') && !text.contains('\\'), "{text}");
        assert!(!e.is_server_side());
    }
}

#[test]
fn validator_and_its_futures_can_cross_threads() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let validator = JwtValidator::new(JwtConfig::new("https://idp.example.com", "a")).unwrap();
    send_sync(&validator);
    send(&validator.validate("x"));
    send(&validator.refresh());
}
