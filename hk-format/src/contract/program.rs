//! A contract bound to a kernel's signature: names resolved to argument, `let` and fact slots,
//! types checked, the expressions flattened into one array of nodes. Evaluating it allocates
//! nothing and parses nothing; every operation is checked.

use super::LaunchDims;
use crate::abi::{Param, ParamType, ScalarType};

use super::expr::{BinaryOp, Expr, Function, MAX_DEPTH};
use super::{BindError, Contract, Fact, Place, describe, is_identifier};

/// At most this many `let` values (their results are kept on the stack during a call).
pub const MAX_LETS: usize = 32;

/// At most this many arguments in a kernel with a contract (their values are kept on the stack
/// during a call).
pub const MAX_PARAMS: usize = 64;

/// A bound contract, ready to evaluate (see [`super::Contract::bind`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    nodes: Vec<Node>,
    lets: Vec<NodeId>,
    requires: Vec<NodeId>,
    block: [NodeId; 3],
    grid: [NodeId; 3],
    shared: NodeId,
    /// Per parameter: the root of its extent (pointers) or `None` (values).
    extents: Vec<Option<NodeId>>,
    /// Every name the contract can read and where its value is, for messages.
    names: Vec<(String, Slot)>,
}

type NodeId = u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Int(i64),
    Slot(Slot),
    Neg(NodeId),
    Not(NodeId),
    Binary(BinaryOp, NodeId, NodeId),
    Min(NodeId, NodeId),
    Max(NodeId, NodeId),
    CeilDiv(NodeId, NodeId),
    NextPow2(NodeId),
    Cond(NodeId, NodeId, NodeId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Arg(u16),
    Let(u16),
    Fact(Fact),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Int,
    Bool,
}

impl Ty {
    const fn name(self) -> &'static str {
        match self {
            Self::Int => "an integer",
            Self::Bool => "a condition",
        }
    }
}

struct Binder<'a> {
    signature: &'a [Param],
    lets: Vec<(&'a str, Ty)>,
    nodes: Vec<Node>,
    place: Place,
}

impl Program {
    pub(super) fn bind(contract: &Contract, signature: &[Param]) -> Result<Self, BindError> {
        let whole = |message: String| BindError {
            place: Place::Contract,
            name: None,
            message,
        };
        if signature.len() > MAX_PARAMS {
            return Err(whole(format!(
                "a kernel with a contract takes at most {MAX_PARAMS} arguments, this one {}",
                signature.len()
            )));
        }
        if contract.lets.len() > MAX_LETS {
            return Err(whole(format!(
                "a contract has at most {MAX_LETS} `let` values, this one {}",
                contract.lets.len()
            )));
        }
        let mut binder = Binder {
            signature,
            lets: Vec::new(),
            nodes: Vec::new(),
            place: Place::Contract,
        };
        let mut lets = Vec::with_capacity(contract.lets.len());
        for binding in &contract.lets {
            binder.place = Place::Let(binding.name.clone());
            binder.check_new_name(&binding.name)?;
            let (root, ty) = binder.bind(&binding.value, 0)?;
            lets.push(root);
            binder.lets.push((&binding.name, ty));
        }
        let mut requires = Vec::with_capacity(contract.requires.len());
        for (i, requirement) in contract.requires.iter().enumerate() {
            binder.place = Place::Requires(i);
            requires.push(binder.typed(&requirement.check, Ty::Bool)?);
        }
        let mut block = [0; 3];
        let mut grid = [0; 3];
        for axis in 0..3 {
            binder.place = Place::Block(axis);
            block[axis] = binder.typed(&contract.block[axis], Ty::Int)?;
            binder.place = Place::Grid(axis);
            grid[axis] = binder.typed(&contract.grid[axis], Ty::Int)?;
        }
        binder.place = Place::Shared;
        let shared = binder.typed(&contract.shared, Ty::Int)?;
        let mut extents = vec![None; signature.len()];
        for extent in &contract.extents {
            binder.place = Place::Extent(extent.name.clone());
            let error = |message: String| BindError {
                place: Place::Extent(extent.name.clone()),
                name: Some(extent.name.clone()),
                message,
            };
            let Some(index) = signature.iter().position(|p| p.name == extent.name) else {
                return Err(error(format!(
                    "the kernel has no argument `{}`",
                    extent.name
                )));
            };
            if !signature[index].ty.is_pointer() {
                return Err(error(format!(
                    "{}: only pointers have extents",
                    describe(&signature[index])
                )));
            }
            if extents[index].is_some() {
                return Err(error(format!("`{}` has two extents", extent.name)));
            }
            extents[index] = Some(binder.typed(&extent.value, Ty::Int)?);
        }
        if let Some(missing) = signature
            .iter()
            .zip(&extents)
            .find(|(p, e)| p.ty.is_pointer() && e.is_none())
        {
            return Err(BindError {
                place: Place::Contract,
                name: Some(missing.0.name.clone()),
                message: format!(
                    "pointer `{}` has no extent: say how many elements the kernel may touch, as in `{}: {} [rows * cols]`",
                    missing.0.name, missing.0.name, missing.0.ty
                ),
            });
        }
        let mut names: Vec<(String, Slot)> = signature
            .iter()
            .enumerate()
            .filter(|(_, p)| integer(p).is_some())
            .map(|(i, p)| (p.name.clone(), Slot::Arg(i as u16)))
            .collect();
        names.extend(
            contract
                .lets
                .iter()
                .enumerate()
                .map(|(i, b)| (b.name.clone(), Slot::Let(i as u16))),
        );
        names.extend(Fact::ALL.map(|f| (f.name().to_owned(), Slot::Fact(f))));
        Ok(Self {
            nodes: binder.nodes,
            lets,
            requires,
            block,
            grid,
            shared,
            extents,
            names,
        })
    }

