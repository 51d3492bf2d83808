//! Arbitrary and mutated bytes fed to every reader of user files (`.npy`,
//! safetensors, `config.json`, attention-maps JSON): each must return a value or an
//! `Err` with a one-line message, never panic, and never allocate more than the
//! bytes it was given can justify. Valid files are mutated (bytes flipped, cut,
//! spliced) so that the cases reach past the magic numbers into the headers.
//! A corpus of the hostile files from issue 13 is kept as regression tests.

use attend::io::npy::{self, NpyArray};
use attend::io::safetensors::{self, SafeTensors};
use attend::models::BertConfig;
use attend::viz::AttentionMaps;
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;

/// A valid `.npy` file of a `[2, 3]` f32 array.
fn npy_file() -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("attend-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.npy");
    let a = ArrayD::from_shape_fn(IxDyn(&[2, 3]), |i| (i[0] * 3 + i[1]) as f32);
    npy::write_f32(&path, a.view()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    bytes
}

/// A `.npy` file with `header` (version 1) and `data`.
fn npy_with(header: &str, data: &[u8]) -> Vec<u8> {
    let mut f = b"\x93NUMPY\x01\x00".to_vec();
    f.extend_from_slice(&(header.len() as u16).to_le_bytes());
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(data);
    f
}

/// A valid safetensors file with two tensors and metadata.
fn safetensors_file() -> Vec<u8> {
    let a = ArrayD::from_shape_fn(IxDyn(&[2, 2]), |i| (i[0] + i[1]) as f32);
    let b = ArrayD::from_shape_fn(IxDyn(&[3]), |i| i[0] as f32);
    let meta = [("format".to_string(), "pt".to_string())].into();
    safetensors::serialize(&[("a", a.view()), ("b", b.view())], Some(&meta)).unwrap()
}

/// A safetensors file with a hand-written header and `data`.
fn safetensors_with(header: &str, data: &[u8]) -> Vec<u8> {
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(data);
    f
}

const CONFIG: &str = r#"{"hidden_act": "gelu", "hidden_size": 8, "intermediate_size": 16,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 16, "model_type": "bert",
    "num_attention_heads": 2, "num_hidden_layers": 1, "type_vocab_size": 2, "vocab_size": 11}"#;

const MAPS: &str =
    r#"{"title": "t", "query_tokens": ["a", "b"], "layers": [[[[0.5, 0.5], [1, 0]]]]}"#;

/// Reads `bytes` with every reader; what they return does not matter, only that
/// they return, and that an error is one line.
fn read_all(bytes: &[u8]) {
    let one_line = |e: attend::Error| assert!(!e.to_string().contains('\n'), "{e}");
    if let Err(e) = npy::from_bytes(bytes, "f.npy") {
        one_line(e);
    }
    match SafeTensors::from_bytes(bytes.to_vec(), "f.safetensors") {
        Ok(file) => {
            let names: Vec<String> = file.names().map(str::to_owned).collect();
            for name in names {
                if let Err(e) = file.tensor(&name) {
                    one_line(e);
                }
                if let Err(e) = file.check_finite(&name) {
                    one_line(e);
                }
            }
        }
        Err(e) => one_line(e),
    }
    let text = String::from_utf8_lossy(bytes);
    if let Err(e) = BertConfig::from_json(&text) {
        one_line(e);
    }
    if let Err(e) = AttentionMaps::from_json(&text) {
        one_line(e);
    }
}

/// A mutation of `base`: some bytes overwritten, then maybe cut or spliced.
fn mutated(base: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = base.len();
    (
        prop::collection::vec((0..len, any::<u8>()), 1..8),
        prop::option::of(0..len + 1),
        prop::collection::vec(any::<u8>(), 0..4),
    )
        .prop_map(move |(flips, cut, splice)| {
            let mut b = base.clone();
            for (at, byte) in flips {
                b[at] = byte;
            }
            if let Some(at) = cut {
                b.truncate(at);
                b.extend_from_slice(&splice);
            }
            b
        })
}

