//! A kernel test case as plain data: the arguments of one call (inputs with their values,
//! outputs with what they must hold afterwards) and how to judge the result. The launch shape
//! is the kernel's contract's.
//!
//! Cases are made on the CPU from fresh random inputs and an f64 reference; any runner (the
//! GPU parity suite through hkload, or a future backend) uploads the inputs, poisons the outputs
//! with [`crate::host::POISON_BYTE`], launches, downloads and calls [`Case::check`].
//!
//! A [`Call`] is the same call without its data: the kernel and its arguments in the
//! signature's order (buffers by name, element type and use; values as passed). A kernel
//! family's module describes its calls once, as a function of the sizes, and makes its test
//! cases from them ([`Call::case`]); the benchmarks (`bench/`) run the same calls at their own
//! sizes, on buffers as long as the kernel's contract computes (`hkload::Kernel::extents`).

use hk_format::abi::{ScalarType, ScalarValue};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What one output buffer must hold after the launch.
#[derive(Debug, Clone)]
pub enum Expect {
    /// Every element close to the f64 reference: `|got - want| <= abs + rel * |want|`.
    Close { want: Vec<f64>, abs: f64, rel: f64 },
    /// Exactly these values (integer outputs, conversions): a NaN matches only a NaN of the
    /// same bits (so the output poison never passes for a wanted NaN, and an FP8 NaN code,
    /// which [`crate::host::fp8_value`] keeps in the payload, must be the wanted one).
    Exact(Vec<f64>),
    /// A strided output (rows `stride` elements apart, as a leading dimension makes them):
    /// element `r · stride + i` close to `want[r · row_len + i]` for `i < row_len`, as
    /// [`Expect::Close`] says; every element between and after the rows must still hold the
    /// poison (NaN), as a kernel must never write there. In this form and the others compared
    /// to a reference, a NaN in `want` marks an element the kernel must not write either (a row
    /// of an output that the call leaves alone).
    StridedClose {
        want: Vec<f64>,
        row_len: usize,
        stride: usize,
        abs: f64,
        rel: f64,
    },
    /// [`Expect::StridedClose`] with a tolerance of its own for each element (`bound[i]` for
    /// `want[i]`): for outputs whose error bound depends on the sums behind each element (the
    /// attention gradients).
    StridedBounded {
        want: Vec<f64>,
        bound: Vec<f64>,
        row_len: usize,
        stride: usize,
    },
    /// Top-k indices: `rows` rows of `k` indices into rows of `row_len` input values; each index
    /// must be in range, unique in its row, and select an input equal to the value the kernel
    /// reported at the same place (`values`, the kernel's own value output, checked separately),
    /// so ties may be broken either way.
    TopKIndices {
        input: Vec<f64>,
        row_len: usize,
        k: usize,
        values_arg: usize,
    },
}

/// One argument of the launch.
#[derive(Debug, Clone)]
pub enum CaseArg {
    /// A device buffer filled with `data` (already rounded to `elem`).
    Input {
        name: &'static str,
        elem: ScalarType,
        data: Vec<f64>,
    },
    /// A device buffer of `len` elements, poisoned before the launch.
    Output {
        name: &'static str,
        elem: ScalarType,
        len: usize,
        expect: Expect,
    },
    /// A device buffer filled with `data` that the kernel updates in place.
    InOut {
        name: &'static str,
        elem: ScalarType,
        data: Vec<f64>,
        expect: Expect,
    },
    /// A value passed by copy.
    Scalar(ScalarValue),
}

impl CaseArg {
    /// An input buffer holding `data`.
    pub fn input(name: &'static str, elem: ScalarType, data: Vec<f64>) -> Self {
        Self::Input { name, elem, data }
    }

    /// An output buffer that must come out close to `want`, within `(abs, rel)`.
    pub fn close(
        name: &'static str,
        elem: ScalarType,
        want: Vec<f64>,
        (abs, rel): (f64, f64),
    ) -> Self {
        Self::Output {
            name,
            elem,
            len: want.len(),
            expect: Expect::Close { want, abs, rel },
        }
    }
}

/// How a kernel uses one of its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only (`*const`).
    Read,
    /// Written only: what it held before the call does not matter.
    Write,
    /// Read and updated in place.
    ReadWrite,
}

impl Access {
    /// Whether the kernel reads the buffer's contents.
    pub fn reads(self) -> bool {
        self != Self::Write
    }

