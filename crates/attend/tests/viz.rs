//! Pictures, pages and bad input of `attend::viz` (the browser tests are in
//! `viz_browser.rs`).

use std::path::PathBuf;

use attend::viz::{
    html_view, render_png, render_svg, terminal_heatmap, viridis, write_heatmap, AttentionMaps,
    ColorMode,
};
use attend::Error;
use ndarray::{Array3, Array4};

fn toks(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("tok{i}")).collect()
}

/// `layers` layers of `heads` heads over `t` tokens, uniform but for a bright diagonal.
fn maps(layers: usize, heads: usize, t: usize) -> AttentionMaps {
    let mut a = Array3::<f32>::from_elem((heads, t, t), 0.5 / t as f32);
    for h in 0..heads {
        for i in 0..t {
            a[[h, i, (i + h) % t]] += 0.5;
        }
    }
    AttentionMaps::new(toks(t), toks(t), vec![a; layers], "test").unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("viz-files");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn notebook004() -> AttentionMaps {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/examples/notebook004.json"
    );
    AttentionMaps::read_json(std::path::Path::new(path)).unwrap()
}

#[test]
fn svg_and_png_are_written_by_extension() {
    let m = notebook004();
    assert_eq!((m.layers.len(), m.heads()), (1, 3));
    let svg = tmp("n4.svg");
    write_heatmap(&m, 0, &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    for h in 0..3 {
        assert!(text.contains(&format!(">head {h}</text>")));
    }
    assert!(text.contains("dessert") && text.contains("url(#viridis)"));
    // The notebook's strongest weight (is -> short, 0.747...) is written in its cell.
    assert!(text.contains(">0.75</text>"));

    let png = tmp("n4.PNG");
    write_heatmap(&m, 0, &png).unwrap();
    let dec = png::Decoder::new(std::fs::File::open(&png).unwrap());
    let mut r = dec.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).unwrap();
    assert!(
        info.width > 600 && info.height > 300,
        "{}x{}",
        info.width,
        info.height
    );
    // Both extremes of the colour scale appear.
    let px: Vec<[u8; 3]> = buf.chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
    assert!(px.contains(&viridis(0.0)) && px.contains(&viridis(1.0)));
}

#[test]
fn pictures_stay_readable_to_64_tokens_and_draw_beyond() {
    for t in [64, 200] {
        let m = maps(1, 12, t);
        let svg = render_svg(&m, 0).unwrap();
        // At 64 tokens every label is drawn on each of the 12 panels (both axes).
        let labels = svg.matches(">tok1</text>").count();
        if t == 64 {
            assert_eq!(labels, 24);
        }
        let png = render_png(&m, 0).unwrap();
        assert!(png.starts_with(b"\x89PNG"));
    }
}

