//! Reading contract expressions from text (the grammar is in [`super::expr`]). Errors give the
//! byte offset in the text, which hkpack turns into a manifest's line and column.

use super::expr::{BinaryOp, Expr, Function, MAX_DEPTH, Precedence};

/// Text that is not an expression, and where in it the problem starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (at byte {offset} of `{text}`)")]
pub struct SyntaxError {
    pub text: String,
    /// Byte offset into the text.
    pub offset: usize,
    pub message: String,
}

pub(crate) fn parse(text: &str) -> Result<Expr, SyntaxError> {
    let mut parser = Parser {
        text,
        tokens: lex(text)?,
        next: 0,
        depth: 0,
    };
    let expr = parser.expr()?.expr;
    match parser.peek() {
        None => Ok(expr),
        Some((_, at)) => Err(parser.error(at, "unexpected text after the expression")),
    }
}

impl std::str::FromStr for Expr {
    type Err = SyntaxError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse(text)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token<'a> {
    Int(i64),
    Name(&'a str),
    /// An operator or punctuation, as written.
    Punct(&'static str),
}

/// Operators and punctuation, longest first so that `<=` is not read as `<`.
const PUNCTUATION: [&str; 20] = [
    "==", "!=", "<=", ">=", "&&", "||", "<", ">", "+", "-", "*", "/", "%", "!", "?", ":", "(", ")",
    ",", "=",
];

fn lex(text: &str) -> Result<Vec<(Token<'_>, usize)>, SyntaxError> {
    let error = |offset, message: String| SyntaxError {
        text: text.to_owned(),
        offset,
        message,
    };
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let c = bytes[at];
        let run = |pred: fn(u8) -> bool| {
            at + bytes[at..]
                .iter()
                .position(|&b| !pred(b))
                .unwrap_or(bytes.len() - at)
        };
        if c.is_ascii_whitespace() {
            at += 1;
        } else if c.is_ascii_digit() {
            let end = run(|b| b.is_ascii_alphanumeric() || b == b'_');
            let digits = &text[at..end];
            let value = digits.parse().map_err(|_| {
                error(
                    at,
                    format!("`{digits}` is not an integer that fits in 64 bits"),
                )
            })?;
            tokens.push((Token::Int(value), at));
            at = end;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let end = run(|b| b.is_ascii_alphanumeric() || b == b'_');
            tokens.push((Token::Name(&text[at..end]), at));
            at = end;
        } else if let Some(p) = PUNCTUATION
            .into_iter()
            .find(|p| bytes[at..].starts_with(p.as_bytes()))
        {
            tokens.push((Token::Punct(p), at));
            at += p.len();
        } else {
            let ch = text[at..].chars().next().unwrap_or('?');
            return Err(error(at, format!("unexpected character `{ch}`")));
        }
    }
    Ok(tokens)
}

struct Parser<'a> {
    text: &'a str,
    tokens: Vec<(Token<'a>, usize)>,
    next: usize,
    /// How deeply the parser's own calls nest, which parentheses raise without making the tree
    /// any higher.
    depth: usize,
}

/// An expression parsed, and its height: the nodes on its longest path, counted as it is built
/// since a chain of operators grows the tree without nesting the parser's calls.
struct Parsed {
    expr: Expr,
    height: usize,
}

impl Parsed {
    fn leaf(expr: Expr) -> Self {
        Self { expr, height: 1 }
    }
}

impl<'a> Parser<'a> {
    fn error(&self, offset: usize, message: impl Into<String>) -> SyntaxError {
        SyntaxError {
            text: self.text.to_owned(),
            offset,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<(&Token<'a>, usize)> {
        self.tokens.get(self.next).map(|(t, at)| (t, *at))
    }

    /// Where the next token starts, or the end of the text.
    fn here(&self) -> usize {
        self.peek().map_or(self.text.len(), |(_, at)| at)
    }

    fn eat(&mut self, punct: &str) -> bool {
        let found = matches!(self.peek(), Some((Token::Punct(p), _)) if *p == punct);
        self.next += usize::from(found);
        found
    }

    fn expect(&mut self, punct: &str, what: &str) -> Result<(), SyntaxError> {
        if self.eat(punct) {
            Ok(())
        } else {
            Err(self.error(self.here(), format!("expected `{punct}` {what}")))
        }
    }

    /// The binary operator of `level` that comes next, if any (and consumes it).
    fn operator(&mut self, level: u8) -> Option<BinaryOp> {
        let (Token::Punct(p), _) = self.peek()? else {
            return None;
        };
        let op = BinaryOp::ALL.iter().find(|op| op.symbol() == *p)?;
        (op.precedence() == level).then(|| {
            self.next += 1;
            *op
        })
    }

    fn too_deep(&self, offset: usize) -> SyntaxError {
        self.error(
            offset,
            format!("the expression nests deeper than {MAX_DEPTH} levels"),
        )
    }

    /// Runs `parse` one level deeper, refusing to go past [`MAX_DEPTH`].
    fn nested(
        &mut self,
        parse: impl FnOnce(&mut Self) -> Result<Parsed, SyntaxError>,
    ) -> Result<Parsed, SyntaxError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.too_deep(self.here()));
        }
        let parsed = parse(self);
        self.depth -= 1;
        parsed
    }

