//! The AMDGPU metadata note (`NT_AMDGPU_METADATA`, code objects V3 and later): a MessagePack
//! map that gives each kernel's argument layout, kernarg segment, registers, spills, LDS,
//! scratch and wave size. It is a format of its own inside the ELF container (`amd_elf`),
//! decoded from untrusted bytes with a depth bound, and its errors name the map and the key
//! at fault.

use std::collections::HashSet;

use rmpv::Value;

use super::{ArgKind, ArgSlot, CodeObjectError, KernelFacts};

/// The deepest real metadata path is map, `amdhsa.kernels`, kernel, `.args`, argument, value;
/// a small bound stops crafted notes from recursing deep into the decoder.
const METADATA_MAX_DEPTH: usize = 16;

/// The merged content of the metadata notes.
#[derive(Debug)]
pub(super) struct AmdMetadata {
    pub(super) version: (u32, u32),
    pub(super) target: String,
    pub(super) kernels: Vec<AmdKernel>,
}

#[derive(Debug)]
pub(super) struct AmdKernel {
    pub(super) facts: KernelFacts,
    /// `.symbol`: the kernel descriptor's symbol, `name.kd` as LLVM writes it.
    pub(super) descriptor: String,
}

/// Decodes each metadata note's descriptor and merges them into one.
pub(super) fn read_metadata<'a>(
    descriptors: impl IntoIterator<Item = &'a [u8]>,
) -> Result<AmdMetadata, CodeObjectError> {
    let mut merged: Option<AmdMetadata> = None;
    for (note, descriptor) in descriptors.into_iter().enumerate() {
        let next = read_metadata_note(note, descriptor)?;
        let Some(merged) = &mut merged else {
            merged = Some(next);
            continue;
        };
        if next.version != merged.version {
            return Err(CodeObjectError::ConflictingNotes {
                key: "amdhsa.version",
                first: format!("{}.{}", merged.version.0, merged.version.1),
                other: format!("{}.{}", next.version.0, next.version.1),
                note,
            });
        }
        if next.target != merged.target {
            return Err(CodeObjectError::ConflictingNotes {
                key: "amdhsa.target",
                first: merged.target.clone(),
                other: next.target,
                note,
            });
        }
        merged.kernels.extend(next.kernels);
    }
    let metadata = merged.ok_or(CodeObjectError::MissingMetadata)?;
    let mut names = HashSet::new();
    for kernel in &metadata.kernels {
        if !names.insert(kernel.facts.name.as_str()) {
            return Err(CodeObjectError::DuplicateKernel {
                kernel: kernel.facts.name.clone(),
            });
        }
    }
    Ok(metadata)
}

fn read_metadata_note(note: usize, descriptor: &[u8]) -> Result<AmdMetadata, CodeObjectError> {
    let mut rest = descriptor;
    let value = rmpv::decode::read_value_with_max_depth(&mut rest, METADATA_MAX_DEPTH).map_err(
        |error| CodeObjectError::MetadataNotMessagePack {
            note,
            reason: error.to_string(),
        },
    )?;
    if !rest.is_empty() {
        return Err(CodeObjectError::TrailingMetadata {
            note,
            extra: rest.len(),
        });
    }
    let top = MetadataMap::new(&value, format!("AMDGPU metadata note {note}"))?;
    let version = top.required("amdhsa.version")?;
    let (major, minor) = match version.as_array().map(Vec::as_slice) {
        Some([major, minor]) => as_u32(major).zip(as_u32(minor)),
        _ => None,
    }
    .ok_or_else(|| {
        top.bad_value(
            "amdhsa.version",
            "an array of two unsigned integers, [major, minor]",
            version,
        )
    })?;
    // Major version 1 is the MessagePack metadata of code objects V3 to V6.
    if major != 1 {
        return Err(CodeObjectError::UnsupportedMetadataVersion { major, minor });
    }
    let target = top.string("amdhsa.target")?.to_owned();
    let kernels = top
        .array("amdhsa.kernels")?
        .iter()
        .enumerate()
        .map(|(index, kernel)| read_kernel(index, kernel))
        .collect::<Result<_, _>>()?;
    Ok(AmdMetadata {
        version: (major, minor),
        target,
        kernels,
    })
}