    /// Starts evaluating the contract for one call: `args` holds each parameter's value as a
    /// 64-bit integer (anything for pointers and floating-point values, which no expression
    /// reads).
    pub fn run<'a>(&'a self, args: &'a [i64], facts: &'a Facts) -> Run<'a> {
        Run {
            program: self,
            args,
            facts,
            known: 0,
            lets: [0; MAX_LETS],
        }
    }
}

/// What a fact is: a count, or (`arch_specific`) a condition, which evaluates to 1 or 0.
const fn fact_type(fact: Fact) -> Ty {
    match fact {
        Fact::WaveSize | Fact::ComputeUnits | Fact::MaxBlockThreads => Ty::Int,
        Fact::ArchSpecific => Ty::Bool,
    }
}

/// The integer type of a parameter a contract may read, if it is one.
fn integer(param: &Param) -> Option<ScalarType> {
    match param.ty {
        ParamType::Scalar(t) if t.is_integer() => Some(t),
        _ => None,
    }
}

impl<'a> Binder<'a> {
    fn error(&self, name: Option<&str>, message: String) -> BindError {
        BindError {
            place: self.place.clone(),
            name: name.map(str::to_owned),
            message,
        }
    }

    fn check_new_name(&self, name: &str) -> Result<(), BindError> {
        let clash = if !is_identifier(name) {
            Some("is not a name".to_owned())
        } else if let Some(p) = self.signature.iter().find(|p| p.name == name) {
            Some(format!("would hide an argument: {}", describe(p)))
        } else if Fact::ALL.iter().any(|f| f.name() == name) {
            Some("would hide a device fact".to_owned())
        } else if Function::from_name(name).is_some() {
            Some("is a function".to_owned())
        } else if self.lets.iter().any(|(n, _)| *n == name) {
            Some("is already defined by an earlier `let`".to_owned())
        } else {
            None
        };
        match clash {
            Some(why) => Err(self.error(Some(name), format!("`{name}` {why}"))),
            None => Ok(()),
        }
    }

    fn typed(&mut self, expr: &Expr, want: Ty) -> Result<NodeId, BindError> {
        let (id, ty) = self.bind(expr, 0)?;
        if ty == want {
            Ok(id)
        } else {
            Err(self.error(
                None,
                format!("`{expr}` is {} where {} is needed", ty.name(), want.name()),
            ))
        }
    }

    fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        (self.nodes.len() - 1) as NodeId
    }

    /// `node` with constant operands replaced by its value, so that a contract that overflows
    /// or divides by zero whatever the call passes is refused when it is bound (by hkpack, at
    /// build time) rather than at every call.
    fn fold(&self, node: Node, expr: &Expr) -> Result<Node, BindError> {
        let constant = |id: NodeId| match self.nodes.get(id as usize) {
            Some(Node::Int(v)) => Some(*v),
            _ => None,
        };
        let operands: &[NodeId] = match &node {
            Node::Int(_) | Node::Slot(_) => return Ok(node),
            Node::Neg(a) | Node::Not(a) | Node::NextPow2(a) => &[*a],
            Node::Binary(_, a, b) | Node::Min(a, b) | Node::Max(a, b) | Node::CeilDiv(a, b) => {
                &[*a, *b]
            }
            Node::Cond(c, a, b) => &[*c, *a, *b],
        };
        let by_zero = match node {
            Node::Binary(BinaryOp::Div | BinaryOp::Rem, _, b) | Node::CeilDiv(_, b) => {
                constant(b) == Some(0)
            }
            _ => false,
        };
        if by_zero {
            return Err(self.error(None, format!("`{expr}` divides by zero")));
        }
        if operands.iter().any(|&id| constant(id).is_none()) {
            return Ok(node);
        }
        apply::<Explained>(node, |id| Ok(constant(id).unwrap_or(0)))
            .map(Node::Int)
            .map_err(|fault| self.error(None, format!("`{expr}` cannot be computed: {fault}")))
    }

    fn operand(
        &mut self,
        expr: &Expr,
        want: Ty,
        context: &Expr,
        depth: usize,
    ) -> Result<NodeId, BindError> {
        let (id, ty) = self.bind(expr, depth + 1)?;
        if ty != want {
            return Err(self.error(
                None,
                format!(
                    "in `{context}`, `{expr}` is {} where {} is needed",
                    ty.name(),
                    want.name()
                ),
            ));
        }
        Ok(id)
    }

    fn bind(&mut self, expr: &Expr, depth: usize) -> Result<(NodeId, Ty), BindError> {
        if depth > MAX_DEPTH {
            return Err(self.error(
                None,
                format!("the expression nests deeper than {MAX_DEPTH} levels"),
            ));
        }
        let (node, ty) = match expr {
            Expr::Int(value) => (Node::Int(*value), Ty::Int),
            Expr::Name(name) => {
                let (slot, ty) = self.name(name)?;
                (Node::Slot(slot), ty)
            }
            Expr::Neg(e) => (Node::Neg(self.operand(e, Ty::Int, expr, depth)?), Ty::Int),
            Expr::Not(e) => (Node::Not(self.operand(e, Ty::Bool, expr, depth)?), Ty::Bool),
            Expr::Binary(op, a, b) => {
                let (operands, result) = match op {
                    BinaryOp::And | BinaryOp::Or => (Ty::Bool, Ty::Bool),
                    op if op.is_comparison() => (Ty::Int, Ty::Bool),
                    _ => (Ty::Int, Ty::Int),
                };
                let a = self.operand(a, operands, expr, depth)?;
                let b = self.operand(b, operands, expr, depth)?;
                (Node::Binary(*op, a, b), result)
            }
            Expr::Call(function, args) => (self.call(*function, args, expr, depth)?, Ty::Int),
            Expr::Cond(c, a, b) => {
                let c = self.operand(c, Ty::Bool, expr, depth)?;
                let (a, ty) = self.bind(a, depth + 1)?;
                let b = self.operand(b, ty, expr, depth)?;
                (Node::Cond(c, a, b), ty)
            }
        };
        let node = self.fold(node, expr)?;
        Ok((self.push(node), ty))
    }

    fn call(
        &mut self,
        function: Function,
        args: &[Expr],
        expr: &Expr,
        depth: usize,
    ) -> Result<Node, BindError> {
        function
            .check_arity(args.len())
            .map_err(|message| self.error(None, message))?;
        if function == Function::ElemSize {
            let pointee = match &args[0] {
                Expr::Name(name) => self
                    .signature
                    .iter()
                    .find(|p| &p.name == name)
                    .and_then(|p| match p.ty {
                        ParamType::Pointer { pointee, .. } => Some(pointee),
                        ParamType::Scalar(_) => None,
                    }),
                _ => None,
            };
            return pointee
                .map(|t| Node::Int(i64::from(t.size())))
                .ok_or_else(|| {
                    self.error(
                        None,
                        format!("`{expr}`: `elem_size` takes the name of a pointer argument"),
                    )
                });
        }
        let mut ids = [0; 2];
        for (slot, arg) in ids.iter_mut().zip(args) {
            *slot = self.operand(arg, Ty::Int, expr, depth)?;
        }
        let [a, b] = ids;
        Ok(match function {
            Function::Min => Node::Min(a, b),
            Function::Max => Node::Max(a, b),
            Function::CeilDiv => Node::CeilDiv(a, b),
            Function::NextPow2 => Node::NextPow2(a),
            Function::ElemSize => unreachable!("handled above"),
        })
    }

    fn name(&self, name: &str) -> Result<(Slot, Ty), BindError> {
        if let Some(i) = self.lets.iter().position(|(n, _)| *n == name) {
            return Ok((Slot::Let(i as u16), self.lets[i].1));
        }
        if let Some(fact) = Fact::ALL.into_iter().find(|f| f.name() == name) {
            return Ok((Slot::Fact(fact), fact_type(fact)));
        }
        if let Some(i) = self.signature.iter().position(|p| p.name == name) {
            let param = &self.signature[i];
            return match integer(param) {
                Some(_) => Ok((Slot::Arg(i as u16), Ty::Int)),
                None => Err(self.error(
                    Some(name),
                    format!(
                        "{}; contracts compute with the integer arguments{}",
                        describe(param),
                        if param.ty.is_pointer() {
                            format!(" (`elem_size({name})` is the size of its elements)")
                        } else {
                            String::new()
                        }
                    ),
                )),
            };
        }
        let mut known: Vec<&str> = self
            .signature
            .iter()
            .filter(|p| integer(p).is_some())
            .map(|p| p.name.as_str())
            .collect();
        known.extend(self.lets.iter().map(|(n, _)| *n));
        known.extend(Fact::ALL.iter().map(|f| f.name()));
        Err(self.error(
            Some(name),
            format!(
                "unknown name `{name}`; the contract can read {}",
                known.join(", ")
            ),
        ))
    }
}

