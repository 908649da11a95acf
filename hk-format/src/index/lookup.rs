//! The index's lookup table: what hkload needs from the manifest between opening a bundle and
//! launching a kernel (each module's file and code images, each kernel's name and where its
//! record lies), in a fixed little-endian layout that is read where it lies.
//!
//! Why a third form of the same records: decoding the whole manifest at open (some 130 small
//! allocations, forty entry IDs parsed, names sorted for duplicates) took 25 µs with warm
//! caches and 60 µs with cold ones on the H100 machine, the largest part of hkload's cold-start
//! overhead over a raw driver load. Reading this table checks its bounds and parses the few
//! distinct entry IDs, and allocates once. The manifest it was made from is decoded only when
//! asked for, and checked then against this table. In `gpu_bench`'s cold start on the H100
//! machine, the open phase went from 53-75 µs to 30-33 µs (medians of two runs each).
//!
//! Layout, every number little-endian, nothing aligned:
//!
//! | part | what |
//! |---|---|
//! | [`Header`] | magic `HKLT`, package name and version, the count of each part below |
//! | [`Extension`] | the counts of the parts added since the header's first form |
//! | ID rows | each distinct entry ID of the bundle, as text ([`Span`] of the text) |
//! | [`ModuleRow`]s | the manifest's modules, in its order |
//! | [`EntryRow`]s | each module's entries, module after module |
//! | BLAKE3 rows | each entry's BLAKE3 digest, 32 bytes, in entry-row order |
//! | [`KernelRow`]s | each module's kernels, module after module, in the manifest's order |
//! | [`NotBuiltRow`]s | each module's not-built targets, module after module |
//! | text | UTF-8: every name the rows point into |
//! | [`Footer`] | the table's size and the magic again, so the table is found from the file's end |
//!
//! The header has no count of the BLAKE3 rows: there are as many as entries.
//!
//! Why the not-built targets here: a device for which a module is skipped on purpose (the FNUZ
//! FP8 GEMMs on sm_90) would otherwise make hkload's `Bundle::load` decode the whole manifest
//! to say so, which took choosing code objects from 1.6 to 59-75 µs in `gpu_bench`'s cold start
//! on the H100 machine.

use std::ops::Range;
use std::sync::Arc;

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::file::FileBytes;
use crate::manifest::{
    Blake3Digest, BundleManifest, EntryRecord, ManifestError, NotBuilt, Sha256Digest,
    check_file_name, duplicate_entry,
};
use crate::target::{EntryId, TargetId};

const MAGIC: [u8; 4] = *b"HKLT";

/// Where something lies: in the table's text, among its rows, or in the index file.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Span {
    start: U32,
    len: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Header {
    magic: [u8; 4],
    package: Span,
    version: Span,
    ids: U32,
    modules: U32,
    entries: U32,
    kernels: U32,
    text: U32,
}

/// What follows the header: the counts of the parts added after the header's first form.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Extension {
    not_built: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ModuleRow {
    name: Span,
    file: Span,
    size: U64,
    /// 1 for a compressed (`CCOB`) module file, 0 for a plain one.
    compressed: u8,
    /// The module's [`EntryRow`]s.
    entries: Span,
    /// The module's [`KernelRow`]s.
    kernels: Span,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct EntryRow {
    /// Which of the table's entry IDs.
    id: U32,
    size: U64,
    sha256: [u8; 32],
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct KernelRow {
    symbol: Span,
    /// The kernel's record in the index file.
    record: Span,
}

/// A build target a module is not built for, and why: a manifest's `not_built` record.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct NotBuiltRow {
    /// The module's place among the modules.
    module: U32,
    target: Span,
    reason: Span,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Footer {
    /// The whole table's size, header to footer.
    size: U32,
    magic: [u8; 4],
}

/// A lookup table whose bounds have been checked: every span lies inside its part, every text
/// is UTF-8, every module file is a plain name, every entry ID parses.
pub struct Table {
    bytes: Arc<FileBytes>,
    /// Where each part lies in `bytes`.
    parts: Parts,
    /// The bundle's distinct entry IDs, parsed; entry rows refer to them by position.
    ids: Vec<EntryId>,
    /// The target of each not-built row, parsed.
    not_built: Vec<TargetId>,
}

struct Parts {
    whole: Range<usize>,
    ids: Range<usize>,
    modules: Range<usize>,
    entries: Range<usize>,
    blake3: Range<usize>,
    kernels: Range<usize>,
    not_built: Range<usize>,
    text: Range<usize>,
}

/// A module as the table describes it.
#[derive(Clone, Copy)]
pub struct Module<'a> {
    table: &'a Table,
    row: &'a ModuleRow,
}

/// Where a kernel is: its module, its place among the module's kernels, its row in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelAt {
    pub module: usize,
    pub position: usize,
    pub row: usize,
}

