//! The admin verbs: one API request each, then its answer printed.
//!
//! Owns: which request each verb sends and what it prints on stdout.
//! Must not touch: cluster logic (the API decides everything; the CLI only
//! asks and prints) and the engine (no verb here opens a disk, except
//! `store check`, which reads devices offline through the store's checker).
//! Invariant: with `--json` the API's JSON is printed as it came, so
//! scripts see the documented shape; verbs whose API answer is empty
//! (stop, start, delete) print nothing with `--json`.

use crate::args::{
    Command, DiskGroupCommand, EncryptionCommand, FaultCommand, HostCommand, ObjectCommand,
    PolicyCommand, ResyncCommand, ScrubCommand, SettingsCommand, SnapshotCommand, StoreCommand,
    TokenCommand, VolumeCommand,
};
use crate::client::{decode, segment, ApiClient, CliError, VERIFY_TIMEOUT};
use crate::render;
use crate::top;
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use tessera_node::control::{
    AuditRecord, ClusterSettings, ControlError, CreatedToken, EncryptionView, EvacuationView,
    EventView, HealthReport, HostSettingsView, HostView, IscsiAccessView, ObjectView, ResyncView,
    ScrubView, Severity, SnapshotDeleted, SnapshotView, StatusView, TokenView, VerifyReport,
    VolumeActivity, VolumeView, HOST_SETTING_NAMES,
};
use tessera_types::policy::Policy;

/// Where the verbs print.
pub struct Output<'a> {
    /// Print the API's JSON.
    pub json: bool,
    /// Standard output (a buffer in tests).
    pub out: &'a mut dyn Write,
}

impl Output<'_> {
    fn text(&mut self, text: &str) -> Result<(), CliError> {
        self.out
            .write_all(text.as_bytes())
            .map_err(|e| CliError::Local(format!("cannot write the output: {e}")))
    }

    fn json(&mut self, value: &Value) -> Result<(), CliError> {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| CliError::Local(format!("cannot print JSON: {e}")))?;
        self.text(&format!("{text}\n"))
    }

    /// Prints `value` as JSON, or decoded as `T` and rendered by `human`.
    fn view<T: serde::de::DeserializeOwned>(
        &mut self,
        what: &str,
        value: Value,
        human: impl FnOnce(&T) -> String,
    ) -> Result<T, CliError> {
        if self.json {
            self.json(&value)?;
        }
        let view: T = decode(what, value)?;
        if !self.json {
            self.text(&human(&view))?;
        }
        Ok(view)
    }
}