#[test]
fn unknown_extension_is_a_clear_error() {
    let m = maps(1, 1, 3);
    for name in ["x.jpg", "x", "x.svg.bak"] {
        let e = write_heatmap(&m, 0, &tmp(name)).unwrap_err();
        assert!(matches!(e, Error::Value(_)), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("unknown picture extension") && msg.contains(".svg or .png"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
        assert!(!tmp(name).exists() || name == "x");
    }
}

#[test]
fn unwritable_path_is_an_io_error_naming_it() {
    let m = maps(1, 1, 3);
    let bad = PathBuf::from("/nonexistent-dir-attend/heat.png");
    let e = write_heatmap(&m, 0, &bad).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("/nonexistent-dir-attend/heat.png: "),
        "{e}"
    );
    // A directory is not a file either.
    let dir = tmp("a-directory.svg");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(matches!(write_heatmap(&m, 0, &dir), Err(Error::Io { .. })));
    let e = attend::viz::write_html(&m, &PathBuf::from("/nonexistent-dir-attend/v.html"));
    assert!(matches!(e, Err(Error::Io { .. })));
}

#[test]
fn layer_and_head_out_of_range_are_clear_errors() {
    let m = maps(2, 3, 4);
    let e = write_heatmap(&m, 2, &tmp("l.svg")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "layer 2 is out of range: the maps have 2 layer(s), 0..=1"
    );
    assert!(render_png(&m, 7).is_err());
    assert_eq!(
        m.check_head(3).unwrap_err().to_string(),
        "head 3 is out of range: the maps have 3 head(s), 0..=2"
    );
    assert!(m.check_head(2).is_ok() && m.check_layer(1).is_ok());
}

#[test]
fn malformed_maps_are_rejected() {
    let a = Array3::<f32>::zeros((2, 3, 4));
    let e = AttentionMaps::new(toks(3), toks(3), vec![a.clone()], "").unwrap_err();
    assert!(
        e.to_string().contains("[2, 3, 4]") && e.to_string().contains("key tokens 3"),
        "{e}"
    );
    assert!(AttentionMaps::new(toks(3), toks(4), vec![], "").is_err());
    assert!(AttentionMaps::new(vec![], toks(4), vec![a.clone()], "").is_err());
    let mut nan = a.clone();
    nan[[1, 2, 0]] = f32::NAN;
    let e = AttentionMaps::new(toks(3), toks(4), vec![a.clone(), nan], "").unwrap_err();
    assert_eq!(
        e.to_string(),
        "layer 1 head 1 weight [2, 0] is NaN (weights must be finite)"
    );
    let other = Array3::<f32>::zeros((1, 3, 4));
    assert!(AttentionMaps::new(toks(3), toks(4), vec![a, other], "").is_err());
    // Public fields can be broken after construction: every output re-validates.
    let mut m = maps(1, 2, 3);
    m.query_tokens.pop();
    assert!(html_view(&m).is_err());
    assert!(render_svg(&m, 0).is_err());
}

#[test]
fn json_round_trip_and_bad_json() {
    let m = maps(2, 2, 3);
    let back = AttentionMaps::from_json(&m.to_json()).unwrap();
    assert_eq!(back, m);
    let e = AttentionMaps::from_json("{\"query_tokens\": [\"a\"], \"layers\": [[[[0.5, 0.5]]]]}")
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("row 0 has 2 values but there are 1 key tokens"),
        "{e}"
    );
    assert!(matches!(
        AttentionMaps::from_json("{"),
        Err(Error::Format(_))
    ));
    let e = AttentionMaps::read_json(&tmp("missing.json")).unwrap_err();
    assert!(matches!(e, Error::Io { .. }));
}

#[test]
fn from_weights_takes_one_batch_entry() {
    let w = Array4::<f32>::from_shape_fn((2, 3, 4, 5), |(b, h, i, j)| (b + h + i + j) as f32);
    let m = AttentionMaps::from_weights(w.view(), 1, toks(4), toks(5), "t").unwrap();
    assert_eq!(m.layers[0][[2, 3, 4]], w[[1, 2, 3, 4]]);
    let e = AttentionMaps::from_weights(w.view(), 2, toks(4), toks(5), "t").unwrap_err();
    assert!(e.to_string().contains("batch index 2"), "{e}");
}

#[test]
fn page_is_self_contained_and_escapes_its_data() {
    let mut m = maps(2, 2, 4);
    m.title = "a </script><script>alert(1)</script> & b".into();
    m.query_tokens[0] = "</script>".into();
    let page = html_view(&m).unwrap();
    assert_eq!(
        page.matches("</script>").count(),
        2,
        "data must not close its script"
    );
    assert!(page.contains("<title>a &lt;/script&gt;"));
    for net in ["http://", "https://", "src=", "@import", "url("] {
        assert!(!page.contains(net), "page refers to {net}");
    }
    assert!(page.contains("\"layers\":2") && page.contains("\"heads\":2"));
}

#[test]
fn terminal_heatmap_of_a_head() {
    let m = notebook004();
    let w = m.layers[0].index_axis(ndarray::Axis(0), 0);
    let s = terminal_heatmap(w, &m.query_tokens, &m.key_tokens, ColorMode::Plain).unwrap();
    assert!(
        s.lines().nth(2).unwrap().starts_with("is") && s.contains("0.747"),
        "{s}"
    );
}
