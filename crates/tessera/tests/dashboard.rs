//! The web dashboard in a real browser: Debian's headless chromium, driven
//! through chromedriver's WebDriver HTTP API, against a real `tessera up`.
//! A user signs in with the admin token and sees every host; a volume made
//! through the CLI appears with its component tree; the IOPS chart moves
//! while fio writes; a host stopped through the CLI turns red, with the
//! health check naming it; every health code `tessera health` reports is
//! on the page with its remedy; and the browser logged no console error
//! the whole time. Screenshots of each state are kept in
//! `target/tmp/dashboard/`. Skips without chromium, chromedriver or fio.

mod common;

use base64::Engine;
use common::up::{fio, tessera, UpCluster};
use common::{free_port, have};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// chromedriver, stopped when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start() -> Driver {
        let port = free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = ureq::get(&format!("{}/status", driver.url))
                .call()
                .ok()
                .and_then(|r| r.into_json::<Value>().ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                return driver;
            }
            assert!(Instant::now() < deadline, "chromedriver did not get ready");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One WebDriver session: a headless chromium window.
struct Browser<'d> {
    driver: &'d Driver,
    session: String,
}

impl Drop for Browser<'_> {
    fn drop(&mut self) {
        let _ = ureq::delete(&format!("{}/session/{}", self.driver.url, self.session)).call();
    }
}