/// Runs an admin verb against `api`, or `store check` locally.
pub fn run(
    command: &Command,
    api: &str,
    credentials: crate::client::Credentials,
    output: &mut Output<'_>,
) -> Result<(), CliError> {
    let client = match command {
        Command::Store(StoreCommand::Check { paths, kek_file }) => {
            return store_check(paths, kek_file.as_deref(), output)
        }
        Command::Up(_) | Command::Node(_) => {
            return Err(CliError::Usage(
                "`tessera up` and `tessera node` run daemons; they are not API requests"
                    .to_string(),
            ))
        }
        _ => ApiClient::new(api, credentials.ca_cert.as_deref())?.with_token(credentials.token),
    };
    match command {
        Command::Token(TokenCommand::Create {
            name,
            role,
            expires_in,
        }) => {
            let mut body = json!({"name": name, "role": role});
            if let Some(s) = expires_in {
                body["expires_in_s"] = json!(s);
            }
            let v = client.post_json("/v1/tokens", &body)?;
            output.view::<CreatedToken>("/v1/tokens", v, render::token_created)?;
        }
        Command::Audit { limit } => {
            let path = format!("/v1/audit?limit={limit}");
            let v = client.get(&path)?;
            output.view::<Vec<AuditRecord>>(&path, v, |entries| render::audit(entries))?;
        }
        Command::Events { limit, follow } => events(&client, *limit, *follow, output)?,
        Command::Token(TokenCommand::List) => {
            let v = client.get("/v1/tokens")?;
            output.view::<Vec<TokenView>>("/v1/tokens", v, |t| render::tokens(t))?;
        }
        Command::Token(TokenCommand::Revoke { id }) => {
            client.delete(&format!("/v1/tokens/{}", segment(id)))?;
            if !output.json {
                output.text(&format!("revoked token {id}\n"))?;
            }
        }
        Command::Status { every } => status(&client, every.watch, output)?,
        Command::Top {
            batch,
            delay,
            iterations,
        } => top(&client, *batch, *delay, *iterations, output)?,
        Command::Health => {
            let v = client.get("/v1/health")?;
            let report = output.view::<HealthReport>("/v1/health", v, render::health_report)?;
            if report.checks.iter().any(|c| c.severity == Severity::Error) {
                return Err(CliError::Found(format!(
                    "the cluster is {}: {} error(s)",
                    render::health(report.health),
                    report
                        .checks
                        .iter()
                        .filter(|c| c.severity == Severity::Error)
                        .count()
                )));
            }
        }
        Command::Settings(SettingsCommand::Show { host: None }) => {
            let v = client.get("/v1/settings")?;
            if output.json {
                output.json(&v)?;
            } else {
                let settings: ClusterSettings = decode("/v1/settings", v)?;
                let hosts: Vec<HostView> = decode("/v1/hosts", client.get("/v1/hosts")?)?;
                output.text(&format!(
                    "{}{}",
                    render::settings(&settings),
                    render::hosts_own_settings(&hosts)
                ))?;
            }
        }
        Command::Settings(SettingsCommand::Show { host: Some(host) }) => {
            let path = host_settings_path(host);
            let v = client.get(&path)?;
            output.view::<HostSettingsView>(&path, v, render::host_settings)?;
        }
        Command::Settings(SettingsCommand::Get { name, host }) => {
            // The row to print, and the values the JSON one is taken from.
            let (row, v) = match host {
                None => {
                    let v = client.get("/v1/settings")?;
                    let settings: ClusterSettings = decode("/v1/settings", v.clone())?;
                    (render::setting(&settings, name), v)
                }
                Some(host) => {
                    let path = host_settings_path(host);
                    let view: HostSettingsView = decode(&path, client.get(&path)?)?;
                    let v = serde_json::to_value(&view.settings).unwrap_or_default();
                    (render::host_setting(&view, name), v)
                }
            };
            let Some(row) = row else {
                return Err(unknown_setting(name));
            };
            if output.json {
                output.json(v.get(name.as_str()).unwrap_or(&Value::Null))?;
            } else {
                output.text(&row)?;
            }
        }
        Command::Settings(SettingsCommand::Set {
            name,
            value,
            host: None,
        }) => {
            let body = setting_change(name, value)?;
            let v = client.patch_json("/v1/settings", &body)?;
            output.view::<ClusterSettings>("/v1/settings", v, render::settings)?;
        }
        Command::Settings(SettingsCommand::Set {
            name,
            value,
            host: Some(host),
        }) => {
            let body = host_setting_change(name, value, host)?;
            let path = host_settings_path(host);
            let v = client.patch_json(&path, &body)?;
            output.view::<HostSettingsView>(&path, v, render::host_settings)?;
        }
        Command::Settings(SettingsCommand::Reset { name, host: None }) => {
            let defaults = serde_json::to_value(ClusterSettings::default()).unwrap_or_default();
            if render::setting(&ClusterSettings::default(), name).is_none() {
                return Err(unknown_setting(name));
            }
            // A setting whose default is each host's own has no value.
            let value = defaults.get(name.as_str()).cloned().unwrap_or(Value::Null);
            let v = client.patch_json("/v1/settings", &json!({ name.as_str(): value }))?;
            output.view::<ClusterSettings>("/v1/settings", v, render::settings)?;
        }
        Command::Settings(SettingsCommand::Reset {
            name,
            host: Some(host),
        }) => {
            host_scoped(name, host)?;
            let path = host_settings_path(host);
            let v = client.patch_json(&path, &json!({ name.as_str(): null }))?;
            output.view::<HostSettingsView>(&path, v, render::host_settings)?;
        }
        Command::Host(HostCommand::Show { host }) => {
            let path = format!("/v1/hosts/{}", segment(host));
            let v = client.get(&path)?;
            output.view::<HostView>(&path, v, |h| render::hosts(std::slice::from_ref(h)))?;
        }
        Command::Policy(PolicyCommand::Show { name }) => {
            let path = format!("/v1/policies/{}", segment(name));
            let v = client.get(&path)?;
            output.view::<Policy>(&path, v, |p| render::policies(std::slice::from_ref(p)))?;
        }
        Command::Policy(PolicyCommand::Set {
            name,
            ftt,
            stripe_width,
            space_reservation,
            qos,
        }) => {
            if ftt.is_none() && stripe_width.is_none() && space_reservation.is_none() && !qos.any()
            {
                return Err(CliError::Usage(
                    "policy set needs at least one of --ftt, --stripe-width, --space-reservation, --iops-limit, --bandwidth-limit, --iops-minimum"
                        .to_string(),
                ));
            }
            let path = format!("/v1/policies/{}", segment(name));
            let mut body = serde_json::Map::new();
            if let Some(f) = ftt {
                body.insert("failures_to_tolerate".into(), json!(f));
            }
            if let Some(w) = stripe_width {
                body.insert("stripe_width".into(), json!(w));
            }
            if let Some(r) = space_reservation {
                body.insert("space_reservation_pct".into(), json!(r));
            }
            if qos.any() {
                body.insert("qos".into(), qos.json());
            }
            let v = client.patch_json(&path, &Value::Object(body))?;
            output.view::<Policy>(&path, v, |p| render::policies(std::slice::from_ref(p)))?;
        }
        Command::Policy(PolicyCommand::Delete { name }) => {
            client.delete(&format!("/v1/policies/{}", segment(name)))?;
            if !output.json {
                output.text(&format!("deleted policy {name}\n"))?;
            }
        }
        Command::Volume(VolumeCommand::Rename { name, new_name }) => {
            let path = format!("/v1/volumes/{}/rename", segment(name));
            let v = client.post_json(&path, &json!({ "new_name": new_name }))?;
            output.view::<VolumeView>(&path, v, |v| {
                render::volume_changed(&format!("renamed {name} to"), v)
            })?;
        }
        Command::Volume(VolumeCommand::Show { name }) => {
            let path = format!("/v1/volumes/{}", segment(name));
            let v = client.get(&path)?;
            output.view::<VolumeView>(&path, v, |v| render::volumes(std::slice::from_ref(v)))?;
        }
        Command::Host(HostCommand::List) => {
            let v = client.get("/v1/hosts")?;
            output.view::<Vec<HostView>>("/v1/hosts", v, |h| render::hosts(h))?;
        }
        Command::Host(HostCommand::Stop { host }) => {
            client.post_json(&format!("/v1/hosts/{}/stop", segment(host)), &json!({}))?;
            if !output.json {
                output.text(&format!("stopped host {host}\n"))?;
            }
        }
        Command::Fault(FaultCommand::CorruptBlock {
            host,
            volume,
            block,
        }) => {
            inject(
                &client,
                host,
                &json!({"kind": "corrupt-block", "volume": volume, "block": block}),
            )?;
            if !output.json {
                output.text(&format!(
                    "one bit of block {block} of {volume}'s copy on {host} flipped\n"
                ))?;
            }
        }
        Command::Fault(FaultCommand::Delay {
            host,
            peer,
            ms,
            jitter_ms,
        }) => {
            let body = json!({"kind": "network-delay", "peer": peer, "delay_ms": ms, "jitter_ms": jitter_ms});
            inject(&client, host, &body)?;
            if !output.json {
                let jitter = if *jitter_ms > 0 {
                    format!(" plus up to {jitter_ms} ms")
                } else {
                    String::new()
                };
                output.text(&format!(
                    "frames {host} sends to {} wait {ms} ms{jitter} from now on\n",
                    peer_words(peer)
                ))?;
            }
        }
        Command::Fault(FaultCommand::Drop {
            host,
            peer,
            percent,
        }) => {
            let body = json!({"kind": "network-drop", "peer": peer, "percent": percent});
            inject(&client, host, &body)?;
            if !output.json {
                output.text(&format!(
                    "{percent}% of the frames {host} sends to {} are lost from now on\n",
                    peer_words(peer)
                ))?;
            }
        }
        Command::Fault(FaultCommand::Partition { host, peer }) => {
            inject(&client, host, &json!({"kind": "partition", "peer": peer}))?;
            if !output.json {
                output.text(&format!(
                    "{host} and {} no longer reach each other\n",
                    peer_words(peer)
                ))?;
            }
        }
        Command::Fault(FaultCommand::Heal { host }) => {
            inject(&client, host, &json!({"kind": "network-heal"}))?;
            if !output.json {
                output.text(&format!("network faults of {host} ended\n"))?;
            }
        }
        Command::Scrub(ScrubCommand::List) => {
            let v = client.get("/v1/scrubs")?;
            output.view::<Vec<ScrubView>>("/v1/scrubs", v, |rows| render::scrubs(rows))?;
        }
        Command::Scrub(ScrubCommand::Start { host }) => {
            let path = format!("/v1/hosts/{}/scrub", segment(host));
            let v = client.post_json(&path, &json!({}))?;
            output.view::<Vec<ScrubView>>(&path, v, |rows| {
                format!(
                    "scrub pass of {host}'s disk groups started; `tessera scrub list` shows it\n{}",
                    render::scrubs(rows)
                )
            })?;
        }
        Command::Fault(FaultCommand::FailDevice {
            host,
            disk_group,
            device,
        }) => {
            inject(
                &client,
                host,
                &json!({"kind": "fail-device", "disk_group": disk_group, "device": device}),
            )?;
            if !output.json {
                let which = if *device == 0 {
                    "cache device".to_string()
                } else {
                    format!("capacity device {device}")
                };
                output.text(&format!(
                    "{which} of {host}'s disk group {disk_group} fails from now on\n"
                ))?;
            }
        }
        Command::Host(HostCommand::Evacuate { host, end: true }) => {
            client.delete(&format!("/v1/hosts/{}/evacuation", segment(host)))?;
            if !output.json {
                output.text(&format!(
                    "evacuation of {host} ended: it takes new components again\n"
                ))?;
            }
        }
        Command::Host(HostCommand::Evacuate { host, end: false }) => {
            evacuate(&client, output, host, None)?;
        }
        Command::DiskGroup(DiskGroupCommand::Evacuate { host, disk_group }) => {
            evacuate(&client, output, host, Some(disk_group))?;
        }
        Command::Encryption(EncryptionCommand::List) => {
            let v = client.get("/v1/encryption")?;
            output.view::<Vec<EncryptionView>>("/v1/encryption", v, |rows| {
                render::encryption(rows)
            })?;
        }
        Command::Encryption(EncryptionCommand::Rekey {
            host,
            deep,
            disk_group,
            wait,
        }) => rekey(&client, output, host, *deep, disk_group.as_deref(), *wait)?,
        Command::Host(HostCommand::Start { host }) => {
            client.post_json(&format!("/v1/hosts/{}/start", segment(host)), &json!({}))?;
            if !output.json {
                output.text(&format!("started host {host}\n"))?;
            }
        }
        Command::Policy(PolicyCommand::Create {
            name,
            ftt,
            stripe_width,
            space_reservation,
            qos,
        }) => {
            let v = client.post_json(
                "/v1/policies",
                &json!({
                    "name": name,
                    "failures_to_tolerate": ftt,
                    "stripe_width": stripe_width,
                    "space_reservation_pct": space_reservation,
                    "qos": qos.json(),
                }),
            )?;
            output.view::<Policy>("/v1/policies", v, render::policy_created)?;
        }
        Command::Policy(PolicyCommand::List) => {
            let v = client.get("/v1/policies")?;
            output.view::<Vec<Policy>>("/v1/policies", v, |p| render::policies(p))?;
        }
        Command::Volume(VolumeCommand::Create {
            name,
            size,
            policy,
            block_size,
        }) => {
            let v = client.post_json(
                "/v1/volumes",
                &json!({
                    "name": name,
                    "size_bytes": size,
                    "policy": policy,
                    "block_bytes": block_size,
                }),
            )?;
            let created = output
                .view::<VolumeView>("/v1/volumes", v, |v| render::volume_changed("created", v))?;
            if !output.json {
                let hint = nbd_hint(&client, &created);
                output.text(&hint)?;
            }
        }
        Command::Volume(VolumeCommand::List) => {
            let v = client.get("/v1/volumes")?;
            output.view::<Vec<VolumeView>>("/v1/volumes", v, |v| render::volumes(v))?;
        }
        Command::Volume(VolumeCommand::Resize { name, size }) => {
            let path = format!("/v1/volumes/{}/resize", segment(name));
            let v = client.post_json(&path, &json!({ "size_bytes": size }))?;
            output.view::<VolumeView>(&path, v, |v| render::volume_changed("resized", v))?;
        }
        Command::Volume(VolumeCommand::Access {
            name,
            allow,
            chap_user,
            chap_secret,
            target_chap_user,
            target_chap_secret,
            nbd_clients,
            plain_nbd,
            open,
        }) => {
            let path = format!("/v1/volumes/{}/access", segment(name));
            let setting = *open
                || !allow.is_empty()
                || chap_user.is_some()
                || !nbd_clients.is_empty()
                || plain_nbd.is_some();
            let v = if setting {
                let credential = |user: &Option<String>, secret: &Option<String>| {
                    user.as_ref()
                        .map(|u| json!({ "user": u, "secret": secret.clone().unwrap_or_default() }))
                };
                client.put_json(
                    &path,
                    &json!({
                        "allowed_initiators": allow,
                        "initiator_chap": credential(chap_user, chap_secret),
                        "target_chap": credential(target_chap_user, target_chap_secret),
                        "nbd_clients": nbd_clients,
                        "plain_nbd": plain_nbd,
                    }),
                )?
            } else {
                client.get(&path)?
            };
            output.view::<IscsiAccessView>(&path, v, render::iscsi_access)?;
        }
        Command::Volume(VolumeCommand::Delete { name, force }) => {
            let query = if *force { "?force=true" } else { "" };
            client.delete(&format!("/v1/volumes/{}{query}", segment(name)))?;
            if !output.json {
                output.text(&format!("deleted volume {name}\n"))?;
            }
        }
        Command::Snapshot(SnapshotCommand::Create {
            volume,
            name,
            group,
        }) => {
            let path = format!("/v1/volumes/{}/snapshots", segment(volume));
            let body = if group.is_empty() {
                json!({ "name": name })
            } else {
                json!({ "name": name, "group": group })
            };
            let v = client.post_json(&path, &body)?;
            output.view::<SnapshotView>(&path, v, render::snapshot_taken)?;
        }
        Command::Volume(VolumeCommand::Revert { name, to }) => {
            let path = format!("/v1/volumes/{}/revert", segment(name));
            let v = client.post_json(&path, &json!({ "to": to }))?;
            output.view::<VolumeView>(&path, v, |v| render::volume_changed("reverted", v))?;
        }
        Command::Volume(VolumeCommand::Clone {
            name,
            from,
            full,
            policy,
            no_wait,
        }) => {
            let Some((volume, snapshot)) = from.split_once('@') else {
                return Err(CliError::Usage(format!(
                    "{from}: name the snapshot as VOLUME@SNAPSHOT"
                )));
            };
            let path = format!(
                "/v1/volumes/{}/snapshots/{}/clones",
                segment(volume),
                segment(snapshot)
            );
            let mut body = json!({ "name": name });
            if *full {
                body["full"] = json!(true);
            }
            if let Some(p) = policy {
                body["policy"] = json!(p);
            }
            let v = client.post_json(&path, &body)?;
            if !*full {
                output.view::<VolumeView>(&path, v, |v| render::volume_changed("cloned", v))?;
            } else if *no_wait {
                output.view::<VolumeView>(&path, v, render::fill_started)?;
            } else {
                let filled = wait_for_fill(&client, name, v, output)?;
                if !output.json {
                    let hint = nbd_hint(&client, &filled);
                    output.text(&hint)?;
                }
            }
        }
        Command::Snapshot(SnapshotCommand::List { volume }) => {
            let path = format!("/v1/volumes/{}/snapshots", segment(volume));
            let v = client.get(&path)?;
            output.view::<Vec<SnapshotView>>(&path, v, |v| render::snapshots(v))?;
        }
        Command::Snapshot(SnapshotCommand::Delete { volume, name }) => {
            let path = format!(
                "/v1/volumes/{}/snapshots/{}",
                segment(volume),
                segment(name)
            );
            let v = client.delete(&path)?;
            output.view::<SnapshotDeleted>(&path, v, render::snapshot_deleted)?;
        }
        Command::Object(ObjectCommand::Show { name }) => {
            let path = format!("/v1/objects/{}", segment(name));
            let v = client.get(&path)?;
            output.view::<ObjectView>(&path, v, render::object)?;
        }
        Command::Object(ObjectCommand::Verify { name }) => {
            let path = format!("/v1/objects/{}/verify", segment(name));
            let v = client.post(&path, None, VERIFY_TIMEOUT)?;
            let report = output.view::<VerifyReport>(&path, v, render::verify)?;
            if !report.identical {
                return Err(CliError::Found(format!(
                    "volume {}: copies differ in {} place(s)",
                    report.volume,
                    report.divergences.len()
                )));
            }
        }
        Command::Resync(ResyncCommand::List { every }) => {
            resync_list(&client, every.watch, output)?
        }
        // Answered above, without the API.
        Command::Store(_) | Command::Up(_) | Command::Node(_) => {}
    }
    Ok(())
}