/// The facts of the device and code object a kernel runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub wave_size: u32,
    pub compute_units: u32,
    pub max_block_threads: u32,
    /// Whether the code object is built for an architecture-specific target (`sm_90a`).
    pub arch_specific: bool,
}

/// Why a contract could not be evaluated, or said no.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvalError {
    /// Requirement `index` is false.
    Unmet { index: usize },
    /// An operation had no 64-bit result: `a op b` overflows, or divides by zero.
    Arithmetic { place: Place, detail: String },
    /// A size came out negative or too large for the launch (block, grid, shared memory) or
    /// for the address space (extents).
    OutOfRange {
        place: Place,
        value: i64,
        limit: &'static str,
    },
}

/// One evaluation of a contract: the call's argument values, the device's facts, and the `let`
/// values computed so far (each once, when first read).
pub struct Run<'a> {
    program: &'a Program,
    args: &'a [i64],
    facts: &'a Facts,
    /// Bit `i` says that `lets[i]` holds the value of `let` `i`.
    known: u32,
    lets: [i64; MAX_LETS],
}

/// How evaluation reports an arithmetic fault: not at all on the way of every call (`Quiet`,
/// whose error costs nothing to return), and in words once an error is to be reported
/// (`Explained`, which evaluates the failed expression again).
trait Faults {
    type Error;
    fn fault(explain: impl FnOnce() -> String) -> Self::Error;
}

struct Quiet;

impl Faults for Quiet {
    type Error = ();
    fn fault(_: impl FnOnce() -> String) {}
}

struct Explained;

impl Faults for Explained {
    type Error = String;
    fn fault(explain: impl FnOnce() -> String) -> String {
        explain()
    }
}

