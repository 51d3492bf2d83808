//! The HTML attention view in a real headless browser (Debian's Chromium):
//! no console errors, selecting a head and a layer changes what is drawn, hovering
//! a token focuses it, the model view opens a head, screenshots are saved, and a
//! 512-token page with a BERT-sized model view opens in under 2 seconds.
//!
//! Skipped with a message when `/usr/bin/chromium` is absent, except under CI
//! (`CI` set), where `.ci/run` installs it with `scripts/setup.d/browser`.

mod browser;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use attend::viz::{html_view, AttentionMaps};
use browser::{chromium_or_skip, Browser};
use ndarray::Array3;

/// One browser at a time, so the timing test does not share the cores.
static ONE_BROWSER: Mutex<()> = Mutex::new(());

/// Deterministic softmax rows with a different structure per head and layer.
fn synthetic(layers: usize, heads: usize, t: usize) -> AttentionMaps {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f32 / (1u64 << 53) as f32
    };
    let tokens: Vec<String> = (0..t)
        .map(|i| {
            ["the", "cat", "sat", "on", "a", "mat", "[SEP]", "<b>&"][i % 8].to_string()
                + &i.to_string()
        })
        .collect();
    let mut ls = Vec::new();
    for l in 0..layers {
        let mut a = Array3::<f32>::zeros((heads, t, t));
        for h in 0..heads {
            let shift = (h + l) % 4;
            for i in 0..t {
                let mut row: Vec<f32> = (0..t)
                    .map(|j| {
                        let near = if (i + shift) % t == j { 4.0 } else { 0.0 };
                        near + 3.0 * next()
                    })
                    .collect();
                let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let s: f32 = row
                    .iter_mut()
                    .map(|x| {
                        *x = (*x - m).exp();
                        *x
                    })
                    .sum();
                for j in 0..t {
                    a[[h, i, j]] = row[j] / s;
                }
            }
        }
        ls.push(a);
    }
    AttentionMaps::new(
        tokens.clone(),
        tokens,
        ls,
        format!("synthetic </script> {layers}x{heads}x{t}"),
    )
    .unwrap()
}

fn write_page(maps: &AttentionMaps, name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("viz");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, html_view(maps).unwrap()).unwrap();
    path
}

fn save(name: &str, png: &[u8]) -> PathBuf {
    assert!(png.starts_with(b"\x89PNG"), "screenshot is not a PNG");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("viz");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
    path
}

fn canvas(b: &mut Browser, id: &str) -> String {
    b.eval(&format!("document.getElementById('{id}').toDataURL()"))
        .as_str()
        .unwrap()
        .to_string()
}

fn body(b: &mut Browser, key: &str) -> String {
    b.eval(&format!("document.body.dataset.{key} || ''"))
        .as_str()
        .unwrap()
        .to_string()
}

fn select(b: &mut Browser, id: &str, value: &str) {
    b.eval(&format!(
        "(() => {{ const s = document.getElementById('{id}'); s.value = '{value}'; \
         s.dispatchEvent(new Event('change', {{ bubbles: true }})); }})()"
    ));
}

