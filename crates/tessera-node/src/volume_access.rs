//! Who may use a volume: the one access record both frontends enforce.
//!
//! Owns: turning a volume's [`VolumeAccessRecord`] into the NBD admission
//! of one client and the initiators of its iSCSI targets.
//! Must not touch: sockets, TLS or the directory; callers hand in the record
//! and what the client proved.
//! Invariants:
//! - a record that names anyone (initiators, a CHAP user, NBD clients)
//!   admits nobody else on either frontend, loopback included;
//! - an NBD client is known by the name its certificate proves, and only
//!   when the cluster CA signed it (the TLS layer checked that); an address
//!   proves nothing but where plain clients may come from.

use tessera_directory::keys::{PlainNbd, VolumeAccessRecord};
use tessera_iscsi::Initiators;
use tessera_nbd::NbdClient;

/// Whether `client` may see and open the NBD exports of `volume` (its own
/// and its snapshots'); the reason it may not.
pub fn nbd_admission(
    volume: &str,
    record: Option<&VolumeAccessRecord>,
    client: &NbdClient,
) -> Result<(), String> {
    let named = record.is_some_and(VolumeAccessRecord::names_anyone);
    let listed = |name: &str| record.is_some_and(|r| r.nbd_clients.iter().any(|c| c == name));
    match &client.certificate {
        Some(name) if !named || listed(name) => return Ok(()),
        Some(name) => {
            return Err(format!(
                "volume {volume} does not admit the NBD client {name:?} \
                 (tessera volume access {volume} --nbd-client {name} admits it)"
            ))
        }
        None if named => {
            return Err(format!(
                "volume {volume} admits only the clients its access record names: \
                 connect over TLS with a client certificate it names"
            ))
        }
        None => {}
    }
    let plain = record.map(|r| r.plain_nbd).unwrap_or_default();
    match plain {
        PlainNbd::Anywhere => Ok(()),
        PlainNbd::Loopback if client.is_loopback() => Ok(()),
        PlainNbd::Loopback => Err(format!(
            "volume {volume} admits NBD clients without a certificate only from the \
             serving host; connect over TLS with a certificate from the cluster CA"
        )),
        PlainNbd::Nowhere => Err(format!(
            "volume {volume} admits only NBD clients with a certificate from the cluster CA"
        )),
    }
}

/// The initiators a volume's iSCSI targets admit (CHAP comes on top).
pub fn iscsi_initiators(record: Option<&VolumeAccessRecord>) -> Initiators {
    match record {
        Some(r) if !r.allowed_initiators.is_empty() => {
            Initiators::Only(r.allowed_initiators.clone())
        }
        // A record that names only NBD clients keeps every initiator out.
        Some(r) if !r.nbd_clients.is_empty() && r.initiator_chap.is_none() => {
            Initiators::Only(Vec::new())
        }
        _ => Initiators::Any,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_directory::keys::ChapRecord;
    use tessera_types::VolumeId;

    fn record() -> VolumeAccessRecord {
        VolumeAccessRecord {
            volume: VolumeId::new("db").unwrap(),
            allowed_initiators: Vec::new(),
            initiator_chap: None,
            target_chap: None,
            nbd_clients: Vec::new(),
            plain_nbd: PlainNbd::Loopback,
        }
    }

    fn client(address: &str, certificate: Option<&str>) -> NbdClient {
        NbdClient {
            address: Some(address.parse().unwrap()),
            tls: certificate.is_some(),
            certificate: certificate.map(str::to_owned),
        }
    }

    #[test]
    fn an_open_volume_admits_plain_clients_from_loopback_and_every_certificate() {
        for r in [None, Some(record())] {
            let r = r.as_ref();
            assert!(nbd_admission("db", r, &client("127.0.0.3", None)).is_ok());
            assert!(nbd_admission("db", r, &client("::1", None)).is_ok());
            let err = nbd_admission("db", r, &client("10.0.0.7", None)).unwrap_err();
            assert!(err.contains("only from the serving host"), "{err}");
            assert!(nbd_admission("db", r, &client("10.0.0.7", Some("esx1"))).is_ok());
        }
        let mut anywhere = record();
        anywhere.plain_nbd = PlainNbd::Anywhere;
        assert!(nbd_admission("db", Some(&anywhere), &client("10.0.0.7", None)).is_ok());
        let mut nowhere = record();
        nowhere.plain_nbd = PlainNbd::Nowhere;
        assert!(nbd_admission("db", Some(&nowhere), &client("127.0.0.1", None)).is_err());
        assert!(nbd_admission("db", Some(&nowhere), &client("127.0.0.1", Some("a"))).is_ok());
        assert_eq!(iscsi_initiators(Some(&record())), Initiators::Any);
    }

    #[test]
    fn a_record_that_names_anyone_admits_nobody_else_on_either_frontend() {
        let mut initiators = record();
        initiators.allowed_initiators = vec!["iqn.1994-05.com.redhat:esx1".into()];
        initiators.plain_nbd = PlainNbd::Anywhere;
        let mut chap = record();
        chap.initiator_chap = Some(ChapRecord {
            user: "alice".into(),
            secret: "alice-secret-12".into(),
        });
        let mut nbd = record();
        nbd.nbd_clients = vec!["esx1".into()];
        for r in [&initiators, &chap, &nbd] {
            let err = nbd_admission("db", Some(r), &client("127.0.0.1", None)).unwrap_err();
            assert!(err.contains("names"), "{err}");
            let err =
                nbd_admission("db", Some(r), &client("127.0.0.1", Some("mallory"))).unwrap_err();
            assert!(err.contains("--nbd-client mallory"), "{err}");
        }
        assert!(nbd_admission("db", Some(&nbd), &client("10.0.0.7", Some("esx1"))).is_ok());
        assert_eq!(
            iscsi_initiators(Some(&initiators)),
            Initiators::Only(vec!["iqn.1994-05.com.redhat:esx1".into()])
        );
        assert_eq!(
            iscsi_initiators(Some(&chap)),
            Initiators::Any,
            "CHAP decides"
        );
        assert_eq!(iscsi_initiators(Some(&nbd)), Initiators::Only(Vec::new()));
    }
}