impl Run<'_> {
    /// Checks every requirement in order.
    pub fn check_requirements(&mut self) -> Result<(), EvalError> {
        for (index, &root) in self.program.requires.iter().enumerate() {
            if self.value(root, || Place::Requires(index))? == 0 {
                return Err(EvalError::Unmet { index });
            }
        }
        Ok(())
    }

    /// The launch shape: block, grid and shared memory, each fitting in 32 bits.
    pub fn shape(&mut self) -> Result<LaunchDims, EvalError> {
        let mut dims = LaunchDims::linear(0, 0);
        for axis in 0..3 {
            dims.block[axis] = self.u32_at(self.program.block[axis], || Place::Block(axis))?;
            dims.grid[axis] = self.u32_at(self.program.grid[axis], || Place::Grid(axis))?;
        }
        dims.shared_bytes = self.u32_at(self.program.shared, || Place::Shared)?;
        Ok(dims)
    }

    /// The elements parameter `index` must hold, if it is a pointer.
    pub fn extent(&mut self, index: usize, name: &str) -> Result<Option<u64>, EvalError> {
        let Some(&Some(root)) = self.program.extents.get(index) else {
            return Ok(None);
        };
        let place = || Place::Extent(name.to_owned());
        let value = self.value(root, place)?;
        u64::try_from(value)
            .map(Some)
            .map_err(|_| EvalError::OutOfRange {
                place: place(),
                value,
                limit: "at least 0",
            })
    }

    /// `name = value` for every name in `names` the contract can read, for messages.
    pub fn values(&mut self, names: &[&str]) -> String {
        let mut shown: Vec<&str> = Vec::new();
        let mut out = Vec::new();
        for &name in names {
            if shown.contains(&name) {
                continue;
            }
            shown.push(name);
            let slot = self
                .program
                .names
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| *s);
            if let Some(slot) = slot {
                match self.slot::<Explained>(slot) {
                    Ok(v) => out.push(format!("{name} = {v}")),
                    Err(fault) => out.push(format!("{name}: {fault}")),
                }
            }
        }
        out.join(", ")
    }

    /// The value of the expression at `root`; a fault is evaluated again to be explained.
    fn value(&mut self, root: NodeId, place: impl FnOnce() -> Place) -> Result<i64, EvalError> {
        match self.eval::<Quiet>(root) {
            Ok(value) => Ok(value),
            Err(()) => Err(EvalError::Arithmetic {
                place: place(),
                detail: self
                    .eval::<Explained>(root)
                    .err()
                    .unwrap_or_else(|| "the value changed when evaluated again".into()),
            }),
        }
    }

    fn u32_at(&mut self, root: NodeId, place: impl Fn() -> Place) -> Result<u32, EvalError> {
        let value = self.value(root, &place)?;
        u32::try_from(value).map_err(|_| EvalError::OutOfRange {
            place: place(),
            value,
            limit: "from 0 to 4294967295",
        })
    }

    fn slot<F: Faults>(&mut self, slot: Slot) -> Result<i64, F::Error> {
        Ok(match slot {
            Slot::Arg(i) => self.args.get(usize::from(i)).copied().unwrap_or(0),
            Slot::Let(i) => {
                let i = usize::from(i);
                if self.known & (1 << i) != 0 {
                    self.lets[i]
                } else {
                    let value = match self.eval::<F>(self.program.lets[i]) {
                        Ok(value) => value,
                        Err(_) => {
                            return Err(F::fault(|| {
                                let detail = self
                                    .eval::<Explained>(self.program.lets[i])
                                    .err()
                                    .unwrap_or_default();
                                format!("{detail} (computing `let {}`)", self.let_name(i))
                            }));
                        }
                    };
                    self.lets[i] = value;
                    self.known |= 1 << i;
                    value
                }
            }
            Slot::Fact(Fact::WaveSize) => i64::from(self.facts.wave_size),
            Slot::Fact(Fact::ComputeUnits) => i64::from(self.facts.compute_units),
            Slot::Fact(Fact::MaxBlockThreads) => i64::from(self.facts.max_block_threads),
            Slot::Fact(Fact::ArchSpecific) => i64::from(self.facts.arch_specific),
        })
    }

    fn let_name(&self, i: usize) -> &str {
        self.program
            .names
            .iter()
            .find(|(_, s)| *s == Slot::Let(i as u16))
            .map_or("?", |(n, _)| n.as_str())
    }

    fn eval<F: Faults>(&mut self, id: NodeId) -> Result<i64, F::Error> {
        // Nodes are bound children first, so a child's id is always below its parent's: the
        // recursion is as deep as the expression, which binding bounded.
        match self.program.nodes[id as usize] {
            Node::Slot(slot) => self.slot::<F>(slot),
            node => apply::<F>(node, |child| self.eval::<F>(child)),
        }
    }
}