fn read_kernel(index: usize, value: &Value) -> Result<AmdKernel, CodeObjectError> {
    let unnamed = MetadataMap::new(value, format!("kernel {index} of `amdhsa.kernels`"))?;
    let name = unnamed.string(".name")?;
    let kernel = MetadataMap {
        entries: unnamed.entries,
        place: format!("kernel `{name}`"),
    };
    let kernarg_size = kernel.u32(".kernarg_segment_size")?;
    let kernarg_align = kernel.u32(".kernarg_segment_align")?;
    if !kernarg_align.is_power_of_two() {
        return Err(kernel.bad_value(
            ".kernarg_segment_align",
            "a power of two",
            &Value::from(kernarg_align),
        ));
    }
    let wavefront_size = kernel.u32(".wavefront_size")?;
    if !matches!(wavefront_size, 32 | 64) {
        return Err(kernel.bad_value(".wavefront_size", "32 or 64", &Value::from(wavefront_size)));
    }

    let mut args = Vec::new();
    for (index, arg) in kernel.optional_array(".args")?.iter().enumerate() {
        let arg = MetadataMap::new(arg, format!("argument {index} of kernel `{name}`"))?;
        let offset = arg.u32(".offset")?;
        let size = arg.u32(".size")?;
        let value_kind = arg.string(".value_kind")?;
        // The runtime fills the hidden arguments itself; callers pass only the explicit ones.
        if value_kind.starts_with("hidden_") {
            continue;
        }
        if u64::from(offset) + u64::from(size) > u64::from(kernarg_size) {
            return Err(CodeObjectError::ArgOutOfBounds {
                kernel: name.to_owned(),
                index,
                offset,
                size,
                kernarg_size,
            });
        }
        args.push(ArgSlot {
            offset,
            size,
            kind: ArgKind::from_value_kind(value_kind),
        });
    }

    let facts = KernelFacts {
        name: name.to_owned(),
        args,
        kernarg_size,
        kernarg_align,
        sgpr_count: Some(kernel.u32(".sgpr_count")?),
        vgpr_count: Some(kernel.u32(".vgpr_count")?),
        agpr_count: kernel.optional_u32(".agpr_count")?,
        registers: None,
        sgpr_spill_count: kernel.optional_u32(".sgpr_spill_count")?.unwrap_or(0),
        vgpr_spill_count: kernel.optional_u32(".vgpr_spill_count")?.unwrap_or(0),
        group_segment_size: kernel.u32(".group_segment_fixed_size")?,
        private_segment_size: kernel.u32(".private_segment_fixed_size")?,
        wavefront_size,
        max_flat_workgroup_size: kernel.u32(".max_flat_workgroup_size")?,
    };
    Ok(AmdKernel {
        facts,
        descriptor: kernel.string(".symbol")?.to_owned(),
    })
}

/// One MessagePack map of the metadata, with the words that place it in error messages.
struct MetadataMap<'v> {
    entries: &'v [(Value, Value)],
    place: String,
}

impl<'v> MetadataMap<'v> {
    fn new(value: &'v Value, place: String) -> Result<Self, CodeObjectError> {
        match value {
            Value::Map(entries) => Ok(Self { entries, place }),
            other => Err(CodeObjectError::NotAMap {
                place,
                found: describe(other),
            }),
        }
    }