impl Table {
    /// The table for `manifest`, whose kernels' records lie at `records` in the index file
    /// (one per kernel, modules in manifest order), or nowhere when `records` is empty. The
    /// same manifest and records always give the same bytes.
    pub fn encode(manifest: &BundleManifest, records: &[Range<usize>]) -> Vec<u8> {
        let mut text = Vec::new();
        let mut put = |s: &str| {
            let start = text.len();
            text.extend_from_slice(s.as_bytes());
            span(start, s.len())
        };
        let package = put(&manifest.package.name);
        let version = put(&manifest.package.version);
        let mut ids: Vec<EntryId> = Vec::new();
        let (mut modules, mut entries, mut kernels) = (Vec::new(), Vec::new(), Vec::new());
        let mut blake3: Vec<[u8; 32]> = Vec::new();
        let mut not_built = Vec::new();
        let mut records = records.iter();
        for (index, module) in manifest.modules.iter().enumerate() {
            for skipped in &module.not_built {
                not_built.push(NotBuiltRow {
                    module: u32_of(index).into(),
                    target: put(&skipped.target.to_string()),
                    reason: put(&skipped.reason),
                });
            }
            let module_entries = span(entries.len(), module.entries.len());
            for entry in &module.entries {
                let id = ids
                    .iter()
                    .position(|id| *id == entry.id)
                    .unwrap_or_else(|| {
                        ids.push(entry.id);
                        ids.len() - 1
                    });
                entries.push(EntryRow {
                    id: u32_of(id).into(),
                    size: entry.size.into(),
                    sha256: entry.sha256.0,
                });
                blake3.push(entry.blake3.0);
            }
            let module_kernels = span(kernels.len(), module.kernels.len());
            for symbol in &module.kernels {
                let record = records.next().map_or(0..0, Clone::clone);
                kernels.push(KernelRow {
                    symbol: put(symbol),
                    record: span(record.start, record.len()),
                });
            }
            modules.push(ModuleRow {
                name: put(&module.name),
                file: put(&module.file),
                size: module.size.into(),
                compressed: module.compressed.into(),
                entries: module_entries,
                kernels: module_kernels,
            });
        }
        let id_spans: Vec<Span> = ids.iter().map(|id| put(&id.to_string())).collect();
        let header = Header {
            magic: MAGIC,
            package,
            version,
            ids: u32_of(id_spans.len()).into(),
            modules: u32_of(modules.len()).into(),
            entries: u32_of(entries.len()).into(),
            kernels: u32_of(kernels.len()).into(),
            text: u32_of(text.len()).into(),
        };
        let mut table = header.as_bytes().to_vec();
        let extension = Extension {
            not_built: u32_of(not_built.len()).into(),
        };
        table.extend_from_slice(extension.as_bytes());
        table.extend_from_slice(id_spans.as_bytes());
        table.extend_from_slice(modules.as_bytes());
        table.extend_from_slice(entries.as_bytes());
        table.extend_from_slice(blake3.as_bytes());
        table.extend_from_slice(kernels.as_bytes());
        table.extend_from_slice(not_built.as_bytes());
        table.extend_from_slice(&text);
        let size = table.len() + size_of::<Footer>();
        table.extend_from_slice(
            Footer {
                size: u32_of(size).into(),
                magic: MAGIC,
            }
            .as_bytes(),
        );
        table
    }