/// The value of `node` (anything but a slot), reading each operand through `operand` only when
/// it decides the result: the conditional evaluates one branch, `&&` and `||` stop early.
#[inline]
fn apply<F: Faults>(
    node: Node,
    mut operand: impl FnMut(NodeId) -> Result<i64, F::Error>,
) -> Result<i64, F::Error> {
    let checked = |result: Option<i64>, a: i64, op: &str, b: i64| {
        result.ok_or_else(|| {
            F::fault(|| {
                if b == 0 && matches!(op, "/" | "%") {
                    format!("{a} {op} {b} divides by zero")
                } else {
                    format!("{a} {op} {b} does not fit in 64 bits")
                }
            })
        })
    };
    match node {
        Node::Int(v) => Ok(v),
        Node::Slot(_) => Err(F::fault(|| {
            "a value is read before the call gives it".into()
        })),
        Node::Neg(a) => {
            let a = operand(a)?;
            a.checked_neg()
                .ok_or_else(|| F::fault(|| format!("-({a}) does not fit in 64 bits")))
        }
        Node::Not(a) => Ok(i64::from(operand(a)? == 0)),
        Node::Binary(BinaryOp::And, a, b) => Ok(i64::from(operand(a)? != 0 && operand(b)? != 0)),
        Node::Binary(BinaryOp::Or, a, b) => Ok(i64::from(operand(a)? != 0 || operand(b)? != 0)),
        Node::Binary(op, a, b) => {
            let (a, b) = (operand(a)?, operand(b)?);
            let symbol = op.symbol();
            match op {
                BinaryOp::Add => checked(a.checked_add(b), a, symbol, b),
                BinaryOp::Sub => checked(a.checked_sub(b), a, symbol, b),
                BinaryOp::Mul => checked(a.checked_mul(b), a, symbol, b),
                BinaryOp::Div => checked(a.checked_div(b), a, symbol, b),
                // The remainder of i64::MIN by -1 is 0, though Rust's checked_rem says no.
                BinaryOp::Rem if b == -1 => Ok(0),
                BinaryOp::Rem => checked(a.checked_rem(b), a, symbol, b),
                BinaryOp::Eq => Ok(i64::from(a == b)),
                BinaryOp::Ne => Ok(i64::from(a != b)),
                BinaryOp::Lt => Ok(i64::from(a < b)),
                BinaryOp::Le => Ok(i64::from(a <= b)),
                BinaryOp::Gt => Ok(i64::from(a > b)),
                BinaryOp::Ge => Ok(i64::from(a >= b)),
                BinaryOp::And | BinaryOp::Or => unreachable!("evaluated lazily above"),
            }
        }
        Node::Min(a, b) => Ok(operand(a)?.min(operand(b)?)),
        Node::Max(a, b) => Ok(operand(a)?.max(operand(b)?)),
        Node::CeilDiv(a, b) => {
            let (a, b) = (operand(a)?, operand(b)?);
            ceil_div(a, b).ok_or_else(|| {
                F::fault(|| {
                    if b == 0 {
                        format!("ceil_div({a}, {b}) divides by zero")
                    } else {
                        format!("ceil_div({a}, {b}) does not fit in 64 bits")
                    }
                })
            })
        }
        Node::NextPow2(a) => {
            let a = operand(a)?;
            next_pow2(a)
                .ok_or_else(|| F::fault(|| format!("next_pow2({a}) does not fit in 64 bits")))
        }
        Node::Cond(c, a, b) => {
            if operand(c)? != 0 {
                operand(a)
            } else {
                operand(b)
            }
        }
    }
}

/// `a / b` rounded towards positive infinity (for any signs), `None` on overflow or `b == 0`.
pub fn ceil_div(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div(b)?;
    let r = a.checked_rem(b)?;
    // The quotient truncates towards zero: round up when the exact one was positive.
    if r != 0 && ((r > 0) == (b > 0)) {
        q.checked_add(1)
    } else {
        Some(q)
    }
}

