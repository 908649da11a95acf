//! Contract expressions as written: a small tree of integer and boolean operations over names,
//! printed back with as few parentheses as the grammar needs, so that text → tree → text gives
//! the same text and tree → text → tree the same tree.
//!
//! The grammar, loosest binding first (every operator but the comparisons groups left to
//! right; the conditional groups right to left):
//!
//! ```text
//! expr    = or ("?" expr ":" expr)?
//! or      = and ("||" and)*
//! and     = compare ("&&" compare)*
//! compare = sum (("==" | "!=" | "<" | "<=" | ">" | ">=") sum)?
//! sum     = product (("+" | "-") product)*
//! product = unary (("*" | "/" | "%") unary)*
//! unary   = ("-" | "!") unary | primary
//! primary = integer | name | function "(" expr ("," expr)* ")" | "(" expr ")"
//! ```

use std::cell::Cell;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The deepest nesting accepted: it bounds the recursion of everything that walks a tree (the
/// parser, the binder, the index's decoder, evaluation), so that none can overflow a thread's
/// stack. It limits both the tree's height (nodes on its longest path: `a + b + c` is 3 deep,
/// a chain of `n` terms `n` deep) and the parser's nesting (each parenthesis, call argument,
/// conditional branch and unary operator counts about two levels).
///
/// The deepest contract in `manifests/` (`min(max(next_pow2(ceil_div(cols * elem_size(x), 64)),
/// 8), 256)`) is 7 levels high and nests 12 in the parser; 256 leaves room for a sum of 256
/// terms or 127 nested parentheses, and the deepest tree still binds and evaluates on a 2 MiB
/// thread in a debug build (the tests check that).
pub const MAX_DEPTH: usize = 256;

/// An expression as written in a manifest: names are resolved only when the contract is bound
/// to a kernel's signature (see [`super::Contract::bind`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    Int(i64),
    /// A scalar argument, a `let` binding or a device fact.
    Name(String),
    Neg(Box<Expr>),
    Not(Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    Call(Function, Vec<Expr>),
    /// `condition ? then : otherwise`; only the chosen branch is evaluated.
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinaryOp {
    /// Every operator.
    pub const ALL: [BinaryOp; 13] = [
        Self::Add,
        Self::Sub,
        Self::Mul,
        Self::Div,
        Self::Rem,
        Self::Eq,
        Self::Ne,
        Self::Lt,
        Self::Le,
        Self::Gt,
        Self::Ge,
        Self::And,
        Self::Or,
    ];

    pub const fn symbol(self) -> &'static str {
        match self {
            Self::Add => "+",
            Self::Sub => "-",
            Self::Mul => "*",
            Self::Div => "/",
            Self::Rem => "%",
            Self::Eq => "==",
            Self::Ne => "!=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::And => "&&",
            Self::Or => "||",
        }
    }

    /// How tightly the operator binds (see the grammar above).
    pub(crate) const fn precedence(self) -> u8 {
        match self {
            Self::Or => Precedence::OR,
            Self::And => Precedence::AND,
            Self::Eq | Self::Ne | Self::Lt | Self::Le | Self::Gt | Self::Ge => Precedence::COMPARE,
            Self::Add | Self::Sub => Precedence::SUM,
            Self::Mul | Self::Div | Self::Rem => Precedence::PRODUCT,
        }
    }

    pub(crate) const fn is_comparison(self) -> bool {
        self.precedence() == Precedence::COMPARE
    }
}

/// The grammar's levels, loosest first.
pub(crate) struct Precedence;

impl Precedence {
    pub(crate) const COND: u8 = 0;
    pub(crate) const OR: u8 = 1;
    pub(crate) const AND: u8 = 2;
    pub(crate) const COMPARE: u8 = 3;
    pub(crate) const SUM: u8 = 4;
    pub(crate) const PRODUCT: u8 = 5;
    pub(crate) const UNARY: u8 = 6;
    pub(crate) const PRIMARY: u8 = 7;
}

/// The functions a contract may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Function {
    Min,
    Max,
    /// `ceil_div(a, b)`: the quotient rounded up, for `a >= 0`, `b > 0`.
    CeilDiv,
    /// `next_pow2(a)`: the smallest power of two at least `a` (1 for `a <= 1`).
    NextPow2,
    /// `elem_size(p)`: the size in bytes of the elements pointer argument `p` points to, a
    /// constant of the kernel's signature.
    ElemSize,
}

