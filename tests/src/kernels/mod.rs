//! The f64 reference and the test cases of every kernel in the library, one module per family.
//! A runner takes [`all_cases`], runs each case on a device and calls [`crate::case::Case::check`].

pub mod activation;
pub mod attention;
pub mod attention_backward;
pub mod conv1d;
pub mod fp8;
pub mod gemm;
pub mod gemm_q8;
pub mod moe_gemm;
pub mod moe_routing;
pub mod norm;
pub mod quant;
pub mod rope;
pub mod softmax;
pub mod topk;

use crate::case::Case;

/// Every case of every kernel family, drawn from `rng` (fresh random inputs each call).
pub fn all_cases(rng: &mut impl rand::Rng) -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(norm::cases(rng));
    cases.extend(activation::cases(rng));
    cases.extend(softmax::cases(rng));
    cases.extend(rope::cases(rng));
    cases.extend(topk::cases(rng));
    cases.extend(moe_routing::cases(rng));
    cases.extend(conv1d::cases(rng));
    cases.extend(gemm::cases(rng));
    cases.extend(gemm_q8::cases(rng));
    cases.extend(moe_gemm::cases(rng));
    cases.extend(fp8::cases());
    cases.extend(quant::cases(rng));
    cases.extend(attention::cases(rng));
    cases.extend(attention_backward::cases(rng));
    cases
}
