//! Kernels' launch contracts as module manifests write them: a `[module.contract]` default, a
//! `[kernel.contract]` per kernel, and each pointer argument's extent in brackets after its
//! type (`"x: *const bf16 [rows * cols]"`). Read here into [`hk_format::contract::Contract`] and
//! checked against the kernel's signature, every problem located at its file, line and column.
//!
//! A kernel's contract is the module's with the kernel's on top: `let` values and `requires`
//! clauses add to the module's (the kernel's come after), `block`, `grid` and `shared` replace
//! the module's.

use hk_format::abi::Param;
use hk_format::contract::{BindError, Binding, Contract, Expr, Place, Requirement};
use serde::Deserialize;
use toml::Spanned;

use super::{ManifestError, SourceFile, plausible};

/// A `[module.contract]` or `[kernel.contract]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawContract {
    #[serde(rename = "let", default)]
    lets: Vec<Spanned<String>>,
    #[serde(default)]
    requires: Vec<RawRequirement>,
    /// `"expr"` (x alone) or `["x", "y", "z"]`.
    block: Option<Spanned<toml::Value>>,
    grid: Option<Spanned<toml::Value>>,
    shared: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequirement {
    check: Spanned<String>,
    message: String,
}

/// Expression text and the byte offset in the manifest where it starts.
#[derive(Debug, Clone)]
pub(super) struct Written {
    text: String,
    at: usize,
}

impl Written {
    /// The text of a TOML string value: it starts one byte after the opening quote.
    fn of(value: &Spanned<String>) -> Self {
        Self {
            text: value.get_ref().clone(),
            at: value.span().start + 1,
        }
    }
}

/// `name: type [extent]` split into the parameter and its extent, if it has one.
pub(super) fn param_with_extent(
    file: &SourceFile,
    symbol: &str,
    written: &Spanned<String>,
) -> Result<(Param, Option<Written>), ManifestError> {
    let text = written.get_ref();
    let at = written.span().start + 1;
    let (decl, extent) = match text.find('[') {
        Some(open) => {
            let rest = &text[open + 1..];
            let Some(close) = rest.rfind(']').filter(|&c| rest[c + 1..].trim().is_empty()) else {
                return Err(file.error(
                    at + open..at + open,
                    format!("kernel `{symbol}`: the extent that starts here needs a closing `]` at the end"),
                ));
            };
            let extent = Written {
                text: rest[..close].to_owned(),
                at: at + open + 1,
            };
            (&text[..open], Some(extent))
        }
        None => (text.as_str(), None),
    };
    let param: Param = decl
        .parse()
        .map_err(|e| file.error(written.span(), format!("kernel `{symbol}`: {e}")))?;
    if extent.is_some() && !param.ty.is_pointer() {
        return Err(file.error(
            written.span(),
            format!(
                "kernel `{symbol}`: `{}` is a value; only pointers have an extent",
                param.name
            ),
        ));
    }
    Ok((param, extent))
}