/// Starts evacuating `host` (only `disk_group` when given) and prints what
/// is to move.
fn evacuate(
    client: &ApiClient,
    output: &mut Output<'_>,
    host: &str,
    disk_group: Option<&String>,
) -> Result<(), CliError> {
    let path = format!("/v1/hosts/{}/evacuation", segment(host));
    let v = client.post_json(&path, &json!({ "disk_group": disk_group }))?;
    output.view::<EvacuationView>(&path, v, render::evacuation)?;
    Ok(())
}

/// Asks the API to inject `fault` into `host`.
fn inject(client: &ApiClient, host: &str, fault: &Value) -> Result<(), CliError> {
    client.post_json(&format!("/v1/hosts/{}/faults", segment(host)), fault)?;
    Ok(())
}

/// The hosts a network fault reaches, in words.
fn peer_words(peer: &Option<String>) -> String {
    match peer {
        Some(p) => p.clone(),
        None => "every other host".to_string(),
    }
}

/// The body of `PATCH /v1/settings` for one setting typed on the command
/// line; an unknown name or a value of the wrong type is a usage error.
fn setting_change(name: &str, value: &str) -> Result<Value, CliError> {
    let bad = |what: &str| CliError::Usage(format!("setting {name}: {value:?} is not {what}"));
    match name {
        "max_overcommit_ratio" => {
            let ratio: f64 = value.parse().map_err(|_| bad("a number, e.g. 2.5"))?;
            Ok(json!({ "max_overcommit_ratio": ratio }))
        }
        "nearly_full_pct" | "full_pct" => {
            let pct: u8 = value
                .trim_end_matches('%')
                .parse()
                .map_err(|_| bad("a percentage from 1 to 100"))?;
            Ok(json!({ name: pct }))
        }
        "read_cache_bytes" => {
            if value.eq_ignore_ascii_case("default") {
                return Ok(json!({ "read_cache_bytes": null }));
            }
            let bytes = tessera_types::parse_size(value)
                .map_err(|_| bad("a size (e.g. 512M, 1G, 0 to disable) or default"))?;
            Ok(json!({ "read_cache_bytes": bytes }))
        }
        "index_cache_bytes" => {
            if value.eq_ignore_ascii_case("default") {
                return Ok(json!({ "index_cache_bytes": null }));
            }
            let bytes = tessera_types::parse_size(value)
                .map_err(|_| bad("a size (e.g. 64M, 1G) or default"))?;
            Ok(json!({ "index_cache_bytes": bytes }))
        }
        "index_prefetch_bytes" => {
            let bytes = tessera_types::parse_size(value)
                .map_err(|_| bad("a size (e.g. 4M, 0 turns read-ahead off)"))?;
            Ok(json!({ "index_prefetch_bytes": bytes }))
        }
        "scrub_period_h" => {
            let hours: u32 = value
                .trim_end_matches('h')
                .parse()
                .map_err(|_| bad("a number of hours (0 turns the scheduled scrub off)"))?;
            Ok(json!({ "scrub_period_h": hours }))
        }
        "repair_delay_s" => {
            if value.eq_ignore_ascii_case("default") {
                return Ok(json!({ "repair_delay_s": null }));
            }
            let secs: u64 = value
                .trim_end_matches('s')
                .parse()
                .map_err(|_| bad("a number of seconds (0 rebuilds at once) or default"))?;
            Ok(json!({ "repair_delay_s": secs }))
        }
        "lease_ttl_ms" => {
            if value.eq_ignore_ascii_case("default") {
                return Ok(json!({ "lease_ttl_ms": null }));
            }
            let ms: u64 = value
                .trim_end_matches("ms")
                .parse()
                .map_err(|_| bad("a number of milliseconds (500 to 300000) or default"))?;
            Ok(json!({ "lease_ttl_ms": ms }))
        }
        "vaai_ats" | "vaai_xcopy" | "vaai_write_same" | "vaai_unmap" => {
            let on = match value.to_ascii_lowercase().as_str() {
                "on" | "true" | "1" | "yes" => true,
                "off" | "false" | "0" | "no" => false,
                _ => return Err(bad("on or off")),
            };
            Ok(json!({ name: on }))
        }
        "resync_delay_multiplier" => {
            let m: u32 = value
                .parse()
                .map_err(|_| bad("a whole number from 1 to 256"))?;
            Ok(json!({ "resync_delay_multiplier": m }))
        }
        other => Err(unknown_setting(other)),
    }
}

