//! The Debian package and its systemd units (docs/deploy.md): the package
//! builds from this tree (`packaging/deb/build-deb`), installs with
//! `dpkg -i` (its binary runs, its `roamdisk` user exists), its units pass
//! `systemd-analyze verify`, and each unit's `ExecStart` line, as written,
//! serves: started with its `Environment=` defaults overridden the way
//! `/etc/default/...` would, reloaded with its `ExecReload` line, stopped
//! with SIGTERM (exit 0). The package is purged at the end. Needs root.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{bin, output_text, path_str, poll_until, require_tool, tempdir, write_server_config};

const UNITS: &str = "/usr/lib/systemd/system";

/// A unit file's `Environment=` defaults and its `ExecStart=` and
/// `ExecReload=` lines.
struct Unit {
    env: HashMap<String, String>,
    exec_start: String,
    exec_reload: String,
}

fn parse_unit(path: &Path) -> Unit {
    let text = std::fs::read_to_string(path).unwrap();
    let mut env = HashMap::new();
    let (mut exec_start, mut exec_reload) = (String::new(), String::new());
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Environment=") {
            for kv in v.split_whitespace() {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                env.insert(k.to_string(), v.to_string());
            }
            if let Some((k, v)) = v.split_once('=') {
                if v.is_empty() {
                    env.insert(k.to_string(), String::new());
                }
            }
        } else if let Some(v) = line.strip_prefix("ExecStart=") {
            exec_start = v.to_string();
        } else if let Some(v) = line.strip_prefix("ExecReload=") {
            exec_reload = v.to_string();
        }
    }
    assert!(
        !exec_start.is_empty(),
        "{} has no ExecStart",
        path.display()
    );
    Unit {
        env,
        exec_start,
        exec_reload,
    }
}

/// A command line as systemd expands it: `${VAR}` is one word, `$VAR` is
/// split at whitespace (nothing if empty).
fn expand(line: &str, env: &HashMap<String, String>) -> Vec<String> {
    let mut words = Vec::new();
    for w in line.split_whitespace() {
        if let Some(name) = w.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
            words.push(
                env.get(name)
                    .unwrap_or_else(|| panic!("${{{name}}} is not set"))
                    .clone(),
            );
        } else if let Some(name) = w.strip_prefix('$') {
            let v = env
                .get(name)
                .unwrap_or_else(|| panic!("${name} is not set"));
            words.extend(v.split_whitespace().map(str::to_string));
        } else {
            words.push(w.to_string());
        }
    }
    words
}

/// Start `unit`'s ExecStart with its defaults overridden by `set`; stderr
/// into `log`.
fn start(unit: &Unit, set: &[(&str, String)], log: &Path) -> Child {
    let mut env = unit.env.clone();
    for (k, v) in set {
        assert!(env.contains_key(*k), "{k} is not a setting of the unit");
        env.insert(k.to_string(), v.clone());
    }
    let argv = expand(&unit.exec_start, &env);
    assert_eq!(argv[0], "/usr/bin/roamdisk", "{argv:?}");
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {argv:?}: {e}"))
}

/// Run `unit`'s ExecReload line against `child`.
fn reload(unit: &Unit, child: &Child) {
    let mut env = HashMap::new();
    env.insert("MAINPID".to_string(), child.id().to_string());
    let argv = expand(&unit.exec_reload, &env);
    let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    assert!(out.status.success(), "{argv:?}: {}", output_text(&out));
}

/// SIGTERM, and a clean exit within 30 s.
fn stop(mut child: Child, log: &Path) {
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            assert!(st.success(), "stopped with {st}:\n{log}");
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "did not stop within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_logged(log: &Path, what: &str) {
    let seen = poll_until(Duration::from_secs(20), Duration::from_millis(50), || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains(what)
            || std::fs::read_to_string(log.with_extension("out"))
                .unwrap_or_default()
                .contains(what)
    });
    assert!(
        seen,
        "no '{what}' in {}:\n{}",
        log.display(),
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// Purges the package when the test ends, however it ends.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "roamdisk"]).output();
    }
}

