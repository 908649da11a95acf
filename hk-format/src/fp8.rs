//! The four 8-bit float formats kernels take, and exact conversions between them and `f32`:
//! the host side of what `kernels/include/hk/fp8.h` does on the device, bit for bit (tests
//! compare the two over every code), and what a scalar argument of an FP8 type is encoded
//! with.
//!
//! Two families share the names E4M3 and E5M2 and differ in what the same bits mean:
//! - OCP (the Open Compute Project's OFP8; torch's `float8_e4m3fn` and `float8_e5m2`):
//!   NVIDIA sm_89+ and AMD gfx950 compute on these. E4M3 has no infinity and one NaN pattern
//!   per sign (`S.1111.111`); E5M2 is IEEE-like, with infinities and NaNs at exponent 31.
//! - FNUZ ("finite, no negative zero"; torch's `float8_e4m3fnuz` and `float8_e5m2fnuz`): AMD
//!   gfx942 computes on these. The exponent bias is one larger (8 and 16), there is no
//!   infinity and no negative zero, and `0x80` is the only NaN.
//!
//! So the same byte read in the other family's format is half (or twice) the value, or a NaN:
//! plausible numbers, wrong by a factor of two, which is why a kernel's signature names the
//! exact format and hkload refuses a buffer of any other.
//!
//! Encoding rounds to nearest, ties to even, into the subnormals; it saturates: a finite value
//! beyond the largest finite one, and an infinity, become that largest value with the input's
//! sign (NVIDIA's `.satfinite`, what quantization wants). A NaN becomes the format's canonical
//! NaN: `0x7F` for the OCP formats (whatever the input's sign), `0x80` for FNUZ. Negative
//! zero stays negative in OCP and becomes `0x00` in FNUZ, as does any negative value that
//! rounds to zero.
//!
//! ```
//! use hk_format::fp8::Fp8Format;
//!
//! assert_eq!(Fp8Format::E4m3fn.decode(0x7E), 448.0);
//! assert_eq!(Fp8Format::E4m3fnuz.decode(0x7E), 224.0); // the same bits, half the value
//! assert_eq!(Fp8Format::E4m3fn.encode(1000.0), 0x7E); // saturated
//! assert_eq!(Fp8Format::E4m3fnuz.encode(-0.0), 0x00); // FNUZ has no negative zero
//! assert!(Fp8Format::E5m2fnuz.decode(0x80).is_nan());
//! ```

use std::fmt;

/// One of the four FP8 formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fp8Format {
    /// OCP E4M3: bias 7, largest 448, no infinity.
    E4m3fn,
    /// FNUZ E4M3: bias 8, largest 240.
    E4m3fnuz,
    /// OCP E5M2: bias 15, largest 57344, with infinities.
    E5m2,
    /// FNUZ E5M2: bias 16, largest 57344.
    E5m2fnuz,
}

/// The two families of FP8 encodings (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Family {
    Ocp,
    Fnuz,
}

impl fmt::Display for Fp8Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ocp => "OCP",
            Self::Fnuz => "FNUZ",
        })
    }
}

impl Fp8Format {
    pub const ALL: [Fp8Format; 4] = [Self::E4m3fn, Self::E4m3fnuz, Self::E5m2, Self::E5m2fnuz];

    pub const fn family(self) -> Fp8Family {
        match self {
            Self::E4m3fn | Self::E5m2 => Fp8Family::Ocp,
            Self::E4m3fnuz | Self::E5m2fnuz => Fp8Family::Fnuz,
        }
    }

