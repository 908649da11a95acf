//! Launch contracts: what a kernel needs from a call, declared in its module manifest and
//! enforced by hkload before every launch.
//!
//! A contract says, as small integer expressions over the kernel's scalar arguments and a few
//! device facts:
//!
//! - the **launch shape**: block and grid (x, y, z) and dynamic shared memory;
//! - the **preconditions** (`requires`), each with the message a caller sees when it fails;
//! - every pointer argument's **extent**: how many elements the kernel may touch through it.
//!
//! ```toml
//! [kernel.contract]
//! let = ["lanes = min(max(next_pow2(ceil_div(cols * elem_size(x), 64)), 8), 256)"]
//! block = ["max(lanes, 64)", "1", "1"]
//! grid = ["ceil_div(rows, max(lanes, 64) / lanes)", "1", "1"]
//! shared = "0"
//! requires = [{ check = "cols >= 1", message = "rows need at least one column" }]
//! extents = ["out = rows * cols", "x = rows * cols", "weight = cols"]
//! ```
//!
//! Everything is computed in 64-bit signed integers, and checked: an overflow, a division by
//! zero or a negative size is an error that names the expression, never a wrapped value. The
//! conditional (`c ? a : b`), `&&` and `||` evaluate only what decides their value, so
//! `n > 0 && total / n > 4` never divides by zero.
//!
//! hkpack parses and checks contracts at build time ([`Contract::bind`] against the kernel's
//! signature) and stores them with the kernel's record: as text in the ABI file people read, as
//! the expression tree in the index hkload reads, so a launch never parses text. hkload binds
//! the tree once when the kernel is looked up (names become slots) and evaluates the bound
//! [`Program`] at every call.

mod expr;
#[cfg(feature = "toml")]
mod parse;
mod program;

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::abi::{Param, ParamType};
pub use expr::{BinaryOp, Expr, Function, MAX_DEPTH};
#[cfg(feature = "toml")]
pub use parse::SyntaxError;
pub use program::{EvalError, Facts, MAX_LETS, MAX_PARAMS, Program, Run};

/// A kernel's launch contract as declared (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    /// Named helper values, each visible to the ones after it and to every other field.
    #[serde(rename = "let", default)]
    pub lets: Vec<Binding>,
    /// Preconditions, checked in order before anything else is computed.
    #[serde(default)]
    pub requires: Vec<Requirement>,
    /// Threads per block, x, y and z.
    pub block: [Expr; 3],
    /// Blocks in the grid, x, y and z.
    pub grid: [Expr; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared: Expr,
    /// Elements each pointer argument must hold, by argument name, one per pointer.
    pub extents: Vec<Binding>,
}

/// `name = expr`: a `let` value or a pointer argument's extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub name: String,
    pub value: Expr,
}

/// A precondition and what to tell a caller who breaks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    pub check: Expr,
    pub message: String,
}

/// The device facts a contract may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    /// Threads per wave (AMD) or warp (NVIDIA) of the chosen code object.
    WaveSize,
    /// Compute units (AMD) or streaming multiprocessors (NVIDIA) of the device.
    ComputeUnits,
    /// The most threads a block of this kernel may have on the chosen code object.
    MaxBlockThreads,
    /// A condition, true (1) when the chosen code object is built for an architecture-specific
    /// target (`sm_90a`), else false (0): such code may tile differently from the portable
    /// code of the same kernel (the same symbol and signature), so its launch shape and shared
    /// memory may differ too: `block = "arch_specific ? 256 : 128"`.
    ArchSpecific,
}

impl Fact {
    pub const ALL: [Fact; 4] = [
        Self::WaveSize,
        Self::ComputeUnits,
        Self::MaxBlockThreads,
        Self::ArchSpecific,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::WaveSize => "wave_size",
            Self::ComputeUnits => "compute_units",
            Self::MaxBlockThreads => "max_block_threads",
            Self::ArchSpecific => "arch_specific",
        }
    }
}

