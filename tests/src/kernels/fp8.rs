//! FP8 conversions: the cases of `kernels/fp8_cast.hip`, bit for bit against the host's
//! conversions ([`hk_format::fp8`], whose own tests prove them against a brute-force nearest
//! value).
//!
//! Symbols (`F` in fp8_e4m3fn, fp8_e4m3fnuz, fp8_e5m2, fp8_e5m2fnuz; `P` empty for the
//! target's own path, an instruction where it has one, or `_software` for the portable path):
//! - `cast_f32_to_F{P}(out, x, n: u64)`: `out[i] = F(x[i])`, round to nearest even, saturating.
//! - `cast_F_to_f32{P}(out, x, n: u64)`: `out[i] = f32(x[i])`, exact; NaN codes give 0x7FC00000.
//!
//! Each format gets every one of its 256 codes decoded, and encodes every value of the format,
//! every midpoint between neighbours and the floats either side of it, values past the largest
//! (infinities too), NaNs of both signs, zeros of both signs and f32 subnormals.

use hk_format::abi::{ScalarType, ScalarValue};
use hk_format::fp8::Fp8Format;

use crate::case::{Case, CaseArg, Expect};
use crate::host::fp8_value;

/// The two code paths of each conversion kernel: the symbol suffix.
const PATHS: [&str; 2] = ["", "_software"];

/// The f32 inputs an encoding is checked on (see the module doc).
pub fn encode_probes(format: Fp8Format) -> Vec<f32> {
    let mut values: Vec<f32> = (0..=255u8)
        .map(|code| format.decode(code))
        .filter(|v| v.is_finite())
        .collect();
    values.sort_by(f32::total_cmp);
    values.dedup();
    let mut probes = values.clone();
    for pair in values.windows(2) {
        let mid = (pair[0] + pair[1]) / 2.0; // exact: both have few significant bits
        probes.extend([
            mid,
            f32::from_bits(mid.to_bits() + 1),
            f32::from_bits(mid.to_bits() - 1),
        ]);
    }
    let max = format.max();
    probes.extend([
        max * 1.5,
        -max * 1.5,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        0.0,
        -0.0,
        f32::from_bits(1),
        -f32::from_bits(1),
        f32::MIN_POSITIVE,
        1e-30,
        0.3,
        -3.3,
    ]);
    probes
}

/// Every conversion kernel's case.
pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for format in Fp8Format::ALL {
        let ty = ScalarType::from(format);
        for path in PATHS {
            let probes = encode_probes(format);
            let want = probes
                .iter()
                .map(|&x| fp8_value(format, format.encode(x)))
                .collect();
            let label = |what: &str| {
                format!(
                    "{what} path={}",
                    if path.is_empty() { "own" } else { "software" }
                )
            };
            cases.push(Case {
                kernel: format!("cast_f32_to_{format}{path}"),
                label: label(&format!("{} probes", probes.len())),
                args: vec![
                    CaseArg::Output {
                        name: "out",
                        elem: ty,
                        len: probes.len(),
                        expect: Expect::Exact(want),
                    },
                    CaseArg::input(
                        "x",
                        ScalarType::F32,
                        probes.iter().map(|&x| f64::from(x)).collect(),
                    ),
                    CaseArg::Scalar(ScalarValue::U64(probes.len() as u64)),
                ],
                grid: [None; 3],
            });
            let codes: Vec<u8> = (0..=255).collect();
            let want = codes
                .iter()
                .map(|&code| match format.decode(code) {
                    v if v.is_nan() => f64::NAN, // 0x7FC00000 as an f64
                    v => f64::from(v),
                })
                .collect();
            cases.push(Case {
                kernel: format!("cast_{format}_to_f32{path}"),
                label: label("256 codes"),
                args: vec![
                    CaseArg::Output {
                        name: "out",
                        elem: ScalarType::F32,
                        len: codes.len(),
                        expect: Expect::Exact(want),
                    },
                    CaseArg::input(
                        "x",
                        ty,
                        codes.iter().map(|&c| fp8_value(format, c)).collect(),
                    ),
                    CaseArg::Scalar(ScalarValue::U64(codes.len() as u64)),
                ],
                grid: [None; 3],
            });
        }
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{POISON_BYTE, decode, encode};

    /// The outputs a correct kernel writes: the case's own want, through the device bytes.
    fn reference_outputs(case: &Case) -> Vec<Option<Vec<f64>>> {
        case.args
            .iter()
            .map(|arg| match arg {
                CaseArg::Output {
                    elem,
                    expect: Expect::Exact(want),
                    ..
                } => Some(decode(*elem, &encode(*elem, want))),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn cases_cover_every_symbol_and_accept_their_reference() {
        let cases = cases();
        assert_eq!(cases.len(), 4 * 2 * 2);
        for case in &cases {
            let outputs = reference_outputs(case);
            assert_eq!(
                case.check(&outputs),
                Ok(()),
                "{} {}",
                case.kernel,
                case.label
            );
        }
    }

    #[test]
    fn cases_refuse_the_other_family_a_wrong_nan_and_the_poison() {
        let cases = cases();
        let find = |kernel: &str| cases.iter().find(|c| c.kernel == kernel).unwrap();
        // OCP E4M3 encoded as FNUZ: off by a factor of two, or NaN.
        let ocp = find("cast_f32_to_fp8_e4m3fn");
        let CaseArg::Input { data: x, .. } = &ocp.args[1] else {
            unreachable!()
        };
        let fnuz: Vec<f64> = x
            .iter()
            .map(|&v| {
                let code = Fp8Format::E4m3fnuz.encode(v as f32);
                fp8_value(Fp8Format::E4m3fn, code)
            })
            .collect();
        assert!(ocp.check(&[Some(fnuz), None, None]).is_err());
        // A NaN of the other sign, or the poison, where the canonical NaN is wanted.
        let mut outputs = reference_outputs(ocp);
        let out = outputs[0].as_mut().unwrap();
        let nan_at = out.iter().position(|v| v.is_nan()).unwrap();
        out[nan_at] = fp8_value(Fp8Format::E4m3fn, 0xFF);
        assert!(ocp.check(&outputs).is_err());
        let decode_case = find("cast_fp8_e4m3fn_to_f32");
        let poison = decode(ScalarType::F32, &[POISON_BYTE; 4 * 256]);
        assert!(decode_case.check(&[Some(poison), None, None]).is_err());
    }
}
