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
    Command, HostCommand, ObjectCommand, PolicyCommand, ResyncCommand, StoreCommand, VolumeCommand,
};
use crate::client::{decode, segment, ApiClient, CliError, VERIFY_TIMEOUT};
use crate::render;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use tessera_node::control::{
    HostView, IscsiAccessView, ObjectView, ResyncView, StatusView, VerifyReport, VolumeView,
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
pub fn run(command: &Command, api: &str, output: &mut Output<'_>) -> Result<(), CliError> {
    let client = match command {
        Command::Store(StoreCommand::Check { paths }) => return store_check(paths, output),
        Command::Up(_) | Command::Node(_) => {
            return Err(CliError::Usage(
                "`tessera up` and `tessera node` run daemons; they are not API requests"
                    .to_string(),
            ))
        }
        _ => ApiClient::new(api)?,
    };
    match command {
        Command::Status => {
            let v = client.get("/v1/status")?;
            output.view::<StatusView>("/v1/status", v, render::status)?;
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
        }) => {
            let v = client.post_json(
                "/v1/policies",
                &json!({
                    "name": name,
                    "failures_to_tolerate": ftt,
                    "stripe_width": stripe_width,
                    "space_reservation_pct": space_reservation,
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
            open,
        }) => {
            let path = format!("/v1/volumes/{}/iscsi-access", segment(name));
            let setting = *open || !allow.is_empty() || chap_user.is_some();
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
                    }),
                )?
            } else {
                client.get(&path)?
            };
            output.view::<IscsiAccessView>(&path, v, render::iscsi_access)?;
        }
        Command::Volume(VolumeCommand::Delete { name }) => {
            client.delete(&format!("/v1/volumes/{}", segment(name)))?;
            if !output.json {
                output.text(&format!("deleted volume {name}\n"))?;
            }
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
        Command::Resync(ResyncCommand::List) => {
            let v = client.get("/v1/resyncs")?;
            output.view::<Vec<ResyncView>>("/v1/resyncs", v, |r| {
                if r.is_empty() {
                    "no resyncs or rebuilds\n".to_string()
                } else {
                    render::resyncs(r)
                }
            })?;
        }
        // Answered above, without the API.
        Command::Store(_) | Command::Up(_) | Command::Node(_) => {}
    }
    Ok(())
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

/// `tessera store check`: an offline, read-only walk over one disk group's
/// devices.
fn store_check(paths: &[PathBuf], output: &mut Output<'_>) -> Result<(), CliError> {
    let report = tessera_store::check_devices(paths);
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