/// Which part of a contract something is about, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Let(String),
    Requires(usize),
    Block(usize),
    Grid(usize),
    Shared,
    Extent(String),
    /// The contract as a whole (a missing extent, say).
    Contract,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const AXES: [&str; 3] = ["x", "y", "z"];
        match self {
            Self::Let(name) => write!(f, "`let {name}`"),
            Self::Requires(i) => write!(f, "requirement {}", i + 1),
            Self::Block(axis) => write!(f, "block {}", AXES.get(*axis).unwrap_or(&"?")),
            Self::Grid(axis) => write!(f, "grid {}", AXES.get(*axis).unwrap_or(&"?")),
            Self::Shared => f.write_str("shared memory"),
            Self::Extent(arg) => write!(f, "the extent of `{arg}`"),
            Self::Contract => f.write_str("the contract"),
        }
    }
}

/// A contract that does not fit the kernel's signature: an unknown name, a type error, a
/// missing or extra extent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {message}")]
pub struct BindError {
    pub place: Place,
    /// The name the error is about, where there is one (so a manifest reader can point at it).
    pub name: Option<String>,
    pub message: String,
}

impl Contract {
    /// Checks the contract against the kernel's signature and turns it into the form hkload
    /// evaluates: every name resolved, every type checked, each pointer's extent in its slot.
    pub fn bind(&self, signature: &[Param]) -> Result<Program, BindError> {
        Program::bind(self, signature)
    }
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}", self.name, self.value)
    }
}

#[cfg(feature = "toml")]
impl std::str::FromStr for Binding {
    type Err = SyntaxError;

    /// `name = expr`; the offset of an error counts from the start of the whole text.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |offset, message: &str| SyntaxError {
            text: text.to_owned(),
            offset,
            message: message.to_owned(),
        };
        let Some(eq) = text.find('=').filter(|&i| !text[i + 1..].starts_with('=')) else {
            return Err(error(0, "expected `name = expression`"));
        };
        let name = text[..eq].trim();
        if !is_identifier(name) {
            let at = text.len() - text.trim_start().len();
            return Err(error(at, "expected a name before `=`"));
        }
        let value = parse::parse(&text[eq + 1..]).map_err(|e| SyntaxError {
            text: text.to_owned(),
            offset: e.offset + eq + 1,
            message: e.message,
        })?;
        Ok(Self {
            name: name.to_owned(),
            value,
        })
    }
}

pub(crate) fn is_identifier(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Text in the TOML files, `(name, tree)` in the binary index.
impl Serialize for Binding {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            (&self.name, &self.value).serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for Binding {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            from_text(deserializer)
        } else {
            let (name, value) = <(String, Expr)>::deserialize(deserializer)?;
            Ok(Self { name, value })
        }
    }
}

/// A contract's text, where a human-readable form (the ABI files' TOML) holds it: parsed with
/// the `toml` feature, which a runtime reading the index (which holds trees) does without.
#[cfg(feature = "toml")]
fn from_text<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
    D: Deserializer<'de>,
{
    crate::text::deserialize(deserializer)
}

#[cfg(not(feature = "toml"))]
fn from_text<'de, T, D: Deserializer<'de>>(_deserializer: D) -> Result<T, D::Error> {
    Err(serde::de::Error::custom(
        "a contract written as text needs hk-format's `toml` feature (its parser)",
    ))
}

/// What a parameter is, for messages about names.
fn describe(param: &Param) -> String {
    match param.ty {
        ParamType::Pointer { .. } => format!("`{}` is a pointer (`{}`)", param.name, param.ty),
        ParamType::Scalar(t) => format!("`{}` is a {t} value", param.name),
    }
}

/// Grid and block shape of a launch, and its dynamic shared memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

impl LaunchDims {
    /// A one-dimensional launch with no dynamic shared memory.
    pub const fn linear(blocks: u32, threads: u32) -> Self {
        Self {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            shared_bytes: 0,
        }
    }

    /// Threads in one block.
    pub const fn block_threads(&self) -> u64 {
        self.block[0] as u64 * self.block[1] as u64 * self.block[2] as u64
    }
}
