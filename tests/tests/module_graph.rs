//! The modules of every crate of the workspace must not import each other in a cycle.
//!
//! Which code is read: every member of the workspace, as the root `Cargo.toml`'s `[workspace]
//! members` lists them when the test runs (so a new crate is checked the day it joins), and in
//! each every crate root under `src/`: `lib.rs`, `main.rs`, and each binary of `src/bin`
//! (`src/bin/x.rs` or `src/bin/x/main.rs`), each a crate of its own with its own graph. A
//! root's modules are the files its `mod` declarations reach, as rustc finds them (`a.rs` or
//! `a/mod.rs`, `a/b.rs` beside a non-`mod.rs` `a.rs`, the file a `#[path]` names), whatever
//! their `#[cfg]`: a module with one file per feature is both files. Every `.rs` file under
//! `src/` must be reached from some root (`every_src_file_is_a_module_of_a_root`): one the
//! reader could not place (an `include!`d file, a forgotten one) fails rather than go
//! unchecked. A crate's `tests/`, `examples/` and `benches/` are not read.
//!
//! For each crate root the test collects the paths its files' `use` declarations name and the
//! `crate::`, `super::` and `self::` paths written out in their code (comments and strings
//! left aside), follows re-exports to the module that defines each item, and builds the graph
//! of which module depends on which. The graph is taken level by level: an edge from
//! `a::b::c` to `a::d::e` is an edge between the siblings `a::b` and `a::d`, and a module's use
//! of its own ancestors or descendants (a child using its parent's types, a parent re-exporting
//! its children) is no edge at all. At every level the siblings must form an acyclic graph:
//! then each module can be read, tested and split on top of the ones it uses. Paths into other
//! crates (`hkload::…` from hkpack) are no edges: cargo already forbids cycles between crates.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use common::workspace;

/// Cycles that moves alone could not remove: the crate root (as [`Root::label`] names it) and
/// the sorted set of the sibling modules in the cycle. Every one needs a comment saying why it
/// is still here.
const KNOWN_CYCLES: &[(&str, &[&str])] = &[];

type ModulePath = Vec<String>;

/// One file of a crate: its module path, its path from the workspace root, and its text.
struct SourceFile {
    module: ModulePath,
    path: PathBuf,
    text: String,
}

/// Every `.rs` file under `dir`, by its path relative to `dir` (`/`-separated), with its text.
fn rust_files(dir: &Path) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(dir).unwrap();
                let relative: Vec<String> = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                files.insert(relative.join("/"), std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    files
}

/// A crate root of a member: `lib.rs`, `main.rs`, `bin/x.rs` or `bin/x/main.rs` under `src/`.
fn is_crate_root(file: &str) -> bool {
    let parts: Vec<&str> = file.split('/').collect();
    matches!(
        parts.as_slice(),
        ["lib.rs" | "main.rs"] | ["bin", _] | ["bin", _, "main.rs"]
    )
}