    fn get(&self, key: &str) -> Option<&'v Value> {
        self.entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, value)| value)
    }

    fn required(&self, key: &'static str) -> Result<&'v Value, CodeObjectError> {
        self.get(key).ok_or_else(|| CodeObjectError::MissingKey {
            place: self.place.clone(),
            key,
        })
    }

    fn bad_value(
        &self,
        key: &'static str,
        expected: &'static str,
        found: &Value,
    ) -> CodeObjectError {
        CodeObjectError::BadValue {
            place: self.place.clone(),
            key,
            expected,
            found: describe(found),
        }
    }

    fn string(&self, key: &'static str) -> Result<&'v str, CodeObjectError> {
        let value = self.required(key)?;
        value
            .as_str()
            .ok_or_else(|| self.bad_value(key, "a UTF-8 string", value))
    }

    fn u32(&self, key: &'static str) -> Result<u32, CodeObjectError> {
        self.u32_from(key, self.required(key)?)
    }

    fn optional_u32(&self, key: &'static str) -> Result<Option<u32>, CodeObjectError> {
        self.get(key)
            .map(|value| self.u32_from(key, value))
            .transpose()
    }

    fn u32_from(&self, key: &'static str, value: &Value) -> Result<u32, CodeObjectError> {
        as_u32(value).ok_or_else(|| self.bad_value(key, "an unsigned 32-bit integer", value))
    }

    fn array(&self, key: &'static str) -> Result<&'v [Value], CodeObjectError> {
        self.array_from(key, self.required(key)?)
    }

    /// An array that may be left out, which means empty.
    fn optional_array(&self, key: &'static str) -> Result<&'v [Value], CodeObjectError> {
        self.get(key)
            .map_or(Ok(&[]), |value| self.array_from(key, value))
    }

    fn array_from(
        &self,
        key: &'static str,
        value: &'v Value,
    ) -> Result<&'v [Value], CodeObjectError> {
        value
            .as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| self.bad_value(key, "an array", value))
    }
}

fn as_u32(value: &Value) -> Option<u32> {
    value.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// A short description of a metadata value for error messages; long strings are not echoed.
fn describe(value: &Value) -> String {
    match value {
        Value::Nil => "nil".to_owned(),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Integer(n) => format!("the integer {n}"),
        Value::F32(x) => format!("the float {x}"),
        Value::F64(x) => format!("the float {x}"),
        Value::String(s) => match s.as_str() {
            Some(text) if text.len() <= 40 => format!("the string {text:?}"),
            Some(text) => format!("a string of {} bytes", text.len()),
            None => "a string that is not UTF-8".to_owned(),
        },
        Value::Binary(bytes) => format!("{} bytes of binary data", bytes.len()),
        Value::Array(items) => format!("an array of {} items", items.len()),
        Value::Map(entries) => format!("a map of {} entries", entries.len()),
        Value::Ext(..) => "a MessagePack extension value".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{AMD_KERNELS, compile_amd, metadata_value};

    fn encode(value: &Value) -> Vec<u8> {
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, value).unwrap();
        bytes
    }

    fn read_one(value: &Value) -> Result<AmdMetadata, CodeObjectError> {
        read_metadata([encode(value).as_slice()])
    }

    fn map_mut(value: &mut Value) -> &mut Vec<(Value, Value)> {
        match value {
            Value::Map(entries) => entries,
            other => panic!("not a map: {other}"),
        }
    }

    /// Sets (or with `None` removes) `key` in a map.
    fn set(map: &mut Value, key: &str, new: Option<Value>) {
        let entries = map_mut(map);
        entries.retain(|(k, _)| k.as_str() != Some(key));
        entries.extend(new.map(|v| (Value::from(key), v)));
    }

    fn get<'v>(map: &'v mut Value, key: &str) -> &'v mut Value {
        map_mut(map)
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
            .unwrap()
    }

    /// Kernel `index` of the metadata.
    fn kernel_at(metadata: &mut Value, index: usize) -> &mut Value {
        match get(metadata, "amdhsa.kernels") {
            Value::Array(kernels) => &mut kernels[index],
            other => panic!("not an array: {other}"),
        }
    }

    fn arg_at(metadata: &mut Value, kernel: usize, index: usize) -> &mut Value {
        match get(kernel_at(metadata, kernel), ".args") {
            Value::Array(args) => &mut args[index],
            other => panic!("not an array: {other}"),
        }
    }

    fn bad_value(
        place: &str,
        key: &'static str,
        expected: &'static str,
        found: &str,
    ) -> CodeObjectError {
        CodeObjectError::BadValue {
            place: place.into(),
            key,
            expected,
            found: found.into(),
        }
    }

    #[test]
    fn metadata_errors_name_the_place_and_the_key() {
        let real = metadata_value(&compile_amd(AMD_KERNELS, "gfx942", 5));
        let fails = |edit: &dyn Fn(&mut Value)| {
            let mut metadata = real.clone();
            edit(&mut metadata);
            read_one(&metadata).unwrap_err()
        };
        let top = "AMDGPU metadata note 0";
        let axpy = "kernel `axpy`";
        let u32_expected = "an unsigned 32-bit integer";

        assert_eq!(
            fails(&|m| *m = Value::from(3)),
            CodeObjectError::NotAMap {
                place: top.into(),
                found: "the integer 3".into()
            }
        );
        for key in ["amdhsa.version", "amdhsa.target", "amdhsa.kernels"] {
            assert_eq!(
                fails(&|m| set(m, key, None)),
                CodeObjectError::MissingKey {
                    place: top.into(),
                    key
                }
            );
        }
        let version_expected = "an array of two unsigned integers, [major, minor]";
        assert_eq!(
            fails(&|m| set(m, "amdhsa.version", Some(Value::Array(vec![1.into()])))),
            bad_value(
                top,
                "amdhsa.version",
                version_expected,
                "an array of 1 items"
            )
        );
        assert_eq!(
            fails(&|m| set(
                m,
                "amdhsa.version",
                Some(Value::Array(vec![1.into(), (-2).into()]))
            )),
            bad_value(
                top,
                "amdhsa.version",
                version_expected,
                "an array of 2 items"
            )
        );
        assert_eq!(
            fails(&|m| set(
                m,
                "amdhsa.version",
                Some(Value::Array(vec![2.into(), 0.into()]))
            )),
            CodeObjectError::UnsupportedMetadataVersion { major: 2, minor: 0 }
        );
        assert_eq!(
            fails(&|m| set(m, "amdhsa.target", Some(Value::Binary(vec![0xff])))),
            bad_value(
                top,
                "amdhsa.target",
                "a UTF-8 string",
                "1 bytes of binary data"
            )
        );
        assert_eq!(
            fails(&|m| set(m, "amdhsa.kernels", Some(Value::Map(vec![])))),
            bad_value(top, "amdhsa.kernels", "an array", "a map of 0 entries")
        );
        assert_eq!(
            fails(&|m| *kernel_at(m, 1) = Value::Nil),
            CodeObjectError::NotAMap {
                place: "kernel 1 of `amdhsa.kernels`".into(),
                found: "nil".into()
            }
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".name", None)),
            CodeObjectError::MissingKey {
                place: "kernel 0 of `amdhsa.kernels`".into(),
                key: ".name"
            }
        );
        for key in [
            ".symbol",
            ".kernarg_segment_size",
            ".group_segment_fixed_size",
            ".private_segment_fixed_size",
            ".kernarg_segment_align",
            ".wavefront_size",
            ".sgpr_count",
            ".vgpr_count",
            ".max_flat_workgroup_size",
        ] {
            assert_eq!(
                fails(&|m| set(kernel_at(m, 0), key, None)),
                CodeObjectError::MissingKey {
                    place: axpy.into(),
                    key
                }
            );
        }
        for (value, found) in [
            (Value::from(-1), "the integer -1"),
            (Value::from(1u64 << 32), "the integer 4294967296"),
            (Value::from("14"), "the string \"14\""),
            (Value::from("x".repeat(41)), "a string of 41 bytes"),
            (Value::F64(14.0), "the float 14"),
            (Value::Boolean(true), "the boolean true"),
            (Value::Ext(1, vec![]), "a MessagePack extension value"),
        ] {
            assert_eq!(
                fails(&|m| set(kernel_at(m, 0), ".sgpr_count", Some(value.clone()))),
                bad_value(axpy, ".sgpr_count", u32_expected, found)
            );
        }
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".agpr_count", Some(Value::F32(0.5)))),
            bad_value(axpy, ".agpr_count", u32_expected, "the float 0.5")
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".kernarg_segment_align", Some(6.into()))),
            bad_value(
                axpy,
                ".kernarg_segment_align",
                "a power of two",
                "the integer 6"
            )
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".wavefront_size", Some(48.into()))),
            bad_value(axpy, ".wavefront_size", "32 or 64", "the integer 48")
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 0), ".args", Some(Value::from("none")))),
            bad_value(axpy, ".args", "an array", "the string \"none\"")
        );
        assert_eq!(
            fails(&|m| *arg_at(m, 0, 1) = Value::Array(vec![])),
            CodeObjectError::NotAMap {
                place: "argument 1 of kernel `axpy`".into(),
                found: "an array of 0 items".into()
            }
        );
        for key in [".offset", ".size", ".value_kind"] {
            assert_eq!(
                fails(&|m| set(arg_at(m, 0, 1), key, None)),
                CodeObjectError::MissingKey {
                    place: "argument 1 of kernel `axpy`".into(),
                    key
                }
            );
        }
        assert_eq!(
            fails(&|m| set(arg_at(m, 0, 3), ".offset", Some(286.into()))),
            CodeObjectError::ArgOutOfBounds {
                kernel: "axpy".into(),
                index: 3,
                offset: 286,
                size: 4,
                kernarg_size: 288
            }
        );
        assert_eq!(
            fails(&|m| set(arg_at(m, 0, 3), ".size", Some(u32::MAX.into()))),
            CodeObjectError::ArgOutOfBounds {
                kernel: "axpy".into(),
                index: 3,
                offset: 24,
                size: u32::MAX,
                kernarg_size: 288
            }
        );
        assert_eq!(
            fails(&|m| set(kernel_at(m, 2), ".name", Some("axpy".into()))),
            CodeObjectError::DuplicateKernel {
                kernel: "axpy".into()
            }
        );
    }

    #[test]
    fn optional_metadata_may_be_left_out_and_other_kinds_are_kept() {
        let mut metadata = metadata_value(&compile_amd(AMD_KERNELS, "gfx942", 5));
        for key in [".agpr_count", ".sgpr_spill_count", ".vgpr_spill_count"] {
            set(kernel_at(&mut metadata, 0), key, None);
        }
        set(kernel_at(&mut metadata, 1), ".args", None);
        set(
            arg_at(&mut metadata, 2, 0),
            ".value_kind",
            Some("dynamic_shared_pointer".into()),
        );
        set(
            arg_at(&mut metadata, 2, 1),
            ".value_kind",
            Some("image".into()),
        );
        let kernels = read_one(&metadata).unwrap().kernels;
        let axpy = &kernels[0].facts;
        assert_eq!(
            (
                axpy.agpr_count,
                axpy.sgpr_spill_count,
                axpy.vgpr_spill_count
            ),
            (None, 0, 0)
        );
        assert!(kernels[1].facts.args.is_empty());
        assert_eq!(kernels[2].facts.args[0].kind, ArgKind::DynamicSharedPointer);
        assert_eq!(
            kernels[2].facts.args[1].kind,
            ArgKind::Other("image".into())
        );
        assert_eq!(kernels[2].descriptor, "gather.kd");
    }

    #[test]
    fn notes_must_decode_completely_and_merge_only_when_they_agree() {
        let real = metadata_value(&compile_amd(AMD_KERNELS, "gfx942", 5));
        assert_eq!(
            read_metadata([]).unwrap_err(),
            CodeObjectError::MissingMetadata
        );
        assert!(matches!(
            read_metadata([&[0x92, 0x01][..]]).unwrap_err(),
            CodeObjectError::MetadataNotMessagePack { note: 0, .. }
        ));
        let mut trailing = encode(&real);
        trailing.push(0);
        assert_eq!(
            read_metadata([trailing.as_slice()]).unwrap_err(),
            CodeObjectError::TrailingMetadata { note: 0, extra: 1 }
        );
        // Nesting deeper than any real metadata is refused before it can exhaust the stack.
        let deep = [&[0x91; 10_000][..], &[0xc0]].concat();
        assert!(matches!(
            read_metadata([deep.as_slice()]).unwrap_err(),
            CodeObjectError::MetadataNotMessagePack { note: 0, .. }
        ));

        // Split the three kernels over two notes.
        let mut first = real.clone();
        let mut second = real.clone();
        if let (Value::Array(a), Value::Array(b)) = (
            get(&mut first, "amdhsa.kernels"),
            get(&mut second, "amdhsa.kernels"),
        ) {
            a.truncate(1);
            b.remove(0);
        }
        let merged = read_metadata([encode(&first).as_slice(), &encode(&second)]).unwrap();
        let names: Vec<_> = merged
            .kernels
            .iter()
            .map(|k| k.facts.name.as_str())
            .collect();
        assert_eq!(names, ["axpy", "scale", "gather"]);

        let duplicate = read_metadata([encode(&first).as_slice(), &encode(&first)]);
        assert_eq!(
            duplicate.unwrap_err(),
            CodeObjectError::DuplicateKernel {
                kernel: "axpy".into()
            }
        );
        let mut other = second.clone();
        set(
            &mut other,
            "amdhsa.version",
            Some(Value::Array(vec![1.into(), 1.into()])),
        );
        assert_eq!(
            read_metadata([encode(&first).as_slice(), &encode(&other)]).unwrap_err(),
            CodeObjectError::ConflictingNotes {
                key: "amdhsa.version",
                first: "1.2".into(),
                other: "1.1".into(),
                note: 1
            }
        );
        let mut other = second.clone();
        set(
            &mut other,
            "amdhsa.target",
            Some("amdgcn-amd-amdhsa--gfx90a".into()),
        );
        assert_eq!(
            read_metadata([encode(&first).as_slice(), &encode(&other)]).unwrap_err(),
            CodeObjectError::ConflictingNotes {
                key: "amdhsa.target",
                first: "amdgcn-amd-amdhsa--gfx942".into(),
                other: "amdgcn-amd-amdhsa--gfx90a".into(),
                note: 1,
            }
        );
    }
}