/// The contract of kernel `symbol`: the module's default and the kernel's own merged, parsed
/// and bound to the signature. `None` when neither the module nor the kernel declares one and
/// no argument has an extent.
pub(super) fn kernel_contract(
    file: &SourceFile,
    symbol: &str,
    signature: &[Param],
    extents: &[(String, Written)],
    module: Option<&RawContract>,
    kernel: Option<&RawContract>,
    kernel_at: usize,
) -> Result<Option<Contract>, ManifestError> {
    if module.is_none() && kernel.is_none() && extents.is_empty() {
        return Ok(None);
    }
    let layers: Vec<&RawContract> = module.into_iter().chain(kernel).collect();
    // Every expression with where it was written, in the order Contract::expressions lists
    // them, to place errors found by binding.
    let mut places: Vec<(Place, Written)> = Vec::new();
    let parse = |written: &Written| -> Result<Expr, ManifestError> {
        written
            .text
            .parse()
            .map_err(|e: hk_format::contract::SyntaxError| {
                let at = written.at + e.offset;
                file.error(at..at, format!("kernel `{symbol}`: {}", e.message))
            })
    };

    let mut lets = Vec::new();
    for written in layers.iter().flat_map(|l| &l.lets) {
        let binding: Binding =
            written
                .get_ref()
                .parse()
                .map_err(|e: hk_format::contract::SyntaxError| {
                    let at = written.span().start + 1 + e.offset;
                    file.error(at..at, format!("kernel `{symbol}`: {}", e.message))
                })?;
        places.push((Place::Let(binding.name.clone()), Written::of(written)));
        lets.push(binding);
    }
    let mut requires = Vec::new();
    for (i, raw) in layers.iter().flat_map(|l| &l.requires).enumerate() {
        let written = Written::of(&raw.check);
        requires.push(Requirement {
            check: parse(&written)?,
            message: raw.message.clone(),
        });
        places.push((Place::Requires(i), written));
    }
    let missing = |what: &str| {
        file.error(
            kernel_at..kernel_at,
            format!(
                "kernel `{symbol}` has a launch contract but no `{what}`: add `{what} = \"...\"` to its [kernel.contract] or the module's [module.contract]"
            ),
        )
    };
    let last = |pick: fn(&RawContract) -> Option<&Spanned<toml::Value>>| {
        layers.iter().rev().find_map(|l| pick(l))
    };
    let block = axes(
        file,
        symbol,
        last(|l| l.block.as_ref()).ok_or_else(|| missing("block"))?,
    )?;
    let grid = axes(
        file,
        symbol,
        last(|l| l.grid.as_ref()).ok_or_else(|| missing("grid"))?,
    )?;
    let shared = layers
        .iter()
        .rev()
        .find_map(|l| l.shared.as_ref())
        .map(Written::of);
    let mut parsed_block = Vec::new();
    for (axis, written) in block.iter().enumerate() {
        parsed_block.push(parse(written)?);
        places.push((Place::Block(axis), written.clone()));
    }
    let mut parsed_grid = Vec::new();
    for (axis, written) in grid.iter().enumerate() {
        parsed_grid.push(parse(written)?);
        places.push((Place::Grid(axis), written.clone()));
    }
    let shared_expr = match &shared {
        Some(written) => {
            places.push((Place::Shared, written.clone()));
            parse(written)?
        }
        None => Expr::Int(0),
    };
    let mut bound_extents = Vec::new();
    for (name, written) in extents {
        bound_extents.push(Binding {
            name: name.clone(),
            value: parse(written)?,
        });
        places.push((Place::Extent(name.clone()), written.clone()));
    }
    let three = |v: Vec<Expr>| -> [Expr; 3] {
        let mut it = v.into_iter();
        [(); 3].map(|()| it.next().unwrap_or(Expr::Int(1)))
    };
    let contract = Contract {
        lets,
        requires,
        block: three(parsed_block),
        grid: three(parsed_grid),
        shared: shared_expr,
        extents: bound_extents,
    };
    let program = contract
        .bind(signature)
        .map_err(|e| bind_error(file, symbol, &places, kernel_at, e))?;
    plausible::check(&program, &contract, signature).map_err(|refusal| {
        let at = places
            .iter()
            .find(|(place, _)| *place == refusal.place)
            .map_or(kernel_at, |(_, written)| written.at);
        file.error(
            at..at,
            format!(
                "kernel `{symbol}`: the contract refuses every call tried on every kind of device: \
                 {} refuses the call that got furthest: {}",
                refusal.place, refusal.why
            ),
        )
    })?;
    Ok(Some(contract))
}

/// `"x"` or `["x", "y", "z"]` (missing axes are 1), each with where it was written.
fn axes(
    file: &SourceFile,
    symbol: &str,
    value: &Spanned<toml::Value>,
) -> Result<Vec<Written>, ManifestError> {
    let span = value.span();
    let bad = || {
        file.error(
            span.clone(),
            format!("kernel `{symbol}`: expected an expression string, or an array of 1 to 3 of them (x, y, z)"),
        )
    };
    match value.get_ref() {
        toml::Value::String(text) => Ok(vec![Written {
            text: text.clone(),
            at: span.start + 1,
        }]),
        toml::Value::Array(items) if (1..=3).contains(&items.len()) => {
            // The array's elements carry no spans of their own: find each one's quoted text
            // in the array's source, in order.
            let source = file.text.get(span.clone()).unwrap_or("");
            let mut from = 0;
            items
                .iter()
                .map(|item| {
                    let text = item.as_str().ok_or_else(bad)?;
                    let found = source[from..]
                        .find(&format!("\"{text}\""))
                        .or_else(|| source[from..].find(&format!("'{text}'")))
                        .map_or(0, |i| from + i + 1);
                    from = found;
                    Ok(Written {
                        text: text.to_owned(),
                        at: span.start + found,
                    })
                })
                .collect()
        }
        _ => Err(bad()),
    }
}

/// A binding error placed at the expression it is about and, where it names something, at
/// that name inside the expression.
fn bind_error(
    file: &SourceFile,
    symbol: &str,
    places: &[(Place, Written)],
    kernel_at: usize,
    error: BindError,
) -> ManifestError {
    let at = places
        .iter()
        .find(|(place, _)| *place == error.place)
        .map_or(kernel_at, |(_, written)| {
            let within = error
                .name
                .as_deref()
                .and_then(|name| find_word(&written.text, name))
                .unwrap_or(0);
            written.at + within
        });
    file.error(at..at, format!("kernel `{symbol}`: {error}"))
}

/// Where `word` first stands as a whole identifier in `text`.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).map(|(i, _)| i).find(|&i| {
        let before = text[..i].chars().next_back().is_none_or(|c| !is_word(c));
        let after = text[i + word.len()..]
            .chars()
            .next()
            .is_none_or(|c| !is_word(c));
        before && after
    })
}
