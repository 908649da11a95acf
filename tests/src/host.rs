//! Host-side values in the device's element types: rounding f64 values to what a dtype can
//! hold, and encoding them to (and decoding them from) the bytes a device buffer holds.

use half::{bf16, f16};
use hk_format::abi::ScalarType;
use hk_format::fp8::Fp8Format;

/// The value `x` becomes when stored as `ty` (round to nearest even for floats, FP8 through
/// f32 as the kernels convert; integers are expected to be integral and in range already).
pub fn round_to(ty: ScalarType, x: f64) -> f64 {
    match ty {
        ScalarType::Bf16 => bf16::from_f64(x).to_f64(),
        ScalarType::F16 => f16::from_f64(x).to_f64(),
        ScalarType::F32 => x as f32 as f64,
        _ => match ty.fp8() {
            Some(format) => fp8_value(format, format.encode(x as f32)),
            None => x,
        },
    }
}

/// The value of FP8 `code`; a NaN code decodes to a NaN that carries the code in its payload,
/// so that [`crate::case::Expect::Exact`] (which compares NaNs by their bits) tells the
/// canonical NaN from any other pattern, the output poison included.
pub fn fp8_value(format: Fp8Format, code: u8) -> f64 {
    let value = format.decode(code);
    if value.is_nan() {
        f64::from_bits(0x7FF8_0000_0000_0000 | u64::from(code))
    } else {
        f64::from(value)
    }
}

/// The gap between 1 and the next value of the 16-bit float `ty`: one ulp, relative (2^-7 for
/// bf16, 2^-10 for f16). Tolerances of 16-bit outputs are stated in it.
pub fn epsilon(ty: ScalarType) -> f64 {
    match ty {
        ScalarType::Bf16 => bf16::EPSILON.to_f64(),
        ScalarType::F16 => f16::EPSILON.to_f64(),
        _ => panic!("epsilon is for the 16-bit float types, not {ty:?}"),
    }
}

/// `len` values drawn uniformly from `center ± spread` and rounded to `ty`: fresh random
/// inputs that the device type holds exactly.
pub fn random_rounded(
    rng: &mut impl rand::Rng,
    ty: ScalarType,
    len: usize,
    center: f64,
    spread: f64,
) -> Vec<f64> {
    (0..len)
        .map(|_| round_to(ty, center + spread * rng.random_range(-1.0..1.0)))
        .collect()
}

/// Little-endian device bytes of `values` stored as `ty`.
pub fn encode(ty: ScalarType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * ty.size() as usize);
    for &x in values {
        match ty {
            ScalarType::Bf16 => out.extend(bf16::from_f64(x).to_le_bytes()),
            ScalarType::F16 => out.extend(f16::from_f64(x).to_le_bytes()),
            ScalarType::F32 => out.extend((x as f32).to_le_bytes()),
            ScalarType::F64 => out.extend(x.to_le_bytes()),
            ScalarType::I8 => out.extend((x as i8).to_le_bytes()),
            ScalarType::U8 => out.extend((x as u8).to_le_bytes()),
            ScalarType::I16 => out.extend((x as i16).to_le_bytes()),
            ScalarType::U16 => out.extend((x as u16).to_le_bytes()),
            ScalarType::I32 => out.extend((x as i32).to_le_bytes()),
            ScalarType::U32 => out.extend((x as u32).to_le_bytes()),
            ScalarType::I64 => out.extend((x as i64).to_le_bytes()),
            ScalarType::U64 => out.extend((x as u64).to_le_bytes()),
            ScalarType::Fp8E4m3fn
            | ScalarType::Fp8E4m3fnuz
            | ScalarType::Fp8E5m2
            | ScalarType::Fp8E5m2fnuz => out.push(fp8_code(ty, x)),
        }
    }
    out
}

