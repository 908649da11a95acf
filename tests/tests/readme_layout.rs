//! README.md's "## Layout" section must match the tree.
//!
//! The section's fenced block lists the repository's folders: a line that starts at column 0
//! names one (`hkpack/     the builder: …`), the indented lines below it go on describing it.
//! The test checks that
//!
//! - every top-level folder that git tracks (`git ls-files`: build outputs, caches and
//!   virtual environments, which `.gitignore` keeps out, are not the layout) is an entry;
//! - every member of the workspace (the root `Cargo.toml`'s `[workspace] members`, read when
//!   the test runs) is named by its folder, and by its package name where that differs
//!   (`python/` is `hkload-python`), so that a `cargo -p` name leads to its folder;
//! - every path the block names exists: each word with a `/` in it (`kernels/include/hk/`,
//!   `src/`), relative to the repository, to its entry's folder or that folder's `src/`, or to
//!   a folder named before it in the same entry; and each file name (`main.rs`, `mfma.h`),
//!   somewhere under its entry's folder.

mod common;

use std::path::Path;

use common::workspace;
use std::process::Command;

/// The lines of the fenced block of the "## Layout" section of README.md, each with its line
/// number in README.md.
fn layout_block(readme: &str) -> Vec<(usize, String)> {
    let section: Vec<(usize, &str)> = readme
        .lines()
        .enumerate()
        .map(|(n, line)| (n + 1, line))
        .skip_while(|(_, line)| line.trim_end() != "## Layout")
        .skip(1)
        .take_while(|(_, line)| !line.starts_with("# ") && !line.starts_with("## "))
        .collect();
    assert!(
        !section.is_empty(),
        "README.md has no \"## Layout\" section"
    );
    let block: Vec<(usize, String)> = section
        .iter()
        .skip_while(|(_, line)| !line.starts_with("```"))
        .skip(1)
        .take_while(|(_, line)| !line.starts_with("```"))
        .map(|(n, line)| (*n, (*line).to_owned()))
        .collect();
    assert!(
        !block.is_empty(),
        "README.md's \"## Layout\" section has no fenced block listing the folders"
    );
    block
}

/// One entry of the block: the folder its first line names, and every word of its lines.
struct Entry {
    folder: String,
    line: usize,
    words: Vec<(usize, String)>,
}

fn entries(block: &[(usize, String)]) -> Vec<Entry> {
    let mut entries: Vec<Entry> = Vec::new();
    for (n, line) in block {
        let mut words = line.split_whitespace();
        if !line.starts_with(char::is_whitespace)
            && let Some(first) = words.next()
        {
            entries.push(Entry {
                folder: first.trim_end_matches('/').to_owned(),
                line: *n,
                words: Vec::new(),
            });
        }
        let entry = entries
            .last_mut()
            .unwrap_or_else(|| panic!("README.md:{n}: a Layout line that belongs to no entry"));
        entry.words.extend(words.map(|w| (*n, w.to_owned())));
    }
    entries
}

/// A word as a path: without the punctuation of the sentence around it (`(src/:` is `src/`),
/// up to a `{` (`driver/{cuda, hip}` names `driver/`). `None` for a word that names no path.
fn path_word(word: &str) -> Option<String> {
    let word = word.split('{').next().unwrap_or_default();
    let word = word
        .trim_start_matches(['(', '[', '`', '"', '\''])
        .trim_end_matches([',', ';', ':', '.', ')', ']', '`', '"', '\'']);
    let file_name = word.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty()
            && !stem.contains('/')
            && matches!(
                ext,
                "rs" | "h" | "hpp" | "cpp" | "hip" | "cu" | "py" | "pyi" | "toml" | "md" | "sh"
            )
    });
    ((word.contains('/') && !word.contains("://")) || file_name).then(|| word.to_owned())
}

/// Whether a file named `name` is somewhere under `folder`, outside build outputs.
fn file_under(folder: &Path, name: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return false;
    };
    entries.map(|e| e.unwrap().path()).any(|path| {
        let file = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            !matches!(&*file, "target" | "__pycache__" | ".venv") && file_under(&path, name)
        } else {
            file == name
        }
    })
}

