//! `attend explain --html` in a real headless browser (Debian's Chromium, driven by
//! the DevTools helper of the library's view test): the page's embedded numbers are
//! `explain --format json`'s for the same flags, hovering a cell shows its sources
//! and a sum equal to the printed value, masked weights say why, keyboard focus
//! reaches every panel, and the 128-token MiniLM page loads and answers quickly.
//!
//! Skipped with a message when `/usr/bin/chromium` is absent, except under CI.
//! `ATTEND_SCREENSHOT_DIR=docs/img` also saves docs/cli.md's screenshot there.

#[path = "../../attend/tests/browser/mod.rs"]
mod browser;
mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use browser::{chromium_or_skip, Browser};
use common::model_dir;
use serde_json::{json, Value};

/// One browser at a time, so the timing test does not share the cores.
static ONE_BROWSER: Mutex<()> = Mutex::new(());

/// Notebook 001: two heads, the padding of the first batch row masked.
#[rustfmt::skip]
const NOTEBOOK_001: &[&str] = &[
    "--tokens", "1,2,0,0;1,2,3,4", "--vocab-size", "5", "--embed-dim", "4",
    "--padding-idx", "0", "--seed", "2", "--skip-draws", "48", "--init", "linear",
    "--qkv", "fused-interleaved", "--heads", "2", "--d-out", "4", "--mask-padding",
];

/// Weights written `[in, out]`, different key and value widths, causal masking and
/// a window of two keys back, softmax over the queries, an output projection.
#[rustfmt::skip]
const IN_OUT_CAUSAL_QUERIES: &[&str] = &[
    "--sentence", "Life is short, eat dessert first", "--embed-dim", "6", "--seed", "123",
    "--init", "uniform-in-out", "--heads", "3", "--d-k", "6", "--d-v", "9", "--causal",
    "--window", "2,0", "--softmax-dim", "queries", "--out-proj",
];

fn attend(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_attend"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "attend {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The page `explain --html` writes for `flags`, and `explain --format json`.
fn page_and_json(flags: &[&str], name: &str) -> (PathBuf, String, Value) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("explain-page");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let mut args = vec!["explain"];
    args.extend_from_slice(flags);
    let json: Value = serde_json::from_str(&attend(&[&args[..], &["--format", "json"]].concat()))
        .expect("explain --format json");
    attend(&[&args[..], &["--html", path.to_str().unwrap()]].concat());
    let html = std::fs::read_to_string(&path).unwrap();
    (path, html, json)
}

/// The data the page embeds, parsed from the page itself.
fn embedded(html: &str) -> Value {
    let open = "<script id=\"attend-data\" type=\"application/json\">";
    let start = html.find(open).expect("embedded data") + open.len();
    let len = html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..start + len]).unwrap()
}

fn flatten(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other.clone()),
    }
}

/// Every step in the page has the JSON's numbers, bit for bit as `f32` (both come
/// from the same `f32` arrays; masked scores are `null` in both), and every array
/// of the JSON is a step of the page.
fn assert_same_numbers(page: &Value, json: &Value) {
    let mut keys = BTreeSet::new();
    for step in page["steps"].as_array().unwrap() {
        let key = step["key"].as_str().unwrap();
        keys.insert(key.to_owned());
        let mut expected = Vec::new();
        flatten(&json[key], &mut expected);
        let got = step["data"].as_array().unwrap();
        assert_eq!(got.len(), expected.len(), "{key}: number of values");
        let shape: Vec<usize> = serde_json::from_value(step["shape"].clone()).unwrap();
        assert_eq!(shape.iter().product::<usize>(), got.len(), "{key}: shape");
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            let same = match (g.as_f64(), e.as_f64()) {
                (Some(g), Some(e)) => g as f32 == e as f32,
                _ => g.is_null() && e.is_null(),
            };
            assert!(same, "{key}[{i}]: page {g}, json {e}");
        }
    }
    for (key, v) in json.as_object().unwrap() {
        if v.is_array() && key != "tokens" {
            assert!(keys.contains(key), "JSON key {key} is not in the page");
        }
    }
}

fn assert_offline(html: &str) {
    for scheme in ["http://", "https://"] {
        assert!(!html.contains(scheme), "the page mentions {scheme}");
    }
}

