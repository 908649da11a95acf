//! Kernel signatures as declared by a module manifest: the element and scalar types a kernel
//! takes, and the text form `name: *mut bf16` that manifests and error messages use.
//!
//! A [`Signature`] is what the author promised; the per-target facts read from each code
//! object (offsets, sizes, kinds) are checked against it at build time by hkpack and used for
//! argument packing at launch time by hkload.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::fp8::Fp8Format;

/// A value type a kernel argument can have, or that a pointer argument points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScalarType {
    Bf16,
    F16,
    F32,
    F64,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    /// The 8-bit float formats ([`crate::fp8`]): each its own type, so that a buffer of one
    /// is never taken for another.
    Fp8E4m3fn,
    Fp8E4m3fnuz,
    Fp8E5m2,
    Fp8E5m2fnuz,
}

impl ScalarType {
    /// Every scalar type, in the order the docs list them.
    pub const ALL: [ScalarType; 16] = [
        Self::Bf16,
        Self::F16,
        Self::F32,
        Self::F64,
        Self::Fp8E4m3fn,
        Self::Fp8E4m3fnuz,
        Self::Fp8E5m2,
        Self::Fp8E5m2fnuz,
        Self::I8,
        Self::U8,
        Self::I16,
        Self::U16,
        Self::I32,
        Self::U32,
        Self::I64,
        Self::U64,
    ];

    /// Size in bytes; also the natural alignment on every target we build for.
    pub const fn size(self) -> u32 {
        match self {
            Self::I8 | Self::U8 => 1,
            Self::Fp8E4m3fn | Self::Fp8E4m3fnuz | Self::Fp8E5m2 | Self::Fp8E5m2fnuz => 1,
            Self::Bf16 | Self::F16 | Self::I16 | Self::U16 => 2,
            Self::F32 | Self::I32 | Self::U32 => 4,
            Self::F64 | Self::I64 | Self::U64 => 8,
        }
    }

    /// Whether values of this type are integers (what launch contracts compute with).
    pub const fn is_integer(self) -> bool {
        !matches!(self, Self::Bf16 | Self::F16 | Self::F32 | Self::F64) && self.fp8().is_none()
    }

    /// The FP8 format of an FP8 type.
    pub const fn fp8(self) -> Option<Fp8Format> {
        match self {
            Self::Fp8E4m3fn => Some(Fp8Format::E4m3fn),
            Self::Fp8E4m3fnuz => Some(Fp8Format::E4m3fnuz),
            Self::Fp8E5m2 => Some(Fp8Format::E5m2),
            Self::Fp8E5m2fnuz => Some(Fp8Format::E5m2fnuz),
            _ => None,
        }
    }

    /// Why a buffer of `found` cannot stand for one of `self` when both are FP8 formats of
    /// the same width in different families (the mix-up that gives plausible garbage), for
    /// argument errors: `None` otherwise.
    pub fn fp8_mixup(self, found: ScalarType) -> Option<String> {
        let (want, got) = (self.fp8()?, found.fp8()?);
        if want.family() == got.family() || want.mantissa_bits() != got.mantissa_bits() {
            return None;
        }
        Some(format!(
            "{got} ({}, the {} encoding) is not {want} ({}, the {} encoding): the same bytes \
             mean other values (a factor of two apart, or NaN), so convert the data to {want} \
             or call the kernel built for {got}",
            got.torch_dtype(),
            got.family(),
            want.torch_dtype(),
            want.family()
        ))
    }

    /// The spelling used in manifests and messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
            Self::F32 => "f32",
            Self::F64 => "f64",
            Self::I8 => "i8",
            Self::U8 => "u8",
            Self::I16 => "i16",
            Self::U16 => "u16",
            Self::I32 => "i32",
            Self::U32 => "u32",
            Self::I64 => "i64",
            Self::U64 => "u64",
            Self::Fp8E4m3fn => "fp8_e4m3fn",
            Self::Fp8E4m3fnuz => "fp8_e4m3fnuz",
            Self::Fp8E5m2 => "fp8_e5m2",
            Self::Fp8E5m2fnuz => "fp8_e5m2fnuz",
        }
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScalarType {
    type Err = SignatureError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| SignatureError::UnknownType(s.to_owned()))
    }
}

/// The type of one kernel parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParamType {
    /// A device pointer (`*const T` or `*mut T`).
    Pointer { pointee: ScalarType, mutable: bool },
    /// A value passed by copy.
    Scalar(ScalarType),
}

/// Size in bytes of a device pointer on every target we build for (amdgcn and nvptx64).
pub const POINTER_SIZE: u32 = 8;