/// Where host `host`'s settings are.
fn host_settings_path(host: &str) -> String {
    format!("/v1/hosts/{}/settings", segment(host))
}

/// Refuses a setting that cannot differ per host, naming those that can.
fn host_scoped(name: &str, host: &str) -> Result<(), CliError> {
    if HOST_SETTING_NAMES.contains(&name) {
        return Ok(());
    }
    if render::setting(&ClusterSettings::default(), name).is_none() {
        return Err(unknown_setting(name));
    }
    Err(CliError::Usage(format!(
        "{name} is the same on every host and cannot be set for {host} alone; the settings a host may have its own value of are {}",
        HOST_SETTING_NAMES.join(", ")
    )))
}

/// The body of `PATCH /v1/hosts/HOST/settings` for one setting typed on
/// the command line.
fn host_setting_change(name: &str, value: &str, host: &str) -> Result<Value, CliError> {
    host_scoped(name, host)?;
    let body = setting_change(name, value)?;
    if body.get(name).is_some_and(Value::is_null) {
        return Err(CliError::Usage(format!(
            "a host's own {name} is a value; `tessera settings reset {name} --host {host}` makes {host} follow the cluster's again"
        )));
    }
    Ok(body)
}

/// The usage error for a setting name there is no setting of.
fn unknown_setting(name: &str) -> CliError {
    CliError::Usage(format!(
        "no setting named {name}: the settings are {}",
        render::setting_names().join(", ")
    ))
}