    /// Whether the kernel writes the buffer (`*mut`).
    pub fn writes(self) -> bool {
        self != Self::Read
    }
}

/// One argument of a [`Call`].
#[derive(Debug, Clone, PartialEq)]
pub enum CallArg {
    /// A buffer of `elem` elements; how many, the kernel's contract says for the call.
    Buffer {
        name: &'static str,
        elem: ScalarType,
        access: Access,
    },
    /// A value passed by copy.
    Scalar(ScalarValue),
}

impl CallArg {
    /// A buffer the kernel reads.
    pub fn read(name: &'static str, elem: ScalarType) -> Self {
        Self::Buffer {
            name,
            elem,
            access: Access::Read,
        }
    }

    /// A buffer the kernel writes.
    pub fn write(name: &'static str, elem: ScalarType) -> Self {
        Self::Buffer {
            name,
            elem,
            access: Access::Write,
        }
    }

    /// A buffer the kernel updates in place.
    pub fn read_write(name: &'static str, elem: ScalarType) -> Self {
        Self::Buffer {
            name,
            elem,
            access: Access::ReadWrite,
        }
    }

    /// A `u32` value: a size or a count.
    pub fn u32(value: usize) -> Self {
        let value = u32::try_from(value).unwrap_or_else(|_| panic!("{value} exceeds a u32"));
        Self::Scalar(ScalarValue::U32(value))
    }
}

/// One call of a kernel without its data: the kernel's symbol and its arguments in the
/// signature's order. [`Call::case`] makes a test case of it; a benchmark allocates each buffer
/// at the extent the kernel's contract gives for the call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub kernel: String,
    pub args: Vec<CallArg>,
}

/// What a test case puts in one buffer of its [`Call`].
#[derive(Debug, Clone)]
pub enum Fill {
    /// The data of a buffer the kernel reads.
    Input(Vec<f64>),
    /// What a buffer the kernel writes must hold afterwards (the buffer is as long as that).
    Output(Expect),
    /// The data of a buffer the kernel updates, and what it must hold afterwards.
    InOut(Vec<f64>, Expect),
}

impl Call {
    /// The test case of this call, labelled `label`, with block counts `grid` (as
    /// [`Case::grid`]): each buffer gets the fill `fills` names it with.
    ///
    /// # Panics
    ///
    /// When a buffer has no fill or two, a fill names no buffer, or a fill does not suit its
    /// buffer's [`Access`]: a mistake in the family's cases, which their tests catch.
    pub fn case(
        self,
        label: String,
        grid: [Option<u32>; 3],
        fills: impl IntoIterator<Item = (&'static str, Fill)>,
    ) -> Case {
        let mut fills: Vec<(&'static str, Fill)> = fills.into_iter().collect();
        let kernel = self.kernel;
        let args = self
            .args
            .into_iter()
            .map(|arg| {
                let (name, elem, access) = match arg {
                    CallArg::Buffer { name, elem, access } => (name, elem, access),
                    CallArg::Scalar(value) => return CaseArg::Scalar(value),
                };
                let mut named = fills.iter().enumerate().filter(|(_, (n, _))| *n == name);
                let at = match (named.next(), named.next()) {
                    (Some((at, _)), None) => at,
                    _ => panic!("{kernel}: buffer `{name}` needs exactly one fill"),
                };
                match (access, fills.remove(at).1) {
                    (Access::Read, Fill::Input(data)) => CaseArg::Input { name, elem, data },
                    (Access::Write, Fill::Output(expect)) => CaseArg::Output {
                        name,
                        elem,
                        len: expect.output_len(),
                        expect,
                    },
                    (Access::ReadWrite, Fill::InOut(data, expect)) => CaseArg::InOut {
                        name,
                        elem,
                        data,
                        expect,
                    },
                    (access, _) => panic!("{kernel}: buffer `{name}` ({access:?}) filled wrongly"),
                }
            })
            .collect();
        if let Some((name, _)) = fills.first() {
            panic!("{kernel}: a fill names `{name}`, which is no buffer of the call");
        }
        Case {
            kernel,
            label,
            args,
            grid,
        }
    }
}

/// One launch of one kernel with its inputs and expected outputs.
#[derive(Debug, Clone)]
pub struct Case {
    /// The kernel's symbol name in the bundle.
    pub kernel: String,
    /// Shape and options, for messages: `rows=7 cols=4099`.
    pub label: String,
    pub args: Vec<CaseArg>,
    /// Blocks along x, y, z instead of the contract's, where set, for kernels whose contract
    /// says that any grid is correct on that axis (their blocks stride over the work, or split
    /// K as they are told): another count than the contract's tests it.
    pub grid: [Option<u32>; 3],
}

/// ` grid=x,y,z` (`-` for the contract's) for a case that overrides the contract's grid, for
/// labels.
pub fn grid_label(grid: [Option<u32>; 3]) -> String {
    if grid.iter().all(Option::is_none) {
        return String::new();
    }
    let axes: Vec<String> = grid
        .iter()
        .map(|g| g.map_or_else(|| "-".to_owned(), |g| g.to_string()))
        .collect();
    format!(" grid={}", axes.join(","))
}

/// An output that did not match, with enough detail to start debugging.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub arg: &'static str,
    pub index: usize,
    pub got: f64,
    pub want: String,
    /// How many elements of this output were wrong.
    pub count: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} wrong elements in `{}`, first at [{}]: got {}, want {}",
            self.count, self.arg, self.index, self.got, self.want
        )
    }
}