#[test]
fn head_view_draws_selects_focuses_and_has_no_console_errors() {
    let Some(chromium) = chromium_or_skip("head_view") else {
        return;
    };
    let _one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let maps = synthetic(2, 3, 8);
    let page = write_page(&maps, "head-view.html");
    let mut b = Browser::launch(&chromium, 1200, 900);
    b.navigate(&format!("file://{}", page.display()));
    assert_eq!(
        body(&mut b, "ready"),
        "1",
        "page did not finish its first draw"
    );
    assert_eq!(body(&mut b, "mode"), "lines");
    let title = b.eval("document.title");
    assert_eq!(
        title, "synthetic </script> 2x3x8",
        "title escaped and intact"
    );
    assert_eq!(b.eval("document.querySelectorAll('#qcol .tok').length"), 8);
    assert_eq!(
        b.eval("document.querySelector('#kcol .tok[data-index=\"7\"]').textContent"),
        "<b>&7"
    );

    // Selecting a head changes what is drawn.
    let head0 = canvas(&mut b, "lines");
    select(&mut b, "head", "2");
    assert_eq!(body(&mut b, "head"), "2");
    let head2 = canvas(&mut b, "lines");
    assert_ne!(head0, head2, "selecting head 2 did not change the lines");
    // And a layer.
    select(&mut b, "layer", "1");
    assert_eq!(body(&mut b, "layer"), "1");
    let layer1 = canvas(&mut b, "lines");
    assert_ne!(head2, layer1, "selecting layer 1 did not change the lines");

    // Hovering a query token focuses it: only its lines are drawn, it is outlined,
    // the readout names it.
    let (x, y) = b.centre_of("#qcol .tok[data-index=\"3\"]");
    b.mouse_move(x, y);
    assert_eq!(body(&mut b, "focus"), "q3");
    assert_eq!(
        b.eval(
            "document.querySelector('#qcol .tok[data-index=\"3\"]').classList.contains('focus')"
        ),
        true
    );
    assert_eq!(
        b.eval("document.querySelectorAll('#qcol .tok.dim').length"),
        7
    );
    let readout = b.eval("document.getElementById('readout').textContent");
    assert!(
        readout.as_str().unwrap().starts_with("on3 attends most to"),
        "{readout}"
    );
    let focused = canvas(&mut b, "lines");
    assert_ne!(focused, layer1, "focusing a token did not change the lines");
    let shot = b.screenshot();
    save("head-view-focus.png", &shot);
    // A key token too, then leaving clears the focus.
    let (x, y) = b.centre_of("#kcol .tok[data-index=\"5\"]");
    b.mouse_move(x, y);
    assert_eq!(body(&mut b, "focus"), "k5");
    b.mouse_move(2.0, 2.0);
    assert_eq!(body(&mut b, "focus"), "");
    assert_eq!(
        canvas(&mut b, "lines"),
        layer1,
        "leaving the token did not restore all lines"
    );

    // The model view opens a head on click.
    assert_eq!(
        b.eval("document.querySelectorAll('#grid canvas').length"),
        6
    );
    let (x, y) = b.centre_of("#grid canvas[data-layer=\"0\"][data-head=\"1\"]");
    b.click(x, y);
    assert_eq!(
        (body(&mut b, "layer"), body(&mut b, "head")),
        ("0".into(), "1".into())
    );
    assert_eq!(b.eval("document.getElementById('head').value"), "1");

    // The heatmap view: hovering a cell focuses its query row.
    select(&mut b, "mode", "heatmap");
    assert_eq!(body(&mut b, "mode"), "heatmap");
    let before = canvas(&mut b, "heat");
    let (x, y) = b.centre_of("#heat");
    b.mouse_move(x, y);
    assert!(body(&mut b, "focus").starts_with('q'));
    assert_ne!(canvas(&mut b, "heat"), before, "hover did not mark the row");
    let readout = b.eval("document.getElementById('readout').textContent");
    assert!(readout.as_str().unwrap().contains('\u{2192}'), "{readout}");

    b.eval("window.scrollTo(0, 0)");
    select(&mut b, "mode", "lines");
    let shot = b.screenshot();
    let p = save("head-view.png", &shot);
    assert!(std::fs::metadata(p).unwrap().len() > 10_000);
    let errors = b.errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}