/// The top-level folders of the files git tracks.
fn tracked_top_level_folders(root: &Path) -> Vec<String> {
    let output = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        .expect("this test runs git, which the repository's checkout has");
    assert!(
        output.status.success(),
        "git ls-files: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut folders: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .split('\0')
        .filter_map(|path| path.split_once('/').map(|(top, _)| top.to_owned()))
        .collect();
    folders.sort();
    folders.dedup();
    folders
}

#[test]
fn the_layout_section_matches_the_tree() {
    let root = common::repo();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = layout_block(&readme);
    let entries = entries(&block);
    let mut problems = Vec::new();

    let folders: Vec<&str> = entries.iter().map(|e| e.folder.as_str()).collect();
    for folder in tracked_top_level_folders(&root) {
        if !folders.contains(&folder.as_str()) {
            problems.push(format!(
                "`{folder}/` is a top-level folder git tracks, but no entry of the Layout block"
            ));
        }
    }

    let words: Vec<String> = entries
        .iter()
        .flat_map(|e| {
            std::iter::once(e.folder.clone()).chain(e.words.iter().map(|(_, w)| w.clone()))
        })
        .collect();
    let paths: Vec<String> = words
        .iter()
        .filter_map(|w| path_word(w))
        .map(|p| p.trim_end_matches('/').to_owned())
        .chain(entries.iter().map(|e| e.folder.clone()))
        .collect();
    for workspace::Member { dir, name } in workspace::members(&root) {
        let dir = dir.to_string_lossy().into_owned();
        if !paths.contains(&dir) {
            problems.push(format!(
                "the workspace member `{dir}/` ({name}) is not named in the Layout block"
            ));
        }
        let bare = |w: &String| {
            w.trim_matches(|c: char| !c.is_alphanumeric() && c != '-' && c != '_') == name
        };
        let folder_name = Path::new(&dir).file_name().and_then(|n| n.to_str());
        if folder_name != Some(name.as_str()) && !words.iter().any(bare) {
            problems.push(format!(
                "the package of `{dir}/`, {name}, is not named in the Layout block"
            ));
        }
    }

    for entry in &entries {
        let folder = root.join(&entry.folder);
        if !folder.is_dir() {
            problems.push(format!(
                "README.md:{}: the Layout entry `{}/` is no folder of the repository",
                entry.line, entry.folder
            ));
            continue;
        }
        let mut named = vec![folder.clone()];
        for (line, word) in &entry.words {
            let Some(path) = path_word(word) else {
                continue;
            };
            if !path.contains('/') {
                if !file_under(&folder, &path) {
                    problems.push(format!(
                        "README.md:{line}: the Layout names `{path}`, but no file under `{}/` \
                         has that name",
                        entry.folder
                    ));
                }
                continue;
            }
            // The nearest folder first: `python/`'s `tests/` is python/tests.
            let found = named
                .iter()
                .rev()
                .chain([folder.join("src"), root.clone()].iter())
                .map(|base| base.join(&path))
                .find(|candidate| candidate.exists());
            match found {
                Some(found) => {
                    if found.is_dir() {
                        named.push(found);
                    }
                }
                None => problems.push(format!(
                    "README.md:{line}: `{path}` is no path of the repository, of `{}/` or \
                     `{0}/src/`, or of a folder named before it in that entry (a word with a \
                     `/` is read as a path)",
                    entry.folder
                )),
            }
        }
    }

    assert!(
        problems.is_empty(),
        "README.md's \"## Layout\" section does not match the tree:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_block_is_read_into_entries_and_paths() {
    let readme = "# t\n\n## Layout\n\nSome prose.\n\n```\nab/     the a-b: lib.rs (x, y),\n        \
                  tests/ (pytest), driver/{cuda, hip}; e.g. sm_90a\ncd/     more\n```\n\n## Next\n";
    let block = layout_block(readme);
    let entries = entries(&block);
    let folders: Vec<&str> = entries.iter().map(|e| e.folder.as_str()).collect();
    assert_eq!(folders, ["ab", "cd"]);
    let paths: Vec<String> = entries[0]
        .words
        .iter()
        .filter_map(|(_, w)| path_word(w))
        .collect();
    assert_eq!(paths, ["lib.rs", "tests/", "driver/"]);
    assert!(entries[0].words.contains(&(9, "tests/".to_owned())));
    assert_eq!(path_word("https://example.invalid/x"), None);
    assert_eq!(path_word("and/or").as_deref(), Some("and/or"));
}