    /// Where the table lies in `file`, found from the footer at its end.
    pub fn locate(file: &[u8]) -> Result<Range<usize>, ManifestError> {
        let footer = Footer::ref_from_suffix(file)
            .ok()
            .filter(|(_, footer)| footer.magic == MAGIC)
            .map(|(_, footer)| footer.size.get() as usize)
            .filter(|size| (size_of::<Header>() + size_of::<Footer>()..=file.len()).contains(size))
            .ok_or_else(|| damaged("its lookup table is missing or cut short"))?;
        Ok(file.len() - footer..file.len())
    }

    /// Checks the table at `whole` in `bytes`, whose kernels' records must lie within
    /// `records` (an empty range for a table without them).
    pub fn read(
        bytes: Arc<FileBytes>,
        whole: Range<usize>,
        records: Range<usize>,
    ) -> Result<Self, ManifestError> {
        let table = bytes
            .get(whole.clone())
            .ok_or_else(|| damaged("its lookup table lies outside the file"))?;
        let (header, _) = Header::ref_from_prefix(table)
            .map_err(|_| damaged("its lookup table is shorter than its header"))?;
        if header.magic != MAGIC {
            return Err(damaged("its lookup table does not start with `HKLT`"));
        }
        let (extension, _) = table
            .get(size_of::<Header>()..)
            .and_then(|rest| Extension::ref_from_prefix(rest).ok())
            .ok_or_else(|| damaged("its lookup table is shorter than its header"))?;
        let not_built = extension.not_built.get();
        let mut end = whole.start + size_of::<Header>() + size_of::<Extension>();
        // Each part follows the one before; their sizes must add up to the table's.
        let mut part = |count: u32, row_size: usize| {
            let start = end;
            end = start.saturating_add((count as usize).saturating_mul(row_size));
            start..end
        };
        let parts = Parts {
            ids: part(header.ids.get(), size_of::<Span>()),
            modules: part(header.modules.get(), size_of::<ModuleRow>()),
            entries: part(header.entries.get(), size_of::<EntryRow>()),
            blake3: part(header.entries.get(), 32),
            kernels: part(header.kernels.get(), size_of::<KernelRow>()),
            not_built: part(not_built, size_of::<NotBuiltRow>()),
            text: part(header.text.get(), 1),
            whole,
        };
        if end.saturating_add(size_of::<Footer>()) != parts.whole.end {
            return Err(damaged(
                "its lookup table's parts do not add up to its size",
            ));
        }
        let mut table = Self {
            bytes,
            parts,
            ids: Vec::new(),
            not_built: Vec::new(),
        };
        table.check(records)?;
        Ok(table)
    }