fn at(json: &Value, key: &str, index: &[usize]) -> f64 {
    index
        .iter()
        .fold(&json[key], |v, &i| &v[i])
        .as_f64()
        .unwrap_or_else(|| panic!("{key}{index:?} is not a number"))
}

fn select(b: &mut Browser, id: &str, value: &str) {
    b.eval(&format!(
        "(() => {{ const s = document.getElementById('{id}'); s.value = '{value}'; \
         s.dispatchEvent(new Event('change', {{ bubbles: true }})); }})()"
    ));
}

/// Moves the mouse over cell `(r, c)` of panel `id`, a table or a heatmap, and
/// checks that the page took it as the current cell.
fn hover(b: &mut Browser, id: &str, r: usize, c: usize) {
    let v = b.eval(&format!(
        "(() => {{ const p = attendPage.panels['{id}']; p.el.scrollIntoView({{block: 'center'}}); \
         if (p.table) {{ const r = p.tbl.rows[{r} + 1].cells[{c} + 1].getBoundingClientRect(); \
         return [r.left + r.width / 2, r.top + r.height / 2]; }} \
         const b = p.over.getBoundingClientRect(); \
         return [b.left + ({c} + 0.5) * p.px, b.top + ({r} + 0.5) * p.px]; }})()"
    ));
    // Let the scroll be drawn before the pointer moves, as it would be for a person.
    b.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))");
    // Leave first, so that entering the same cell again is a new hover.
    b.mouse_move(1.0, 1.0);
    b.mouse_move(v[0].as_f64().unwrap(), v[1].as_f64().unwrap());
    assert_eq!(
        b.eval("document.body.dataset.cell"),
        format!("{id}:{r},{c}"),
        "hovering {id} ({r}, {c})"
    );
}

fn text(b: &mut Browser, expr: &str) -> String {
    b.eval(expr).as_str().unwrap_or_default().to_owned()
}

/// The sum the explanation shows for the current cell.
fn shown_sum(b: &mut Browser) -> f64 {
    text(b, "document.querySelector('#why .sum').textContent")
        .parse()
        .unwrap()
}

/// The displayed sum equals the printed value: it is shown with 6 decimals (≤ 5e-7
/// off) and recomputed in f64 from the f32 inputs, whose reference was accumulated
/// in f64 and rounded to f32 (≤ 6e-8 relative); 1e-4 is the bound and far
/// above both.
fn assert_sum(b: &mut Browser, what: &str, expected: f64) {
    let got = shown_sum(b);
    assert!(
        (got - expected).abs() <= 1e-4,
        "{what}: the page sums to {got}, explain printed {expected}"
    );
}

fn marks(b: &mut Browser) -> Value {
    serde_json::from_str(&text(b, "document.body.dataset.marks")).unwrap()
}

/// `(row, column)` of the table cells of panel `id` marked as sources.
fn marked_cells(b: &mut Browser, id: &str) -> Vec<(u64, u64)> {
    let v = b.eval(&format!(
        "[...document.querySelectorAll('#panel-{id} td.src')].map(t => [+t.dataset.r, +t.dataset.c])"
    ));
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap()))
        .collect()
}

fn press(b: &mut Browser, key: &str, code: u32) {
    for t in ["rawKeyDown", "keyUp"] {
        b.call(
            "Input.dispatchKeyEvent",
            json!({ "type": t, "key": key, "code": key, "windowsVirtualKeyCode": code }),
        );
    }
}

/// Writes the page for `flags` and checks it against `--format json` and its
/// promise to reference nothing outside itself.
fn checked_page(flags: &[&str], name: &str) -> (PathBuf, Value) {
    let (path, html, json) = page_and_json(flags, name);
    assert_offline(&html);
    assert_same_numbers(&embedded(&html), &json);
    (path, json)
}

/// A browser of its own for a page test (the guard keeps the others out), or `None`
/// when the test is skipped.
fn browser(test: &str) -> Option<(MutexGuard<'static, ()>, Browser)> {
    let chromium = chromium_or_skip(test)?;
    let one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    Some((one, Browser::launch(&chromium, 1400, 1000)))
}