impl<'d> Browser<'d> {
    fn open(driver: &'d Driver) -> Browser<'d> {
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // The API's certificate comes from the cluster's own CA.
            "acceptInsecureCerts": true,
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,2400"],
            },
        }}});
        let answer: Value = ureq::post(&format!("{}/session", driver.url))
            .send_json(capabilities)
            .expect("a browser session")
            .into_json()
            .unwrap();
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("a session id in {answer}"))
            .to_string();
        Browser { driver, session }
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}/session/{}{path}", self.driver.url, self.session);
        let answer = match method {
            "GET" => ureq::get(&url).call(),
            _ => ureq::request(method, &url).send_json(body),
        };
        match answer {
            Ok(r) => r.into_json::<Value>().unwrap()["value"].take(),
            Err(ureq::Error::Status(code, r)) => {
                panic!(
                    "WebDriver {method} {path}: {code} {}",
                    r.into_string().unwrap()
                )
            }
            Err(e) => panic!("WebDriver {method} {path}: {e}"),
        }
    }

    fn go(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url }));
    }

    /// Runs `script` in the page and answers what it returns.
    fn run(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": [] }),
        )
    }

    fn element(&self, css: &str) -> String {
        let found = self.call(
            "POST",
            "/element",
            json!({ "using": "css selector", "value": css }),
        );
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{css} on the page: {found}"))
            .to_string()
    }

    fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            json!({ "text": text }),
        );
    }

    fn click(&self, css: &str) {
        let id = self.element(css);
        self.call("POST", &format!("/element/{id}/click"), json!({}));
    }

    /// Waits until `script` returns true, or fails with what it returned
    /// and a screenshot.
    fn wait_until(&self, what: &str, secs: u64, script: &str) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let now = self.run(script);
            if now == Value::Bool(true) {
                return;
            }
            if Instant::now() > deadline {
                let shot = self.screenshot("timed-out");
                panic!("the page did not show {what} in {secs} s ({now}); see {shot:?}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Saves the window as `name`.png among the test's artifacts.
    fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.call("GET", "/screenshot", Value::Null);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("a base64 screenshot"))
            .unwrap();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// The browser console's entries since the last call.
    fn console(&self) -> Vec<Value> {
        self.call("POST", "/se/log", json!({ "type": "browser" }))
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

fn severe(entries: &[Value]) -> Vec<&Value> {
    entries.iter().filter(|e| e["level"] == "SEVERE").collect()
}

#[test]
fn the_dashboard_shows_the_cluster_as_it_changes() {
    if !have("chromium") || !have("chromedriver") || !have("fio") {
        return;
    }
    let up = UpCluster::start(93, &[]);
    let token = std::fs::read_to_string(up.data_dir.join("admin.token")).unwrap();
    let driver = Driver::start();
    let browser = Browser::open(&driver);

    // Signing in: the page asks for a token before it reads anything.
    browser.go(&format!("{}/", up.api));
    browser.wait_until(
        "the sign-in form",
        20,
        "return !document.getElementById('login').hidden && document.getElementById('main').hidden",
    );
    browser.type_into("#token", token.trim());
    browser.click("#sign-in");
    browser.wait_until(
        "every host",
        20,
        "return ['host-1','host-2','host-3','host-4'].every(h => \
           document.querySelector(`tr.host[data-host='${h}'] .badge.present`))",
    );
    browser.screenshot("1-signed-in");

    // A volume made through the CLI appears, with its component tree.
    let (view, uri) = up.create_volume("web1", "64M", None);
    let owner = view["owner"].as_str().unwrap().to_string();
    browser.wait_until(
        "the new volume",
        20,
        "return !!document.querySelector(\"#volumes tr[data-volume='web1']\")",
    );
    browser.click("#volumes tr[data-volume='web1']");
    // FTT=1 with RAID-1: two data copies and a witness, all active.
    browser.wait_until(
        "web1's component tree",
        20,
        "const c = document.querySelectorAll('#object li.component'); \
         return c.length === 3 && [...c].every(li => li.querySelector('.badge.active'))",
    );
    browser.screenshot("2-volume-created");

    // The IOPS chart moves while fio writes, for the owner and the volume.
    let load = fio(
        &uri,
        &["--rw=randrw", "--time_based", "--runtime=30", "--size=16M"],
    )
    .spawn()
    .expect("fio starts");
    browser.wait_until(
        "the owner's IOPS in the chart",
        40,
        "return Number(document.getElementById('chart-iops').dataset.latest) > 0",
    );
    browser.run(
        "const s = document.getElementById('chart-scope'); s.value = 'web1'; \
         s.dispatchEvent(new Event('change')); return true",
    );
    browser.wait_until(
        "web1's IOPS in the chart",
        20,
        "return document.getElementById('chart-scope').value === 'web1' && \
                document.getElementById('chart-iops').getAttribute('aria-label').startsWith('web1 read, web1 write') && \
                Number(document.getElementById('chart-iops').dataset.latest) > 0 && \
                Number(document.getElementById('chart-mbs').dataset.latest) > 0 && \
                Number(document.getElementById('chart-latency').dataset.latest) > 0",
    );
    browser.screenshot("3-fio-running");
    let fio_out = load.wait_with_output().unwrap();
    assert!(fio_out.status.success(), "fio: {fio_out:?}");

    // A host stopped through the CLI turns red, named by a health check.
    let stopped = ["host-1", "host-2", "host-3", "host-4"]
        .into_iter()
        .find(|h| *h != owner)
        .unwrap();
    let (ok, out) = tessera(&up.api, &["host", "stop", stopped]);
    assert!(ok, "{out}");
    let red = format!(
        "const row = document.querySelector(\"tr.host[data-host='{stopped}']\"); \
         const check = document.querySelector(\".check[data-code='HOST_DOWN']\"); \
         return !!row && row.classList.contains('down') && \
           getComputedStyle(row.cells[0]).backgroundColor === 'rgb(253, 236, 234)' && \
           getComputedStyle(row.cells[0]).color === 'rgb(198, 40, 40)' && \
           !!check && check.textContent.includes('{stopped}')"
    );
    browser.wait_until("the stopped host in red", 30, &red);
    browser.screenshot("4-host-stopped");

    // Every check `tessera health` reports is there, with its remedy.
    let (ok, health) = tessera(&up.api, &["health", "--json"]);
    assert!(ok, "{health}");
    let health: Value = serde_json::from_str(&health).unwrap();
    let checks = health["checks"].as_array().unwrap();
    assert!(checks.iter().any(|c| c["code"] == "HOST_DOWN"), "{health}");
    for check in checks {
        let script = format!(
            "return [...document.querySelectorAll(\".check[data-code='{}']\")] \
               .some(c => c.textContent.includes({}))",
            check["code"].as_str().unwrap(),
            check["remedy"]
        );
        browser.wait_until(&format!("{} with its remedy", check["code"]), 20, &script);
    }

    // No console error on the way; the console is read for real (a probe
    // error shows up).
    let entries = browser.console();
    assert!(severe(&entries).is_empty(), "console errors: {entries:#?}");
    browser.run("console.error('tessera dashboard probe'); return true");
    let probe = browser.console();
    assert!(
        severe(&probe).iter().any(|e| e["message"]
            .as_str()
            .unwrap_or("")
            .contains("tessera dashboard probe")),
        "{probe:#?}"
    );
}

#[test]
fn the_dashboard_s_files_need_no_token_and_allow_nothing_from_elsewhere() {
    if !have("curl") {
        return;
    }
    let up = UpCluster::start(95, &[]);
    let ca = up.data_dir.join("tls").join("ca-cert.pem");
    let get = |path: &str| {
        let out = Command::new("curl")
            .args(["-s", "-i", "--cacert"])
            .arg(&ca)
            .arg(format!("{}{path}", up.api))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_lowercase()
    };
    let root = get("/");
    assert!(
        root.contains(" 303") && root.contains("location: /ui/"),
        "{root}"
    );
    for (path, kind) in [
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
    ] {
        let answer = get(path);
        assert!(answer.contains(" 200"), "{path}: {answer}");
        assert!(
            answer.contains(&format!("content-type: {kind}")),
            "{answer}"
        );
        assert!(
            answer.contains("content-security-policy: default-src 'none'; script-src 'self'"),
            "{answer}"
        );
    }
    // The data behind it still needs a token.
    assert!(get("/v1/activity/history").contains(" 401"));
}

/// Checks each `(label, schema, answer)` of `cases` against the document's
/// schemas with python3's jsonschema (JSON Schema 2020-12, the dialect of
/// OpenAPI 3.1); answers what it found wrong.
fn schema_violations(doc: &Value, cases: &[(String, Value, Value)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cases.json");
    let cases: Vec<Value> = cases
        .iter()
        .map(|(label, schema, answer)| json!({"label": label, "schema": schema, "answer": answer}))
        .collect();
    std::fs::write(
        &input,
        json!({"components": doc["components"], "cases": cases}).to_string(),
    )
    .unwrap();
    let script = r#"
import json, sys
from jsonschema import Draft202012Validator
data = json.load(open(sys.argv[1]))
bad = []
for case in data["cases"]:
    schema = dict(case["schema"], components=data["components"])
    for error in Draft202012Validator(schema).iter_errors(case["answer"]):
        bad.append(f'{case["label"]}: {list(error.absolute_path)}: {error.message}'[:400])
print("\n".join(bad))
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&input)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn the_api_s_answers_match_its_openapi_document() {
    if !have("curl") || !have("python3") {
        return;
    }
    let have_jsonschema = Command::new("python3")
        .args(["-c", "import jsonschema"])
        .status()
        .is_ok_and(|s| s.success());
    if !have_jsonschema {
        assert!(
            std::env::var("TESSERA_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "python3-jsonschema is required (TESSERA_REQUIRE_TOOLS=1)"
        );
        return;
    }
    let up = UpCluster::start(97, &[]);
    up.create_volume("db1", "64M", None);
    let (ok, out) = tessera(&up.api, &["snapshot", "create", "db1", "first"]);
    assert!(ok, "{out}");
    let token = std::fs::read_to_string(up.data_dir.join("admin.token")).unwrap();
    let ca = up.data_dir.join("tls").join("ca-cert.pem");
    let get = |path: &str, auth: bool| -> Value {
        let mut curl = Command::new("curl");
        curl.args(["-s", "--fail-with-body", "--cacert"]).arg(&ca);
        if auth {
            curl.args(["-H", &format!("Authorization: Bearer {}", token.trim())]);
        }
        let out = curl.arg(format!("{}{path}", up.api)).output().unwrap();
        assert!(out.status.success(), "GET {path}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("GET {path}: {e}: {out:?}"))
    };
    let doc = get("/v1/openapi.json", false);
    let mut cases = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(schema) =
            item["get"]["responses"]["200"]["content"]["application/json"].get("schema")
        else {
            continue;
        };
        let concrete = path
            .replace("{id}", "host-1")
            .replace("/policies/{name}", "/policies/default")
            .replace("{name}", "db1");
        cases.push((concrete.clone(), schema.clone(), get(&concrete, true)));
    }
    assert!(cases.len() >= 20, "{} GET answers", cases.len());
    let violations = schema_violations(&doc, &cases);
    assert!(
        violations.is_empty(),
        "answers unlike the document:\n{violations}"
    );
    // The check can fail: an answer missing a required field is caught.
    let mut broken = cases
        .iter()
        .find(|(path, _, _)| path == "/v1/volumes/db1")
        .cloned()
        .unwrap();
    broken.2.as_object_mut().unwrap().remove("size_bytes");
    assert!(schema_violations(&doc, &[broken]).contains("size_bytes"));
}