impl Function {
    pub const ALL: [Function; 5] = [
        Self::Min,
        Self::Max,
        Self::CeilDiv,
        Self::NextPow2,
        Self::ElemSize,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Min => "min",
            Self::Max => "max",
            Self::CeilDiv => "ceil_div",
            Self::NextPow2 => "next_pow2",
            Self::ElemSize => "elem_size",
        }
    }

    pub const fn arity(self) -> usize {
        match self {
            Self::Min | Self::Max | Self::CeilDiv => 2,
            Self::NextPow2 | Self::ElemSize => 1,
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Whether `count` arguments fit the function; the error says what does.
    pub fn check_arity(self, count: usize) -> Result<(), String> {
        if count == self.arity() {
            Ok(())
        } else {
            Err(format!(
                "`{}` takes {} argument(s), not {count}",
                self.name(),
                self.arity()
            ))
        }
    }
}

impl Expr {
    fn precedence(&self) -> u8 {
        match self {
            Self::Int(_) | Self::Name(_) | Self::Call(..) => Precedence::PRIMARY,
            Self::Neg(_) | Self::Not(_) => Precedence::UNARY,
            Self::Binary(op, ..) => op.precedence(),
            Self::Cond(..) => Precedence::COND,
        }
    }

    /// Every name the expression reads, with repeats, in reading order.
    pub fn names(&self) -> Vec<&str> {
        let mut names = Vec::new();
        self.visit_names(&mut |name| names.push(name));
        names
    }

    /// Names in reading order. A loop over a stack rather than recursion, as are printing and
    /// dropping: a tree built by hand has no depth limit.
    fn visit_names<'a>(&'a self, visit: &mut impl FnMut(&'a str)) {
        let mut stack = vec![self];
        while let Some(expr) = stack.pop() {
            match expr {
                Self::Int(_) => {}
                Self::Name(name) => visit(name),
                // Pushed last first, so that they are visited in reading order.
                Self::Neg(e) | Self::Not(e) => stack.push(e),
                Self::Binary(_, a, b) => stack.extend([&**b, &**a]),
                Self::Call(_, args) => stack.extend(args.iter().rev()),
                Self::Cond(c, a, b) => stack.extend([&**b, &**a, &**c]),
            }
        }
    }

    /// Moves out every child that has children of its own, leaving a leaf in its place, so
    /// that `self` then drops without recursing.
    fn take_children(&mut self, into: &mut Vec<Expr>) {
        let mut take = |child: &mut Expr| {
            if !child.is_leaf() {
                into.push(std::mem::replace(child, Expr::Int(0)));
            }
        };
        match self {
            Self::Int(_) | Self::Name(_) => {}
            Self::Neg(e) | Self::Not(e) => take(e),
            Self::Binary(_, a, b) => [a, b].into_iter().for_each(|e| take(e)),
            Self::Call(_, args) => args.iter_mut().for_each(take),
            Self::Cond(c, a, b) => [c, a, b].into_iter().for_each(|e| take(e)),
        }
    }

    fn is_leaf(&self) -> bool {
        match self {
            Self::Int(_) | Self::Name(_) => true,
            Self::Call(_, args) => args.is_empty(),
            Self::Neg(_) | Self::Not(_) | Self::Binary(..) | Self::Cond(..) => false,
        }
    }
}

/// Drops the tree a node at a time: the derived drop recurses once per level, and a tree built
/// by hand (or a bug) could be deeper than a thread's stack.
impl Drop for Expr {
    fn drop(&mut self) {
        let mut stack = Vec::new();
        self.take_children(&mut stack);
        while let Some(mut expr) = stack.pop() {
            expr.take_children(&mut stack);
        }
    }
}

/// One step of printing an expression.
enum Print<'a> {
    /// The expression, in parentheses if it binds more loosely than the level given.
    Operand(&'a Expr, u8),
    Text(&'static str),
}

impl fmt::Display for Expr {
    /// A loop over the steps left rather than recursion (see [`Expr::visit_names`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut steps = vec![Print::Operand(self, Precedence::COND)];
        while let Some(step) = steps.pop() {
            match step {
                Print::Text(text) => f.write_str(text)?,
                Print::Operand(expr, at_least) if expr.precedence() < at_least => {
                    f.write_str("(")?;
                    steps.push(Print::Text(")"));
                    steps.push(Print::Operand(expr, Precedence::COND));
                }
                Print::Operand(expr, _) => expr.print(f, &mut steps)?,
            }
        }
        Ok(())
    }
}

impl Expr {
    /// Writes what comes first of the expression and pushes the rest, last first.
    fn print<'a>(&'a self, f: &mut fmt::Formatter<'_>, rest: &mut Vec<Print<'a>>) -> fmt::Result {
        match self {
            Self::Int(value) => write!(f, "{value}"),
            Self::Name(name) => f.write_str(name),
            Self::Neg(e) => {
                rest.push(Print::Operand(e, Precedence::UNARY));
                f.write_str("-")
            }
            Self::Not(e) => {
                rest.push(Print::Operand(e, Precedence::UNARY));
                f.write_str("!")
            }
            Self::Binary(op, a, b) => {
                let level = op.precedence();
                // Left-grouping: the right operand of the same level needs parentheses;
                // comparisons do not chain, so neither side may be one.
                let left = if op.is_comparison() { level + 1 } else { level };
                rest.extend([
                    Print::Operand(b, level + 1),
                    Print::Text(" "),
                    Print::Text(op.symbol()),
                    Print::Text(" "),
                    Print::Operand(a, left),
                ]);
                Ok(())
            }
            Self::Call(function, args) => {
                rest.push(Print::Text(")"));
                for (i, arg) in args.iter().enumerate().rev() {
                    rest.push(Print::Operand(arg, Precedence::COND));
                    if i > 0 {
                        rest.push(Print::Text(", "));
                    }
                }
                write!(f, "{}(", function.name())
            }
            Self::Cond(c, a, b) => {
                rest.extend([
                    Print::Operand(b, Precedence::COND),
                    Print::Text(" : "),
                    Print::Operand(a, Precedence::COND),
                    Print::Text(" ? "),
                    Print::Operand(c, Precedence::OR),
                ]);
                Ok(())
            }
        }
    }
}