/// Clears a terminal and puts the cursor top left.
const CLEAR_SCREEN: &str = "\x1b[H\x1b[2J";

/// Prints one listing with `show`, once, or with `--watch` every `watch`
/// seconds for as long as `show` says there is more to see. On a terminal
/// each listing replaces the one before; elsewhere (a file, a pipe) they
/// follow each other a blank line apart.
fn watched(
    watch: Option<u64>,
    output: &mut Output<'_>,
    mut show: impl FnMut(&mut Output<'_>) -> Result<bool, CliError>,
) -> Result<(), CliError> {
    let terminal = watch.is_some() && std::io::stdout().is_terminal();
    let mut first = true;
    loop {
        if terminal {
            output.text(CLEAR_SCREEN)?;
        } else if !first {
            output.text("\n")?;
        }
        first = false;
        let more = show(output)?;
        let _ = output.out.flush();
        match watch {
            Some(seconds) if more => std::thread::sleep(std::time::Duration::from_secs(seconds)),
            _ => return Ok(()),
        }
    }
}

/// `tessera status`, once, or with `--watch` every `watch` seconds until
/// Ctrl-C.
fn status(client: &ApiClient, watch: Option<u64>, output: &mut Output<'_>) -> Result<(), CliError> {
    watched(watch, output, |output| {
        let v = client.get("/v1/status")?;
        output.view::<StatusView>("/v1/status", v, render::status)?;
        Ok(true)
    })
}

/// How often `tessera events --follow` asks for new events.
const EVENTS_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// `tessera events`: the latest `limit` events; with `follow`, then every
/// new one as it appears, until Ctrl-C.
fn events(
    client: &ApiClient,
    limit: usize,
    follow: bool,
    output: &mut Output<'_>,
) -> Result<(), CliError> {
    let path = format!("/v1/events?limit={limit}");
    let v = client.get(&path)?;
    let mut seen = output.view::<Vec<EventView>>(&path, v, |e| render::events(e, true))?;
    let _ = output.out.flush();
    if !follow {
        return Ok(());
    }
    loop {
        std::thread::sleep(EVENTS_POLL);
        let path = format!("/v1/events?limit={}", limit.max(EVENTS_FOLLOW_WINDOW));
        let now: Vec<EventView> = decode(&path, client.get(&path)?)?;
        let fresh = new_events(&seen, &now);
        if !fresh.is_empty() {
            if output.json {
                for e in &fresh {
                    let line = serde_json::to_string(e)
                        .map_err(|e| CliError::Local(format!("cannot print JSON: {e}")))?;
                    output.text(&format!("{line}\n"))?;
                }
            } else {
                output.text(&render::events(&fresh, false))?;
            }
            let _ = output.out.flush();
        }
        seen = now;
    }
}

/// Events `--follow` reads each time: more than can happen in a second.
const EVENTS_FOLLOW_WINDOW: usize = 1000;

/// The events of `now` that `seen` (the listing before, oldest first) did
/// not hold, from the oldest time `seen` covers on: a host writes its
/// events in the background, so one may appear after a newer one of
/// another host was listed.
fn new_events(seen: &[EventView], now: &[EventView]) -> Vec<EventView> {
    let from = seen.first().map_or(0, |e| e.at_ms);
    now.iter()
        .filter(|e| e.at_ms >= from && !seen.contains(e))
        .cloned()
        .collect()
}

/// `tessera top`: samples `/v1/activity` every `delay` seconds and prints
/// each interval's rates (a table redrawn in place on a terminal, CSV rows
/// with `batch`) until `iterations` intervals were shown or Ctrl-C.
fn top(
    client: &ApiClient,
    batch: bool,
    delay: u64,
    iterations: Option<u64>,
    output: &mut Output<'_>,
) -> Result<(), CliError> {
    let sample = || -> Result<(Vec<VolumeActivity>, std::time::Instant), CliError> {
        let v = client.get("/v1/activity")?;
        Ok((decode("/v1/activity", v)?, std::time::Instant::now()))
    };
    let terminal = !batch && std::io::stdout().is_terminal();
    if batch {
        output.text(&format!("{}\n", top::CSV_HEADER))?;
    }
    let (mut then, mut then_at) = sample()?;
    let mut shown = 0;
    while iterations.is_none_or(|n| shown < n) {
        std::thread::sleep(std::time::Duration::from_secs(delay));
        let (now, now_at) = sample()?;
        let seconds = now_at.duration_since(then_at).as_secs_f64();
        let rows = tessera_node::activity_history::interval_rates(&then, &now, seconds);
        if batch {
            let time_unix = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let mut text = String::new();
            for row in &rows {
                text.push_str(&top::csv_line(time_unix, row));
                text.push('\n');
            }
            output.text(&text)?;
        } else {
            if terminal {
                output.text(CLEAR_SCREEN)?;
            } else if shown > 0 {
                output.text("\n")?;
            }
            output.text(&top::table(&rows, seconds))?;
        }
        let _ = output.out.flush();
        (then, then_at) = (now, now_at);
        shown += 1;
    }
    Ok(())
}

/// `tessera resync list`, once, or with `--watch` every `watch` seconds
/// until no resync is running or waiting to retry (the last listing shows
/// how they ended).
fn resync_list(
    client: &ApiClient,
    watch: Option<u64>,
    output: &mut Output<'_>,
) -> Result<(), CliError> {
    watched(watch, output, |output| {
        let v = client.get("/v1/resyncs")?;
        let listed = output.view::<Vec<ResyncView>>("/v1/resyncs", v, |r| {
            if r.is_empty() {
                "no resyncs or rebuilds\n".to_string()
            } else {
                render::resyncs(r)
            }
        })?;
        let unfinished = |r: &ResyncView| {
            r.is_running() || r.state == tessera_node::control::ResyncState::Waiting
        };
        Ok(listed.iter().any(unfinished))
    })
}

/// How often `volume clone --full` looks at the fill's progress.
const FILL_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Waits until full clone `name` (its view as made: `made`) is filled,
/// printing its progress: on a terminal one line rewritten in place, else a
/// line whenever it changed. With `--json`, prints the volume's view once
/// filled. Ctrl-C stops the waiting, not the fill. Answers the filled
/// volume's view.
fn wait_for_fill(
    client: &ApiClient,
    name: &str,
    made: Value,
    output: &mut Output<'_>,
) -> Result<VolumeView, CliError> {
    let path = format!("/v1/volumes/{}", segment(name));
    let mut value = made;
    let mut view: VolumeView = decode(&path, value.clone())?;
    let terminal = !output.json && std::io::stdout().is_terminal();
    if !output.json {
        output.text(&render::fill_started(&view))?;
    }
    let mut last_fill = view.fill.clone();
    let mut last_line = String::new();
    while view.fill.is_some() {
        let _ = output.out.flush();
        std::thread::sleep(FILL_POLL);
        value = match client.get(&path) {
            Ok(v) => v,
            Err(CliError::Refused(ControlError::NotFound(_))) => {
                if terminal {
                    output.text("\n")?;
                }
                return Err(CliError::Refused(ControlError::NotFound(format!(
                    "volume {name} was deleted while it was being filled"
                ))));
            }
            Err(e) => return Err(e),
        };
        view = decode(&path, value.clone())?;
        let Some(fill) = &view.fill else { break };
        last_fill = Some(fill.clone());
        if output.json {
            continue;
        }
        let line = render::fill_progress(&view.name, fill);
        if terminal {
            output.text(&format!("\r\x1b[K{line}"))?;
        } else if line != last_line {
            output.text(&format!("{line}\n"))?;
        }
        last_line = line;
    }
    if output.json {
        output.json(&value)?;
    } else {
        if terminal && !last_line.is_empty() {
            output.text("\r\x1b[K")?;
        }
        output.text(&render::fill_done(
            &view,
            last_fill.as_ref().map(|f| f.from.as_str()),
        ))?;
    }
    Ok(view)
}

/// Where a client attaches the new volume: the owner's NBD address (every
/// host serves every volume; the owner's is the shortest path). Left out
/// when the hosts cannot be listed: the volume exists either way.
fn nbd_hint(client: &ApiClient, volume: &VolumeView) -> String {
    let Ok(value) = client.get("/v1/hosts") else {
        return String::new();
    };
    let Ok(hosts) = decode::<Vec<HostView>>("/v1/hosts", value) else {
        return String::new();
    };
    let host = volume
        .owner
        .as_ref()
        .and_then(|o| hosts.iter().find(|h| &h.id == o))
        .or_else(|| hosts.first());
    match host {
        Some(h) => format!("attach with: nbd://{}/{}\n", h.nbd_addr, volume.name),
        None => String::new(),
    }
}

/// `tessera encryption rekey`: asks the host, then (with `--wait`) follows
/// a deep rekey's progress in the host's disk group records until each is
/// done.
fn rekey(
    client: &ApiClient,
    output: &mut Output<'_>,
    host: &str,
    deep: bool,
    disk_group: Option<&str>,
    wait: bool,
) -> Result<(), CliError> {
    let path = format!("/v1/hosts/{}/rekey", segment(host));
    let v = client.post_json(&path, &json!({ "deep": deep, "disk_group": disk_group }))?;
    let started: Vec<EncryptionView> = decode(&path, v.clone())?;
    if !(deep && wait) {
        output.view::<Vec<EncryptionView>>(&path, v, |rows| {
            let what = if deep {
                "deep rekey started (every block is rewritten in the background; `tessera encryption list` shows it)"
            } else {
                "data keys sealed again with the current key encryption key"
            };
            format!("{host}: {what}\n{}", render::encryption(rows))
        })?;
        return Ok(());
    }
    let mut last_line = String::new();
    loop {
        let rows: Vec<EncryptionView> = decode("/v1/encryption", client.get("/v1/encryption")?)?;
        let mine: Vec<&EncryptionView> = rows
            .iter()
            .filter(|r| r.host == host && started.iter().any(|s| s.disk_group == r.disk_group))
            .collect();
        let running: Vec<_> = mine
            .iter()
            .filter_map(|r| r.encryption.as_ref()?.rekey.map(|p| (r, p)))
            .collect();
        if running.is_empty() {
            let done: Vec<EncryptionView> = mine.into_iter().cloned().collect();
            if output.json {
                return output.json(&serde_json::to_value(&done).unwrap_or_default());
            }
            return output.text(&format!(
                "{host}: deep rekey done\n{}",
                render::encryption(&done)
            ));
        }
        if !output.json {
            let line = running
                .iter()
                .map(|(r, p)| {
                    format!(
                        "{} {}% ({} of {})",
                        r.disk_group,
                        render::percent_done(
                            p.done_bytes,
                            p.total_bytes.saturating_sub(p.done_bytes)
                        ),
                        tessera_types::format_size(p.done_bytes),
                        tessera_types::format_size(p.total_bytes)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            if line != last_line {
                output.text(&format!("rekeying {line}\n"))?;
                last_line = line;
            }
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// `tessera store check`: an offline, read-only walk over one disk group's
/// devices.
fn store_check(
    paths: &[PathBuf],
    kek_file: Option<&std::path::Path>,
    output: &mut Output<'_>,
) -> Result<(), CliError> {
    let keys = kek_file
        .map(|f| tessera_store::KeyEncryptionKey::load(f).map(tessera_store::AtRestKeys::new))
        .transpose()
        .map_err(|e| CliError::Local(format!("cannot check: {e}")))?;
    // Refused, reading nothing, while a host has the devices open: their
    // contents are changing and a report would be false.
    let report = tessera_store::check_encrypted_devices(paths, keys.as_ref())
        .map_err(|e| CliError::Local(format!("cannot check: {e}")))?;
    if output.json {
        let problems: Vec<Value> = report
            .problems
            .iter()
            .map(|p| json!({ "device": p.device, "offset": p.offset, "problem": p.problem }))
            .collect();
        output.json(&json!({
            "devices": report.devices,
            "components": report.components,
            "index_pages": report.index_pages,
            "data_blocks": report.data_blocks,
            "log_records": report.log_records,
            "problems": problems,
            "notes": report.notes,
            "clean": report.is_clean(),
        }))?;
    } else {
        output.text(&format!("{report}\n"))?;
    }
    if report.is_clean() {
        Ok(())
    } else {
        Err(CliError::Found(format!(
            "{} problem(s) found on {}",
            report.problems.len(),
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}