impl ParamType {
    /// Size of the parameter in the argument buffer, in bytes.
    pub const fn size(self) -> u32 {
        match self {
            Self::Pointer { .. } => POINTER_SIZE,
            Self::Scalar(t) => t.size(),
        }
    }

    /// Required alignment of the parameter in the argument buffer.
    pub const fn align(self) -> u32 {
        self.size()
    }

    pub const fn is_pointer(self) -> bool {
        matches!(self, Self::Pointer { .. })
    }
}

impl fmt::Display for ParamType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pointer {
                pointee,
                mutable: true,
            } => write!(f, "*mut {pointee}"),
            Self::Pointer {
                pointee,
                mutable: false,
            } => write!(f, "*const {pointee}"),
            Self::Scalar(t) => write!(f, "{t}"),
        }
    }
}

impl FromStr for ParamType {
    type Err = SignatureError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let pointer = |rest: &str, mutable| {
            Ok(Self::Pointer {
                pointee: rest.trim().parse()?,
                mutable,
            })
        };
        if let Some(rest) = s.strip_prefix("*mut ") {
            pointer(rest, true)
        } else if let Some(rest) = s.strip_prefix("*const ") {
            pointer(rest, false)
        } else if s.starts_with('*') {
            Err(SignatureError::PointerWithoutMutability(s.to_owned()))
        } else {
            Ok(Self::Scalar(s.parse()?))
        }
    }
}

/// One named, typed kernel parameter: `eps: f32`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Param {
    pub name: String,
    pub ty: ParamType,
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.ty)
    }
}

impl FromStr for Param {
    type Err = SignatureError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, ty) = s
            .split_once(':')
            .ok_or_else(|| SignatureError::MissingName(s.to_owned()))?;
        let name = name.trim();
        let is_identifier = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !is_identifier {
            return Err(SignatureError::BadName(s.to_owned()));
        }
        Ok(Self {
            name: name.to_owned(),
            ty: ty.parse()?,
        })
    }
}

impl Serialize for Param {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::text::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for Param {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::text::deserialize(deserializer)
    }
}

/// A scalar argument value with its type, as passed to a launch.
///
/// `bf16`, `f16` and the FP8 formats carry their raw bit patterns so hkload needs no
/// half-precision crate ([`Fp8Format::encode`] makes an FP8 one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScalarValue {
    Bf16(u16),
    F16(u16),
    F32(f32),
    F64(f64),
    I8(i8),
    U8(u8),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    Fp8(Fp8Format, u8),
}

impl ScalarValue {
    pub const fn ty(self) -> ScalarType {
        match self {
            Self::Bf16(_) => ScalarType::Bf16,
            Self::F16(_) => ScalarType::F16,
            Self::F32(_) => ScalarType::F32,
            Self::F64(_) => ScalarType::F64,
            Self::I8(_) => ScalarType::I8,
            Self::U8(_) => ScalarType::U8,
            Self::I16(_) => ScalarType::I16,
            Self::U16(_) => ScalarType::U16,
            Self::I32(_) => ScalarType::I32,
            Self::U32(_) => ScalarType::U32,
            Self::I64(_) => ScalarType::I64,
            Self::U64(_) => ScalarType::U64,
            Self::Fp8(format, _) => ScalarType::from_fp8(format),
        }
    }

    /// The value as a 64-bit signed integer, for launch contracts: `None` for floating-point
    /// values and for `u64` values above `i64::MAX`.
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Self::I8(v) => Some(v.into()),
            Self::U8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            Self::U64(v) => i64::try_from(v).ok(),
            Self::Bf16(_) | Self::F16(_) | Self::F32(_) | Self::F64(_) | Self::Fp8(..) => None,
        }
    }

    /// The value's little-endian bytes; only the first `ty().size()` bytes are meaningful
    /// (the rest are zero). Built from the bits as one `u64`, so that packing an argument on
    /// the launch path copies a fixed eight bytes.
    pub fn to_le_bytes(self) -> [u8; 8] {
        let bits: u64 = match self {
            Self::Bf16(v) | Self::F16(v) | Self::U16(v) => v.into(),
            Self::F32(v) => v.to_bits().into(),
            Self::F64(v) => v.to_bits(),
            Self::I8(v) => u64::from(v as u8),
            Self::U8(v) | Self::Fp8(_, v) => v.into(),
            Self::I16(v) => u64::from(v as u16),
            Self::I32(v) => u64::from(v as u32),
            Self::U32(v) => v.into(),
            Self::I64(v) => v as u64,
            Self::U64(v) => v,
        };
        bits.to_le_bytes()
    }
}