    /// `expr` over `children`, one level higher than the highest of them, refused if that is
    /// past [`MAX_DEPTH`] (`at` is where the node's operator is written).
    fn node(&self, at: usize, expr: Expr, children: &[usize]) -> Result<Parsed, SyntaxError> {
        let height = 1 + children.iter().copied().max().unwrap_or(0);
        if height > MAX_DEPTH {
            return Err(self.too_deep(at));
        }
        Ok(Parsed { expr, height })
    }

    fn expr(&mut self) -> Result<Parsed, SyntaxError> {
        self.nested(|p| {
            let condition = p.binary(Precedence::OR)?;
            let at = p.here();
            if !p.eat("?") {
                return Ok(condition);
            }
            let then = p.expr()?;
            p.expect(":", "after the `?` branch of a conditional")?;
            let otherwise = p.expr()?;
            let heights = [condition.height, then.height, otherwise.height];
            let expr = Expr::Cond(
                Box::new(condition.expr),
                Box::new(then.expr),
                Box::new(otherwise.expr),
            );
            p.node(at, expr, &heights)
        })
    }

    fn binary(&mut self, level: u8) -> Result<Parsed, SyntaxError> {
        if level == Precedence::UNARY {
            return self.unary();
        }
        let mut left = self.binary(level + 1)?;
        loop {
            let operator_at = self.here();
            let Some(op) = self.operator(level) else {
                return Ok(left);
            };
            let at = self.here();
            let right = self.binary(level + 1)?;
            let heights = [left.height, right.height];
            let expr = Expr::Binary(op, Box::new(left.expr), Box::new(right.expr));
            left = self.node(operator_at, expr, &heights)?;
            if op.is_comparison() && self.operator(level).is_some() {
                return Err(self.error(
                    at,
                    "comparisons do not chain: write `a < b && b < c`, not `a < b < c`",
                ));
            }
        }
    }

    fn unary(&mut self) -> Result<Parsed, SyntaxError> {
        self.nested(|p| {
            let at = p.here();
            if p.eat("-") {
                let operand = p.unary()?;
                p.node(at, Expr::Neg(Box::new(operand.expr)), &[operand.height])
            } else if p.eat("!") {
                let operand = p.unary()?;
                p.node(at, Expr::Not(Box::new(operand.expr)), &[operand.height])
            } else {
                p.primary()
            }
        })
    }