impl Case {
    /// The case's call without its data.
    pub fn call(&self) -> Call {
        let args = self
            .args
            .iter()
            .map(|arg| match arg {
                CaseArg::Input { name, elem, .. } => CallArg::read(name, *elem),
                CaseArg::Output { name, elem, .. } => CallArg::write(name, *elem),
                CaseArg::InOut { name, elem, .. } => CallArg::read_write(name, *elem),
                CaseArg::Scalar(value) => CallArg::Scalar(*value),
            })
            .collect();
        Call {
            kernel: self.kernel.clone(),
            args,
        }
    }

    /// Judges the downloaded outputs. `outputs[i]` holds the decoded contents of argument `i`
    /// after the launch (`None` for inputs and scalars).
    pub fn check(&self, outputs: &[Option<Vec<f64>>]) -> Result<(), Mismatch> {
        for (i, arg) in self.args.iter().enumerate() {
            let (name, expect) = match arg {
                CaseArg::Output { name, expect, .. } | CaseArg::InOut { name, expect, .. } => {
                    (*name, expect)
                }
                CaseArg::Input { .. } | CaseArg::Scalar(_) => continue,
            };
            let got = outputs.get(i).and_then(Option::as_deref).unwrap_or(&[]);
            check_one(name, expect, got, outputs)?;
        }
        Ok(())
    }
}

fn check_one(
    name: &'static str,
    expect: &Expect,
    got: &[f64],
    outputs: &[Option<Vec<f64>>],
) -> Result<(), Mismatch> {
    let mut first: Option<(usize, f64, String)> = None;
    let mut count = 0;
    let mut fail = |index: usize, got: f64, want: String| {
        count += 1;
        first.get_or_insert((index, got, want));
    };
    match expect {
        Expect::Close { .. } | Expect::StridedClose { .. } | Expect::StridedBounded { .. } => {
            let Some(layout) = expect.close_layout() else {
                unreachable!("both forms are compared to a reference")
            };
            compare_len(name, got.len(), layout.len())?;
            for (i, &g) in got.iter().enumerate() {
                match layout.at(i) {
                    // A NaN reference is an element the kernel must not write: it must still
                    // hold the poison.
                    Some((w, _)) if w.is_nan() && !g.is_nan() => fail(
                        i,
                        g,
                        "the poison: the kernel must not write this element".into(),
                    ),
                    Some((w, _)) if w.is_nan() => {}
                    // Written so that NaN (an unwritten element) fails: NaN is never within.
                    // An infinite reference (a log-sum-exp over nothing) takes only itself.
                    Some((w, tolerance)) => {
                        let within = match w.is_infinite() {
                            true => g == w,
                            false => (g - w).abs() <= tolerance,
                        };
                        if !within {
                            fail(i, g, format!("{w} ± {tolerance:.3e}"));
                        }
                    }
                    None if !g.is_nan() => fail(
                        i,
                        g,
                        "the poison: this element lies outside the output".into(),
                    ),
                    None => {}
                }
            }
        }
        Expect::Exact(want) => {
            compare_len(name, got.len(), want.len())?;
            for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
                let same = g == w || (g.is_nan() && g.to_bits() == w.to_bits());
                if !same {
                    fail(i, g, w.to_string());
                }
            }
        }
        Expect::TopKIndices {
            input,
            row_len,
            k,
            values_arg,
        } => {
            let values = outputs
                .get(*values_arg)
                .and_then(Option::as_deref)
                .unwrap_or(&[]);
            compare_len(name, got.len(), values.len())?;
            for (row, (indices, vals)) in got.chunks(*k).zip(values.chunks(*k)).enumerate() {
                let mut seen = std::collections::HashSet::new();
                for (j, (&idx, &val)) in indices.iter().zip(vals).enumerate() {
                    let at = row * k + j;
                    let valid = idx >= 0.0 && (idx as usize) < *row_len && idx.fract() == 0.0;
                    if !valid || !seen.insert(idx as usize) {
                        fail(at, idx, format!("a unique index below {row_len}"));
                    } else if input[row * row_len + idx as usize] != val {
                        fail(at, idx, format!("an index whose input equals {val}"));
                    }
                }
            }
        }
    }
    match first {
        None => Ok(()),
        Some((index, got, want)) => Err(Mismatch {
            arg: name,
            index,
            got,
            want,
            count,
        }),
    }
}