    /// The torch dtype of the format (`torch.float8_e4m3fn`, ...).
    pub const fn torch_dtype(self) -> &'static str {
        match self {
            Self::E4m3fn => "torch.float8_e4m3fn",
            Self::E4m3fnuz => "torch.float8_e4m3fnuz",
            Self::E5m2 => "torch.float8_e5m2",
            Self::E5m2fnuz => "torch.float8_e5m2fnuz",
        }
    }

    /// Mantissa (fraction) bits: 3 for E4M3, 2 for E5M2.
    pub const fn mantissa_bits(self) -> u32 {
        match self {
            Self::E4m3fn | Self::E4m3fnuz => 3,
            Self::E5m2 | Self::E5m2fnuz => 2,
        }
    }

    /// The exponent bias.
    pub const fn bias(self) -> i32 {
        match self {
            Self::E4m3fn => 7,
            Self::E4m3fnuz => 8,
            Self::E5m2 => 15,
            Self::E5m2fnuz => 16,
        }
    }

    /// The code of the largest finite value (positive).
    pub const fn max_code(self) -> u8 {
        match self {
            Self::E4m3fn => 0x7E,
            Self::E5m2 => 0x7B,
            Self::E4m3fnuz | Self::E5m2fnuz => 0x7F,
        }
    }

    /// The largest finite value: 448, 240, 57344, 57344.
    pub fn max(self) -> f32 {
        self.decode(self.max_code())
    }

    /// The NaN that [`Fp8Format::encode`] gives.
    pub const fn nan_code(self) -> u8 {
        match self.family() {
            Fp8Family::Ocp => 0x7F,
            Fp8Family::Fnuz => 0x80,
        }
    }

    /// The exact value of `code` (a NaN for every NaN pattern).
    pub fn decode(self, code: u8) -> f32 {
        let mantissa_bits = self.mantissa_bits();
        let negative = code & 0x80 != 0;
        let exponent = i32::from((code & 0x7F) >> mantissa_bits);
        let mantissa = u32::from(code) & ((1 << mantissa_bits) - 1);
        let all_ones = (1 << (7 - mantissa_bits)) - 1;
        let nan = match self {
            Self::E4m3fn => code & 0x7F == 0x7F,
            Self::E5m2 => exponent == all_ones && mantissa != 0,
            Self::E4m3fnuz | Self::E5m2fnuz => code == 0x80,
        };
        if nan {
            return f32::NAN;
        }
        let magnitude = if self == Self::E5m2 && exponent == all_ones {
            f32::INFINITY
        } else if exponent == 0 {
            // Subnormal: mantissa quanta of 2^(1 - bias - mantissa_bits).
            mantissa as f32 * pow2(1 - self.bias() - mantissa_bits as i32)
        } else {
            ((1 << mantissa_bits) + mantissa) as f32
                * pow2(exponent - self.bias() - mantissa_bits as i32)
        };
        if negative { -magnitude } else { magnitude }
    }

    /// `x` rounded to the format (nearest, ties to even; saturating; see the module doc).
    pub fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return self.nan_code();
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let magnitude = f64::from(x.abs());
        let max = f64::from(self.max());
        if magnitude >= max {
            return sign | self.max_code();
        }
        let mantissa_bits = self.mantissa_bits() as i32;
        // The quantum at x's binade (never finer than the subnormals'), in which x is
        // an integer count plus a fraction; f64 holds every f32 divided by a power of two.
        let min_exponent = 1 - self.bias();
        let exponent = if magnitude == 0.0 {
            min_exponent
        } else {
            (magnitude.log2().floor() as i32).max(min_exponent)
        };
        let quantum = f64::from(pow2(exponent - mantissa_bits));
        let quanta = round_half_even(magnitude / quantum);
        // quanta counts quantum steps: below 2^mantissa_bits a subnormal (only in the lowest
        // binade), else (after a carry, perhaps into the next binade) a normal number.
        let code = if exponent == min_exponent && quanta < (1 << mantissa_bits) {
            quanta
        } else {
            let (quanta, exponent) = if quanta == 2 << mantissa_bits {
                (1 << mantissa_bits, exponent + 1)
            } else {
                (quanta, exponent)
            };
            let biased = (exponent + self.bias()) as u32;
            (biased << mantissa_bits) | (quanta - (1 << mantissa_bits))
        };
        let code = code as u8;
        if code == 0 && self.family() == Fp8Family::Fnuz {
            return 0;
        }
        sign | code
    }
}

impl fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::E4m3fn => "fp8_e4m3fn",
            Self::E4m3fnuz => "fp8_e4m3fnuz",
            Self::E5m2 => "fp8_e5m2",
            Self::E5m2fnuz => "fp8_e5m2fnuz",
        })
    }
}

