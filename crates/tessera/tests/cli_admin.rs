//! The built `tessera` binary against a REST API served in the test over
//! loopback (the in-memory control plane of tessera-node's API tests):
//! exit codes, human and `--json` output, where the CLI finds the API, and
//! what it says when the API is not there. Also `store check` on real
//! devices made by the store.

#[path = "../../tessera-node/tests/support/mod.rs"]
mod support;

use serde_json::Value;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Command, Output};
use std::sync::Arc;
use std::thread::JoinHandle;
use support::MemoryControl;
use tessera_node::control::{ClusterControl, ResyncState, ResyncView};
use tessera_types::ComponentId;

/// A REST API served on a free loopback port until dropped.
struct ApiServer {
    url: String,
    control: Arc<MemoryControl>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ApiServer {
    fn start() -> ApiServer {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind loopback");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let control = Arc::new(MemoryControl::new());
        let served: Arc<dyn ClusterControl> = control.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                tessera_node::api::serve(listener, served, async {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
            });
        });
        ApiServer {
            url,
            control,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A loopback address nothing listens on: bound, then released.
fn dead_url() -> String {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

/// Runs `tessera` with `args`, with `TESSERA_API` set to `env_api` and
/// `TESSERA_TOKEN` to `token`, or unset.
fn tessera_env(args: &[&str], env_api: Option<&str>, token: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera"));
    command
        .args(args)
        .env_remove("TESSERA_API")
        .env_remove("TESSERA_TOKEN")
        .env_remove("TESSERA_TOKEN_FILE")
        .env("RUST_LOG", "warn");
    if let Some(url) = env_api {
        command.env("TESSERA_API", url);
    }
    if let Some(token) = token {
        command.env("TESSERA_TOKEN", token);
    }
    command.output().expect("run tessera")
}

/// Runs `tessera --api URL args...` with the server's admin token.
fn tessera(server: &ApiServer, args: &[&str]) -> Output {
    let mut all = vec!["--api", server.url.as_str()];
    all.extend_from_slice(args);
    tessera_env(&all, None, Some(server.control.admin_token()))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed")
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

#[test]
fn policies_and_volumes_are_created_listed_resized_and_deleted() {
    let api = ApiServer::start();
    let created = tessera(
        &api,
        &[
            "policy",
            "create",
            "gold",
            "--ftt",
            "1",
            "--stripe-width",
            "2",
        ],
    );
    assert_eq!(code(&created), 0, "{}", stderr(&created));
    assert_eq!(
        stdout(&created),
        "created policy gold: FTT=1, RAID-1, 2 copies, stripe width 2, 0% space reservation\n"
    );
    let list = tessera(&api, &["policy", "list"]);
    assert!(
        stdout(&list).contains("gold     1    RAID-1  2"),
        "{}",
        stdout(&list)
    );

    let vol = tessera(
        &api,
        &[
            "volume", "create", "vol1", "--size", "10G", "--policy", "gold",
        ],
    );
    assert_eq!(code(&vol), 0, "{}", stderr(&vol));
    let text = stdout(&vol);
    assert!(
        text.starts_with(
            "created volume vol1: 10.0 GiB, policy gold, 512e, healthy, owner host-1 (epoch 1)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("attach with: nbd://127.0.0.1:10809/vol1"),
        "{text}"
    );

    api.control.set_used("vol1", 3 << 20);
    let list = tessera(&api, &["volume", "list"]);
    assert_eq!(
        stdout(&list),
        "NAME  SIZE      POLICY  BLOCK  STATE    USED     OWNER   EPOCH  CLIENTS  QOS\n\
         vol1  10.0 GiB  gold    512e   healthy  3.0 MiB  host-1  1      0        -\n"
    );
    let listed = json(&tessera(&api, &["volume", "list", "--json"]));
    assert_eq!(listed[0]["size_bytes"], 10_u64 << 30);
    assert_eq!(listed[0]["used_bytes"], 3_u64 << 20);

    let resized = tessera(&api, &["volume", "resize", "vol1", "--size", "20G"]);
    assert_eq!(code(&resized), 0, "{}", stderr(&resized));
    assert!(stdout(&resized).starts_with("resized volume vol1: 20.0 GiB"));

    let deleted = tessera(&api, &["volume", "delete", "vol1"]);
    assert_eq!(
        (code(&deleted), stdout(&deleted)),
        (0, "deleted volume vol1\n".to_string())
    );
    let deleted_json = tessera(&api, &["--json", "volume", "delete", "vol1"]);
    assert_eq!(code(&deleted_json), 1, "already gone");
    assert_eq!(
        json(&tessera(&api, &["volume", "list", "--json"])),
        Value::Array(Vec::new())
    );
}

#[test]
fn refusals_print_the_api_message_on_stderr_and_exit_1() {
    let api = ApiServer::start();
    assert_eq!(
        code(&tessera(
            &api,
            &["volume", "create", "vol1", "--size", "1G"]
        )),
        0
    );
    let cases: [(&[&str], &str); 4] = [
        (
            &["volume", "create", "vol1", "--size", "1G"],
            "volume vol1 already exists",
        ),
        (
            &[
                "volume", "create", "vol2", "--size", "1G", "--policy", "platinum",
            ],
            "no policy named \"platinum\"",
        ),
        (
            &["policy", "create", "ftt2", "--ftt", "2"],
            "FTT=2 with RAID-1 needs 5 fault domains, cluster has 4",
        ),
        (&["object", "show", "nope"], "no volume named \"nope\""),
    ];
    for (args, message) in cases {
        let o = tessera(&api, args);
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.starts_with("error: ") && err.contains(message),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert_eq!(stdout(&o), "", "{args:?}: nothing on stdout");
    }
    let list = json(&tessera(&api, &["volume", "list", "--json"]));
    assert_eq!(
        list.as_array().map(Vec::len),
        Some(1),
        "refusals changed nothing"
    );
}

#[test]
fn usage_mistakes_exit_2_without_asking_the_api() {
    let api = ApiServer::start();
    for args in [
        &["volume", "create", "v", "--size", "ten"][..],
        &["policy", "create", "p"][..],
        &["volume", "frobnicate"][..],
    ] {
        let o = tessera(&api, args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
    }
    let bad_url = tessera_env(&["--api", "localhost:9480", "status"], None, None);
    assert_eq!(code(&bad_url), 2, "{}", stderr(&bad_url));
    assert!(stderr(&bad_url).contains("must start with https:// or http://"));
    assert_eq!(
        json(&tessera(&api, &["volume", "list", "--json"])),
        Value::Array(Vec::new())
    );
}

#[test]
fn tokens_are_made_listed_and_revoked_and_a_missing_one_is_explained() {
    let api = ApiServer::start();
    let url = api.url.as_str();
    // No token anywhere: the API refuses, and says where the CLI looks.
    let none = tessera_env(&["--api", url, "volume", "list"], None, None);
    assert_eq!(code(&none), 1, "{}", stderr(&none));
    assert!(stderr(&none).contains("TESSERA_TOKEN"), "{}", stderr(&none));
    let made = tessera(
        &api,
        &[
            "token",
            "create",
            "backup",
            "--role",
            "viewer",
            "--expires-in",
            "90d",
        ],
    );
    assert_eq!(code(&made), 0, "{}", stderr(&made));
    let text = stdout(&made);
    let token = text
        .lines()
        .find(|l| l.starts_with("tsn_"))
        .unwrap_or_else(|| panic!("the token on a line of its own: {text}"))
        .to_string();
    assert!(
        text.contains("viewer role") && text.contains("shown this once"),
        "{text}"
    );
    // A viewer reads and may not write; from a file as well as the flag.
    let file = tempfile::NamedTempFile::new().expect("a file");
    std::fs::write(file.path(), format!("{token}\n")).expect("write the token");
    let path = file.path().to_string_lossy().to_string();
    let read = tessera_env(
        &["--api", url, "--token-file", &path, "volume", "list"],
        None,
        None,
    );
    assert_eq!(code(&read), 0, "{}", stderr(&read));
    let write = tessera_env(
        &[
            "--api", url, "--token", &token, "volume", "create", "v", "--size", "1G",
        ],
        None,
        None,
    );
    assert_eq!(code(&write), 1, "{}", stderr(&write));
    assert!(stderr(&write).contains("viewer role"), "{}", stderr(&write));
    let list = tessera(&api, &["token", "list"]);
    let listed = stdout(&list);
    assert!(
        listed.contains("backup") && listed.contains("viewer"),
        "{listed}"
    );
    assert!(
        !listed.contains(&token[21..]),
        "no secret in the list: {listed}"
    );
    let id = &token[4..20];
    let revoked = tessera(&api, &["token", "revoke", id]);
    assert_eq!(code(&revoked), 0, "{}", stderr(&revoked));
    let after = tessera_env(
        &["--api", url, "--token", &token, "volume", "list"],
        None,
        None,
    );
    assert_eq!(code(&after), 1);
    assert!(stderr(&after).contains("not valid"), "{}", stderr(&after));
    let bad_role = tessera(&api, &["token", "create", "x", "--role", "root"]);
    assert_eq!(code(&bad_role), 1, "{}", stderr(&bad_role));
    let bad_time = tessera(
        &api,
        &[
            "token",
            "create",
            "x",
            "--role",
            "viewer",
            "--expires-in",
            "soon",
        ],
    );
    assert_eq!(code(&bad_time), 2, "{}", stderr(&bad_time));

    // The audit log shows who asked for each change and how it ended:
    // the viewer's refused create and the admin's revoke among them.
    let audit = tessera(&api, &["audit", "--limit", "20"]);
    assert_eq!(code(&audit), 0, "{}", stderr(&audit));
    let log = stdout(&audit);
    assert!(log.contains("TOKEN") && log.contains("ANSWER"), "{log}");
    let refused = log
        .lines()
        .find(|l| l.contains("POST /v1/volumes") && l.contains("viewer"))
        .unwrap_or_else(|| panic!("no refused create in:\n{log}"));
    assert!(
        refused.contains("backup") && refused.contains("403"),
        "{refused}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains(&format!("DELETE /v1/tokens/{id}")) && l.contains("204")),
        "{log}"
    );
    assert!(!log.contains("GET "), "reads are not changes: {log}");
}

#[test]
fn an_unreachable_api_exits_3_with_a_hint() {
    let dead = dead_url();
    let o = tessera_env(&["--api", &dead, "status"], None, None);
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("cannot reach the Tessera API at {dead}")),
        "{err}"
    );
    assert!(err.contains("is `tessera up` running?"), "{err}");
    assert_eq!(stdout(&o), "");
}

#[test]
fn the_api_flag_wins_over_the_environment_which_wins_over_the_default() {
    let api = ApiServer::start();
    let dead = dead_url();
    let from_env = tessera_env(
        &["volume", "list", "--json"],
        Some(&api.url),
        Some(api.control.admin_token()),
    );
    assert_eq!(
        code(&from_env),
        0,
        "TESSERA_API is used: {}",
        stderr(&from_env)
    );

    let flag_over_env = tessera_env(
        &["--api", &dead, "volume", "list"],
        Some(&api.url),
        Some(api.control.admin_token()),
    );
    assert_eq!(code(&flag_over_env), 3, "--api wins over TESSERA_API");
    assert!(stderr(&flag_over_env).contains(&dead));

    let flag_after_verb = tessera_env(
        &["volume", "list", "--api", &api.url],
        Some(&dead),
        Some(api.control.admin_token()),
    );
    assert_eq!(code(&flag_after_verb), 0, "{}", stderr(&flag_after_verb));

    let help = tessera_env(&["--help"], None, None);
    assert!(
        stdout(&help).contains("https://127.0.0.1:9480"),
        "the default is documented: {}",
        stdout(&help)
    );
}

#[test]
fn object_show_prints_the_tree_and_verify_exits_1_on_divergence() {
    let api = ApiServer::start();
    assert_eq!(
        code(&tessera(
            &api,
            &["volume", "create", "vol1", "--size", "1G"]
        )),
        0
    );
    let show = tessera(&api, &["object", "show", "vol1"]);
    assert_eq!(code(&show), 0, "{}", stderr(&show));
    let text = stdout(&show);
    let tree: Vec<&str> = text
        .lines()
        .skip(3)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split("  host-").next().unwrap_or(l).trim_end())
        .collect();
    assert!(text.contains("out of space 0\n"), "{text}");
    assert!(
        text.ends_with("read cache: 0 hits, 0 misses (blocks of 4 KiB read through the owner)\n"),
        "{text}"
    );
    assert_eq!(
        tree,
        [
            "RAID-1 column 0",
            "  component c0000000000000001",
            "  component c0000000000000002",
            "witness c0000000000000003",
        ],
        "{text}"
    );
    let shown = json(&tessera(&api, &["object", "show", "vol1", "--json"]));
    assert_eq!(shown["components"][2]["role"], "witness");

    let same = tessera(&api, &["object", "verify", "vol1"]);
    assert_eq!(code(&same), 0, "{}", stderr(&same));
    assert!(stdout(&same).contains("copies identical"));

    api.control.make_divergent("vol1");
    let differ = tessera(&api, &["object", "verify", "vol1"]);
    assert_eq!(code(&differ), 1);
    assert!(
        stdout(&differ).contains("byte 8192  4.0 KiB"),
        "{}",
        stdout(&differ)
    );
    assert_eq!(
        stderr(&differ),
        "error: volume vol1: copies differ in 1 place(s)\n"
    );
    let differ_json = tessera(&api, &["object", "verify", "vol1", "--json"]);
    assert_eq!(code(&differ_json), 1);
    assert_eq!(json(&differ_json)["identical"], false);
}

#[test]
fn host_stop_and_start_show_in_status_and_host_list() {
    let api = ApiServer::start();
    let stop = tessera(&api, &["host", "stop", "host-2"]);
    assert_eq!(
        (code(&stop), stdout(&stop)),
        (0, "stopped host host-2\n".to_string())
    );
    let status = tessera(&api, &["status"]);
    let text = stdout(&status);
    assert!(
        text.starts_with("cluster tessera: degraded\ncapacity: 32.0 GiB total"),
        "{text}"
    );
    assert!(text.contains("host-2  fd-2          stopped"), "{text}");
    let again = tessera(&api, &["host", "stop", "host-2"]);
    assert_eq!(code(&again), 1);
    assert_eq!(stderr(&again), "error: host host-2 is already stopped\n");

    let start = tessera(&api, &["--json", "host", "start", "host-2"]);
    assert_eq!((code(&start), stdout(&start)), (0, String::new()));
    let hosts = json(&tessera(&api, &["host", "list", "--json"]));
    assert_eq!(hosts[1]["state"], "present");
    let list = stdout(&tessera(&api, &["host", "list"]));
    assert!(list.contains("DISK GROUP"), "{list}");
    let status = json(&tessera(&api, &["status", "--json"]));
    assert_eq!(status["health"], "healthy");
}

#[test]
fn a_cluster_without_fault_injection_refuses_a_fault() {
    let api = ApiServer::start();
    let refused = tessera(&api, &["fault", "fail-device", "host-2", "--device", "0"]);
    assert_eq!(code(&refused), 1);
    assert!(
        stderr(&refused).contains("does not accept fault injection"),
        "{}",
        stderr(&refused)
    );
    let usage = tessera(&api, &["fault", "fail-device", "host-2"]);
    assert_eq!(code(&usage), 2, "--device is required");
}

#[test]
fn host_show_prints_the_read_cache_and_the_setting_sizes_it() {
    let api = ApiServer::start();
    let shown = stdout(&tessera(&api, &["host", "show", "host-1"]));
    assert!(
        shown.contains("HOST    READ CACHE  BUDGET    CACHED   HITS  MISSES  HIT RATE"),
        "{shown}"
    );
    assert!(
        shown.contains("host-1  on          64.0 MiB  4.0 MiB  300   100     75.0%"),
        "{shown}"
    );
    let json_view = json(&tessera(&api, &["host", "show", "host-1", "--json"]));
    assert_eq!(json_view["read_cache"]["hits"], 300);
    assert_eq!(json_view["read_cache"]["hit_rate"], 0.75);

    let set = tessera(
        &api,
        &["--json", "settings", "set", "read_cache_bytes", "256M"],
    );
    assert_eq!(code(&set), 0, "{}", stderr(&set));
    assert_eq!(json(&set)["read_cache_bytes"], 256 << 20);
    let table = stdout(&tessera(&api, &["settings", "show"]));
    assert!(
        table.contains("read_cache_bytes         256.0 MiB"),
        "{table}"
    );
    let off = json(&tessera(
        &api,
        &["--json", "settings", "set", "read_cache_bytes", "0"],
    ));
    assert_eq!(off["read_cache_bytes"], 0);
    let back = json(&tessera(
        &api,
        &["--json", "settings", "set", "read_cache_bytes", "default"],
    ));
    assert!(back.get("read_cache_bytes").is_none(), "{back}");
    let table = stdout(&tessera(&api, &["settings", "show"]));
    assert!(
        table.contains("read_cache_bytes         default"),
        "{table}"
    );
    // `list` is `show`; `get` answers one setting, or refuses a name by
    // listing the real ones.
    assert_eq!(stdout(&tessera(&api, &["settings", "list"])), table);
    let one = stdout(&tessera(&api, &["settings", "get", "full_pct"]));
    assert_eq!(one.lines().count(), 2, "{one}");
    assert!(
        one.lines()
            .nth(1)
            .unwrap()
            .starts_with("full_pct  95%    95%"),
        "{one}"
    );
    assert_eq!(
        json(&tessera(&api, &["--json", "settings", "get", "full_pct"])),
        95
    );
    let unknown = tessera(&api, &["settings", "get", "ful_pct"]);
    assert_eq!(code(&unknown), 2);
    assert!(
        stderr(&unknown).contains("no setting named ful_pct: the settings are max_overcommit_ratio, nearly_full_pct, full_pct,"),
        "{}",
        stderr(&unknown)
    );
    let bad = tessera(&api, &["settings", "set", "read_cache_bytes", "lots"]);
    assert_eq!(code(&bad), 2);
    assert!(stderr(&bad).contains("a size"), "{}", stderr(&bad));
    let too_much = tessera(&api, &["settings", "set", "read_cache_bytes", "9G"]);
    assert_eq!(code(&too_much), 1);
    assert!(
        stderr(&too_much).contains("at most half of a host's memory"),
        "{}",
        stderr(&too_much)
    );
}

#[test]
fn a_full_clone_waits_for_its_fill_printing_the_progress_unless_told_not_to() {
    let api = ApiServer::start();
    for args in [
        &["volume", "create", "vm", "--size", "64M"][..],
        &["snapshot", "create", "vm", "s1"],
    ] {
        let out = tessera(&api, args);
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    }
    // Waits by default: the made volume, one line per look at the fill
    // (the in-memory API moves it half the volume per look), then the end.
    let out = tessera(
        &api,
        &["volume", "clone", "copy", "--from", "vm@s1", "--full"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("cloned volume copy: 64.0 MiB, policy default, 512e, healthy"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("full clone of vm@s1: it is being filled in the background"),
        "{text}"
    );
    assert_eq!(
        lines[2],
        "copy is being filled from vm@s1: 50%, 32.0 MiB of 64.0 MiB done, 32.0 MiB copied, 32.0 MiB/s, about 1s left",
        "{text}"
    );
    assert_eq!(
        lines[3],
        "volume copy is filled: a full copy of vm@s1, 64.0 MiB of data; it serves clients now",
        "{text}"
    );
    assert!(lines[4].starts_with("attach with: nbd://"), "{text}");

    // --no-wait answers at once; list and show say it is filling.
    let out = tessera(
        &api,
        &[
            "volume",
            "clone",
            "copy2",
            "--from",
            "vm@s1",
            "--full",
            "--no-wait",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains("full clone of vm@s1"),
        "{}",
        stdout(&out)
    );
    let list = stdout(&tessera(&api, &["volume", "list"]));
    assert!(list.contains("filling 0%"), "{list}");
    assert!(
        list.contains("copy2 is being filled from vm@s1: 0%"),
        "{list}"
    );
    let shown = json(&tessera(&api, &["--json", "volume", "show", "copy2"]));
    assert_eq!(shown["fill"]["from"], "vm@s1", "{shown:#}");
    assert_eq!(shown["fill"]["done_bytes"], 32 << 20, "{shown:#}");

    // With --json it prints the filled volume's view, once.
    let out = tessera(
        &api,
        &[
            "--json", "volume", "clone", "copy3", "--from", "vm@s1", "--full",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let filled = json(&out);
    assert_eq!(filled["name"], "copy3");
    assert!(filled.get("fill").is_none(), "{filled:#}");

    // --no-wait and --policy are for full clones only.
    for args in [
        &["volume", "clone", "x", "--from", "vm@s1", "--no-wait"][..],
        &[
            "volume", "clone", "x", "--from", "vm@s1", "--policy", "default",
        ],
    ] {
        let out = tessera(&api, args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn resync_list_shows_progress() {
    let api = ApiServer::start();
    let none = tessera(&api, &["resync", "list"]);
    assert_eq!(stdout(&none), "no resyncs or rebuilds\n");
    api.control.add_resync(ResyncView {
        volume: "vol1".to_string(),
        component: ComponentId(2),
        host: "host-2".to_string(),
        kind: "resync".to_string(),
        state: ResyncState::Running,
        error: None,
        attempts: 1,
        done_bytes: 64 << 20,
        left_bytes: 192 << 20,
        copied_bytes: 8 << 20,
        rate_bytes_per_s: 32 << 20,
        eta_s: Some(6),
    });
    let text = stdout(&tessera(&api, &["resync", "list"]));
    let row = text.lines().nth(1).unwrap_or_default();
    for cell in [
        "25%",
        "64.0 MiB",
        "192.0 MiB",
        "8.0 MiB",
        "32.0 MiB/s",
        "6s",
    ] {
        assert!(row.contains(cell), "{cell} missing: {text}");
    }
    let listed = json(&tessera(&api, &["resync", "list", "--json"]));
    assert_eq!(listed[0]["left_bytes"], 192_u64 << 20);
    // The component as the tables print it; the state a closed word, its
    // reason apart.
    assert_eq!(listed[0]["component"], "c0000000000000002");
    assert!(row.contains("c0000000000000002"), "{text}");
    assert_eq!(listed[0]["state"], "running");
    assert_eq!(listed[0]["error"], Value::Null);
    assert_eq!(listed[0]["attempts"], 1);
    assert_eq!(listed[0]["eta_s"], 6);
    let status = stdout(&tessera(&api, &["status"]));
    assert!(status.contains("RESYNCS (1 running)"), "{status}");
}

fn resync(component: u64, state: ResyncState, left_bytes: u64) -> ResyncView {
    ResyncView {
        volume: "vol1".to_string(),
        component: ComponentId(component),
        host: "host-2".to_string(),
        kind: "resync".to_string(),
        state,
        error: None,
        attempts: 1,
        done_bytes: 64 << 20,
        left_bytes,
        copied_bytes: 8 << 20,
        rate_bytes_per_s: 32 << 20,
        eta_s: (state == ResyncState::Running).then_some(left_bytes.div_ceil(32 << 20)),
    }
}

#[test]
fn a_failed_resync_has_a_state_word_and_its_reason_apart() {
    let api = ApiServer::start();
    api.control.add_resync(ResyncView {
        error: Some("host-2 is unreachable: Connection refused".to_string()),
        attempts: 2,
        ..resync(2, ResyncState::Failed, 192 << 20)
    });
    let listed = json(&tessera(&api, &["resync", "list", "--json"]));
    assert_eq!(listed[0]["state"], "failed");
    assert_eq!(
        listed[0]["error"],
        "host-2 is unreachable: Connection refused"
    );
    assert_eq!(listed[0]["eta_s"], Value::Null);
    let text = stdout(&tessera(&api, &["resync", "list"]));
    assert!(
        text.lines().nth(1).unwrap().contains("  failed  "),
        "{text}"
    );
    assert!(
        text.ends_with("attempt 2 failed: host-2 is unreachable: Connection refused\n"),
        "{text}"
    );
}

#[test]
fn resync_list_watch_redraws_until_nothing_runs() {
    let api = ApiServer::start();
    // Nothing running: one listing, then exit 0.
    api.control.add_resync(resync(1, ResyncState::Done, 0));
    let once = tessera(&api, &["resync", "list", "--watch", "1"]);
    assert_eq!(code(&once), 0, "{}", stderr(&once));
    assert_eq!(
        stdout(&once).matches("VOLUME").count(),
        1,
        "{}",
        stdout(&once)
    );

    api.control
        .add_resync(resync(2, ResyncState::Running, 192 << 20));
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
    let child = command
        .args(["--api", api.url.as_str(), "resync", "list", "--watch", "1"])
        .env_remove("TESSERA_API")
        .env("TESSERA_TOKEN", api.control.admin_token())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tessera");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    // Waiting to retry is not finished either.
    api.control.set_resyncs(vec![
        resync(1, ResyncState::Done, 0),
        resync(2, ResyncState::Waiting, 192 << 20),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(2000));
    api.control.set_resyncs(vec![
        resync(1, ResyncState::Done, 0),
        resync(2, ResyncState::Done, 0),
    ]);
    let started = std::time::Instant::now();
    let out = child.wait_with_output().expect("tessera ends");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "exits once nothing runs"
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    // Not a terminal: no screen clearing, listings a blank line apart.
    assert!(!text.contains('\x1b'), "{text:?}");
    let listings: Vec<&str> = text.split("\n\n").collect();
    assert!(listings.len() >= 4, "{text}");
    assert!(listings[0].contains("running"), "{text}");
    assert!(listings.iter().any(|l| l.contains("waiting")), "{text}");
    let last = listings.last().unwrap();
    assert!(!last.contains("running") && last.contains("done"), "{text}");
}

/// A disk group of file devices under `dir`: a 24 MiB cache, a 32 MiB
/// capacity device.
fn small_disk_group(dir: &std::path::Path) -> tessera_store::DiskGroupConfig {
    use tessera_store::{DeviceSpec, DiskGroupConfig};
    DiskGroupConfig {
        id: tessera_types::DiskGroupId::new("dg-1").expect("name"),
        cache: DeviceSpec {
            path: dir.join("cache"),
            size_bytes: 24 << 20,
        },
        capacity: vec![DeviceSpec {
            path: dir.join("cap0"),
            size_bytes: 32 << 20,
        }],
        index_cache_bytes: 1 << 20,
        content_cache_bytes: tessera_store::CONTENT_CACHE_BYTES_DEFAULT,
        direct_io: tessera_store::DirectIo::Off,
        encryption: None,
    }
}

#[test]
fn store_check_passes_a_clean_disk_group_and_fails_a_damaged_one() {
    use tessera_store::DiskGroup;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = small_disk_group(dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let group = DiskGroup::create(config.clone()).await.expect("create");
        group
            .create_component(ComponentId(7), 1 << 20, 0)
            .await
            .expect("component");
        group.settle().await.expect("settle");
    });
    let cache = config.cache.path.to_string_lossy().into_owned();
    let cap = config.capacity[0].path.to_string_lossy().into_owned();

    let clean = tessera_env(&["store", "check", &cache, &cap], None, None);
    assert_eq!(code(&clean), 0, "{}{}", stdout(&clean), stderr(&clean));
    assert!(
        stdout(&clean).ends_with("0 problem(s)\n"),
        "{}",
        stdout(&clean)
    );
    let clean_json = json(&tessera_env(
        &["store", "check", "--json", &cache, &cap],
        None,
        None,
    ));
    assert_eq!(clean_json["clean"], true);
    assert_eq!(clean_json["components"], 1);

    let mut bytes = std::fs::read(&cap).expect("read capacity device");
    bytes[..4096].fill(0x5a);
    std::fs::write(&cap, &bytes).expect("damage the capacity device");
    let damaged = tessera_env(&["store", "check", &cache, &cap], None, None);
    assert_eq!(code(&damaged), 1, "{}", stdout(&damaged));
    assert!(stdout(&damaged).contains("PROBLEM"), "{}", stdout(&damaged));
    assert!(
        stderr(&damaged).contains("problem(s) found on"),
        "{}",
        stderr(&damaged)
    );

    let missing = tessera_env(
        &["store", "check", "/nonexistent/tessera-device"],
        None,
        None,
    );
    assert_eq!(code(&missing), 1);
    assert!(
        stdout(&missing).contains("cannot open"),
        "{}",
        stdout(&missing)
    );
}

#[test]
fn volume_access_shows_and_sets_who_may_log_in_and_never_prints_secrets() {
    let api = ApiServer::start();
    assert_eq!(
        code(&tessera(&api, &["volume", "create", "db", "--size", "1G"])),
        0
    );
    let open = tessera(&api, &["volume", "access", "db"]);
    assert_eq!(
        stdout(&open),
        "volume db: target iqn.2026-11.io.tessera:db, LUN 0\niSCSI admits: every initiator\n\
         authentication: no CHAP\nNBD admits: any certificate of the cluster CA (over TLS); \
         clients without a certificate: from the serving host (loopback)\n"
    );
    let short = tessera(
        &api,
        &[
            "volume",
            "access",
            "db",
            "--chap-user",
            "alice",
            "--chap-secret",
            "short",
        ],
    );
    assert_eq!(code(&short), 1, "{}", stderr(&short));
    assert!(
        stderr(&short).contains("12 to 255 characters"),
        "{}",
        stderr(&short)
    );
    let set = tessera(
        &api,
        &[
            "volume",
            "access",
            "db",
            "--allow",
            "iqn.1994-05.com.redhat:esx1",
            "--allow",
            "iqn.1994-05.com.redhat:esx2",
            "--chap-user",
            "alice",
            "--chap-secret",
            "alice-secret-12",
            "--target-chap-user",
            "tessera",
            "--target-chap-secret",
            "target-secret-12",
        ],
    );
    assert_eq!(code(&set), 0, "{}", stderr(&set));
    assert_eq!(
        stdout(&set),
        "volume db: target iqn.2026-11.io.tessera:db, LUN 0\n\
         iSCSI admits: iqn.1994-05.com.redhat:esx1, iqn.1994-05.com.redhat:esx2\n\
         authentication: mutual CHAP as alice, target answers as tessera\n\
         NBD admits: none (over TLS); clients without a certificate: none\n"
    );
    let shown = tessera(&api, &["volume", "access", "db", "--json"]);
    let text = stdout(&shown);
    assert!(!text.contains("secret-12"), "a secret was printed: {text}");
    assert_eq!(json(&shown)["chap_user"], "alice");
    let nbd = tessera(
        &api,
        &[
            "volume",
            "access",
            "db",
            "--nbd-client",
            "esx1",
            "--plain-nbd",
            "anywhere",
        ],
    );
    assert_eq!(code(&nbd), 0, "{}", stderr(&nbd));
    assert!(
        stdout(&nbd).contains("iSCSI admits: no initiator (the settings name only NBD clients)"),
        "{}",
        stdout(&nbd)
    );
    assert!(
        stdout(&nbd).contains("NBD admits: esx1 (over TLS)"),
        "{}",
        stdout(&nbd)
    );
    let bad = tessera(
        &api,
        &["volume", "access", "db", "--plain-nbd", "sometimes"],
    );
    assert_eq!(code(&bad), 2, "{}", stderr(&bad));
    let cleared = tessera(&api, &["volume", "access", "db", "--open"]);
    assert!(stdout(&cleared).contains("iSCSI admits: every initiator"));
    assert!(stdout(&cleared).contains("without a certificate: from the serving host"));
}

#[test]
fn store_check_refuses_devices_a_running_host_holds_and_passes_once_they_are_closed() {
    use tessera_store::DiskGroup;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = small_disk_group(dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Held open by the store in this process, as a running host holds it.
    let group = runtime.block_on(async {
        let group = DiskGroup::create(config.clone()).await.expect("create");
        group
            .create_component(ComponentId(7), 1 << 20, 0)
            .await
            .expect("component");
        group
    });
    let cache = config.cache.path.to_string_lossy().into_owned();
    let cap = config.capacity[0].path.to_string_lossy().into_owned();

    // The first device found in use is named: the cache device, or the
    // capacity device when it is checked alone.
    for (args, named) in [
        (vec!["store", "check", &cache, &cap], &cache),
        (vec!["store", "check", "--json", &cache, &cap], &cache),
        (vec!["store", "check", &cap], &cap),
    ] {
        let refused = tessera_env(&args, None, None);
        assert_eq!(
            code(&refused),
            1,
            "{args:?}: {}{}",
            stdout(&refused),
            stderr(&refused)
        );
        // No report: nothing was read, and "0 problem(s)" would be untrue.
        assert_eq!(stdout(&refused), "", "{args:?}");
        let said = stderr(&refused);
        assert!(said.contains(named.as_str()), "{said}");
        assert!(said.contains("in use by a running host"), "{said}");
        assert!(said.contains("stop that host first"), "{said}");
    }

    runtime.block_on(async move {
        group.settle().await.expect("settle");
        drop(group);
    });
    let clean = tessera_env(&["store", "check", &cache, &cap], None, None);
    assert_eq!(code(&clean), 0, "{}{}", stdout(&clean), stderr(&clean));
    assert!(
        stdout(&clean).ends_with("0 problem(s)\n"),
        "{}",
        stdout(&clean)
    );
    assert!(
        stdout(&clean).contains("checked 1 components"),
        "{}",
        stdout(&clean)
    );
}

/// Runs `volume create v --size SIZE` and `volume resize v --size SIZE`:
/// both must be usage errors (exit 2) that print clap's line naming the
/// value and `message`, and send nothing.
fn assert_size_refused(api: &ApiServer, size: &str, message: &str) {
    for verb in ["create", "resize"] {
        let o = tessera(api, &["volume", verb, "v", "--size", size]);
        let err = stderr(&o);
        assert_eq!(code(&o), 2, "{verb} --size {size}: {err}");
        assert!(
            err.starts_with(&format!(
                "error: invalid value '{size}' for '--size <SIZE>': "
            )),
            "{verb} --size {size}: {err}"
        );
        assert!(err.contains(message), "{verb} --size {size}: {err}");
        assert_eq!(stdout(&o), "", "{verb} --size {size}");
    }
}

#[test]
fn sizes_are_exact_and_each_mistake_exits_2_with_its_own_message() {
    let api = ApiServer::start();
    assert_size_refused(
        &api,
        "1.5",
        "\"1.5\" is 1.5 bytes, not a whole number of bytes; a fraction needs a unit K, M, G or T, e.g. 1.5G",
    );
    assert_size_refused(
        &api,
        "0.1K",
        "\"0.1K\" is 102.4 bytes, not a whole number of bytes",
    );
    assert_size_refused(&api, "-5G", "\"-5G\": a size cannot be negative");
    for huge in ["99999999T", "18446744073709551616"] {
        assert_size_refused(
            &api,
            huge,
            &format!(
                "\"{huge}\" is too large: the largest size is 18446744073709551615 bytes (16 EiB less one byte)"
            ),
        );
    }
    assert_size_refused(
        &api,
        "0",
        "\"0\" is zero bytes: a size must be at least 4K (4096 bytes)",
    );
    assert_size_refused(
        &api,
        "1000",
        "\"1000\" is 1000 bytes, not a multiple of 4K (4096 bytes), the block size Tessera stores; the nearest valid size is 4096 bytes",
    );
    assert_size_refused(&api, "1.5K", "\"1.5K\" is 1536 bytes, not a multiple of 4K");
    assert_size_refused(&api, "ten", "cannot read \"ten\" as a size");
    assert_eq!(
        json(&tessera(&api, &["volume", "list", "--json"])),
        Value::Array(Vec::new()),
        "no refused size reached the API"
    );

    let created = tessera(&api, &["volume", "create", "v", "--size", "1.5G", "--json"]);
    assert_eq!(code(&created), 0, "{}", stderr(&created));
    assert_eq!(json(&created)["size_bytes"], 1_610_612_736_u64);
    let resized = tessera(
        &api,
        &["volume", "resize", "v", "--size", "2.25G", "--json"],
    );
    assert_eq!(code(&resized), 0, "{}", stderr(&resized));
    assert_eq!(json(&resized)["size_bytes"], 9_u64 << 28);
}