/// The tree as the index stores it: MessagePack, decoded without parsing text.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Expr")]
enum Tree {
    Int(i64),
    Name(String),
    Neg(Box<Expr>),
    Not(Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    Call(Function, Vec<Expr>),
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
}

/// Text in the TOML files people read, the tree in the binary index.
impl Serialize for Expr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            Tree::serialize(self, serializer)
        }
    }
}

impl<'de> Deserialize<'de> for Expr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            super::from_text(deserializer)
        } else {
            let _level = Level::enter().map_err(serde::de::Error::custom)?;
            Tree::deserialize(deserializer)
        }
    }
}

thread_local! {
    /// How many trees are being decoded inside one another on this thread.
    static DECODING: Cell<usize> = const { Cell::new(0) };
}

/// One level of a tree being decoded. The derived decoder of [`Tree`] calls
/// [`Expr::deserialize`] for each child, on this thread's stack, with no way to pass a depth
/// down: the count kept per thread is that depth. Without a limit, an index damaged or forged
/// to hold a tree 200,000 deep overflows the stack before anything can refuse it; the format's
/// own nesting limit does not count a `Neg` or `Not`, which add no array.
struct Level;

impl Level {
    fn enter() -> Result<Self, String> {
        let depth = DECODING.get() + 1;
        if depth > MAX_DEPTH {
            return Err(format!(
                "a contract expression nests deeper than {MAX_DEPTH} levels: the index is \
                 damaged or was not made by hkpack"
            ));
        }
        DECODING.set(depth);
        Ok(Self)
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        DECODING.set(DECODING.get() - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::small_stack::on_small_stack;

    /// `-(-(...(1)))`, `depth` levels, built by hand: no limit applies.
    fn negations(depth: usize) -> Expr {
        let mut expr = Expr::Int(1);
        for _ in 1..depth {
            expr = Expr::Neg(Box::new(expr));
        }
        expr
    }

    #[test]
    fn a_deep_tree_built_by_hand_drops() {
        on_small_stack(|| drop(negations(200_000)));
        on_small_stack(|| {
            let mut expr = Expr::Name("n".into());
            for i in 0..200_000 {
                let term = Box::new(Expr::Call(Function::Max, vec![Expr::Int(i), Expr::Int(1)]));
                expr = Expr::Binary(BinaryOp::Add, Box::new(expr), term);
            }
            drop(expr);
        });
    }

    #[test]
    fn a_deep_tree_built_by_hand_prints() {
        let text = on_small_stack(|| negations(200_000).to_string());
        assert_eq!(text, format!("{}1", "-".repeat(199_999)));
        let names = on_small_stack(|| {
            let mut expr = Expr::Name("n".into());
            for _ in 0..200_000 {
                let right = Box::new(Expr::Name("m".into()));
                expr = Expr::Binary(BinaryOp::Sub, Box::new(expr), right);
            }
            (expr.to_string().len(), expr.names().len())
        });
        assert_eq!(names, (1 + 200_000 * " - m".len(), 200_001));
    }
}