/// [`checked_page`], opened in [`browser`].
fn open(flags: &[&str], name: &str) -> Option<(MutexGuard<'static, ()>, Browser, Value)> {
    let (path, json) = checked_page(flags, name);
    let (one, mut b) = browser(name)?;
    b.navigate(&format!("file://{}", path.display()));
    assert_eq!(text(&mut b, "document.body.dataset.ready"), "1");
    Some((one, b, json))
}

fn assert_no_console_errors(b: &mut Browser) {
    let errors = b.errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}

fn save_screenshot(b: &mut Browser, file: &str) {
    let r = b.call("Page.captureScreenshot", json!({ "format": "png" }));
    let png = browser::decode_base64(r["data"].as_str().unwrap());
    assert!(png.starts_with(b"\x89PNG"), "screenshot is not a PNG");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("explain-page");
    std::fs::write(dir.join(file), &png).unwrap();
    if let Some(to) = std::env::var_os("ATTEND_SCREENSHOT_DIR") {
        let to = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(to);
        std::fs::create_dir_all(&to).unwrap();
        std::fs::write(to.join(file), &png).unwrap();
    }
}

#[test]
fn notebook_001_page_links_every_step() {
    let Some((_one, mut b, json)) = open(NOTEBOOK_001, "notebook001.html") else {
        return;
    };

    // Head 1 of batch row 0 (keys 2 and 3 are padding). Head widths: d_k = d_v = 2.
    select(&mut b, "head", "1");
    let (bt, h) = (0, 1);
    hover(&mut b, "scores", 1, 0);
    assert_eq!(marks(&mut b), json!([["q", "row", 1], ["k", "row", 0]]));
    assert_eq!(marked_cells(&mut b, "q"), [(1, 0), (1, 1)]);
    assert_eq!(marked_cells(&mut b, "k"), [(0, 0), (0, 1)]);
    let products = b.eval("document.querySelectorAll('#why table tr').length");
    assert_eq!(
        products, 3,
        "a header and one product per query/key dimension"
    );
    assert_sum(
        &mut b,
        "scores[0,1,1,0]",
        at(&json, "scores", &[bt, h, 1, 0]),
    );

    for (id, key, r, c, index) in [
        ("scaled", "scaled", 1, 0, vec![bt, h, 1, 0]),
        ("weights", "weights", 1, 1, vec![bt, h, 1, 1]),
        ("ctx", "context", 1, 1, vec![bt, 1, 2 + 1]),
        ("q", "q", 1, 1, vec![bt, h, 1, 1]),
        ("k", "k", 0, 1, vec![bt, h, 0, 1]),
        ("v", "v", 1, 0, vec![bt, h, 1, 0]),
    ] {
        hover(&mut b, id, r, c);
        assert_sum(&mut b, &format!("{key}{index:?}"), at(&json, key, &index));
    }
    // The weight's sources are its row of scaled scores; the projection's, x's row
    // and W's row (written [out, in]).
    hover(&mut b, "weights", 1, 1);
    assert_eq!(
        marks(&mut b),
        json!([["scaled", "row", 1], ["weights", "row", 1]])
    );
    hover(&mut b, "q", 1, 1);
    assert_eq!(marks(&mut b), json!([["x", "row", 1], ["w_q", "row", 3]]));

    // A masked weight says so, and why.
    hover(&mut b, "weights", 1, 2);
    let why = text(&mut b, "document.getElementById('why').textContent");
    assert!(why.contains("masked (padding"), "{why}");
    assert!(text(&mut b, "document.getElementById('why').dataset.masked").starts_with("padding"));

    // Keyboard: Tab reaches every panel; the arrow keys move within one.
    let all = b.eval("Object.keys(attendPage.panels)");
    let all: BTreeSet<String> = serde_json::from_value(all).unwrap();
    let mut reached = BTreeSet::new();
    // Each panel has two stops (itself, its "as printed" summary), plus the picker.
    for _ in 0..2 * all.len() + 4 {
        press(&mut b, "Tab", 9);
        let p = text(&mut b, "document.activeElement.dataset.panel || ''");
        if !p.is_empty() {
            reached.insert(p);
        }
    }
    assert_eq!(reached, all, "panels reached by Tab");
    // Focus comes back to the panel's last cell, (1, 0) hovered above.
    b.eval("document.getElementById('panel-scores').focus()");
    assert_eq!(text(&mut b, "document.body.dataset.cell"), "scores:1,0");
    press(&mut b, "ArrowRight", 39);
    press(&mut b, "ArrowDown", 40);
    assert_eq!(text(&mut b, "document.body.dataset.cell"), "scores:2,1");

    // docs/cli.md's picture: head 0, the second token's score against the first.
    select(&mut b, "head", "0");
    hover(&mut b, "scores", 1, 0);
    b.eval("document.activeElement.blur(); window.scrollTo(0, 0)");
    save_screenshot(&mut b, "explain-page-001.png");
    assert_no_console_errors(&mut b);
}