/// The smallest power of two at least `a` (1 for `a <= 1`), `None` past 2⁶².
pub fn next_pow2(a: i64) -> Option<i64> {
    if a <= 1 {
        return Some(1);
    }
    let p = (a as u64).checked_next_power_of_two()?;
    i64::try_from(p).ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::contract::{Binding, Requirement};

    const NAMES: [&str; 3] = ["a", "b", "c"];

    fn signature() -> Vec<Param> {
        NAMES
            .iter()
            .map(|n| format!("{n}: i64").parse().unwrap())
            .collect()
    }

    /// A contract whose only `let` is `expr`, so that evaluating the let evaluates it.
    fn contract(expr: Expr) -> Contract {
        let one = || Expr::Int(1);
        Contract {
            lets: vec![Binding {
                name: "value".into(),
                value: expr,
            }],
            requires: Vec::<Requirement>::new(),
            block: [one(), one(), one()],
            grid: [one(), one(), one()],
            shared: Expr::Int(0),
            extents: Vec::new(),
        }
    }

    #[test]
    fn arch_specific_is_a_condition_read_from_the_facts() {
        let signature = signature();
        let text = |t: &str| t.parse::<Expr>().unwrap();
        let program = Program::bind(&contract(text("arch_specific ? 128 : 64")), &signature)
            .unwrap_or_else(|e| panic!("{e}"));
        for (arch_specific, expected) in [(true, 128), (false, 64)] {
            let facts = Facts {
                wave_size: 32,
                compute_units: 132,
                max_block_threads: 1024,
                arch_specific,
            };
            let mut run = program.run(&[0; 3], &facts);
            assert_eq!(run.slot::<Quiet>(Slot::Let(0)).ok(), Some(expected));
        }
        // A condition, not a count: arithmetic on it is refused when the manifest is built.
        let error = Program::bind(&contract(text("arch_specific * 64")), &signature).unwrap_err();
        assert!(
            error
                .message
                .contains("`arch_specific` is a condition where an integer is needed"),
            "{error}"
        );
    }

    /// The deepest trees the parser accepts bind and evaluate on a thread with the default
    /// 2 MiB stack: [`MAX_DEPTH`] bounds that recursion.
    #[test]
    fn the_deepest_expressions_bind_and_evaluate_on_a_small_stack() {
        // Each call nests the parser two levels (`expr`, then `unary`).
        let calls = MAX_DEPTH / 2 - 1;
        let deepest = [
            (vec!["a"; MAX_DEPTH].join(" + "), MAX_DEPTH as i64),
            (
                format!("{}a{}", "max(a, ".repeat(calls), ")".repeat(calls)),
                1,
            ),
        ];
        for (text, expected) in deepest {
            let value = std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(move || {
                    let expr = text.parse().unwrap();
                    let program = Program::bind(&contract(expr), &signature()).unwrap();
                    let facts = Facts {
                        wave_size: 32,
                        compute_units: 132,
                        max_block_threads: 1024,
                        arch_specific: false,
                    };
                    program
                        .run(&[1; 3], &facts)
                        .slot::<Quiet>(Slot::Let(0))
                        .ok()
                })
                .unwrap()
                .join()
                .unwrap();
            assert_eq!(value, Some(expected));
        }
    }

    /// The reference: exact arithmetic in i128, refusing any value outside i64 (the checked
    /// evaluator's only faults), division by zero included.
    fn reference(expr: &Expr, args: &[i64; 3]) -> Option<i128> {
        let fit = |v: i128| {
            (i128::from(i64::MIN)..=i128::from(i64::MAX))
                .contains(&v)
                .then_some(v)
        };
        let truth = |v: bool| Some(i128::from(v));
        Some(match expr {
            Expr::Int(v) => i128::from(*v),
            Expr::Name(n) => i128::from(args[NAMES.iter().position(|x| x == n)?]),
            Expr::Neg(e) => fit(-reference(e, args)?)?,
            Expr::Not(e) => truth(reference(e, args)? == 0)?,
            Expr::Binary(BinaryOp::And, a, b) => {
                truth(reference(a, args)? != 0 && reference(b, args)? != 0)?
            }
            Expr::Binary(BinaryOp::Or, a, b) => {
                truth(reference(a, args)? != 0 || reference(b, args)? != 0)?
            }
            Expr::Binary(op, a, b) => {
                let (a, b) = (reference(a, args)?, reference(b, args)?);
                match op {
                    BinaryOp::Add => fit(a + b)?,
                    BinaryOp::Sub => fit(a - b)?,
                    BinaryOp::Mul => fit(a.checked_mul(b)?)?,
                    BinaryOp::Div => fit(a.checked_div(b)?)?,
                    BinaryOp::Rem => fit(a.checked_rem(b)?)?,
                    BinaryOp::Eq => truth(a == b)?,
                    BinaryOp::Ne => truth(a != b)?,
                    BinaryOp::Lt => truth(a < b)?,
                    BinaryOp::Le => truth(a <= b)?,
                    BinaryOp::Gt => truth(a > b)?,
                    BinaryOp::Ge => truth(a >= b)?,
                    BinaryOp::And | BinaryOp::Or => unreachable!(),
                }
            }
            Expr::Call(f, args_) => {
                let a = reference(&args_[0], args)?;
                match f {
                    Function::Min => a.min(reference(&args_[1], args)?),
                    Function::Max => a.max(reference(&args_[1], args)?),
                    Function::CeilDiv => {
                        let b = reference(&args_[1], args)?;
                        let q = a.checked_div(b)?;
                        fit(if a % b != 0 && ((a % b > 0) == (b > 0)) {
                            q + 1
                        } else {
                            q
                        })?
                    }
                    Function::NextPow2 => fit(if a <= 1 {
                        1
                    } else {
                        (a as u128).next_power_of_two() as i128
                    })?,
                    Function::ElemSize => return None,
                }
            }
            Expr::Cond(c, a, b) => {
                if reference(c, args)? != 0 {
                    reference(a, args)?
                } else {
                    reference(b, args)?
                }
            }
        })
    }

    fn value() -> impl Strategy<Value = i64> {
        prop_oneof![
            -4i64..=4,
            Just(i64::MAX),
            Just(i64::MIN),
            Just(1 << 32),
            Just(1 << 62),
            any::<i64>(),
        ]
    }

    /// Integer expressions over `a`, `b`, `c`; conditions inside conditionals, `!`, `&&`, `||`.
    fn integer() -> impl Strategy<Value = Expr> {
        let leaf = prop_oneof![
            value().prop_map(|v| Expr::Int(v.max(0))),
            proptest::sample::select(&NAMES[..]).prop_map(|n| Expr::Name(n.to_owned())),
        ];
        leaf.prop_recursive(5, 48, 3, |inner| {
            let ops = |comparisons: bool| {
                let ops: Vec<BinaryOp> = BinaryOp::ALL
                    .into_iter()
                    .filter(|op| op.is_comparison() == comparisons)
                    .filter(|op| !matches!(op, BinaryOp::And | BinaryOp::Or))
                    .collect();
                proptest::sample::select(ops)
            };
            let (arithmetic, comparison) = (ops(false), ops(true));
            let condition = (comparison, inner.clone(), inner.clone())
                .prop_map(|(op, a, b)| Expr::Binary(op, Box::new(a), Box::new(b)));
            let condition = prop_oneof![
                condition.clone(),
                condition.clone().prop_map(|c| Expr::Not(Box::new(c))),
                (condition.clone(), condition.clone(), any::<bool>()).prop_map(|(a, b, and)| {
                    let op = if and { BinaryOp::And } else { BinaryOp::Or };
                    Expr::Binary(op, Box::new(a), Box::new(b))
                }),
            ];
            prop_oneof![
                (arithmetic, inner.clone(), inner.clone()).prop_map(|(op, a, b)| Expr::Binary(
                    op,
                    Box::new(a),
                    Box::new(b)
                )),
                inner.clone().prop_map(|e| Expr::Neg(Box::new(e))),
                (
                    proptest::sample::select(
                        &[Function::Min, Function::Max, Function::CeilDiv][..]
                    ),
                    inner.clone(),
                    inner.clone()
                )
                    .prop_map(|(f, a, b)| Expr::Call(f, vec![a, b])),
                inner
                    .clone()
                    .prop_map(|a| Expr::Call(Function::NextPow2, vec![a])),
                (condition, inner.clone(), inner).prop_map(|(c, a, b)| Expr::Cond(
                    Box::new(c),
                    Box::new(a),
                    Box::new(b)
                )),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// The checked evaluator agrees with exact arithmetic: the same value where it fits in
        /// 64 bits, an error exactly where some evaluated step does not (or divides by zero).
        #[test]
        fn evaluation_matches_exact_arithmetic(expr in integer(), args in [value(), value(), value()]) {
            let signature = signature();
            match Program::bind(&contract(expr.clone()), &signature) {
                Ok(program) => {
                    let facts = Facts { wave_size: 32, compute_units: 132, max_block_threads: 1024, arch_specific: false };
                    let mut run = program.run(&args, &facts);
                    let got = run.slot::<Quiet>(Slot::Let(0)).ok();
                    prop_assert_eq!(got.is_some(), run.slot::<Explained>(Slot::Let(0)).is_ok());
                    prop_assert_eq!(got.map(i128::from), reference(&expr, &args), "{}", expr);
                }
                // Binding folds constant parts and refuses those that fail whatever the
                // arguments; then some part must fail in exact arithmetic too.
                Err(error) => {
                    prop_assert!(error.message.contains("cannot be computed") || error.message.contains("divides by zero"), "{}", error);
                }
            }
        }

        /// Text and the index's binary form both give the tree back.
        #[test]
        fn expressions_round_trip_through_text_and_binary(expr in integer()) {
            let text = expr.to_string();
            prop_assert_eq!(&text.parse::<Expr>().unwrap(), &expr, "{}", text);
            let bytes = rmp_serde::to_vec(&expr).unwrap();
            prop_assert_eq!(rmp_serde::from_slice::<Expr>(&bytes).unwrap(), expr);
        }
    }
}
