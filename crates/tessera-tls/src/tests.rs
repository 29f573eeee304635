//! Tests of the CA, the TLS settings and the cluster credentials: real
//! handshakes in memory between rustls endpoints made from these settings.

use super::*;
use rustls::{ClientConnection, ServerConnection};

fn server_request() -> CertificateRequest {
    CertificateRequest {
        name: "hosts".into(),
        ips: vec!["127.0.0.1".parse().unwrap()],
        dns_names: vec!["localhost".into()],
        usage: Usage::Server,
    }
}

fn client_request(name: &str) -> CertificateRequest {
    CertificateRequest {
        name: name.into(),
        ips: Vec::new(),
        dns_names: Vec::new(),
        usage: Usage::Client,
    }
}

fn identity(issued: &IssuedCertificate) -> Identity {
    Identity::from_pem(&issued.cert_pem, &issued.key_pem).unwrap()
}

/// Runs a handshake in memory; the server's view of the client's name, or
/// the error that ended it.
fn handshake(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
) -> Result<Option<String>, rustls::Error> {
    let mut server = ServerConnection::new(server).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut client = ClientConnection::new(client, name).unwrap();
    for _ in 0..10 {
        pump(&mut *client, &mut *server)?;
        pump(&mut *server, &mut *client)?;
        if !server.is_handshaking() && !client.is_handshaking() {
            return Ok(peer_name(&server));
        }
    }
    panic!("handshake did not finish");
}

/// Moves every record `from` wants to send into `to`, which processes them.
fn pump<F, T>(
    from: &mut rustls::ConnectionCommon<F>,
    to: &mut rustls::ConnectionCommon<T>,
) -> Result<(), rustls::Error> {
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire).unwrap();
    }
    let mut slice = wire.as_slice();
    while !slice.is_empty() {
        to.read_tls(&mut slice).unwrap();
    }
    to.process_new_packets().map(|_| ())
}

#[test]
fn a_client_with_a_certificate_from_the_cluster_ca_is_named_and_one_from_another_is_refused() {
    let ca = CertificateAuthority::generate("test").unwrap();
    let roots = TrustedRoots::from_pem(&ca.cert_pem()).unwrap();
    let server = server_config(
        &identity(&ca.issue(&server_request()).unwrap()),
        &ClientCertificates::Required(roots.clone()),
    )
    .unwrap();
    let alice = identity(&ca.issue(&client_request("alice")).unwrap());
    assert_eq!(alice.name().as_deref(), Some("alice"));
    let client = client_config(&roots, Some(&alice)).unwrap();
    assert_eq!(
        handshake(server.clone(), client).unwrap().as_deref(),
        Some("alice")
    );

    let other = CertificateAuthority::generate("other").unwrap();
    let mallory = identity(&other.issue(&client_request("alice")).unwrap());
    let client = client_config(&roots, Some(&mallory)).unwrap();
    assert!(handshake(server.clone(), client).is_err());

    let anonymous = client_config(&roots, None).unwrap();
    assert!(handshake(server, anonymous).is_err());
}

#[test]
fn an_optional_client_certificate_may_be_absent_and_a_server_of_another_ca_is_refused() {
    let ca = CertificateAuthority::generate("test").unwrap();
    let roots = TrustedRoots::from_pem(&ca.cert_pem()).unwrap();
    let server = server_config(
        &identity(&ca.issue(&server_request()).unwrap()),
        &ClientCertificates::Optional(roots.clone()),
    )
    .unwrap();
    assert_eq!(
        handshake(server.clone(), client_config(&roots, None).unwrap()).unwrap(),
        None
    );
    let other = CertificateAuthority::generate("other").unwrap();
    let other_roots = TrustedRoots::from_pem(&other.cert_pem()).unwrap();
    assert!(handshake(server, client_config(&other_roots, None).unwrap()).is_err());
}

#[test]
fn a_client_certificate_cannot_serve_and_a_ca_key_must_match_its_certificate() {
    let ca = CertificateAuthority::generate("test").unwrap();
    let roots = TrustedRoots::from_pem(&ca.cert_pem()).unwrap();
    let wrong_use = identity(&ca.issue(&client_request("127.0.0.1")).unwrap());
    let server = server_config(&wrong_use, &ClientCertificates::NotAsked).unwrap();
    assert!(handshake(server, client_config(&roots, None).unwrap()).is_err());

    let other = CertificateAuthority::generate("other").unwrap();
    let err = CertificateAuthority::from_pem(&ca.cert_pem(), &other.key_pem())
        .err()
        .expect("a foreign key is refused");
    assert!(err.to_string().contains("does not belong"), "{err}");
    let again = CertificateAuthority::from_pem(&ca.cert_pem(), &ca.key_pem()).unwrap();
    // Certificates the CA signs after a restart are still trusted.
    let server = server_config(
        &identity(&again.issue(&server_request()).unwrap()),
        &ClientCertificates::NotAsked,
    )
    .unwrap();
    assert!(handshake(server, client_config(&roots, None).unwrap()).is_ok());
}

#[test]
fn bad_pem_is_a_clear_error() {
    let err = TrustedRoots::from_pem("not a certificate").unwrap_err();
    assert!(err.to_string().contains("no certificate"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let err = TrustedRoots::load(&missing).unwrap_err();
    assert!(err.to_string().contains("missing.pem"), "{err}");
}

#[test]
fn cluster_credentials_are_made_once_kept_and_their_keys_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let ips: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap()];
    let creds = ClusterCredentials::ensure(&tls, "test", &ips, "local-admin").unwrap();
    for key in [
        creds.ca_key(),
        creds.server_key(),
        creds.client_key(),
        creds.secrets_key(),
    ] {
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", key.display());
    }
    let ca = std::fs::read_to_string(creds.ca_cert()).unwrap();
    let server = std::fs::read_to_string(creds.server_cert()).unwrap();
    assert_eq!(std::fs::read_to_string(creds.client_ca_cert()).unwrap(), ca);
    let sealed = SecretsKey::load(&creds.secrets_key())
        .unwrap()
        .seal("p", "s")
        .unwrap();
    let again = ClusterCredentials::ensure(&tls, "test", &ips, "local-admin").unwrap();
    let kept = SecretsKey::load(&again.secrets_key()).unwrap();
    assert_eq!(
        kept.open("p", &sealed).unwrap(),
        "s",
        "the secrets key was kept"
    );
    assert_eq!(std::fs::read_to_string(again.ca_cert()).unwrap(), ca);
    assert_eq!(
        std::fs::read_to_string(again.server_cert()).unwrap(),
        server
    );
    // A new address needs a new server certificate, from the same CA.
    let more: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "127.0.0.3".parse().unwrap()];
    let third = ClusterCredentials::ensure(&tls, "test", &more, "local-admin").unwrap();
    assert_eq!(std::fs::read_to_string(third.ca_cert()).unwrap(), ca);
    assert_ne!(
        std::fs::read_to_string(third.server_cert()).unwrap(),
        server
    );
    let server = server_config(
        &third.server_identity().unwrap(),
        &ClientCertificates::Required(third.roots().unwrap()),
    )
    .unwrap();
    let client = client_config(
        &third.roots().unwrap(),
        Some(&third.client_identity().unwrap()),
    );
    assert_eq!(
        handshake(server, client.unwrap()).unwrap().as_deref(),
        Some("local-admin")
    );
}