/// Where the elements of a close-to-reference output are and how close each must come.
pub struct CloseLayout<'a> {
    want: &'a [f64],
    /// Each element's own tolerance, where given (else `abs + rel·|want|`).
    bound: Option<&'a [f64]>,
    row_len: usize,
    stride: usize,
    abs: f64,
    rel: f64,
}

impl CloseLayout<'_> {
    /// Elements the output holds, gaps between rows included.
    pub fn len(&self) -> usize {
        self.want.len() / self.row_len.max(1) * self.stride
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The reference value of output element `i` and its tolerance `abs + rel·|want|`; `None`
    /// for an element in a gap between rows (or past the output).
    pub fn at(&self, i: usize) -> Option<(f64, f64)> {
        let (row, col) = (i / self.stride.max(1), i % self.stride.max(1));
        let at = row * self.row_len + col;
        let want = *self.want.get(at).filter(|_| col < self.row_len)?;
        let tolerance = match self.bound {
            Some(bound) => bound[at],
            None => self.abs + self.rel * want.abs(),
        };
        Some((want, tolerance))
    }
}

impl Expect {
    /// The elements an output judged this way holds (gaps between rows included).
    pub fn output_len(&self) -> usize {
        match self {
            Self::Exact(want) => want.len(),
            Self::TopKIndices {
                input, row_len, k, ..
            } => input.len() / (*row_len).max(1) * k,
            Self::Close { .. } | Self::StridedClose { .. } | Self::StridedBounded { .. } => {
                self.close_layout().map_or(0, |layout| layout.len())
            }
        }
    }

    /// The layout of a close-to-reference output (a plain one is a single row); `None` for the
    /// forms compared otherwise.
    pub fn close_layout(&self) -> Option<CloseLayout<'_>> {
        match self {
            Self::Close { want, abs, rel } => Some(CloseLayout {
                want,
                bound: None,
                row_len: want.len(),
                stride: want.len(),
                abs: *abs,
                rel: *rel,
            }),
            Self::StridedClose {
                want,
                row_len,
                stride,
                abs,
                rel,
            } => Some(CloseLayout {
                want,
                bound: None,
                row_len: *row_len,
                stride: *stride,
                abs: *abs,
                rel: *rel,
            }),
            Self::StridedBounded {
                want,
                bound,
                row_len,
                stride,
            } => Some(CloseLayout {
                want,
                bound: Some(bound),
                row_len: *row_len,
                stride: *stride,
                abs: 0.0,
                rel: 0.0,
            }),
            Self::Exact(_) | Self::TopKIndices { .. } => None,
        }
    }
}

fn compare_len(name: &'static str, got: usize, want: usize) -> Result<(), Mismatch> {
    if got == want {
        return Ok(());
    }
    Err(Mismatch {
        arg: name,
        index: got.min(want),
        got: got as f64,
        want: format!("{want} elements"),
        count: 1,
    })
}

/// Test cases planned but not yet made: the kernels they call are known at once; their random
/// inputs and f64 references are drawn and computed by [`Planned::make`]. Making a large case
/// takes up to seconds (an attention reference over thousands of tokens), so a runner that wants
/// one family's cases, or one case of each kernel, makes only those.
///
/// Each plan draws its own seed from the planning rng, so a plan makes the same cases whichever
/// others are made, and a run repeats from its one seed.
pub struct Planned {
    kernels: Vec<String>,
    seed: u64,
    make: MakeCases,
}

