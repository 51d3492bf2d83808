//! A minimal Chrome DevTools Protocol client for tests: Debian's headless Chromium
//! driven over `--remote-debugging-pipe` (NUL-separated JSON on fds 3 and 4), so no
//! WebSocket, no port and no extra crate is needed.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The browser to use: `$ATTEND_CHROMIUM`, else `/usr/bin/chromium`; `None` when
/// absent (the caller skips, or fails under CI).
pub fn chromium() -> Option<PathBuf> {
    let p = std::env::var_os("ATTEND_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    p.exists().then_some(p)
}

/// Returns the browser path, or `None` after printing why the test is skipped.
/// Under CI (`CI` set) a missing browser is a failure: `.ci/run` installs it with
/// `scripts/setup.d/browser`.
pub fn chromium_or_skip(test: &str) -> Option<PathBuf> {
    match chromium() {
        Some(p) => Some(p),
        None if std::env::var_os("CI").is_some() => {
            panic!("{test}: /usr/bin/chromium is missing; run scripts/setup.d/browser")
        }
        None => {
            eprintln!("{test}: skipped, no /usr/bin/chromium (run scripts/setup.d/browser)");
            None
        }
    }
}

/// One headless Chromium with one page attached.
pub struct Browser {
    child: Child,
    input: ChildStdin,
    rx: Receiver<Value>,
    next_id: u64,
    session: String,
    /// Every event received so far (console messages, exceptions, log entries...).
    pub events: Vec<Value>,
    profile: PathBuf,
}

const TIMEOUT: Duration = Duration::from_secs(60);

impl Browser {
    /// Starts Chromium (flags as documented for this machine) and opens a blank page
    /// of `width × height` CSS pixels.
    pub fn launch(chromium: &Path, width: u32, height: u32) -> Browser {
        let profile = std::env::temp_dir().join(format!(
            "attend-chromium-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos() ^ rand_ish()
        ));
        std::fs::create_dir_all(&profile).unwrap();
        // The shell puts our pipes on fds 3 (commands in) and 4 (replies out).
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg("exec \"$0\" \"$@\" 3<&0 4>&1 </dev/null >/dev/null")
            .arg(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--mute-audio",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                &format!("--window-size={width},{height}"),
                &format!("--user-data-dir={}", profile.display()),
                "about:blank",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        let input = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if buf.last() == Some(&0) {
                            buf.pop();
                        }
                        if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                            if tx.send(v).is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            input,
            rx,
            next_id: 0,
            session: String::new(),
            events: Vec::new(),
            profile,
        };
        let t = b.call_browser("Target.createTarget", json!({ "url": "about:blank" }));
        let target = t["targetId"].as_str().expect("targetId").to_string();
        let a = b.call_browser(
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
        );
        b.session = a["sessionId"].as_str().expect("sessionId").to_string();
        for m in ["Page.enable", "Runtime.enable", "Log.enable"] {
            b.call(m, json!({}));
        }
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        );
        b
    }

    fn send(&mut self, method: &str, params: Value, session: Option<String>) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = Value::String(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.input.write_all(&bytes).expect("write to chromium");
        self.input.flush().unwrap();
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(v) if v["id"].as_u64() == Some(id) => {
                    if let Some(e) = v.get("error") {
                        panic!("{method} failed: {e}");
                    }
                    return v["result"].clone();
                }
                Ok(v) => self.events.push(v),
                Err(RecvTimeoutError::Timeout) => panic!("{method}: no reply in {TIMEOUT:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("{method}: chromium exited"),
            }
        }
    }

    /// A browser-level command.
    pub fn call_browser(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, None)
    }

    /// A command to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.send(method, params, Some(s))
    }

    /// Waits for the page event `method` (one already received counts), returning
    /// its params.
    pub fn wait_event(&mut self, method: &str, timeout: Duration) -> Value {
        if let Some(i) = self.events.iter().position(|e| e["method"] == method) {
            return self.events.remove(i)["params"].clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(v) if v["method"] == method => return v["params"].clone(),
                Ok(v) => self.events.push(v),
                Err(_) => panic!("no {method} within {timeout:?}"),
            }
        }
    }

    /// Opens `url` and waits for its load event.
    pub fn navigate(&mut self, url: &str) {
        self.events.retain(|e| e["method"] != "Page.loadEventFired");
        let r = self.call("Page.navigate", json!({ "url": url }));
        assert!(r.get("errorText").is_none(), "navigate {url}: {r}");
        self.wait_event("Page.loadEventFired", TIMEOUT);
    }

    /// Evaluates a JavaScript expression in the page and returns its value.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("evaluating {expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Moves the mouse to `(x, y)` (CSS pixels of the viewport).
    pub fn mouse_move(&mut self, x: f64, y: f64) {
        self.call(
            "Input.dispatchMouseEvent",
            json!({ "type": "mouseMoved", "x": x, "y": y }),
        );
    }

    /// Clicks at `(x, y)`.
    pub fn click(&mut self, x: f64, y: f64) {
        self.mouse_move(x, y);
        for t in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": t, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            );
        }
    }

    /// The centre of the first element matching `selector`, scrolled into view.
    pub fn centre_of(&mut self, selector: &str) -> (f64, f64) {
        let v = self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return null; \
             e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
             return [r.left + r.width / 2, r.top + r.height / 2]; }})()",
            sel = serde_json::to_string(selector).unwrap()
        ));
        assert!(!v.is_null(), "no element matches {selector}");
        (v[0].as_f64().unwrap(), v[1].as_f64().unwrap())
    }

    /// A PNG screenshot of the whole page.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let r = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        );
        decode_base64(r["data"].as_str().expect("screenshot data"))
    }

    /// Console errors, uncaught exceptions and error log entries seen so far, one
    /// line each.
    pub fn errors(&mut self) -> Vec<String> {
        // Let pending events arrive.
        while let Ok(v) = self.rx.recv_timeout(Duration::from_millis(50)) {
            self.events.push(v);
        }
        let mut out = Vec::new();
        for e in &self.events {
            let p = &e["params"];
            match e["method"].as_str() {
                Some("Runtime.consoleAPICalled")
                    if matches!(p["type"].as_str(), Some("error") | Some("assert")) =>
                {
                    out.push(format!("console.{}: {}", p["type"], p["args"]))
                }
                Some("Runtime.exceptionThrown") => {
                    out.push(format!("exception: {}", p["exceptionDetails"]))
                }
                Some("Log.entryAdded") if p["entry"]["level"] == "error" => {
                    out.push(format!("log: {}", p["entry"]))
                }
                _ => {}
            }
        }
        out
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn rand_ish() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Standard base64 (with padding) to bytes.
pub fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => 0,
        }
    };
    let b: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for ch in b.chunks(4) {
        let n = ch.iter().fold(0u32, |n, &c| (n << 6) | val(c)) << (6 * (4 - ch.len()));
        let pad = ch.iter().filter(|&&c| c == b'=').count();
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad.max(4 - ch.len())]);
    }
    out
}