/// The files one crate root reaches through its `mod` declarations (`files` are a member's
/// `src/` files by their paths relative to `src/`), each with its module path; `Err` names a
/// module the reader cannot place. A declared module whose file does not exist is left out:
/// only a `#[cfg]` that is off lets that compile, and then it is no code.
fn crate_modules(
    files: &BTreeMap<String, String>,
    root: &str,
) -> Result<Vec<(String, ModulePath)>, String> {
    let mut reached = Vec::new();
    // A file, its module, and the folder (relative to `src/`, "" or ending in `/`) where the
    // files of its child modules are.
    let folder_of = |file: &str| file.rfind('/').map_or("", |i| &file[..=i]).to_owned();
    let mut pending = vec![(root.to_owned(), ModulePath::new(), folder_of(root))];
    while let Some((file, module, children)) = pending.pop() {
        let tokens = tokenize(&files[&file]);
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0;
        // The file a `#[path = "…"]` just read names, relative to this file's folder.
        let mut path_attribute: Option<String> = None;
        for (i, token) in tokens.iter().enumerate() {
            let next = |k: usize| tokens.get(i + k).map_or("", |t| t.text.as_str());
            match token.text.as_str() {
                "{" => {
                    depth += 1;
                    path_attribute = None;
                }
                "}" => {
                    depth -= 1;
                    if inline.last().is_some_and(|&(_, open)| open == depth) {
                        inline.pop();
                    }
                }
                "#" if next(1) == "[" && next(2) == "path" && next(3) == "=" => {
                    let path = next(4).strip_prefix('"').and_then(|p| p.strip_suffix('"'));
                    path_attribute = Some(path.unwrap_or_default().to_owned());
                }
                "mod"
                    if next(1).starts_with(|c: char| c.is_alphabetic() || c == '_')
                        && matches!(next(2), ";" | "{")
                        && (i == 0 || tokens[i - 1].text != "$") =>
                {
                    let name = next(1).to_owned();
                    let mut child = module.clone();
                    child.extend(inline.iter().map(|(n, _)| n.clone()));
                    child.push(name.clone());
                    if let Some(path) = path_attribute.take() {
                        // Relative to the file's own folder; the file is then read as a
                        // `mod.rs` is, its children's files beside it.
                        match normalize(&format!("{}{path}", folder_of(&file))) {
                            Some(target)
                                if inline.is_empty()
                                    && next(2) == ";"
                                    && files.contains_key(&target) =>
                            {
                                let children = folder_of(&target);
                                pending.push((target, child, children));
                                continue;
                            }
                            _ => {
                                return Err(format!(
                                    "{file}:{}: module `{name}` has #[path = \"{path}\"], which \
                                     this test follows only to a file of src/ from a module \
                                     declared outside inline modules",
                                    token.line
                                ));
                            }
                        }
                    }
                    if next(2) == "{" {
                        inline.push((name, depth));
                        continue;
                    }
                    let folder: String = inline.iter().map(|(n, _)| format!("{n}/")).collect();
                    let base = format!("{children}{folder}{name}");
                    if files.contains_key(&format!("{base}.rs")) {
                        pending.push((format!("{base}.rs"), child, format!("{base}/")));
                    } else if files.contains_key(&format!("{base}/mod.rs")) {
                        pending.push((format!("{base}/mod.rs"), child, format!("{base}/")));
                    }
                }
                ";" => path_attribute = None,
                _ => {}
            }
        }
        reached.push((file, module));
    }
    reached.sort();
    Ok(reached)
}

/// A `/`-separated relative path with its `.` and `..` folded away; `None` if it leaves the
/// folder it is relative to.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// One crate root of one member, and its files.
struct Root {
    /// `hkload-python (src/lib.rs)`.
    label: String,
    files: Vec<SourceFile>,
}

/// What the reader found in the workspace.
struct Scan {
    /// Every crate root of every member that the reader could follow.
    roots: Vec<Root>,
    /// The roots whose `mod` declarations the reader could not follow, and why.
    unreadable: Vec<String>,
    /// The `.rs` files under a `src/` that no root reaches.
    unreached: Vec<String>,
}

