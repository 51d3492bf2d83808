//! [`multiversion!`](crate::multiversion): element-wise loops compiled for each
//! instruction set and chosen at run time through the one dispatch point, so that
//! plain loops vectorise without asking the user for `-C target-cpu=native`. Their
//! bodies are written so that LLVM can vectorise them: no calls into libm (see
//! [`exp`](crate::exp), [`erf`](crate::erf)), no branches, reductions split into 16
//! independent lanes.

/// Defines `fn $name(args)` that runs `$body` compiled for the best instruction set
/// the CPU has, chosen at run time by [`dispatch`](crate::dispatch).
#[macro_export]
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            $crate::dispatch(
                $crate::IsaToken::best(),
                $crate::Scalar(|| body($($arg),*)),
            )
        }
    };
}
