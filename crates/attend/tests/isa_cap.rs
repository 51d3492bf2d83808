//! `ATTEND_MAX_ISA` caps the instruction set `Isa::detect` picks. One test in its
//! own binary: it sets the process's environment, which no other test may read
//! at the same time.

use attend::kernels::{Isa, MAX_ISA_VAR};

#[test]
fn the_cap_lowers_detection_and_a_bad_name_is_reported() {
    std::env::remove_var(MAX_ISA_VAR);
    let best = Isa::detect();
    assert!(best.is_available());
    assert_eq!(Isa::env_cap().unwrap(), None);

    for cap in Isa::ALL {
        std::env::set_var(MAX_ISA_VAR, cap.name());
        assert_eq!(Isa::env_cap().unwrap(), Some(cap));
        // The best available at or below the cap, by Isa::ALL's order.
        let below = &Isa::ALL[..=Isa::ALL.iter().position(|&i| i == cap).unwrap()];
        let want = below
            .iter()
            .rev()
            .copied()
            .find(|isa| isa.is_available())
            .unwrap();
        assert_eq!(Isa::detect(), want, "cap {}", cap.name());
    }

    std::env::set_var(MAX_ISA_VAR, "avx9000");
    let err = Isa::env_cap().unwrap_err().to_string();
    assert!(
        err.contains(MAX_ISA_VAR) && err.contains("avx9000") && err.contains("avx2"),
        "{err}"
    );
    assert!(!err.contains('\n'), "one line: {err}");
    // An invalid cap is ignored by detection; the front ends refuse it.
    assert_eq!(Isa::detect(), best);
    std::env::remove_var(MAX_ISA_VAR);
}