#[test]
fn in_out_weights_causal_and_window_masks_softmax_over_queries_and_output_projection() {
    let Some((_one, mut b, json)) = open(IN_OUT_CAUSAL_QUERIES, "in-out-causal.html") else {
        return;
    };
    // Head 2: q/k columns 4..6, v columns 6..9 (d_k 2, d_v 3 per head).
    select(&mut b, "head", "2");
    hover(&mut b, "q", 3, 1);
    assert_eq!(marks(&mut b), json!([["x", "row", 3], ["w_q", "col", 5]]));
    assert_sum(&mut b, "q[0,2,3,1]", at(&json, "q", &[0, 2, 3, 1]));
    // Softmax over the queries: the weight's sources are its column.
    hover(&mut b, "weights", 3, 1);
    assert_eq!(
        marks(&mut b),
        json!([["scaled", "col", 1], ["weights", "col", 1]])
    );
    assert_sum(
        &mut b,
        "weights[0,2,3,1]",
        at(&json, "weights", &[0, 2, 3, 1]),
    );
    hover(&mut b, "weights", 1, 3);
    let why = text(&mut b, "document.getElementById('why').dataset.masked");
    assert!(why.starts_with("causal"), "{why}");
    hover(&mut b, "weights", 5, 1);
    let why = text(&mut b, "document.getElementById('why').dataset.masked");
    assert!(why.starts_with("window"), "{why}");
    hover(&mut b, "ctx", 4, 2);
    assert_sum(
        &mut b,
        "context[0,4,8]",
        at(&json, "context", &[0, 4, 2 * 3 + 2]),
    );
    hover(&mut b, "output", 4, 7);
    assert_eq!(
        marks(&mut b),
        json!([
            ["context", "row", 4],
            ["w_o", "row", 7],
            ["b_o", "cell", 0, 7]
        ])
    );
    assert_sum(&mut b, "output[0,4,7]", at(&json, "output", &[0, 4, 7]));
    assert_no_console_errors(&mut b);
}

#[test]
fn trained_model_page() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("explain-page");
    std::fs::create_dir_all(&dir).unwrap();
    let w = dir.join("reverser.safetensors");
    let curve = dir.join("loss.svg");
    // A few steps are enough: the page shows whatever the weights are. The curve goes
    // to the scratch folder too, not to the working directory.
    attend(&[
        "train",
        "--len",
        "4",
        "--steps",
        "20",
        "--quiet",
        "--weights",
        w.to_str().unwrap(),
        "--curve",
        curve.to_str().unwrap(),
    ]);
    let flags = ["--trained", w.to_str().unwrap(), "--digits", "3141"];
    let Some((_one, mut b, json)) = open(&flags, "trained.html") else {
        return;
    };
    hover(&mut b, "scores", 3, 0);
    assert_sum(
        &mut b,
        "scores[0,0,3,0]",
        at(&json, "scores", &[0, 0, 3, 0]),
    );
    hover(&mut b, "q", 2, 1);
    assert_sum(&mut b, "q[0,0,2,1]", at(&json, "q", &[0, 0, 2, 1]));
    assert_no_console_errors(&mut b);
}