/// Values of the `ty` elements in `bytes` (a trailing partial element is ignored).
pub fn decode(ty: ScalarType, bytes: &[u8]) -> Vec<f64> {
    let size = ty.size() as usize;
    bytes
        .chunks_exact(size)
        .map(|b| {
            let b2 = || [b[0], b[1]];
            let b4 = || [b[0], b[1], b[2], b[3]];
            let b8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
            match ty {
                ScalarType::Bf16 => bf16::from_le_bytes(b2()).to_f64(),
                ScalarType::F16 => f16::from_le_bytes(b2()).to_f64(),
                ScalarType::F32 => f32::from_le_bytes(b4()) as f64,
                ScalarType::F64 => f64::from_le_bytes(b8()),
                ScalarType::I8 => b[0] as i8 as f64,
                ScalarType::U8 => b[0] as f64,
                ScalarType::I16 => i16::from_le_bytes(b2()) as f64,
                ScalarType::U16 => u16::from_le_bytes(b2()) as f64,
                ScalarType::I32 => i32::from_le_bytes(b4()) as f64,
                ScalarType::U32 => u32::from_le_bytes(b4()) as f64,
                ScalarType::I64 => i64::from_le_bytes(b8()) as f64,
                ScalarType::U64 => u64::from_le_bytes(b8()) as f64,
                ScalarType::Fp8E4m3fn
                | ScalarType::Fp8E4m3fnuz
                | ScalarType::Fp8E5m2
                | ScalarType::Fp8E5m2fnuz => fp8_value(fp8_format(ty), b[0]),
            }
        })
        .collect()
}

fn fp8_format(ty: ScalarType) -> Fp8Format {
    ty.fp8()
        .unwrap_or_else(|| panic!("{ty} is not an FP8 type"))
}

/// The FP8 code of `x`, for uploads: a NaN made by [`fp8_value`] gives back its code and an
/// infinity E5M2's infinity (which the saturating conversion would not give); anything else is
/// encoded (rounded) as the kernels do.
fn fp8_code(ty: ScalarType, x: f64) -> u8 {
    let format = fp8_format(ty);
    if x.is_nan() && x.to_bits() & !0xFF == 0x7FF8_0000_0000_0000 {
        x.to_bits() as u8
    } else if x.is_infinite() && format == Fp8Format::E5m2 {
        if x > 0.0 { 0x7C } else { 0xFC }
    } else {
        format.encode(x as f32)
    }
}

/// A byte pattern written over every output before a kernel runs, so an element the kernel
/// never wrote cannot pass: it decodes to NaN in every float type and to an absurd integer.
pub const POISON_BYTE: u8 = 0xFF;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epsilon_is_the_step_after_one() {
        for ty in [ScalarType::Bf16, ScalarType::F16] {
            let eps = epsilon(ty);
            assert_eq!(round_to(ty, 1.0 + eps), 1.0 + eps, "{ty}");
            assert_eq!(round_to(ty, 1.0 + eps * 0.49), 1.0, "{ty}");
        }
        assert_eq!(epsilon(ScalarType::Bf16), 2f64.powi(-7));
        assert_eq!(epsilon(ScalarType::F16), 2f64.powi(-10));
    }

    #[test]
    fn encode_decode_round_trips_rounded_values() {
        let xs = [0.0, -1.5, -2.75, 65_504.0, 1e-3];
        for ty in [ScalarType::Bf16, ScalarType::F16, ScalarType::F32] {
            let rounded: Vec<f64> = xs.iter().map(|&x| round_to(ty, x)).collect();
            assert_eq!(decode(ty, &encode(ty, &rounded)), rounded, "{ty}");
        }
        assert_eq!(
            decode(ScalarType::I32, &encode(ScalarType::I32, &[-7.0])),
            [-7.0]
        );
    }

    #[test]
    fn fp8_codes_round_trip_through_values_nans_included() {
        for format in Fp8Format::ALL {
            let ty = ScalarType::from(format);
            let codes: Vec<u8> = (0..=255).collect();
            let values = decode(ty, &codes);
            assert_eq!(encode(ty, &values), codes, "{format}");
        }
    }

    #[test]
    fn poison_is_nan_in_every_float_type() {
        for ty in [
            ScalarType::Bf16,
            ScalarType::F16,
            ScalarType::F32,
            ScalarType::F64,
        ] {
            let poisoned = vec![POISON_BYTE; ty.size() as usize];
            assert!(decode(ty, &poisoned)[0].is_nan(), "{ty}");
        }
    }
}