    /// The table's bytes, header to footer.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[self.parts.whole.clone()]
    }

    /// The package's name and version.
    pub fn package(&self) -> (&str, &str) {
        let header = self.header();
        (self.text(header.package), self.text(header.version))
    }

    pub fn modules(&self) -> impl ExactSizeIterator<Item = Module<'_>> + Clone {
        self.module_rows()
            .iter()
            .map(|row| Module { table: self, row })
    }

    pub fn module(&self, index: usize) -> Option<Module<'_>> {
        self.module_rows()
            .get(index)
            .map(|row| Module { table: self, row })
    }

    /// Where every kernel is, in row order (modules in manifest order).
    pub fn kernels(&self) -> impl Iterator<Item = KernelAt> + '_ {
        self.module_rows()
            .iter()
            .enumerate()
            .flat_map(|(module, m)| {
                range(m.kernels)
                    .enumerate()
                    .map(move |(position, row)| KernelAt {
                        module,
                        position,
                        row,
                    })
            })
    }

    /// The build targets of the bundle's code images, each once, in the order first met.
    pub fn build_targets(&self) -> Vec<TargetId> {
        let mut targets: Vec<TargetId> = Vec::new();
        for id in &self.ids {
            if !targets.contains(&id.target()) {
                targets.push(id.target());
            }
        }
        targets
    }

    /// Where kernel `symbol` is. A scan of a few hundred names costs less than building a map
    /// at every open.
    pub fn find_kernel(&self, symbol: &str) -> Option<KernelAt> {
        let rows = self.kernel_rows();
        self.kernels()
            .find(|at| self.text_bytes(rows[at.row].symbol) == symbol.as_bytes())
    }

    /// Every kernel's symbol, modules in manifest order.
    pub fn kernel_symbols(&self) -> impl ExactSizeIterator<Item = &str> {
        self.kernel_rows()
            .iter()
            .map(|kernel| self.text(kernel.symbol))
    }

    /// The symbol of the kernel in table row `row`, and where its record lies in the index.
    pub fn kernel(&self, row: usize) -> Option<(&str, Range<usize>)> {
        let kernel = self.kernel_rows().get(row)?;
        Some((self.text(kernel.symbol), range(kernel.record)))
    }

    fn check(&mut self, records: Range<usize>) -> Result<(), ManifestError> {
        let text = std::str::from_utf8(&self.bytes[self.parts.text.clone()])
            .map_err(|_| damaged("its lookup table's text is not UTF-8"))?;
        let text_ok = |span: Span| {
            text.get(range(span))
                .map(drop)
                .ok_or_else(|| damaged("a name lies outside its text or splits a character"))
        };
        // Every row's spans, before any is followed.
        let header = self.header();
        text_ok(header.package)?;
        text_ok(header.version)?;
        for &id in self.id_rows() {
            text_ok(id)?;
        }
        let (entries, kernels) = (self.entry_rows().len(), self.kernel_rows().len());
        let (mut next_entry, mut next_kernel) = (0, 0);
        for module in self.module_rows() {
            text_ok(module.name)?;
            text_ok(module.file)?;
            // The modules' rows follow each other, so a row belongs to one module only.
            let (own_entries, own_kernels) = (range(module.entries), range(module.kernels));
            if own_entries.start != next_entry || own_kernels.start != next_kernel {
                return Err(damaged("its modules' rows are out of order"));
            }
            (next_entry, next_kernel) = (own_entries.end, own_kernels.end);
            if module.compressed > 1 {
                return Err(damaged("a module is neither compressed nor plain"));
            }
        }
        if (next_entry, next_kernel) != (entries, kernels) {
            return Err(damaged("its modules do not own all its rows"));
        }
        for entry in self.entry_rows() {
            if entry.id.get() as usize >= self.id_rows().len() {
                return Err(damaged("an entry names an ID the table does not have"));
            }
        }
        for kernel in self.kernel_rows() {
            text_ok(kernel.symbol)?;
            // An empty record is checked too: it is still sliced out of the file.
            let record = range(kernel.record);
            let inside = records.start <= record.start && record.end <= records.end;
            if !inside {
                return Err(damaged(
                    "a kernel's record lies outside the index's records",
                ));
            }
        }
        let modules = self.module_rows().len();
        for row in self.not_built_rows() {
            text_ok(row.target)?;
            text_ok(row.reason)?;
            if row.module.get() as usize >= modules {
                return Err(damaged(
                    "a not-built target names a module the table does not have",
                ));
            }
        }
        // The rows are sound; now what they say.
        self.ids = self
            .id_rows()
            .iter()
            .map(|&id| self.text(id).parse())
            .collect::<Result<_, _>>()
            .map_err(|e| damaged(&format!("its lookup table holds a bad entry ID: {e}")))?;
        self.not_built = self
            .not_built_rows()
            .iter()
            .map(|row| self.text(row.target).parse())
            .collect::<Result<_, _>>()
            .map_err(|e| damaged(&format!("its lookup table holds a bad target: {e}")))?;
        let module_rows = self.module_rows();
        for (i, module) in self.modules().enumerate() {
            check_file_name(module.name(), module.file())?;
            // A bundle names each module once (its name names its files): with two of one
            // name, which one a lookup by name meant could not be told. The manifest's own
            // check runs only when it is decoded, so the table checks too, pairwise in place as
            // the entries below: a few hundred comparisons of short names for the repository.
            let name = self.text_bytes(module.row.name);
            if module_rows[..i]
                .iter()
                .any(|other| self.text_bytes(other.name) == name)
            {
                return Err(damaged(&format!(
                    "module `{}` is listed twice in its lookup table",
                    module.name()
                )));
            }
            // A module has a handful of entries: compared pairwise in place, where
            // manifest::first_duplicate sorts a copy. Through that, a warm open of the repo's
            // bundle took 1.78 µs instead of 1.45 on the development machine.
            let rows = &self.entry_rows()[range(module.row.entries)];
            for (i, entry) in rows.iter().enumerate() {
                if rows[..i].iter().any(|other| other.id == entry.id) {
                    return Err(duplicate_entry(
                        module.name(),
                        &self.ids[entry.id.get() as usize],
                    ));
                }
            }
        }
        Ok(())
    }

    fn header(&self) -> &Header {
        let bytes = &self.bytes[self.parts.whole.clone()];
        Header::ref_from_prefix(bytes).map_or_else(|_| unreachable_layout(), |(header, _)| header)
    }

    fn id_rows(&self) -> &[Span] {
        self.rows(&self.parts.ids)
    }

    fn module_rows(&self) -> &[ModuleRow] {
        self.rows(&self.parts.modules)
    }

    fn entry_rows(&self) -> &[EntryRow] {
        self.rows(&self.parts.entries)
    }

    /// Each entry's BLAKE3, in entry-row order.
    fn blake3_rows(&self) -> &[[u8; 32]] {
        self.rows(&self.parts.blake3)
    }

    fn kernel_rows(&self) -> &[KernelRow] {
        self.rows(&self.parts.kernels)
    }

    /// The not-built rows.
    fn not_built_rows(&self) -> &[NotBuiltRow] {
        self.rows(&self.parts.not_built)
    }

    /// The build targets module `index` is not built for, by design, and why.
    pub fn not_built(&self, index: usize) -> Vec<NotBuilt> {
        self.not_built_rows()
            .iter()
            .zip(&self.not_built)
            .filter(|(row, _)| row.module.get() as usize == index)
            .map(|(row, target)| NotBuilt {
                target: *target,
                reason: self.text(row.reason).to_owned(),
            })
            .collect()
    }

    fn rows<T: FromBytes + Immutable + KnownLayout + Unaligned>(
        &self,
        part: &Range<usize>,
    ) -> &[T] {
        <[T]>::ref_from_bytes(&self.bytes[part.clone()]).unwrap_or_else(|_| unreachable_layout())
    }

    /// Text the checks at [`Table::read`] found inside the text and UTF-8.
    fn text(&self, span: Span) -> &str {
        std::str::from_utf8(self.text_bytes(span)).unwrap_or_else(|_| unreachable_layout())
    }

    /// The bytes of that text, for comparing without checking them as UTF-8 again.
    fn text_bytes(&self, span: Span) -> &[u8] {
        &self.bytes[self.parts.text.clone()][range(span)]
    }
}