#[test]
fn minilm_page_with_128_tokens_loads_in_under_1_s_and_answers_a_hover_in_under_50_ms() {
    let dir = model_dir();
    // 126 one-piece words and [CLS], [SEP].
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "park",
    ];
    let sentence: Vec<&str> = (0..126).map(|i| words[i % words.len()]).collect();
    let sentence = sentence.join(" ");
    let flags = [
        "--model",
        dir.to_str().unwrap(),
        "--layer",
        "2",
        "--head",
        "3",
        &sentence,
    ];
    let (path, json) = checked_page(&flags, "minilm-128.html");
    assert_eq!(json["tokens"].as_array().unwrap().len(), 128);
    let Some((_one, mut b)) = browser("MiniLM explain page") else {
        return;
    };
    let wall = Instant::now();
    b.navigate(&format!("file://{}", path.display()));
    let wall = wall.elapsed();
    let t = b.eval(
        "(() => { const n = performance.getEntriesByType('navigation')[0]; \
         return [n.loadEventEnd, attendPage.readyAt]; })()",
    );
    let (load, ready) = (t[0].as_f64().unwrap(), t[1].as_f64().unwrap());
    assert_eq!(
        b.eval("document.querySelectorAll('table.m').length"),
        0,
        "128 tokens: every panel is a heatmap"
    );
    let mut hovers = Vec::new();
    let cells = [("scores", 100, 37), ("weights", 5, 120), ("ctx", 64, 20)];
    for &(id, r, c) in cells.iter().cycle().take(9) {
        hover(&mut b, id, r, c);
        let done = b.eval("attendPage.hoverMs").as_f64().unwrap();
        let frame = b.eval(
            "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => \
             r(attendPage.hoverFrameMs))))",
        );
        hovers.push((done, frame.as_f64().unwrap()));
    }
    assert_eq!(
        marks(&mut b),
        json!([["weights", "row", 64], ["v", "col", 20]])
    );
    assert_sum(&mut b, "context[64,20]", at(&json, "context", &[64, 20]));
    hover(&mut b, "scores", 100, 37);
    assert_eq!(marks(&mut b), json!([["q", "row", 100], ["k", "row", 37]]));
    assert_sum(&mut b, "scores[100,37]", at(&json, "scores", &[100, 37]));
    let tokens = &json["tokens"];
    assert_eq!(
        text(
            &mut b,
            "document.querySelector('#panel-scores .readout').textContent"
        ),
        format!(
            "row 100 ({}), column 37 ({}): {:.4}",
            tokens[100].as_str().unwrap(),
            tokens[37].as_str().unwrap(),
            at(&json, "scores", &[100, 37])
        )
    );
    // The projections: this head's rows of the model's weights, plus its bias.
    hover(&mut b, "k", 90, 7);
    assert_eq!(
        marks(&mut b),
        json!([["x", "row", 90], ["w_k", "row", 7], ["b_k", "cell", 0, 7]])
    );
    // The model computed k with an f32 GEMM (not the f64 reference): recursive
    // summation of n terms is off by at most n·2⁻²⁴·Σ|terms|, plus the 5e-7 of
    // the 6 decimals shown.
    let terms = b.eval(
        "[...document.querySelectorAll('#why table tr')].slice(1)\
         .reduce((s, tr) => s + Math.abs(+tr.cells[3].textContent), 0)",
    );
    let n = 384.0;
    let bound = n * f64::powi(2.0, -24) * terms.as_f64().unwrap() + 5e-7;
    let (got, want) = (shown_sum(&mut b), at(&json, "k", &[90, 7]));
    eprintln!("k[90,7]: page {got}, explain {want}, bound {bound:.2e}");
    assert!(
        (got - want).abs() <= bound,
        "k[90,7]: page {got}, explain {want}"
    );
    eprintln!(
        "MiniLM 128 tokens, page {:.2} MB: load event end {load:.0} ms, ready {ready:.0} ms \
         (wall {wall:?}); hover to (updated view, next frame) {hovers:.1?} ms",
        std::fs::metadata(&path).unwrap().len() as f64 / 1e6
    );
    assert!(
        load > 0.0 && load < 1000.0,
        "load event ended at {load:.0} ms"
    );
    // Timed by the page from the event's creation: to the linked view being
    // updated, and to the frame that draws it. The page's own work is a few ms;
    // the rest is waiting for a core, so on a shared 2-core machine one hover can
    // be late: the median of nine hovers over three cells is what is required.
    let mut slowest: Vec<f64> = hovers.iter().map(|(d, f)| d.max(*f)).collect();
    slowest.sort_by(f64::total_cmp);
    let median = slowest[slowest.len() / 2];
    assert!(
        median < 50.0,
        "the median hover took {median:.1} ms to its frame (all: {hovers:.1?})"
    );
    assert_no_console_errors(&mut b);
}
