//! The error variants a caller can match on (docs/design.md, "Conventions"), and the
//! size checks that keep every kernel's arithmetic in range.

use attend::attention::{
    attention_backward, attention_with, attention_with_lse, AttentionOptions, Config, Exec, Kernel,
    Saved, SoftmaxAxis,
};
use attend::kernels::Isa;
use attend::Error;
use ndarray::Array4;

#[test]
fn an_output_too_large_to_count_is_refused_before_any_work() {
    // Every input is empty (E = 0, S = 0), but [B, Hq, L, Ev] has 2^80 elements.
    let q = Array4::<f32>::zeros((1 << 20, 1 << 20, 1 << 20, 0));
    let k = Array4::<f32>::zeros((1 << 20, 1, 0, 0));
    let v = Array4::<f32>::zeros((1 << 20, 1, 0, 1 << 20));
    let err = attention_with_lse(q.view(), k.view(), v.view(), &Default::default()).unwrap_err();
    assert!(matches!(err, Error::Value(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "attention output [B, Hq, L, Ev]: shape [1048576, 1048576, 1048576, 1048576] \
         has more elements than any memory holds"
    );
}

#[test]
fn a_mis_shaped_gradient_names_the_argument_and_both_shapes() {
    let q = Array4::<f32>::zeros((1, 2, 3, 4));
    let opts = AttentionOptions::default();
    let (out, lse) = attention_with_lse(q.view(), q.view(), q.view(), &opts).unwrap();
    let dout = Array4::<f32>::zeros((1, 2, 3, 5));
    let err = attention_backward(
        q.view(),
        q.view(),
        q.view(),
        Saved::new(out.view(), lse.view()),
        dout.view(),
        &opts,
    )
    .unwrap_err();
    let Error::Shape { arg, got, want } = &err else {
        panic!("not a Shape error: {err:?}");
    };
    assert_eq!((arg.as_str(), got.as_slice()), ("dout", &[1, 2, 3, 5][..]));
    assert_eq!(want, "the output's shape [1, 2, 3, 4]");
    assert_eq!(
        err.to_string(),
        "dout of shape [1, 2, 3, 5] must be the output's shape [1, 2, 3, 4]"
    );
}

#[test]
fn a_mis_shaped_saved_forward_names_out_or_lse() {
    // `Saved` carries both forward results in one argument; each keeps its own name.
    let q = Array4::<f32>::zeros((1, 2, 3, 4));
    let opts = AttentionOptions::default();
    let (out, lse) = attention_with_lse(q.view(), q.view(), q.view(), &opts).unwrap();
    let short_out = Array4::<f32>::zeros((1, 2, 2, 4));
    let short_lse = ndarray::Array3::<f32>::zeros((1, 2, 2));
    let cases = [
        (
            Saved::new(short_out.view(), lse.view()),
            "out of shape [1, 2, 2, 4] must be the forward output's shape [1, 2, 3, 4]",
        ),
        (
            Saved::new(out.view(), short_lse.view()),
            "lse of shape [1, 2, 2] must be [B, Hq, L] = [1, 2, 3]",
        ),
    ];
    for (saved, message) in cases {
        let err =
            attention_backward(q.view(), q.view(), q.view(), saved, out.view(), &opts).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{err:?}");
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn a_kernel_asked_for_what_it_does_not_do_says_so() {
    let q = Array4::<f32>::zeros((1, 1, 4, 8));
    let opts = AttentionOptions {
        softmax_axis: SoftmaxAxis::Queries,
        ..Default::default()
    };
    for (kernel, name) in [(Kernel::Fused, "fused"), (Kernel::Decode, "decode")] {
        let config = Config {
            kernel,
            ..Default::default()
        };
        let err = attention_with(q.view(), q.view(), q.view(), &opts, &config).unwrap_err();
        assert!(
            matches!(err, Error::Unsupported { kernel, .. } if kernel == name),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with(&format!("kernel: the {name} kernel supports only")),
            "{err}"
        );
    }
}

#[test]
fn an_instruction_set_this_cpu_lacks_is_a_typed_error() {
    let missing: Vec<Isa> = Isa::ALL
        .into_iter()
        .filter(|isa| !isa.is_available())
        .collect();
    let q = Array4::<f32>::zeros((1, 1, 4, 8));
    for isa in &missing {
        let config = Config {
            exec: Exec {
                isa: Some(*isa),
                ..Default::default()
            },
            ..Default::default()
        };
        let err =
            attention_with(q.view(), q.view(), q.view(), &Default::default(), &config).unwrap_err();
        assert!(
            matches!(err, Error::IsaUnavailable(i) if i == *isa),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("isa {} is not available on this CPU", isa.name())
        );
    }
    if missing.is_empty() {
        println!("this CPU has every instruction set: IsaUnavailable not exercised");
    }
}

#[test]
fn a_thread_count_builds_its_pool_once() {
    let first = attend::threads::pool(2).unwrap();
    let again = attend::threads::pool(2).unwrap();
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    assert_eq!(first.current_num_threads(), 2);
    let err = attend::threads::pool(0).unwrap_err();
    assert_eq!(err.to_string(), "threads must be between 1 and 1024, got 0");
}
