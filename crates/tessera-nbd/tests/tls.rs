//! NBD over TLS (`NBD_OPT_STARTTLS`) and per-export admission, driven by
//! libnbd's tools: certificates from the cluster CA admit a client by the
//! name they prove, certificates from another CA do not get in, a server
//! that requires TLS refuses plain clients, and data crosses TLS intact.

mod common;

use common::{have_tool, run_bounded, run_ok, TestServer};
use std::path::Path;
use std::sync::Arc;
use tessera_blockdev::{BlockDevice, MemoryDevice};
use tessera_nbd::{ExportCatalog, NbdClient, NbdTls, StaticCatalog};
use tessera_tls::{
    server_config, CertificateAuthority, CertificateRequest, ClientCertificates, Identity,
    TrustedRoots, Usage,
};

const MIB: u64 = 1 << 20;

/// `secret` admits only TLS clients proving `alice`; `open` admits anyone.
struct Guarded(StaticCatalog);

impl ExportCatalog for Guarded {
    fn list(&self) -> Vec<String> {
        self.0.list()
    }
    fn open(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.0.open(name)
    }
    fn admits(&self, name: &str, client: &NbdClient) -> Result<(), String> {
        if name == "secret" && client.certificate.as_deref() != Some("alice") {
            return Err(format!("export {name} admits only alice"));
        }
        Ok(())
    }
}

fn catalog() -> Arc<dyn ExportCatalog> {
    let catalog = StaticCatalog::new();
    catalog.insert(
        "secret",
        Arc::new(MemoryDevice::new("secret", 8 * MIB)),
        None,
    );
    catalog.insert("open", Arc::new(MemoryDevice::new("open", 4 * MIB)), None);
    Arc::new(Guarded(catalog))
}

/// A GnuTLS client directory (`ca-cert.pem`, `client-cert.pem`,
/// `client-key.pem`) holding a certificate for `name` signed by `signer`,
/// trusting `trusted`.
fn client_dir(
    dir: &Path,
    trusted: &CertificateAuthority,
    signer: &CertificateAuthority,
    name: &str,
) {
    std::fs::create_dir_all(dir).unwrap();
    let issued = signer
        .issue(&CertificateRequest {
            name: name.into(),
            ips: Vec::new(),
            dns_names: Vec::new(),
            usage: Usage::Client,
        })
        .unwrap();
    std::fs::write(dir.join("ca-cert.pem"), trusted.cert_pem()).unwrap();
    std::fs::write(dir.join("client-cert.pem"), issued.cert_pem).unwrap();
    std::fs::write(dir.join("client-key.pem"), issued.key_pem).unwrap();
}

fn tls(ca: &CertificateAuthority, required: bool) -> NbdTls {
    let issued = ca
        .issue(&CertificateRequest {
            name: "test host".into(),
            ips: vec!["127.0.0.1".parse().unwrap()],
            dns_names: vec!["localhost".into()],
            usage: Usage::Server,
        })
        .unwrap();
    let identity = Identity::from_pem(&issued.cert_pem, &issued.key_pem).unwrap();
    let roots = TrustedRoots::from_pem(&ca.cert_pem()).unwrap();
    NbdTls {
        config: server_config(&identity, &ClientCertificates::Optional(roots)).unwrap(),
        required,
    }
}

/// A CA and a client directory for `alice` signed by it.
fn alice() -> (CertificateAuthority, tempfile::TempDir, std::path::PathBuf) {
    let ca = CertificateAuthority::generate("test").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let alice = dir.path().join("alice");
    client_dir(&alice, &ca, &ca, "alice");
    (ca, dir, alice)
}