fn scan_workspace() -> Scan {
    let workspace = common::repo();
    let mut roots = Vec::new();
    let mut unreadable = Vec::new();
    let mut unreached_files = Vec::new();
    for member in workspace::members(&workspace) {
        let src = member.dir.join("src");
        let files = rust_files(&workspace.join(&src));
        let mut unreached: BTreeSet<&String> = files.keys().collect();
        for root in files.keys().filter(|f| is_crate_root(f)) {
            match crate_modules(&files, root) {
                Ok(modules) => {
                    let files = modules
                        .into_iter()
                        .map(|(file, module)| {
                            unreached.remove(&file);
                            SourceFile {
                                module,
                                path: src.join(&file),
                                text: files[&file].clone(),
                            }
                        })
                        .collect();
                    roots.push(Root {
                        label: format!("{} ({})", member.name, src.join(root).display()),
                        files,
                    });
                }
                Err(problem) => unreadable.push(format!("{}/{problem}", src.display())),
            }
        }
        unreached_files.extend(unreached.into_iter().map(|file| {
            format!(
                "{}/{file} is a module of no crate root this test reads (lib.rs, main.rs, \
                 bin/): teach the test where it belongs, or remove it",
                src.display()
            )
        }));
    }
    Scan {
        roots,
        unreadable,
        unreached: unreached_files,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    text: String,
    line: usize,
}

/// Splits Rust source into identifiers, `::`, single punctuation characters and plain string
/// literals (one token each, quotes and escapes as written: `#[path = "x.rs"]` needs its
/// string), leaving out comments, raw, byte and C strings, character literals, lifetimes and
/// numbers.
fn tokenize(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if c == '"' {
            let start = (i, line);
            i = skip_string(&chars, i + 1, None, &mut line);
            tokens.push(Token {
                text: chars[start.0..i].iter().collect(),
                line: start.1,
            });
        } else if c == '\'' {
            if at(i + 1) == '\\' {
                // An escaped character literal: up to the closing quote.
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime or label: its name follows as a harmless identifier.
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // Raw, byte and C strings: r"..", r#".."#, b"..", br#".."#, c"..".
            if matches!(word.as_str(), "r" | "b" | "br" | "c" | "cr")
                && (at(i) == '"' || (word.ends_with('r') && at(i) == '#'))
            {
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                if at(i) == '"' {
                    let raw = word.ends_with('r').then_some(hashes);
                    i = skip_string(&chars, i + 1, raw, &mut line);
                    continue;
                }
            }
            tokens.push(Token { text: word, line });
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            tokens.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    tokens
}

/// Skips a string literal from just after its opening quote; `raw` gives the number of `#`
/// of a raw string, in which backslashes escape nothing. Returns the index after the closing
/// delimiter.
fn skip_string(chars: &[char], mut i: usize, raw: Option<usize>, line: &mut usize) -> usize {
    let hashes = raw.unwrap_or(0);
    while i < chars.len() {
        match chars[i] {
            '\\' if raw.is_none() => {
                *line += usize::from(chars.get(i + 1) == Some(&'\n'));
                i += 2;
            }
            '"' if chars[i + 1..].iter().take_while(|&&c| c == '#').count() >= hashes => {
                return i + 1 + hashes;
            }
            c => {
                *line += usize::from(c == '\n');
                i += 1;
            }
        }
    }
    i
}

/// The paths a `use` tree names, from the token after `use` up to its `;` (exclusive), each
/// with the name it brings into scope (none for a glob).
fn use_paths(tokens: &[Token]) -> Vec<(Vec<String>, Option<String>)> {
    type Found = Vec<(Vec<String>, Option<String>)>;
    fn tree(tokens: &[Token], pos: &mut usize, prefix: &[String], out: &mut Found) {
        let mut path = prefix.to_vec();
        if tokens.get(*pos).is_some_and(|t| t.text == "::") {
            *pos += 1;
        }
        while let Some(token) = tokens.get(*pos) {
            match token.text.as_str() {
                "{" => {
                    *pos += 1;
                    while tokens.get(*pos).is_some_and(|t| t.text != "}") {
                        tree(tokens, pos, &path, out);
                        if tokens.get(*pos).is_some_and(|t| t.text == ",") {
                            *pos += 1;
                        }
                    }
                    *pos += 1;
                    return;
                }
                "*" => {
                    *pos += 1;
                    out.push((path, None));
                    return;
                }
                _ => {
                    path.push(token.text.clone());
                    *pos += 1;
                    if tokens.get(*pos).is_some_and(|t| t.text == "::") {
                        *pos += 1;
                        continue;
                    }
                    // `a::b::{self}` brings `b` into scope.
                    let mut name = match path.as_slice() {
                        [.., parent, last] if last == "self" => parent.clone(),
                        [.., last] => last.clone(),
                        [] => unreachable!("a segment was just pushed"),
                    };
                    if tokens.get(*pos).is_some_and(|t| t.text == "as") {
                        name = tokens.get(*pos + 1).map_or(name, |t| t.text.clone());
                        *pos += 2;
                    }
                    out.push((path, Some(name)));
                    return;
                }
            }
        }
    }
    let mut out = Vec::new();
    tree(tokens, &mut 0, &[], &mut out);
    out
}

/// A path named in a file.
#[derive(Debug, Clone)]
struct Named {
    /// The module it is named in: the file's, or an inline module's inside it.
    context: ModulePath,
    path: Vec<String>,
    line: usize,
    /// For a `use` declaration, the name it brings into scope.
    binding: Option<String>,
}

/// Every path a file's `use` declarations name, and every `crate::`, `super::` or `self::`
/// path written out in its code.
fn named_paths(file: &SourceFile) -> Vec<Named> {
    let tokens = tokenize(&file.text);
    let mut found = Vec::new();
    // Inline modules (`mod tests { .. }`) open at a brace depth and close back to it.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let context = |inline: &[(String, usize)]| {
        let mut module = file.module.clone();
        module.extend(inline.iter().map(|(name, _)| name.clone()));
        module
    };
    let mut i = 0;
    while i < tokens.len() {
        let text = tokens[i].text.as_str();
        let next = |k: usize| tokens.get(i + k).map(|t| t.text.as_str());
        match text {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|&(_, open)| open == depth) {
                    inline.pop();
                }
            }
            "mod" if next(2) == Some("{") => inline.push((tokens[i + 1].text.clone(), depth)),
            "use" => {
                let end = tokens[i..]
                    .iter()
                    .position(|t| t.text == ";")
                    .map_or(tokens.len(), |n| i + n);
                for (path, binding) in use_paths(&tokens[i + 1..end]) {
                    found.push(Named {
                        context: context(&inline),
                        path,
                        line: tokens[i].line,
                        binding,
                    });
                }
                i = end;
                continue;
            }
            "crate" | "super" | "self"
                if next(1) == Some("::") && (i == 0 || tokens[i - 1].text != "$") =>
            {
                let line = tokens[i].line;
                let mut path = vec![text.to_owned()];
                i += 1;
                while tokens.get(i).is_some_and(|t| t.text == "::")
                    && tokens.get(i + 1).is_some_and(|t| {
                        t.text
                            .chars()
                            .next()
                            .is_some_and(|c| c.is_alphabetic() || c == '_')
                    })
                {
                    path.push(tokens[i + 1].text.clone());
                    i += 2;
                }
                found.push(Named {
                    context: context(&inline),
                    path,
                    line,
                    binding: None,
                });
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The modules of the crate's files, and what each file's own `use` declarations bring into
/// scope (by name, the path named), so that a path through a re-export (`crate::Error`) leads
/// to the module that defines the item.
struct Crate {
    modules: BTreeSet<ModulePath>,
    imports: BTreeMap<ModulePath, BTreeMap<String, Vec<String>>>,
}

impl Crate {
    fn new(files: &[SourceFile]) -> Self {
        let mut imports: BTreeMap<ModulePath, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for file in files {
            for named in named_paths(file) {
                if let Some(name) = named.binding
                    && named.context == file.module
                {
                    imports
                        .entry(file.module.clone())
                        .or_default()
                        .insert(name, named.path);
                }
            }
        }
        Self {
            modules: files.iter().map(|f| f.module.clone()).collect(),
            imports,
        }
    }

    /// The file module that defines what `path` names, in the module `context`: the longest
    /// prefix of the path that is a module of its own file, through the imports of that module
    /// where the next name is one. `None` for a path into another crate.
    fn resolve(&self, context: &[String], path: &[String]) -> Option<ModulePath> {
        self.resolve_within(context, path, 0)
    }

    fn resolve_within(
        &self,
        context: &[String],
        path: &[String],
        hops: usize,
    ) -> Option<ModulePath> {
        // An inline module (`tests`) is part of its file.
        let file_of = |mut module: ModulePath| {
            while !self.modules.contains(&module) {
                module.pop();
            }
            module
        };
        let own = file_of(context.to_vec());
        let mut segments = path.iter().peekable();
        let mut module = match segments.peek().map(|s| s.as_str()) {
            Some("crate") => {
                segments.next();
                Vec::new()
            }
            Some("self") => {
                segments.next();
                own
            }
            Some("super") => {
                let mut module = context.to_vec();
                while segments.next_if(|s| *s == "super").is_some() {
                    module.pop();
                }
                file_of(module)
            }
            // A bare path in a `use` starts at a child module, or in another crate.
            Some(first) => {
                let mut child = own.clone();
                child.push(first.to_owned());
                if !self.modules.contains(&child) {
                    return None;
                }
                own
            }
            None => return None,
        };
        for segment in segments {
            module.push(segment.clone());
            if self.modules.contains(&module) {
                continue;
            }
            module.pop();
            if let Some(imported) = self.imports.get(&module).and_then(|i| i.get(segment))
                && hops < 8
                && let Some(defined) = self.resolve_within(&module, imported, hops + 1)
            {
                return Some(defined);
            }
            break;
        }
        Some(module)
    }
}

/// Why one module depends on another: the file, line and path that names it.
#[derive(Debug, Clone)]
struct Witness {
    file: PathBuf,
    line: usize,
    path: String,
}

type Graph = BTreeMap<String, BTreeMap<String, Witness>>;

/// The dependency graph between sibling modules, each edge with the first path that makes it.
fn sibling_graph(files: &[SourceFile]) -> Graph {
    let krate = Crate::new(files);
    let mut graph = Graph::new();
    for file in files {
        for named in named_paths(file) {
            let Some(target) = krate.resolve(&named.context, &named.path) else {
                continue;
            };
            let from = &file.module;
            let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
            // A module's own ancestors and descendants are no edge.
            if common == from.len() || common == target.len() {
                continue;
            }
            graph
                .entry(from[..=common].join("::"))
                .or_default()
                .entry(target[..=common].join("::"))
                .or_insert_with(|| Witness {
                    file: file.path.clone(),
                    line: named.line,
                    path: named.path.join("::"),
                });
        }
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan's algorithm), each
/// sorted.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        components: Vec<Vec<String>>,
    }
    fn visit<'g>(state: &mut State<'g>, node: &'g str) {
        let n = state.index.len();
        state.index.insert(node, n);
        state.low.insert(node, n);
        state.stack.push(node);
        for next in state.graph.get(node).into_iter().flat_map(|e| e.keys()) {
            let next = next.as_str();
            let reached = if !state.index.contains_key(next) {
                visit(state, next);
                state.low[next]
            } else if state.stack.contains(&next) {
                state.index[next]
            } else {
                continue;
            };
            let low = state.low[node].min(reached);
            state.low.insert(node, low);
        }
        if state.low[node] == state.index[node] {
            let at = state.stack.iter().rposition(|&n| n == node).unwrap();
            let mut component: Vec<String> = state.stack.drain(at..).map(str::to_owned).collect();
            if component.len() > 1 {
                component.sort();
                state.components.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        components: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.components.sort();
    state.components
}

/// The members of a cycle, and one way round it with the line behind each step.
fn describe_cycle(graph: &Graph, component: &[String]) -> String {
    // Walk from the first member along edges inside the component until a module repeats.
    let mut walk = vec![component[0].as_str()];
    loop {
        let next = graph[*walk.last().unwrap()]
            .keys()
            .map(String::as_str)
            .find(|next| component.iter().any(|m| m == next))
            .unwrap();
        if let Some(start) = walk.iter().position(|&n| n == next) {
            walk.drain(..start);
            walk.push(next);
            break;
        }
        walk.push(next);
    }
    let mut text = format!("{{{}}}, e.g. {}", component.join(", "), walk.join(" -> "));
    for step in walk.windows(2) {
        let witness = &graph[step[0]][step[1]];
        write!(
            text,
            "\n    {} -> {}: `{}` at {}:{}",
            step[0],
            step[1],
            witness.path,
            witness.file.display(),
            witness.line
        )
        .unwrap();
    }
    text
}

#[test]
fn modules_import_each_other_without_cycles() {
    // Files no root reaches are `every_src_file_is_a_module_of_a_root`'s failure.
    let scan = scan_workspace();
    assert!(
        scan.unreadable.is_empty(),
        "the test cannot follow the modules of some crates:\n  {}",
        scan.unreadable.join("\n  ")
    );
    let graphs: Vec<(&Root, Graph)> = scan
        .roots
        .iter()
        .map(|root| (root, sibling_graph(&root.files)))
        .collect();
    for (root, graph) in &graphs {
        let edges: usize = graph.values().map(BTreeMap::len).sum();
        println!(
            "{}: {} files, {edges} edges between siblings",
            root.label,
            root.files.len()
        );
    }
    // The reader must see the crates' real dependencies, or empty graphs would pass: a crate
    // of four files or more whose files use none of each other is a broken reader.
    let blind: Vec<&str> = graphs
        .iter()
        .filter(|(root, graph)| root.files.len() >= 4 && graph.is_empty())
        .map(|(root, _)| root.label.as_str())
        .collect();
    assert!(
        blind.is_empty(),
        "the import graphs of {blind:?} have no edge: the reader of `use` lines is broken"
    );
    let (_, python) = graphs
        .iter()
        .find(|(root, _)| root.label == "hkload-python (python/src/lib.rs)")
        .expect("the Python extension is a crate of the workspace");
    for (from, to) in [
        ("bundle", "kernels"),
        ("kernels", "errors"),
        ("args", "torch"),
    ] {
        assert!(
            python.get(from).is_some_and(|edges| edges.contains_key(to)),
            "the import graph of python/src lacks {from} -> {to}: the reader of `use` lines is \
             broken"
        );
    }

    let known: Vec<(&str, Vec<String>)> = KNOWN_CYCLES
        .iter()
        .map(|(label, cycle)| (*label, cycle.iter().map(|m| (*m).to_owned()).collect()))
        .collect();
    let mut new = Vec::new();
    let mut found_known = Vec::new();
    for (root, graph) in &graphs {
        for cycle in cycles(graph) {
            if known.contains(&(root.label.as_str(), cycle.clone())) {
                found_known.push((root.label.as_str(), cycle));
            } else {
                new.push(format!("{}: {}", root.label, describe_cycle(graph, &cycle)));
            }
        }
    }
    assert!(
        new.is_empty(),
        "modules import each other in a cycle:\n  {}",
        new.join("\n  ")
    );
    let gone: Vec<&(&str, Vec<String>)> =
        known.iter().filter(|k| !found_known.contains(k)).collect();
    assert!(
        gone.is_empty(),
        "these known cycles are gone; remove them from KNOWN_CYCLES: {gone:?}"
    );
}

#[test]
fn every_member_and_root_is_read() {
    let members = workspace::members(&common::repo());
    let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
    for name in ["hkload", "hkpack", "hkload-python", "hk-tests"] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    let scan = scan_workspace();
    let labels: Vec<&str> = scan.roots.iter().map(|r| r.label.as_str()).collect();
    for label in [
        "hkpack (hkpack/src/lib.rs)",
        "hkpack (hkpack/src/main.rs)",
        "hk-tests (tests/src/bin/gpu_parity.rs)",
    ] {
        assert!(labels.contains(&label), "{label} missing from {labels:?}");
    }
}

/// A file that no crate root reaches is no code rustc builds, or code this test did not
/// check (an `include!`d file): either way the import graph could not vouch for it.
#[test]
fn every_src_file_is_a_module_of_a_root() {
    let scan = scan_workspace();
    assert!(
        scan.unreached.is_empty(),
        "files under src/ that the test did not check:\n  {}",
        scan.unreached.join("\n  ")
    );
}

#[test]
fn crate_roots_reach_their_module_files() {
    let files: BTreeMap<String, String> = [
        (
            "lib.rs",
            "pub mod a; mod b; #[cfg(test)] mod gone; mod c { pub mod d; }",
        ),
        (
            "a.rs",
            "mod x; macro_rules! m { ($n:ident) => { mod $n; } }",
        ),
        (
            "a/x.rs",
            "// mod not_a_module;\nconst S: &str = \"mod nor_this;\";",
        ),
        ("b/mod.rs", "pub(crate) mod y;"),
        ("b/y.rs", ""),
        ("c/d.rs", ""),
        ("main.rs", "fn main() {}"),
        ("bin/tool.rs", "mod helper;"),
        ("bin/helper.rs", ""),
        ("bin/big/main.rs", "mod part;"),
        ("bin/big/part.rs", ""),
        ("stray.rs", ""),
    ]
    .into_iter()
    .map(|(path, text)| (path.to_owned(), text.to_owned()))
    .collect();
    let roots: Vec<&str> = files
        .keys()
        .map(String::as_str)
        .filter(|f| is_crate_root(f))
        .collect();
    // Cargo makes every `bin/*.rs` a binary: `helper.rs` too, though `tool.rs` declares it.
    assert_eq!(
        roots,
        [
            "bin/big/main.rs",
            "bin/helper.rs",
            "bin/tool.rs",
            "lib.rs",
            "main.rs"
        ]
    );
    let modules = |root: &str| -> Vec<(String, String)> {
        crate_modules(&files, root)
            .unwrap()
            .into_iter()
            .map(|(file, module)| (file, module.join("::")))
            .collect()
    };
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(f, m)| ((*f).to_owned(), (*m).to_owned()))
            .collect()
    };
    assert_eq!(
        modules("lib.rs"),
        pairs(&[
            ("a.rs", "a"),
            ("a/x.rs", "a::x"),
            ("b/mod.rs", "b"),
            ("b/y.rs", "b::y"),
            ("c/d.rs", "c::d"),
            ("lib.rs", ""),
        ])
    );
    assert_eq!(
        modules("bin/tool.rs"),
        pairs(&[("bin/helper.rs", "helper"), ("bin/tool.rs", "")])
    );
    assert_eq!(
        modules("bin/big/main.rs"),
        pairs(&[("bin/big/main.rs", ""), ("bin/big/part.rs", "part")])
    );

    // `#[path]` is relative to the declaring file's folder, whatever the file, and the file it
    // names has its children beside it.
    let with_path: BTreeMap<String, String> = [
        ("lib.rs", "mod a;"),
        (
            "a.rs",
            "#[cfg(x)]\nmod b;\n#[cfg(not(x))]\n#[path = \"other/b_stub.rs\"]\nmod b;",
        ),
        ("a/b.rs", ""),
        ("other/b_stub.rs", "mod c;"),
        ("other/c.rs", ""),
    ]
    .into_iter()
    .map(|(path, text)| (path.to_owned(), text.to_owned()))
    .collect();
    let modules: Vec<(String, String)> = crate_modules(&with_path, "lib.rs")
        .unwrap()
        .into_iter()
        .map(|(file, module)| (file, module.join("::")))
        .collect();
    assert_eq!(
        modules,
        pairs(&[
            ("a.rs", "a"),
            ("a/b.rs", "a::b"),
            ("lib.rs", ""),
            ("other/b_stub.rs", "a::b"),
            ("other/c.rs", "a::b::c"),
        ])
    );
    let elsewhere: BTreeMap<String, String> = [(
        "lib.rs".to_owned(),
        "#[path = \"../elsewhere.rs\"]\nmod odd;".to_owned(),
    )]
    .into();
    let error = crate_modules(&elsewhere, "lib.rs").unwrap_err();
    assert!(
        error.starts_with("lib.rs:2: module `odd` has #[path = \"../elsewhere.rs\"]"),
        "{error}"
    );
}

#[test]
fn the_reader_follows_use_trees_and_skips_comments_and_strings() {
    let text = r##"
//! See [`crate::a::B`].
use crate::{a::{B, c::D as E}, f::{self}};
use super::g::*;
const S: &str = "crate::h::I \" crate::h";
const R: &str = r#"crate::j"#;
fn k<'a>(x: &'a str) -> char { let _ = crate::l::M::new(); '"' }
/* crate::m /* nested */ crate::m */
mod tests {
    use super::*;
    use super::super::n::O;
}
"##;
    let file = SourceFile {
        module: vec!["p".into(), "q".into()],
        path: "src/p/q.rs".into(),
        text: text.into(),
    };
    let paths: Vec<(String, String, Option<String>)> = named_paths(&file)
        .into_iter()
        .map(|n| (n.context.join("::"), n.path.join("::"), n.binding))
        .collect();
    let some = |name: &str| Some(name.to_owned());
    let expected = [
        ("p::q", "crate::a::B", some("B")),
        ("p::q", "crate::a::c::D", some("E")),
        ("p::q", "crate::f::self", some("f")),
        ("p::q", "super::g", None),
        ("p::q", "crate::l::M::new", None),
        ("p::q::tests", "super", None),
        ("p::q::tests", "super::super::n::O", some("O")),
    ]
    .map(|(c, p, b)| (c.to_owned(), p.to_owned(), b));
    assert_eq!(paths, expected);
}

#[test]
fn paths_resolve_to_the_module_that_defines_the_item() {
    let file = |path: &str, module: &[&str], text: &str| SourceFile {
        module: module.iter().map(|m| (*m).to_owned()).collect(),
        path: path.into(),
        text: text.into(),
    };
    let files = [
        file("lib.rs", &[], "mod a; mod p; pub use a::Thing;"),
        file("a.rs", &["a"], "pub struct Thing;"),
        file("p/mod.rs", &["p"], "mod q; mod n; pub use n::O;"),
        file("src/p/q.rs", &["p", "q"], "use crate::Thing;"),
        file("p/n.rs", &["p", "n"], "pub struct O;"),
    ];
    let krate = Crate::new(&files);
    let resolved = |context: &str, path: &str| {
        let context: Vec<String> = context.split("::").map(str::to_owned).collect();
        let path: Vec<String> = path.split("::").map(str::to_owned).collect();
        krate.resolve(&context, &path).map(|m| m.join("::"))
    };
    let some = |module: &str| Some(module.to_owned());
    assert_eq!(resolved("p::q", "crate::a::Thing"), some("a"));
    // Through the crate root's re-export.
    assert_eq!(resolved("p::q", "crate::Thing"), some("a"));
    // Through the parent's re-export, and from an inline test module.
    assert_eq!(resolved("p::q", "super::O"), some("p::n"));
    assert_eq!(resolved("p::q::tests", "super::super::O"), some("p::n"));
    assert_eq!(resolved("p::q::tests", "super::Thing"), some("a"));
    assert_eq!(resolved("p::q::tests", "super"), some("p::q"));
    assert_eq!(resolved("p", "n::O"), some("p::n"));
    assert_eq!(resolved("p::q", "std::fmt"), None);

    let graph = sibling_graph(&files);
    let edges: Vec<(&str, &str)> = graph
        .iter()
        .flat_map(|(from, to)| to.keys().map(move |to| (from.as_str(), to.as_str())))
        .collect();
    assert_eq!(edges, [("p", "a")]);
    assert!(cycles(&graph).is_empty());
}

#[test]
fn cycles_are_found_and_named() {
    let witness = || Witness {
        file: "x.rs".into(),
        line: 1,
        path: "crate::x".into(),
    };
    let mut graph = Graph::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("e", "f")] {
        graph
            .entry(from.to_owned())
            .or_default()
            .insert(to.to_owned(), witness());
    }
    let found = cycles(&graph);
    assert_eq!(found, [["a", "b", "c"]]);
    let text = describe_cycle(&graph, &found[0]);
    assert!(
        text.starts_with("{a, b, c}, e.g. a -> b -> c -> a"),
        "{text}"
    );
}
