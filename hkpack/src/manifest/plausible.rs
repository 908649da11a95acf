//! A contract must accept some call: one that fails on every call (a requirement that is
//! always false, a grid of 2^32, a block of 2048 threads, a gibibyte of shared memory, an
//! extent of -1, `n / (n - n)`) would build, ship and refuse every launch. So each contract is
//! evaluated at build time over calls searched for in its own argument space, on the facts of
//! every kind of device the package targets, and one that accepts none of them is a build
//! error at the expression that refused the call that got furthest.
//!
//! The search: each integer argument starts from a value drawn from sizes kernels take
//! (0, 1, powers of two, a few odd sizes, -1 for signed ones), and a call is improved one
//! argument at a time (mostly one that the first requirement it fails reads) while it passes
//! more of the contract's requirements, with restarts; the first call the whole contract
//! accepts ends it. It is a search, not a proof: a contract it
//! calls impossible may, in principle, accept some call it never tried, which is why the error
//! shows the call it got furthest with.

use hk_format::abi::{Param, ParamType, ScalarType};
use hk_format::contract::LaunchDims;
use hk_format::contract::{Contract, EvalError, Expr, Facts, Place, Program};

/// What no device allows, on every target hkload runs on: threads a block (CUDA's and HIP's
/// maximum) and shared memory a block (the largest, sm_90's 227 KiB opt-in).
const MAX_BLOCK_THREADS: u64 = 1024;
const MAX_SHARED_BYTES: u32 = 227 * 1024;

/// The devices the search evaluates on: a wave64 AMD GPU and a warp32 NVIDIA one, with code
/// built for its architecture and for its architecture-specific target.
const DEVICES: [Facts; 3] = [
    Facts {
        wave_size: 64,
        compute_units: 304,
        max_block_threads: 1024,
        arch_specific: false,
    },
    Facts {
        wave_size: 32,
        compute_units: 132,
        max_block_threads: 1024,
        arch_specific: false,
    },
    Facts {
        wave_size: 32,
        compute_units: 132,
        max_block_threads: 1024,
        arch_specific: true,
    },
];

/// Values an integer argument is drawn from.
const SIZES: [i64; 22] = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    32,
    64,
    100,
    128,
    192,
    256,
    512,
    1000,
    1024,
    4096,
    8192,
    65535,
    65536,
    1 << 20,
];

const RESTARTS: usize = 48;
const STEPS: usize = 96;

/// Why the call that got furthest was refused, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refusal {
    pub place: Place,
    pub why: String,
}

/// How far a call got: the requirements it passed, then whether its launch and extents did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Progress {
    Requirements(usize),
    Launch,
    Extents,
    Accepted,
}

/// Ok if some call is accepted on some device, else why the furthest one was refused.
pub(super) fn check(
    program: &Program,
    contract: &Contract,
    signature: &[Param],
) -> Result<(), Refusal> {
    let integers: Vec<(usize, bool)> = signature
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p.ty {
            ParamType::Scalar(t) if t.is_integer() => Some((i, signed(t))),
            _ => None,
        })
        .collect();
    let readers: Vec<Vec<(usize, bool)>> = contract
        .requires
        .iter()
        .map(|r| arguments_read(&r.check, contract, signature, &integers))
        .collect();
    let mut random = SplitMix(0x5eed_c0de ^ signature.len() as u64);
    // The furthest refused call; it is explained (its refusal put in words) once, at the end.
    let mut best: Option<(Progress, Vec<i64>, &Facts)> = None;
    for facts in &DEVICES {
        for _ in 0..RESTARTS {
            let mut args = vec![0i64; signature.len()];
            for &(i, signed) in &integers {
                args[i] = random.size(signed);
            }
            let mut progress = evaluate(program, signature, &args, facts).0;
            for _ in 0..STEPS {
                if progress == Progress::Accepted || integers.is_empty() {
                    break;
                }
                // Mostly an argument the failing requirement reads; sometimes any, as the
                // requirement may depend on others through its `let` values.
                let pool = match progress {
                    Progress::Requirements(i) if !readers[i].is_empty() && random.below(4) > 0 => {
                        &readers[i]
                    }
                    _ => &integers,
                };
                let (i, signed) = pool[random.below(pool.len())];
                let before = args[i];
                args[i] = random.size(signed);
                let next = evaluate(program, signature, &args, facts).0;
                if next >= progress {
                    progress = next;
                } else {
                    args[i] = before;
                }
            }
            if progress == Progress::Accepted {
                return Ok(());
            }
            if best.as_ref().is_none_or(|(p, _, _)| progress > *p) {
                best = Some((progress, args, facts));
            }
        }
    }
    let (_, args, facts) = best.expect("the search evaluates at least one call");
    Err(explain(program, signature, &args, facts))
}