macro_rules! scalar_value_from {
    ($($rust:ty => $variant:ident),* $(,)?) => {
        $(impl From<$rust> for ScalarValue {
            fn from(v: $rust) -> Self {
                Self::$variant(v)
            }
        })*
    };
}

scalar_value_from!(
    f32 => F32, f64 => F64, i8 => I8, u8 => U8, i16 => I16, u16 => U16,
    i32 => I32, u32 => U32, i64 => I64, u64 => U64,
);

impl ScalarType {
    /// The type of an FP8 format's elements.
    pub const fn from_fp8(format: Fp8Format) -> Self {
        match format {
            Fp8Format::E4m3fn => Self::Fp8E4m3fn,
            Fp8Format::E4m3fnuz => Self::Fp8E4m3fnuz,
            Fp8Format::E5m2 => Self::Fp8E5m2,
            Fp8Format::E5m2fnuz => Self::Fp8E5m2fnuz,
        }
    }
}

impl From<Fp8Format> for ScalarType {
    fn from(format: Fp8Format) -> Self {
        Self::from_fp8(format)
    }
}

/// A kernel's declared parameter list, in order.
pub type Signature = Vec<Param>;

/// A parameter declaration that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error(
        "unknown type `{0}`; expected one of bf16, f16, f32, f64, fp8_e4m3fn, fp8_e4m3fnuz, fp8_e5m2, fp8_e5m2fnuz, i8, u8, i16, u16, i32, u32, i64, u64"
    )]
    UnknownType(String),
    #[error("pointer type `{0}` must say `*const T` or `*mut T`")]
    PointerWithoutMutability(String),
    #[error("parameter `{0}` needs a name: write it as `name: type`, e.g. `out: *mut bf16`")]
    MissingName(String),
    #[error("parameter `{0}` has a name that is not an identifier")]
    BadName(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_other_family_of_one_width_is_a_mixup() {
        let (e4_ocp, e4_fnuz) = (ScalarType::Fp8E4m3fn, ScalarType::Fp8E4m3fnuz);
        let text = e4_ocp.fp8_mixup(e4_fnuz).unwrap();
        for part in [
            "fp8_e4m3fnuz (torch.float8_e4m3fnuz, the FNUZ encoding)",
            "fp8_e4m3fn (torch.float8_e4m3fn, the OCP encoding)",
        ] {
            assert!(text.contains(part), "`{part}` not in {text}");
        }
        assert!(e4_fnuz.fp8_mixup(e4_ocp).is_some());
        assert!(
            ScalarType::Fp8E5m2
                .fp8_mixup(ScalarType::Fp8E5m2fnuz)
                .is_some()
        );
        assert_eq!(e4_ocp.fp8_mixup(ScalarType::Fp8E5m2), None);
        assert_eq!(e4_ocp.fp8_mixup(ScalarType::Fp8E5m2fnuz), None);
        assert_eq!(e4_ocp.fp8_mixup(ScalarType::U8), None);
    }

    #[test]
    fn params_round_trip_through_text() {
        for text in ["out: *mut bf16", "x: *const f16", "eps: f32", "n: u64"] {
            let param: Param = text.parse().unwrap();
            assert_eq!(param.to_string(), text);
        }
    }

    #[test]
    fn spacing_is_forgiven_but_not_missing_parts() {
        let param: Param = "  rows :u32 ".parse().unwrap();
        assert_eq!(param.to_string(), "rows: u32");
        assert_eq!(
            "x: *bf16".parse::<Param>(),
            Err(SignatureError::PointerWithoutMutability("*bf16".into()))
        );
        assert_eq!(
            "*mut bf16".parse::<Param>(),
            Err(SignatureError::MissingName("*mut bf16".into()))
        );
        assert_eq!(
            "x: float".parse::<Param>(),
            Err(SignatureError::UnknownType("float".into()))
        );
        assert_eq!(
            "2x: f32".parse::<Param>(),
            Err(SignatureError::BadName("2x: f32".into()))
        );
    }

    #[test]
    fn sizes_are_natural() {
        for t in ScalarType::ALL {
            assert_eq!(t.to_string().parse::<ScalarType>(), Ok(t));
            assert!(t.size().is_power_of_two());
        }
        for format in Fp8Format::ALL {
            let ty = ScalarType::from(format);
            assert_eq!((ty.fp8(), ty.name()), (Some(format), &*format.to_string()));
            assert!(!ty.is_integer());
        }
        let ptr: ParamType = "*const u8".parse().unwrap();
        assert_eq!((ptr.size(), ptr.align()), (8, 8));
    }
}