/// A mutation of a text document that keeps it text: digits, quotes, brackets and
/// commas swapped in where they break structure or sizes the most.
fn mutated_text(base: &'static str) -> impl Strategy<Value = String> {
    let len = base.len();
    let pieces = prop::sample::select(vec![
        "0",
        "-1",
        "1e300",
        "NaN",
        "18446744073709551616",
        "4294967296",
        "1000000000",
        "\"",
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        "null",
        "[]",
        "\"x\"",
        "true",
    ]);
    prop::collection::vec((0..len, pieces), 1..6).prop_map(move |edits| {
        let mut s = base.to_string();
        for (at, piece) in edits {
            let at = (0..=at.min(s.len()))
                .rev()
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(0);
            s.insert_str(at, piece);
        }
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        read_all(&bytes);
    }

    #[test]
    fn mutated_npy_files_never_panic(bytes in mutated(npy_file())) {
        read_all(&bytes);
    }

    #[test]
    fn mutated_safetensors_files_never_panic(bytes in mutated(safetensors_file())) {
        read_all(&bytes);
    }

    #[test]
    fn mutated_configs_never_panic(text in mutated_text(CONFIG)) {
        read_all(text.as_bytes());
        if let Ok(c) = BertConfig::from_json(&text) {
            prop_assert!(c.layer_norm_eps.is_finite() && c.hidden_size % c.num_attention_heads == 0);
        }
    }

    #[test]
    fn mutated_attention_maps_never_panic(text in mutated_text(MAPS)) {
        read_all(text.as_bytes());
    }

    /// Any shape in a header gives an array of that shape or an error: big,
    /// empty and overflowing dimensions alike.
    #[test]
    fn npy_shapes_are_checked(dims in prop::collection::vec(
        prop_oneof![0usize..4, Just(1usize << 32), Just(usize::MAX)], 0..4)) {
        let shape = match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
        };
        let header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        match npy::from_bytes(&npy_with(&header, &[0; 64]), "f.npy") {
            Ok(a) => prop_assert_eq!(a.shape(), &dims[..]),
            Err(e) => prop_assert!(!e.to_string().contains('\n')),
        }
    }
}

/// The hostile files of issue 13, and what each must give.
#[test]
fn issue_13_corpus() {
    let f32s = |n: usize| vec![0u8; 4 * n];
    // npy: a shape with an empty element is not a tuple NumPy reads.
    let err = npy::from_bytes(
        &npy_with(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,, 2, 4, 8), }",
            &f32s(64),
        ),
        "bad.npy",
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("bad.npy: bad header"), "{err}");
    // npy: an overflowing shape says so, naming the file.
    let err = npy::from_bytes(
        &npy_with(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
            &f32s(4),
        ),
        "big.npy",
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "big.npy: shape [4294967296, 4294967296] has more elements than any memory holds"
    );
    // npy: double-quoted keys, as numpy.load reads them.
    let a = npy::from_bytes(
        &npy_with(
            r#"{"descr": "<f4", "fortran_order": False, "shape": (2,), }"#,
            &f32s(2),
        ),
        "dq.npy",
    )
    .unwrap();
    assert_eq!(a, NpyArray::F32(ArrayD::zeros(IxDyn(&[2]))));

    // safetensors: an empty tensor with a huge axis (used to panic on reading).
    let huge = safetensors_with(
        r#"{"t": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}}"#,
        &[],
    );
    let err = SafeTensors::from_bytes(huge, "z.safetensors")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("z.safetensors") && err.contains("too large"),
        "{err}"
    );
    // safetensors: two tensors sharing bytes, and bytes no tensor owns.
    let overlap = safetensors_with(
        r#"{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}"#,
        &f32s(3),
    );
    let err = SafeTensors::from_bytes(overlap, "o.safetensors")
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"a\" and \"b\" overlap"), "{err}");
    let trailing = safetensors_with(
        r#"{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}"#,
        &f32s(3),
    );
    let err = SafeTensors::from_bytes(trailing, "t.safetensors")
        .unwrap_err()
        .to_string();
    assert!(err.contains("trailing data"), "{err}");
    // safetensors: a NaN weight is named with its tensor.
    let nan = ArrayD::from_elem(IxDyn(&[2]), f32::NAN);
    let file = SafeTensors::from_bytes(
        safetensors::serialize(&[("w", nan.view())], None).unwrap(),
        "n.safetensors",
    )
    .unwrap();
    let err = file.check_finite("w").unwrap_err().to_string();
    assert!(
        err.starts_with("n.safetensors: tensor \"w\" holds a NaN"),
        "{err}"
    );

    // config: an epsilon that is infinite in f32.
    let err = BertConfig::from_json(&CONFIG.replace("1e-12", "1e300"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer_norm_eps"), "{err}");
}