#[test]
fn the_package_installs_and_each_units_exec_start_serves_as_written() {
    for t in ["dpkg-deb", "dpkg", "systemd-analyze", "nbdinfo", "adduser"] {
        require_tool(t);
    }
    let uid = common::run_stdout("id", &["-u"]);
    assert_eq!(
        uid.trim(),
        "0",
        "installing a package needs root (the test suite runs as root)"
    );
    let dir = tempdir();
    let d = dir.path();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let built = Command::new(root.join("packaging/deb/build-deb"))
        .args(["--binary", path_str(&bin()), "--out", path_str(d)])
        .output()
        .unwrap();
    assert!(built.status.success(), "build-deb: {}", output_text(&built));
    let deb = PathBuf::from(String::from_utf8_lossy(&built.stdout).trim());
    assert!(deb.exists(), "{}", deb.display());
    let contents = common::run_stdout("dpkg-deb", &["--contents", path_str(&deb)]);
    for f in [
        "./usr/bin/roamdisk",
        "./usr/lib/systemd/system/roamdisk-server.service",
        "./usr/lib/systemd/system/roamdisk-store.service",
        "./usr/share/doc/roamdisk/examples/server.toml",
    ] {
        assert!(contents.contains(f), "{f} not in the package:\n{contents}");
    }

    let _purge = Installed;
    let inst = Command::new("dpkg")
        .args(["-i", path_str(&deb)])
        .output()
        .unwrap();
    assert!(inst.status.success(), "dpkg -i: {}", output_text(&inst));
    let version = Command::new("/usr/bin/roamdisk")
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success(), "{}", output_text(&version));
    let user = Command::new("getent")
        .args(["passwd", "roamdisk"])
        .output()
        .unwrap();
    assert!(user.status.success(), "no roamdisk user after dpkg -i");
    for u in ["roamdisk-server.service", "roamdisk-store.service"] {
        let v = Command::new("systemd-analyze")
            .args(["verify", &format!("{UNITS}/{u}")])
            .output()
            .unwrap();
        assert!(
            v.status.success() && v.stderr.is_empty(),
            "systemd-analyze verify {u}: {}",
            output_text(&v)
        );
    }

    // roamdisk-server: a config of the test's, its socket in the test's folder.
    let unit = parse_unit(&Path::new(UNITS).join("roamdisk-server.service"));
    let golden = d.join("golden.img");
    std::fs::write(&golden, vec![7u8; 1 << 20]).unwrap();
    let me = common::uid();
    let config = write_server_config(
        d,
        &format!(
            "socket = \"srv.sock\"\n[[image]]\nname = \"desktop\"\nstack = \"raw:{}\"\n\n[[client]]\nname = \"me\"\nuid = {me}\nview = [\"desktop\"]\n",
            golden.display()
        ),
    );
    let log = d.join("server.log");
    let child = start(
        &unit,
        &[("ROAMDISK_SERVER_CONFIG", path_str(&config).to_string())],
        &log,
    );
    wait_logged(&log, "serving");
    let uri = format!(
        "nbd+unix:///desktop?socket={}",
        d.join("srv.sock").display()
    );
    let size = common::run_stdout("nbdinfo", &["--size", &uri]);
    assert_eq!(size.trim(), (1u64 << 20).to_string());
    reload(&unit, &child);
    wait_logged(&log, "config reloaded");
    let size = common::run_stdout("nbdinfo", &["--size", &uri]);
    assert_eq!(size.trim(), (1u64 << 20).to_string());
    stop(child, &log);

    // roamdisk-store: a store and a users file of the test's.
    let unit = parse_unit(&Path::new(UNITS).join("roamdisk-store.service"));
    let store = d.join("store");
    let users = d.join("users.toml");
    common::rd(&["-q", "store", "init", path_str(&store)]);
    common::rd(&[
        "-q",
        "store",
        "user",
        "add",
        "alice",
        "--users",
        path_str(&users),
        "--token-file",
        path_str(&d.join("alice.token")),
    ]);
    let log = d.join("store.log");
    let child = start(
        &unit,
        &[
            ("ROAMDISK_STORE", path_str(&store).to_string()),
            ("ROAMDISK_STORE_LISTEN", "127.0.0.1:0".to_string()),
            ("ROAMDISK_STORE_USERS", path_str(&users).to_string()),
        ],
        &log,
    );
    wait_logged(&log, "127.0.0.1:");
    let mut child = child;
    reload(&unit, &child);
    // SIGHUP's default would end the process: it must be caught.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the store server died of its ExecReload signal:\n{}",
        std::fs::read_to_string(&log).unwrap()
    );
    stop(child, &log);
}