/// What draws a plan's inputs and computes its references.
type MakeCases = Box<dyn FnOnce(&mut StdRng) -> Vec<Case>>;

impl Planned {
    /// Cases of `kernels` that `make` draws from a seed taken from `rng` now (cases that share
    /// inputs, as one problem's forward and gradients do, are planned together).
    pub fn new(
        kernels: impl IntoIterator<Item = String>,
        rng: &mut impl Rng,
        make: impl FnOnce(&mut StdRng) -> Vec<Case> + 'static,
    ) -> Self {
        Self {
            kernels: kernels.into_iter().collect(),
            seed: rng.random(),
            make: Box::new(make),
        }
    }

    /// One case of `kernel`, as [`Planned::new`] plans it.
    pub fn one(
        kernel: String,
        rng: &mut impl Rng,
        make: impl FnOnce(&mut StdRng) -> Case + 'static,
    ) -> Self {
        Self::new([kernel], rng, move |rng| vec![make(rng)])
    }

    /// A case made already (a family whose cases are cheap makes them eagerly).
    pub fn made(case: Case) -> Self {
        Self {
            kernels: vec![case.kernel.clone()],
            seed: 0,
            make: Box::new(|_| vec![case]),
        }
    }

    /// The kernels the cases call, in the order they are made.
    pub fn kernels(&self) -> &[String] {
        &self.kernels
    }

