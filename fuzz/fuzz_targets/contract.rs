//! Contract expressions as a manifest writes them: an input is parsed as an expression
//! (`Expr::from_str`) and as a `let` or extent (`name = expr`, `Binding::from_str`); what parses
//! is printed and parsed again, and must come back the same tree. Deep inputs must be refused
//! with an error, never overflow the stack.
#![no_main]

use hk_format::contract::{Binding, Expr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    if let Ok(expr) = text.parse::<Expr>() {
        let again: Expr = expr
            .to_string()
            .parse()
            .expect("a printed expression parses");
        assert_eq!(again, expr, "text -> tree -> text -> tree changed the tree");
    }
    if let Ok(binding) = text.parse::<Binding>() {
        let again: Binding = binding
            .to_string()
            .parse()
            .expect("a printed binding parses");
        assert_eq!(
            again, binding,
            "text -> binding -> text -> binding changed it"
        );
    }
});
