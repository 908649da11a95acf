//! The workspace's members, read from the root `Cargo.toml` as it is when a test runs, so that
//! a crate added later is covered without editing the tests that walk every crate.

use std::path::{Path, PathBuf};

/// One member of the workspace.
pub struct Member {
    /// Its folder, relative to the workspace root (`hkload`, `python`).
    pub dir: PathBuf,
    /// Its package name (`hkload-python`).
    pub name: String,
}

/// The workspace's members. A member `dir/*` stands for every folder of `dir` with a
/// `Cargo.toml`, less those `exclude` names.
pub fn members(root: &Path) -> Vec<Member> {
    let manifest = read_manifest(&root.join("Cargo.toml"));
    let strings = |key: &str| -> Vec<String> {
        manifest["workspace"]
            .get(key)
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .map(|v| v.as_str().expect("workspace paths are strings").to_owned())
            .collect()
    };
    let exclude = strings("exclude");
    let mut dirs = Vec::new();
    for member in strings("members") {
        if let Some(parent) = member.strip_suffix("/*") {
            let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(parent))
                .unwrap()
                .map(|e| Path::new(parent).join(e.unwrap().file_name()))
                .filter(|d| root.join(d).join("Cargo.toml").is_file())
                .filter(|d| !exclude.iter().any(|x| Path::new(x) == d))
                .collect();
            found.sort();
            dirs.extend(found);
        } else {
            assert!(
                !member.contains(['*', '?', '[']),
                "workspace member `{member}`: these tests read only plain folders and `dir/*`"
            );
            dirs.push(PathBuf::from(member));
        }
    }
    dirs.into_iter()
        .map(|dir| {
            let path = root.join(&dir).join("Cargo.toml");
            let name = read_manifest(&path)
                .get("package")
                .and_then(|p| p.get("name"))
                .and_then(toml::Value::as_str)
                .unwrap_or_else(|| panic!("{} names no package", path.display()))
                .to_owned();
            Member { dir, name }
        })
        .collect()
}

fn read_manifest(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