    fn primary(&mut self) -> Result<Parsed, SyntaxError> {
        let at = self.here();
        let Some((token, _)) = self.peek() else {
            return Err(self.error(at, "the expression ends too early"));
        };
        match token.clone() {
            Token::Int(value) => {
                self.next += 1;
                Ok(Parsed::leaf(Expr::Int(value)))
            }
            Token::Name(name) => {
                self.next += 1;
                if !self.eat("(") {
                    return Ok(Parsed::leaf(Expr::Name(name.to_owned())));
                }
                let function = Function::from_name(name).ok_or_else(|| {
                    let known: Vec<&str> = Function::ALL.iter().map(|f| f.name()).collect();
                    self.error(
                        at,
                        format!(
                            "unknown function `{name}`; the functions are {}",
                            known.join(", ")
                        ),
                    )
                })?;
                let mut args = vec![self.expr()?];
                while self.eat(",") {
                    args.push(self.expr()?);
                }
                self.expect(")", &format!("to close the call of `{name}`"))?;
                function
                    .check_arity(args.len())
                    .map_err(|message| self.error(at, message))?;
                let heights: Vec<usize> = args.iter().map(|arg| arg.height).collect();
                let args = args.into_iter().map(|arg| arg.expr).collect();
                self.node(at, Expr::Call(function, args), &heights)
            }
            Token::Punct("(") => {
                self.next += 1;
                let inner = self.expr()?;
                self.expect(")", "to close the parenthesis")?;
                Ok(inner)
            }
            Token::Punct(p) => Err(self.error(at, format!("expected a value, found `{p}`"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::small_stack::on_small_stack;

    fn round_trip(text: &str) -> String {
        parse(text).unwrap().to_string()
    }

    #[test]
    fn precedence_and_grouping_match_c() {
        assert_eq!(round_trip("a + b * c"), "a + b * c");
        assert_eq!(round_trip("(a + b) * c"), "(a + b) * c");
        assert_eq!(round_trip("a - (b - c)"), "a - (b - c)");
        assert_eq!(round_trip("(a - b) - c"), "a - b - c");
        assert_eq!(round_trip("a < b && c || !d"), "a < b && c || !d");
        assert_eq!(round_trip("a || b && c"), "a || b && c");
        assert_eq!(round_trip("(a || b) && c"), "(a || b) && c");
        assert_eq!(round_trip("c ? x : d ? y : z"), "c ? x : d ? y : z");
        assert_eq!(round_trip("(c ? x : y) + 1"), "(c ? x : y) + 1");
        assert_eq!(round_trip("-(a + 1)"), "-(a + 1)");
        assert_eq!(
            round_trip("ceil_div( rows,max(1 ,x))"),
            "ceil_div(rows, max(1, x))"
        );
    }

    #[test]
    fn errors_point_at_the_problem() {
        let at = |text: &str| parse(text).unwrap_err().offset;
        assert_eq!(at("rows *"), 6);
        assert_eq!(at("rows $ 2"), 5);
        assert_eq!(at("floor(x)"), 0);
        assert_eq!(at("min(a)"), 0);
        assert_eq!(at("(a + b"), 6);
        assert_eq!(at("a b"), 2);
        assert_eq!(at("a < b < c"), 4);
        assert_eq!(at("99999999999999999999"), 0);
        assert!(parse(&"(".repeat(200)).is_err());
        assert!(parse(&"-".repeat(200)).is_err());
    }

    /// `n + n + ... + n`, `terms` terms: a left-deep chain as deep as it is long.
    fn sum(terms: usize) -> String {
        vec!["n"; terms].join(" + ")
    }

    #[test]
    fn a_chain_deeper_than_the_limit_is_an_error() {
        let error = on_small_stack(|| parse(&sum(200_000)).unwrap_err());
        assert_eq!(
            error.message,
            format!("the expression nests deeper than {MAX_DEPTH} levels")
        );
        // At the operator that would nest one level too deep.
        assert_eq!(error.offset, "n + ".len() * MAX_DEPTH - 2);
        let error = on_small_stack(|| parse(&sum(MAX_DEPTH + 1)).unwrap_err());
        assert_eq!(error.offset, "n + ".len() * MAX_DEPTH - 2);
    }

    #[test]
    fn from_str_refuses_a_chain_deeper_than_the_limit() {
        let error = on_small_stack(|| sum(200_000).parse::<Expr>().unwrap_err());
        assert!(error.to_string().contains("deeper than"), "{error}");
        let product = on_small_stack(|| vec!["2"; 200_000].join(" * ").parse::<Expr>());
        assert!(product.is_err());
    }

    #[test]
    fn the_deepest_accepted_expressions_print_and_parse_again() {
        // Each parenthesis nests the parser two levels (`expr`, then `unary`).
        let parens = MAX_DEPTH / 2 - 1;
        let deepest = [
            sum(MAX_DEPTH),
            format!("{}n{}", "(".repeat(parens), ")".repeat(parens)),
            format!("{}1", "-".repeat(MAX_DEPTH - 2)),
        ];
        for text in deepest {
            on_small_stack(move || {
                let expr = parse(&text).unwrap();
                assert_eq!(parse(&expr.to_string()).unwrap(), expr);
            });
        }
    }
}