    /// Draws the inputs and computes the references.
    ///
    /// # Panics
    ///
    /// When the cases made call other kernels than the plan said: a mistake in the family's
    /// cases, which their tests catch.
    pub fn make(self) -> Vec<Case> {
        let cases = (self.make)(&mut StdRng::seed_from_u64(self.seed));
        let made: Vec<&str> = cases.iter().map(|c| c.kernel.as_str()).collect();
        assert_eq!(
            made, self.kernels,
            "the cases made are not the ones planned"
        );
        cases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(expect: Expect) -> Case {
        Case {
            kernel: "k".into(),
            label: String::new(),
            args: vec![CaseArg::Output {
                name: "out",
                elem: ScalarType::F32,
                len: 2,
                expect,
            }],
            grid: [None; 3],
        }
    }

    /// A plan of kernel `k` whose case expects the first value its rng draws.
    fn drawn(rng: &mut StdRng) -> Planned {
        Planned::one("k".into(), rng, |rng| {
            case(Expect::Exact(vec![rng.random(), 0.0]))
        })
    }

    fn exact(case: &Case) -> &[f64] {
        match &case.args[0] {
            CaseArg::Output {
                expect: Expect::Exact(want),
                ..
            } => want,
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_plan_makes_the_same_case_whichever_plans_before_it_are_made() {
        let plans = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            [drawn(&mut rng), drawn(&mut rng)]
        };
        let [first, second] = plans(9);
        let both = [first.make(), second.make()];
        let [_, alone] = plans(9);
        assert_eq!(exact(&alone.make()[0]), exact(&both[1][0]));
        assert_ne!(exact(&both[0][0]), exact(&both[1][0]));
    }

    #[test]
    #[should_panic(expected = "the cases made are not the ones planned")]
    fn a_plan_that_makes_another_kernel_is_a_mistake() {
        let mut rng = StdRng::seed_from_u64(1);
        Planned::new(["other".to_owned()], &mut rng, |_| {
            vec![case(Expect::Exact(vec![0.0; 2]))]
        })
        .make();
    }

    #[test]
    fn close_accepts_tolerance_and_refuses_nan() {
        let c = case(Expect::Close {
            want: vec![1.0, 2.0],
            abs: 0.0,
            rel: 1e-3,
        });
        assert!(c.check(&[Some(vec![1.0005, 2.0])]).is_ok());
        let err = c.check(&[Some(vec![1.0, f64::NAN])]).unwrap_err();
        assert_eq!((err.index, err.count), (1, 1));
        assert!(
            c.check(&[Some(vec![1.0])]).is_err(),
            "short output must fail"
        );
    }

    #[test]
    fn an_infinite_reference_takes_only_itself() {
        let c = case(Expect::Close {
            want: vec![f64::NEG_INFINITY],
            abs: 1e-3,
            rel: 1e-3,
        });
        assert!(c.check(&[Some(vec![f64::NEG_INFINITY])]).is_ok());
        for got in [-1e30, 0.0, f64::INFINITY, f64::NAN] {
            assert!(c.check(&[Some(vec![got])]).is_err(), "{got}");
        }
    }

    #[test]
    fn strided_close_refuses_writes_between_rows() {
        let c = case(Expect::StridedClose {
            want: vec![1.0, 2.0],
            row_len: 1,
            stride: 2,
            abs: 0.0,
            rel: 1e-3,
        });
        assert!(c.check(&[Some(vec![1.0, f64::NAN, 2.0, f64::NAN])]).is_ok());
        let err = c.check(&[Some(vec![1.0, 0.0, 2.0, f64::NAN])]).unwrap_err();
        assert_eq!((err.index, err.count), (1, 1));
        assert!(
            c.check(&[Some(vec![1.0, f64::NAN, f64::NAN, f64::NAN])])
                .is_err()
        );
    }

    #[test]
    fn a_call_becomes_a_case_and_back() {
        let call = Call {
            kernel: "k".into(),
            args: vec![
                CallArg::write("out", ScalarType::F32),
                CallArg::read_write("acc", ScalarType::F32),
                CallArg::read("x", ScalarType::Bf16),
                CallArg::u32(3),
            ],
        };
        let expect = || Expect::Close {
            want: vec![1.0, 2.0, 3.0],
            abs: 0.0,
            rel: 0.0,
        };
        let case = call.clone().case(
            "n=3".into(),
            [None; 3],
            [
                ("x", Fill::Input(vec![0.5; 3])),
                ("out", Fill::Output(expect())),
                ("acc", Fill::InOut(vec![0.0; 3], expect())),
            ],
        );
        assert_eq!(case.call(), call);
        assert!(matches!(case.args[0], CaseArg::Output { len: 3, .. }));
        assert!(matches!(&case.args[1], CaseArg::InOut { data, .. } if data.len() == 3));
        assert!(matches!(&case.args[2], CaseArg::Input { name: "x", .. }));
        assert!(Access::ReadWrite.reads() && Access::ReadWrite.writes());
        assert!(!Access::Read.writes() && !Access::Write.reads());
    }

    #[test]
    #[should_panic(expected = "buffer `x` (Read) filled wrongly")]
    fn a_fill_must_suit_its_buffer() {
        let call = Call {
            kernel: "k".into(),
            args: vec![CallArg::read("x", ScalarType::F32)],
        };
        call.case(
            String::new(),
            [None; 3],
            [("x", Fill::Output(Expect::Exact(vec![])))],
        );
    }

    #[test]
    #[should_panic(expected = "a fill names `y`")]
    fn every_fill_must_name_a_buffer() {
        let call = Call {
            kernel: "k".into(),
            args: vec![CallArg::read("x", ScalarType::F32)],
        };
        call.case(
            String::new(),
            [None; 3],
            [("x", Fill::Input(vec![])), ("y", Fill::Input(vec![]))],
        );
    }

    #[test]
    fn output_lengths_follow_the_expectation() {
        let strided = Expect::StridedClose {
            want: vec![0.0; 6],
            row_len: 3,
            stride: 5,
            abs: 0.0,
            rel: 0.0,
        };
        assert_eq!(strided.output_len(), 10);
        let topk = Expect::TopKIndices {
            input: vec![0.0; 12],
            row_len: 4,
            k: 2,
            values_arg: 0,
        };
        assert_eq!(topk.output_len(), 6);
        assert_eq!(Expect::Exact(vec![0.0; 7]).output_len(), 7);
    }

    #[test]
    fn topk_indices_allow_ties_but_not_repeats() {
        let input = vec![5.0, 7.0, 7.0, 1.0];
        let mut c = case(Expect::TopKIndices {
            input,
            row_len: 4,
            k: 2,
            values_arg: 1,
        });
        c.args.push(CaseArg::Output {
            name: "values",
            elem: ScalarType::F32,
            len: 2,
            expect: Expect::Exact(vec![7.0, 7.0]),
        });
        let values = Some(vec![7.0, 7.0]);
        assert!(c.check(&[Some(vec![2.0, 1.0]), values.clone()]).is_ok());
        assert!(c.check(&[Some(vec![1.0, 1.0]), values.clone()]).is_err());
        assert!(c.check(&[Some(vec![0.0, 1.0]), values]).is_err());
    }
}
