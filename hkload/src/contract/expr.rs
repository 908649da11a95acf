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

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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

    fn visit_names<'a>(&'a self, visit: &mut impl FnMut(&'a str)) {
        match self {
            Self::Int(_) => {}
            Self::Name(name) => visit(name),
            Self::Neg(e) | Self::Not(e) => e.visit_names(visit),
            Self::Binary(_, a, b) => {
                a.visit_names(visit);
                b.visit_names(visit);
            }
            Self::Call(_, args) => args.iter().for_each(|a| a.visit_names(visit)),
            Self::Cond(c, a, b) => {
                c.visit_names(visit);
                a.visit_names(visit);
                b.visit_names(visit);
            }
        }
    }
}

/// Writes `expr`, in parentheses if it binds more loosely than `at_least`.
fn write_operand(f: &mut fmt::Formatter<'_>, expr: &Expr, at_least: u8) -> fmt::Result {
    if expr.precedence() < at_least {
        write!(f, "({expr})")
    } else {
        write!(f, "{expr}")
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(value) => write!(f, "{value}"),
            Self::Name(name) => f.write_str(name),
            Self::Neg(e) => {
                f.write_str("-")?;
                write_operand(f, e, Precedence::UNARY)
            }
            Self::Not(e) => {
                f.write_str("!")?;
                write_operand(f, e, Precedence::UNARY)
            }
            Self::Binary(op, a, b) => {
                let level = op.precedence();
                // Left-grouping: the right operand of the same level needs parentheses;
                // comparisons do not chain, so neither side may be one.
                let left = if op.is_comparison() { level + 1 } else { level };
                write_operand(f, a, left)?;
                write!(f, " {} ", op.symbol())?;
                write_operand(f, b, level + 1)
            }
            Self::Call(function, args) => {
                write!(f, "{}(", function.name())?;
                for (i, arg) in args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{arg}")?;
                }
                f.write_str(")")
            }
            Self::Cond(c, a, b) => {
                write_operand(f, c, Precedence::OR)?;
                write!(f, " ? {a} : {b}")
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
            crate::text::deserialize(deserializer)
        } else {
            Tree::deserialize(deserializer)
        }
    }
}