/// The integer arguments `expr` reads, directly or through the contract's `let` values.
fn arguments_read(
    expr: &Expr,
    contract: &Contract,
    signature: &[Param],
    integers: &[(usize, bool)],
) -> Vec<(usize, bool)> {
    let mut names: Vec<&str> = expr.names();
    let mut read = Vec::new();
    while let Some(name) = names.pop() {
        if let Some(binding) = contract.lets.iter().find(|b| b.name == name) {
            names.extend(binding.value.names());
        } else if let Some(&found) = integers.iter().find(|(i, _)| signature[*i].name == name)
            && !read.contains(&found)
        {
            read.push(found);
        }
    }
    read
}

/// What stopped a call: an error of the contract's, or a launch no device allows.
enum Stop {
    Error(EvalError),
    Launch(LaunchDims),
}

/// How far one call gets through the contract, and what stopped it (nothing is put in words
/// here: the search evaluates thousands of calls, and only the furthest is explained).
fn evaluate(
    program: &Program,
    signature: &[Param],
    args: &[i64],
    facts: &Facts,
) -> (Progress, Option<Stop>) {
    let mut run = program.run(args, facts);
    if let Err(error) = run.check_requirements() {
        let progress = match error {
            EvalError::Unmet { index } => Progress::Requirements(index),
            _ => Progress::Requirements(0),
        };
        return (progress, Some(Stop::Error(error)));
    }
    let dims = match run.shape() {
        Ok(dims) => dims,
        Err(error) => return (Progress::Launch, Some(Stop::Error(error))),
    };
    if impossible_launch(&dims).is_some() {
        return (Progress::Launch, Some(Stop::Launch(dims)));
    }
    for (index, param) in signature.iter().enumerate() {
        if let Err(error) = run.extent(index, &param.name) {
            return (Progress::Extents, Some(Stop::Error(error)));
        }
    }
    (Progress::Accepted, None)
}

/// Why a refused call was refused, and where, with the values of its arguments.
fn explain(program: &Program, signature: &[Param], args: &[i64], facts: &Facts) -> Refusal {
    let (place, why) = match evaluate(program, signature, args, facts).1 {
        Some(Stop::Error(error)) => (place_of(&error), describe(&error)),
        Some(Stop::Launch(dims)) => impossible_launch(&dims).expect("the launch was refused"),
        None => unreachable!("the explained call was refused"),
    };
    let names: Vec<&str> = signature
        .iter()
        .filter(|p| !p.ty.is_pointer())
        .map(|p| p.name.as_str())
        .collect();
    let values = program.run(args, facts).values(&names);
    Refusal {
        place,
        why: format!("{why} (with {values})"),
    }
}

/// A launch no device allows: where it is written, and why.
fn impossible_launch(dims: &LaunchDims) -> Option<(Place, String)> {
    let threads = dims.block_threads();
    if dims.block.contains(&0) || threads > MAX_BLOCK_THREADS {
        let axis = dims.block.iter().position(|&b| b == 0).unwrap_or(0);
        return Some((
            Place::Block(axis),
            format!(
                "the block comes out as {:?}, {threads} threads, and devices run 1 to {MAX_BLOCK_THREADS}",
                dims.block
            ),
        ));
    }
    if let Some(axis) = dims.grid.iter().position(|&g| g == 0) {
        return Some((
            Place::Grid(axis),
            format!(
                "the grid comes out as {:?}: every dimension must be at least 1",
                dims.grid
            ),
        ));
    }
    if dims.shared_bytes > MAX_SHARED_BYTES {
        return Some((
            Place::Shared,
            format!(
                "shared memory comes out as {} bytes, more than any device gives a block ({MAX_SHARED_BYTES})",
                dims.shared_bytes
            ),
        ));
    }
    None
}

fn signed(t: ScalarType) -> bool {
    matches!(
        t,
        ScalarType::I8 | ScalarType::I16 | ScalarType::I32 | ScalarType::I64
    )
}

fn place_of(error: &EvalError) -> Place {
    match error {
        EvalError::Unmet { index } => Place::Requires(*index),
        EvalError::Arithmetic { place, .. } | EvalError::OutOfRange { place, .. } => place.clone(),
    }
}

fn describe(error: &EvalError) -> String {
    match error {
        EvalError::Unmet { .. } => "it is false".to_owned(),
        EvalError::Arithmetic { detail, .. } => format!("it cannot be computed: {detail}"),
        EvalError::OutOfRange { value, limit, .. } => {
            format!("it comes out as {value}, but must be {limit}")
        }
    }
}

/// SplitMix64: a small, seeded generator, so that a build's search is the same every time.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn size(&mut self, signed: bool) -> i64 {
        // Signed arguments (window bounds, offsets) also take -1, the usual "none".
        let pick = self.below(SIZES.len() + usize::from(signed));
        SIZES.get(pick).copied().unwrap_or(-1)
    }
}