/// docs/cli.md's head-view pictures: the notebook-004 example (3 heads of golden
/// PyTorch weights) focused on "is", and all-MiniLM-L6-v2's layer 2, head 3 on a
/// real sentence (`attend attention --all` wrote `docs/examples/minilm.json`)
/// focused on "it". Saved under target/tmp/viz/ and, when `ATTEND_SCREENSHOT_DIR`
/// is set (relative to the workspace root), there too:
/// `ATTEND_SCREENSHOT_DIR=docs/img cargo test -p attend --test viz_browser`.
#[test]
fn readme_head_view_screenshots() {
    let Some(chromium) = chromium_or_skip("docs/cli.md screenshots") else {
        return;
    };
    let _one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    // (example, layer, head, query token to hover, window size)
    for (name, layer, head, token, (w, h)) in [
        ("notebook004", "0", "2", 1, (760, 560)),
        ("minilm", "2", "3", 10, (1010, 820)),
    ] {
        let maps =
            AttentionMaps::read_json(&root.join(format!("docs/examples/{name}.json"))).unwrap();
        let page = write_page(&maps, &format!("{name}.html"));
        let mut b = Browser::launch(&chromium, w, h);
        b.navigate(&format!("file://{}", page.display()));
        select(&mut b, "layer", layer);
        select(&mut b, "head", head);
        let (x, y) = b.centre_of(&format!("#qcol .tok[data-index=\"{token}\"]"));
        b.mouse_move(x, y);
        assert_eq!(body(&mut b, "focus"), format!("q{token}"), "{name}");
        b.eval("window.scrollTo(0, 0)");
        let r = b.call(
            "Page.captureScreenshot",
            serde_json::json!({ "format": "png" }),
        );
        let png = browser::decode_base64(r["data"].as_str().unwrap());
        let file = format!("{name}-head-view.png");
        let saved = save(&file, &png);
        if let Some(dir) = std::env::var_os("ATTEND_SCREENSHOT_DIR") {
            let dir = root.join(dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(&saved, dir.join(&file)).unwrap();
        }
        let errors = b.errors();
        assert!(errors.is_empty(), "{name}: console errors: {errors:#?}");
    }
}

#[test]
fn page_with_512_tokens_opens_in_under_2_seconds() {
    let Some(chromium) = chromium_or_skip("512 tokens") else {
        return;
    };
    let _one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    // The shape of a BERT-sized model (all-MiniLM-L6-v2: 6 layers, 12 heads).
    let maps = synthetic(6, 12, 512);
    let page = write_page(&maps, "tokens-512.html");
    let size = std::fs::metadata(&page).unwrap().len();
    let mut b = Browser::launch(&chromium, 1200, 900);
    let url = format!("file://{}", page.display());
    let wall = Instant::now();
    b.navigate(&url);
    let wall = wall.elapsed();
    assert_eq!(body(&mut b, "ready"), "1");
    // The browser's own clock: navigation start to the end of the load event, and to
    // the end of the page's first draw (heatmap and model view included).
    let t = b.eval(
        "(() => { const n = performance.getEntriesByType('navigation')[0]; \
         return [n.domContentLoadedEventEnd, n.loadEventEnd, window.attendView.readyAt]; })()",
    );
    let (dcl, load, ready) = (
        t[0].as_f64().unwrap(),
        t[1].as_f64().unwrap(),
        t[2].as_f64().unwrap(),
    );
    eprintln!(
        "512 tokens, 6 layers x 12 heads, page {:.1} MB: DOMContentLoaded {dcl:.0} ms, \
         first draw done {ready:.0} ms, load event end {load:.0} ms (wall {wall:?})",
        size as f64 / 1e6
    );
    assert!(load > 0.0 && ready > 0.0);
    assert!(
        load.max(ready) < 2000.0,
        "512-token page took {:.0} ms to open",
        load.max(ready)
    );
    assert_eq!(
        body(&mut b, "mode"),
        "heatmap",
        "512 tokens should open on the heatmap"
    );
    assert_eq!(
        b.eval("document.querySelectorAll('#grid canvas').length"),
        72
    );
    // Still responsive: selecting another head redraws quickly.
    let before = canvas(&mut b, "heat");
    let t0 = Instant::now();
    select(&mut b, "head", "5");
    assert_ne!(canvas(&mut b, "heat"), before);
    assert!(t0.elapsed() < Duration::from_secs(2));
    save("tokens-512.png", &b.screenshot());
    let errors = b.errors();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
}