impl<'a> Module<'a> {
    pub fn name(&self) -> &'a str {
        self.table.text(self.row.name)
    }

    /// The module file's name inside the bundle folder.
    pub fn file(&self) -> &'a str {
        self.table.text(self.row.file)
    }

    /// The module file's size in bytes.
    pub fn size(&self) -> u64 {
        self.row.size.get()
    }

    /// Whether the module file is a compressed (`CCOB`) bundle.
    pub fn compressed(&self) -> bool {
        self.row.compressed == 1
    }

    pub fn entries(&self) -> impl ExactSizeIterator<Item = EntryRecord> + 'a {
        let table = self.table;
        let rows = range(self.row.entries);
        // The BLAKE3 rows are as many as the entry rows: `read` checked the parts' sizes.
        table.entry_rows()[rows.clone()]
            .iter()
            .zip(&table.blake3_rows()[rows])
            .map(|(row, blake3)| EntryRecord {
                id: table.ids[row.id.get() as usize],
                size: row.size.get(),
                sha256: Sha256Digest(row.sha256),
                blake3: Blake3Digest(*blake3),
            })
    }

    /// The table rows of the module's kernels.
    pub(crate) fn kernel_rows(&self) -> Range<usize> {
        range(self.row.kernels)
    }

    pub fn entry_ids(&self) -> Vec<EntryId> {
        self.entries().map(|entry| entry.id).collect()
    }
}