/// 2^e for the exponents FP8 needs (within f32's normal range).
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `x` (non-negative) rounded to the nearest integer, ties to even.
fn round_half_even(x: f64) -> u32 {
    let floor = x.floor();
    let fraction = x - floor;
    let floor = floor as u32;
    if fraction > 0.5 || (fraction == 0.5 && floor % 2 == 1) {
        floor + 1
    } else {
        floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite code's value, with its code.
    fn finite(format: Fp8Format) -> Vec<(f32, u8)> {
        (0..=255u8)
            .map(|code| (format.decode(code), code))
            .filter(|(v, _)| v.is_finite())
            .collect()
    }

    /// Encoding by brute force: the nearest finite value, ties to the even code, saturating.
    fn nearest(format: Fp8Format, x: f32) -> u8 {
        let x64 = f64::from(x).clamp(-f64::from(format.max()), f64::from(format.max()));
        let mut best: Option<(f64, u8)> = None;
        for (v, code) in finite(format) {
            // Zero's sign follows x (OCP) or is always positive (FNUZ); other values must
            // carry x's sign to be the nearest.
            let other_zero = v.is_sign_negative() != x.is_sign_negative();
            if v == 0.0 && other_zero && format.family() == Fp8Family::Ocp {
                continue;
            }
            let distance = (f64::from(v) - x64).abs();
            let better = match best {
                None => true,
                Some((d, c)) => distance < d || (distance == d && code % 2 == 0 && c % 2 == 1),
            };
            if better {
                best = Some((distance, code));
            }
        }
        best.map_or(0, |(_, code)| code)
    }

    #[test]
    fn decoded_extremes_are_the_formats_own() {
        use Fp8Format::*;
        let cases = [
            (E4m3fn, 0x7E, 448.0),
            (E4m3fn, 0x01, 2f32.powi(-9)),
            (E4m3fn, 0x08, 2f32.powi(-6)),
            (E4m3fnuz, 0x7F, 240.0),
            (E4m3fnuz, 0x01, 2f32.powi(-10)),
            (E5m2, 0x7B, 57344.0),
            (E5m2, 0x01, 2f32.powi(-16)),
            (E5m2fnuz, 0x7F, 57344.0),
            (E5m2fnuz, 0x01, 2f32.powi(-17)),
            (E4m3fn, 0x38, 1.0),
            (E4m3fnuz, 0x40, 1.0),
            (E5m2, 0x3C, 1.0),
            (E5m2fnuz, 0x40, 1.0),
        ];
        for (format, code, value) in cases {
            assert_eq!(format.decode(code), value, "{format} {code:#04x}");
            assert_eq!(format.decode(code | 0x80), -value, "{format} {code:#04x}");
        }
        assert_eq!(E5m2.decode(0x7C), f32::INFINITY);
        assert_eq!(E5m2.decode(0xFC), f32::NEG_INFINITY);
        let nans = |format: Fp8Format| {
            (0..=255u8)
                .filter(|&c| format.decode(c).is_nan())
                .collect::<Vec<_>>()
        };
        assert_eq!(nans(E4m3fn), [0x7F, 0xFF]);
        assert_eq!(nans(E5m2), [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]);
        assert_eq!(nans(E4m3fnuz), [0x80]);
        assert_eq!(nans(E5m2fnuz), [0x80]);
        assert!(E4m3fn.decode(0x80).is_sign_negative() && E4m3fn.decode(0x80) == 0.0);
    }

    #[test]
    fn every_code_round_trips() {
        for format in Fp8Format::ALL {
            for (value, code) in finite(format) {
                assert_eq!(format.encode(value), code, "{format} {code:#04x} = {value}");
            }
        }
    }

    #[test]
    fn encoding_is_the_nearest_value_ties_to_even() {
        // Every finite value, the midpoints between neighbours and just off them, both signs,
        // and values beyond the largest and below the smallest.
        for format in Fp8Format::ALL {
            let mut values: Vec<f32> = finite(format).iter().map(|v| v.0).collect();
            values.sort_by(f32::total_cmp);
            values.dedup();
            let mut probes = Vec::new();
            for pair in values.windows(2) {
                let mid = (pair[0] + pair[1]) / 2.0; // exact: both have few bits
                probes.extend([mid, next_up(mid), next_down(mid)]);
            }
            probes.extend([1e-30, 1e30, f32::MIN_POSITIVE / 4.0, 1e-7, 0.3, 3.3]);
            for x in probes {
                for x in [x, -x] {
                    assert_eq!(format.encode(x), nearest(format, x), "{format} {x:e}");
                }
            }
        }
    }

    #[test]
    fn saturation_nan_and_zero_follow_the_family() {
        use Fp8Format::*;
        for format in Fp8Format::ALL {
            let max = format.max_code();
            assert_eq!(format.encode(f32::INFINITY), max, "{format}");
            assert_eq!(format.encode(f32::NEG_INFINITY), 0x80 | max, "{format}");
            assert_eq!(format.encode(1e9), max, "{format}");
            assert_eq!(format.encode(f32::NAN), format.nan_code(), "{format}");
            assert_eq!(format.encode(-f32::NAN), format.nan_code(), "{format}");
            assert_eq!(format.encode(0.0), 0, "{format}");
        }
        assert_eq!(E4m3fn.encode(-0.0), 0x80);
        assert_eq!(E5m2.encode(-1e-30), 0x80);
        assert_eq!(E4m3fnuz.encode(-0.0), 0x00);
        assert_eq!(E5m2fnuz.encode(-1e-30), 0x00);
        // 464 is halfway between 448 and the NaN pattern's place: it saturates, not NaNs.
        assert_eq!(E4m3fn.encode(464.0), 0x7E);
    }

    fn next_up(x: f32) -> f32 {
        f32::from_bits(x.to_bits() + 1)
    }

    fn next_down(x: f32) -> f32 {
        f32::from_bits(x.to_bits() - 1)
    }
}