fn uri(server: &TestServer, export: &str, dir: &Path) -> String {
    format!(
        "nbds://{}/{export}?tls-certificates={}",
        server.addr,
        dir.display()
    )
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_server_requiring_tls_admits_clients_by_their_certificate() {
    if !have_tool("nbdinfo", &["--version"]) || !have_tool("nbdcopy", &["--version"]) {
        return;
    }
    let ca = CertificateAuthority::generate("test").unwrap();
    let other = CertificateAuthority::generate("other").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let alice = dir.path().join("alice");
    let bob = dir.path().join("bob");
    let mallory = dir.path().join("mallory");
    client_dir(&alice, &ca, &ca, "alice");
    client_dir(&bob, &ca, &ca, "bob");
    client_dir(&mallory, &ca, &other, "alice");
    let server = TestServer::start_with_tls(catalog(), Some(tls(&ca, true)));

    // alice sees and opens both exports over TLS.
    let listed = run_ok(
        30,
        "nbdinfo",
        &["--list", "--json", &uri(&server, "", &alice)],
    );
    assert!(
        listed.contains("\"secret\"") && listed.contains("\"open\""),
        "{listed}"
    );
    let size = run_ok(30, "nbdinfo", &["--size", &uri(&server, "secret", &alice)]);
    assert_eq!(size.trim(), (8 * MIB).to_string());

    // bob is a client of the cluster, but `secret` is not his: it is not
    // listed, and opening it fails with the catalog's reason.
    let listed = run_ok(
        30,
        "nbdinfo",
        &["--list", "--json", &uri(&server, "", &bob)],
    );
    assert!(
        !listed.contains("\"secret\"") && listed.contains("\"open\""),
        "{listed}"
    );
    let refused = run_bounded(30, "nbdinfo", &["--size", &uri(&server, "secret", &bob)]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("policy"), "{}", stderr(&refused));

    // A certificate from another CA proves nothing, whatever name it
    // claims: its holder is an anonymous TLS client, kept out of `secret`.
    let refused = run_bounded(
        30,
        "nbdinfo",
        &["--size", &uri(&server, "secret", &mallory)],
    );
    assert!(!refused.status.success(), "{}", stderr(&refused));
    let listed = run_ok(
        30,
        "nbdinfo",
        &["--list", "--json", &uri(&server, "", &mallory)],
    );
    assert!(!listed.contains("\"secret\""), "{listed}");

    // A plain client is told TLS is required, even for the open export.
    let plain = format!("nbd://{}/open", server.addr);
    let refused = run_bounded(30, "nbdinfo", &["--size", &plain]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).to_lowercase().contains("tls"),
        "{}",
        stderr(&refused)
    );

    // Data written over TLS reads back the same, in requests large and
    // small (nbdcopy sends 256 KiB requests on several connections).
    let pattern: Vec<u8> = (0..8 * MIB as usize)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let source = dir.path().join("pattern");
    let back = dir.path().join("back");
    std::fs::write(&source, &pattern).unwrap();
    run_ok(
        60,
        "nbdcopy",
        &[source.to_str().unwrap(), &uri(&server, "secret", &alice)],
    );
    run_ok(
        60,
        "nbdcopy",
        &[&uri(&server, "secret", &alice), back.to_str().unwrap()],
    );
    assert!(
        std::fs::read(&back).unwrap() == pattern,
        "data changed over TLS"
    );
}

#[test]
fn a_server_offering_tls_still_serves_plain_clients_what_they_are_admitted_to() {
    if !have_tool("nbdinfo", &["--version"]) {
        return;
    }
    let (ca, _dir, alice) = alice();
    let server = TestServer::start_with_tls(catalog(), Some(tls(&ca, false)));
    let plain = |export: &str| format!("nbd://{}/{export}", server.addr);
    let size = run_ok(30, "nbdinfo", &["--size", &plain("open")]);
    assert_eq!(size.trim(), (4 * MIB).to_string());
    let refused = run_bounded(30, "nbdinfo", &["--size", &plain("secret")]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("policy"), "{}", stderr(&refused));
    let size = run_ok(30, "nbdinfo", &["--size", &uri(&server, "secret", &alice)]);
    assert_eq!(size.trim(), (8 * MIB).to_string());
}

#[test]
fn a_server_without_tls_refuses_starttls_with_a_reason() {
    if !have_tool("nbdinfo", &["--version"]) {
        return;
    }
    let (_ca, _dir, alice) = alice();
    let server = TestServer::start_with_tls(catalog(), None);
    let refused = run_bounded(30, "nbdinfo", &["--size", &uri(&server, "open", &alice)]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).to_lowercase().contains("tls"),
        "{}",
        stderr(&refused)
    );
}

/// Many small requests in flight on each connection over TLS, as a guest
/// sends them: several arrive in one TLS record or one read of the socket,
/// their replies leave together, and every byte written reads back (fio's
/// own checksums). fio's nbd engine takes no file names in its URI, so
/// libnbd trusts the server by the CA where it looks by default,
/// `$HOME/.pki/libnbd`, and the export is one that admits any TLS client.
#[test]
fn fio_verifies_small_pipelined_requests_over_tls() {
    if !have_tool("fio", &["--version"]) || !have_tool("nbdinfo", &["--version"]) {
        return;
    }
    let (ca, dir, alice) = alice();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".pki")).unwrap();
    std::fs::rename(&alice, home.join(".pki/libnbd")).unwrap();
    let server = TestServer::start_with_tls(catalog(), Some(tls(&ca, true)));
    let per_job = MIB;
    let job = dir.path().join("verify.fio");
    std::fs::write(
        &job,
        format!(
            "[global]\nioengine=nbd\nuri=nbds://{}/open\nrw=randrw\nrwmixread=30\nbs=4k\n\
             iodepth=16\nnumjobs=4\nsize={per_job}\noffset_increment={per_job}\nverify=crc32c\n\
             verify_fatal=1\nverify_state_save=0\ndo_verify=1\ngroup_reporting=1\n[verify]\n",
            server.addr
        ),
    )
    .unwrap();
    let out = std::process::Command::new("timeout")
        .args(["-k", "5", "300", "fio", "--output-format=json"])
        .arg(&job)
        .env("HOME", &home)
        .output()
        .expect("cannot start fio");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed: {}\n{text}\n{}",
        out.status,
        stderr(&out)
    );
    let report: serde_json::Value =
        serde_json::from_str(&text[text.find('{').expect("fio json")..]).expect("fio json");
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "fio reported an error");
    assert!(job["write"]["io_bytes"].as_u64().unwrap_or(0) > 0);
    assert!(job["read"]["io_bytes"].as_u64().unwrap_or(0) > 0);
}