fn span(start: usize, len: usize) -> Span {
    Span {
        start: u32_of(start).into(),
        len: u32_of(len).into(),
    }
}

fn range(span: Span) -> Range<usize> {
    let start = span.start.get() as usize;
    start..start + span.len.get() as usize
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).expect("an index is far smaller than 4 GiB")
}

pub(super) fn damaged(what: &str) -> ManifestError {
    ManifestError::Invalid(format!(
        "the index is damaged: {what}; rebuild the bundle with `hkpack build`"
    ))
}

/// For the accessors' conversions, which [`Table::read`] has already checked.
fn unreachable_layout() -> ! {
    unreachable!("the lookup table's layout was checked when it was read")
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::manifest::{EntryRecord, FORMAT_VERSION, ModuleRecord, Package, Toolchain};

    /// A manifest of two modules and three kernels (also the index tests' sample).
    pub(in crate::index) fn manifest() -> BundleManifest {
        let entry = |id: &str, size| EntryRecord {
            id: id.parse().unwrap(),
            size,
            sha256: Sha256Digest::of(id.as_bytes()),
            blake3: Blake3Digest::of(id.as_bytes()),
        };
        let module = |name: &str, kernels: &[&str]| ModuleRecord {
            name: name.into(),
            file: format!("{name}.hipfb"),
            size: 4096,
            sha256: Sha256Digest::of(name.as_bytes()),
            compressed: name == "norm",
            kernels: kernels.iter().map(|&k| k.to_owned()).collect(),
            abi_file: format!("{name}.abi.toml"),
            abi_sha256: Sha256Digest::of(b"abi"),
            entries: vec![
                entry("hipv4-amdgcn-amd-amdhsa--gfx942", 1000),
                entry("cuda-nvptx64-nvidia-cuda-sm_90", 2000),
                entry("cuda-nvptx64-nvidia-cuda-compute_90", 3000),
            ],
            not_built: if name == "act" {
                vec![NotBuilt {
                    target: "gfx90a".parse().unwrap(),
                    reason: "no such instruction".into(),
                }]
            } else {
                Vec::new()
            },
            blake3: Blake3Digest::of(name.as_bytes()),
        };
        BundleManifest {
            format_version: FORMAT_VERSION,
            targets: vec!["gfx942".parse().unwrap(), "sm_90".parse().unwrap()],
            package: Package {
                name: "kernels".into(),
                version: "1.0.0".into(),
            },
            toolchain: Toolchain {
                clang: "clang".into(),
                ptxas: None,
                amd_code_object_version: 5,
            },
            modules: vec![
                module("norm", &["rmsnorm_bf16", "layernorm_bf16"]),
                module("act", &["silu_bf16"]),
            ],
            provenance: None,
        }
    }

    /// The table of [`manifest`] with its kernels' records at 100.., 200.. and 300.., edited by
    /// `edit`, then read as if it lay after records in 0..1000.
    fn read_edited(edit: impl FnOnce(&mut Vec<u8>)) -> Result<Table, ManifestError> {
        let records = [100..150, 200..260, 300..310];
        let mut bytes = Table::encode(&manifest(), &records);
        edit(&mut bytes);
        let mut file = vec![0; 1000];
        file.extend(bytes);
        let whole = Table::locate(&file)?;
        Table::read(Arc::new(file.into()), whole, 0..1000)
    }

    /// The table of `manifest` alone, with no kernel records.
    fn build(manifest: &BundleManifest) -> Result<Table, ManifestError> {
        let bytes = Table::encode(manifest, &[]);
        let whole = 0..bytes.len();
        Table::read(Arc::new(bytes.into()), whole, 0..0)
    }

    fn header(bytes: &mut [u8]) -> &mut Header {
        Header::mut_from_prefix(bytes).unwrap().0
    }

    fn rows<T: FromBytes + IntoBytes + KnownLayout + Unaligned>(
        bytes: &mut [u8],
        part: usize,
    ) -> &mut [T] {
        let h = header(bytes);
        // The parts in order; the BLAKE3 rows are as many as the entries.
        let (ids, modules, entries, kernels) = (
            h.ids.get(),
            h.modules.get(),
            h.entries.get(),
            h.kernels.get(),
        );
        let extension = Extension::mut_from_prefix(&mut bytes[size_of::<Header>()..])
            .unwrap()
            .0;
        let counts = [
            ids,
            modules,
            entries,
            entries,
            kernels,
            extension.not_built.get(),
        ];
        let sizes = [
            size_of::<Span>(),
            size_of::<ModuleRow>(),
            size_of::<EntryRow>(),
            32,
            size_of::<KernelRow>(),
            size_of::<NotBuiltRow>(),
        ];
        let start = size_of::<Header>()
            + size_of::<Extension>()
            + (0..part)
                .map(|p| counts[p] as usize * sizes[p])
                .sum::<usize>();
        let len = counts[part] as usize * sizes[part];
        <[T]>::mut_from_bytes(&mut bytes[start..start + len]).unwrap()
    }

    #[test]
    fn says_what_the_manifest_says() {
        let table = read_edited(|_| {}).unwrap();
        let manifest = manifest();
        assert_eq!(table.package(), ("kernels", "1.0.0"));
        assert_eq!(table.modules().len(), 2);
        for (module, record) in table.modules().zip(&manifest.modules) {
            assert_eq!(module.name(), record.name);
            assert_eq!(module.file(), record.file);
            assert_eq!(module.size(), record.size);
            assert_eq!(module.compressed(), record.compressed);
            let entries: Vec<EntryRecord> = module.entries().collect();
            let expected = record.entries.clone();
            assert_eq!(entries, expected);
        }
        let symbols: Vec<&str> = table.kernel_symbols().collect();
        assert_eq!(symbols, ["rmsnorm_bf16", "layernorm_bf16", "silu_bf16"]);
        let at = |module, position, row| KernelAt {
            module,
            position,
            row,
        };
        assert_eq!(table.find_kernel("layernorm_bf16"), Some(at(0, 1, 1)));
        assert_eq!(table.find_kernel("silu_bf16"), Some(at(1, 0, 2)));
        assert_eq!(table.find_kernel("silu"), None);
        assert_eq!(table.kernel(2), Some(("silu_bf16", 300..310)));
        assert_eq!(table.kernel(3), None);
        // Three distinct entry IDs, shared by both modules.
        assert_eq!(table.ids.len(), 3);
        for (index, record) in manifest.modules.iter().enumerate() {
            assert_eq!(table.not_built(index), record.not_built);
        }
    }

    #[test]
    fn refuses_tables_that_do_not_hold_together() {
        let refused = |what: &str, edit: &dyn Fn(&mut Vec<u8>)| {
            let error = read_edited(edit)
                .err()
                .unwrap_or_else(|| panic!("{what}: accepted"));
            let text = error.to_string();
            assert!(text.contains("rebuild"), "{what}: {text}");
        };
        refused("no footer", &|b| b.truncate(b.len() - 1));
        refused("footer too large", &|b| {
            let at = b.len() - 8;
            b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        });
        refused("bad magic", &|b| header(b).magic = *b"HKLX");
        refused("counts beyond the table", &|b| header(b).kernels = 4.into());
        refused("counts short of the table", &|b| header(b).text -= 1);
        refused("text outside", &|b| header(b).package.len = 10_000.into());
        refused("text not UTF-8", &|b| {
            let at = b.len() - 9;
            b[at] = 0xff;
        });
        refused("rows out of order", &|b| {
            rows::<ModuleRow>(b, 1)[1].entries.start = 0.into()
        });
        refused("rows left over", &|b| {
            rows::<ModuleRow>(b, 1)[1].kernels.len = 0.into()
        });
        refused("neither compressed nor plain", &|b| {
            rows::<ModuleRow>(b, 1)[0].compressed = 2;
        });
        refused("unknown ID", &|b| rows::<EntryRow>(b, 2)[0].id = 3.into());
        refused("record outside", &|b| {
            rows::<KernelRow>(b, 4)[0].record.start = 990.into();
        });
        refused("empty record far outside", &|b| {
            rows::<KernelRow>(b, 4)[0].record = span(u32::MAX as usize, 0);
        });
        refused("not-built row of no module", &|b| {
            rows::<NotBuiltRow>(b, 5)[0].module = 2.into();
        });
        refused("not-built reason outside", &|b| {
            rows::<NotBuiltRow>(b, 5)[0].reason.len = 10_000.into();
        });
        refused("not-built rows beyond the table", &|b| {
            Extension::mut_from_prefix(&mut b[size_of::<Header>()..])
                .unwrap()
                .0
                .not_built = 2.into();
        });
        refused("bad not-built target", &|b| {
            // The row's target, `gfx90a`, made `gfx9za`.
            let span = rows::<NotBuiltRow>(b, 5)[0].target;
            let text = b.len() - size_of::<Footer>() - header(b).text.get() as usize;
            b[text + span.start.get() as usize + 4] = b'z';
        });
        refused("bad entry ID", &|b| {
            // The first ID's text, `hipv4-…`, made `hipv5-…`.
            let span = rows::<Span>(b, 0)[0];
            let text = b.len() - size_of::<Footer>() - header(b).text.get() as usize;
            b[text + span.start.get() as usize + 4] = b'5';
        });
    }

    #[test]
    fn each_entrys_blake3_row_is_its_own() {
        // Each entry's own digest: a changed row changes that entry alone.
        let table = read_edited(|b| rows::<[u8; 32]>(b, 3)[4][0] ^= 1).unwrap();
        let changed: Vec<bool> = table
            .modules()
            .zip(&manifest().modules)
            .flat_map(|(m, record)| {
                m.entries()
                    .zip(record.entries.clone())
                    .map(|(read, written)| read.blake3 != written.blake3)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(changed, [false, false, false, false, true, false]);
    }

    #[test]
    fn refuses_module_files_outside_the_bundle() {
        let mut manifest = manifest();
        manifest.modules[1].file = "../act.hipfb".into();
        let error = build(&manifest).err().unwrap();
        assert!(
            error.to_string().contains("not a plain file name"),
            "{error}"
        );
    }

    #[test]
    fn refuses_a_module_file_whose_name_holds_a_nul() {
        // Found by the `bundle` fuzz target: such a name can never be opened.
        let mut manifest = manifest();
        manifest.modules[1].file = "act.h\0fb".into();
        let error = build(&manifest).err().unwrap();
        assert!(
            error.to_string().contains("not a plain file name"),
            "{error}"
        );
    }

    #[test]
    fn refuses_two_modules_of_one_name() {
        // Each its own file, so that only the name is shared.
        let mut manifest = manifest();
        manifest.modules[1].name = "norm".into();
        let error = build(&manifest).err().unwrap();
        let text = error.to_string();
        assert!(text.contains("module `norm` is listed twice"), "{text}");
        assert!(text.contains("rebuild"), "{text}");
    }

    #[test]
    fn refuses_a_module_with_an_entry_twice() {
        let mut manifest = manifest();
        let twice = manifest.modules[0].entries[0];
        manifest.modules[0].entries.push(twice);
        let error = build(&manifest).err().unwrap();
        assert!(error.to_string().contains("lists entry"), "{error}");
    }
}
