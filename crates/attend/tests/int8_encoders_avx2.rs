//! The int8 encoders on the AVX2 path, as a CPU without VNNI runs them: weights
//! quantized to ±63 (so that `vpmaddubsw` cannot saturate; docs/int8.md) and held
//! to the same cosines of f32 as on the best instruction set (`int8_encoders.rs`).
//! One test in its own binary: it caps the instruction set through the process's
//! environment before anything detects it.
#![cfg(feature = "tokenizers")]

use attend::kernels::{Isa, MAX_ISA_VAR};

mod int8_support;
mod model_support;

use int8_support::int8_against_f32;
use model_support::{MINILM, MPNET};

#[test]
fn minilm_and_mpnet_in_int8_on_avx2_are_within_the_issues_cosines_of_f32() {
    std::env::set_var(MAX_ISA_VAR, Isa::Avx2.name());
    assert_eq!(
        Isa::detect(),
        Isa::Avx2,
        "this test needs a CPU with AVX2 (it checks the AVX2 path)"
    );
    int8_against_f32(&MINILM);
    int8_against_f32(&MPNET);
}
