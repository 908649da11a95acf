//! The f64 reference and the test cases of every kernel in the library, one module per family.
//! A runner takes the cases of the kernels it runs ([`cases_of`], which makes only those), runs
//! each case on a device and calls [`crate::case::Case::check`].

pub mod activation;
pub mod attention;
pub mod attention_backward;
pub mod conv1d;
pub mod fp8;
pub mod gemm;
pub mod gemm_q8;
pub mod moe_align;
pub mod moe_gemm;
pub mod moe_routing;
pub mod norm;
pub mod quant;
pub mod rope;
pub mod softmax;
pub mod topk;

use crate::case::{Case, Planned};

/// Every case of every kernel family, planned from `rng`: the families whose references are
/// cheap make their cases now, the others (attention, the GEMMs) when [`Planned::make`] runs.
pub fn all_planned(rng: &mut impl rand::Rng) -> Vec<Planned> {
    let made = [
        norm::cases(rng),
        activation::cases(rng),
        softmax::cases(rng),
        rope::cases(rng),
        topk::cases(rng),
        moe_routing::cases(rng),
        moe_align::cases(rng),
        conv1d::cases(rng),
        fp8::cases(),
        quant::cases(rng),
    ];
    let mut planned: Vec<Planned> = made.into_iter().flatten().map(Planned::made).collect();
    planned.extend(gemm::plan(rng));
    planned.extend(gemm_q8::plan(rng));
    planned.extend(moe_gemm::plan(rng));
    planned.extend(attention::plan(rng));
    planned.extend(attention_backward::plan(rng));
    planned
}

/// The cases of the kernels `wanted` accepts (fresh random inputs each call), making only the
/// plans that call one.
pub fn cases_of(rng: &mut impl rand::Rng, wanted: impl Fn(&str) -> bool) -> Vec<Case> {
    all_planned(rng)
        .into_iter()
        .filter(|plan| plan.kernels().iter().any(|k| wanted(k)))
        .flat_map(Planned::make)
        .filter(|case| wanted(&case.kernel))
        .collect()
}
