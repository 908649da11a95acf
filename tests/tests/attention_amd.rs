//! The attention module (flash attention forward, `kernels/attention.hip`) on AMD, statically
//! (no AMD GPU runs here): built alone by the real hkpack for gfx90a, gfx942 and gfx950, every
//! kernel must fit its target without spills or scratch, keep its LDS tiles under the target's
//! limit, and contain the MFMA instructions of its element type, as many as one walk of its key
//! loop needs (read back by `llvm-objdump --mcpu=<target>`, not taken from our own metadata).
//! The d = 64 and 128 kernels run the 8-wave ping-pong (`hk/tile/pingpong.h`): their key loop
//! must hold its four clusters, each ending at `s_barrier`, the two matrix clusters MFMAs alone
//! at raised priority (`s_setprio 1` .. `s_setprio 0`), the scores' and P·V's.
//!
//! The backward module (`kernels/attention_backward.hip`: delta, dQ and dK/dV) likewise: built
//! alone, no spills or scratch, LDS of its own rows' two tiles and one stage of the rows it walks
//! (none for delta), and per walked block the MFMAs of its products, counted by the formula of
//! its structure.
//!
//! With `HK_TINYGRAD` set to a tinygrad source tree, the gfx942 and gfx950 code of both modules
//! also runs on its CDNA emulator against an f64 reference (`tests/emu/attention_emu.py`,
//! `tests/emu/attention_backward_emu.py`); without it those tests say they skipped and pass.

mod common;

use common::*;
use hk_format::manifest::{BundleManifest, MANIFEST_FILE};
use hk_format::target::TargetId;
use hkload::Bundle;

/// `(target, LDS bytes a workgroup may have, MFMA mnemonic of bf16 kernels, of f16 kernels, the
/// MFMA's k)`.
const TARGETS: [(&str, u32, &str, &str, usize); 3] = [
    (
        "gfx90a",
        64 * 1024,
        "v_mfma_f32_16x16x16bf16_1k",
        "v_mfma_f32_16x16x16f16",
        16,
    ),
    (
        "gfx942",
        64 * 1024,
        "v_mfma_f32_16x16x16_bf16",
        "v_mfma_f32_16x16x16_f16",
        16,
    ),
    (
        "gfx950",
        160 * 1024,
        "v_mfma_f32_16x16x32_bf16",
        "v_mfma_f32_16x16x32_f16",
        32,
    ),
];

/// `(symbol, d_qk, d_v)` of every kernel of the module.
const KERNELS: [(&str, usize, usize); 8] = [
    ("attn_fwd_d64_bf16", 64, 64),
    ("attn_fwd_d128_bf16", 128, 128),
    ("attn_fwd_d256_bf16", 256, 256),
    ("attn_fwd_d192_dv128_bf16", 192, 128),
    ("attn_fwd_d64_f16", 64, 64),
    ("attn_fwd_d128_f16", 128, 128),
    ("attn_fwd_d256_f16", 256, 256),
    ("attn_fwd_d192_dv128_f16", 192, 128),
];

/// Keys a block walks at a time (`Forward::kKeys`, `PingPongForward::kKeys`).
const KEYS: usize = 32;

/// Whether a kernel runs the 8-wave ping-pong on AMD (`Program::kPingPong`: d_qk = d_v <= 128).
fn ping_pong(d_qk: usize, d_v: usize) -> bool {
    d_qk == d_v && d_qk <= 128
}

/// Waves a block: the ping-pong's 8 (two a SIMD), Forward's 4 (`kForwardThreads`).
fn waves(d_qk: usize, d_v: usize) -> usize {
    if ping_pong(d_qk, d_v) { 8 } else { 4 }
}

/// One block's LDS (static on AMD), 2-byte elements: the ping-pong's two stages of K and V (Q's
/// operands are loaded straight into registers), or Forward's Q tile of its queries and one
/// stage of K and V (the next block staged in registers).
fn lds_bytes(d_qk: usize, d_v: usize) -> usize {
    if ping_pong(d_qk, d_v) {
        2 * 2 * KEYS * (d_qk + d_v)
    } else {
        let queries = 16 * query_tiles(d_qk) * waves(d_qk, d_v);
        2 * (queries * d_qk + KEYS * (d_qk + d_v))
    }
}

/// Tiles of 16 queries a wave holds (`Forward::kQueryTiles` on AMD): 2 where the outputs fit its
/// registers (d_qk <= 128), else 1.
fn query_tiles(d_qk: usize) -> usize {
    if d_qk <= 128 { 2 } else { 1 }
}

/// The repository's attention module alone, built for the AMD targets into `dir`.
fn build_attention(dir: &std::path::Path) -> std::path::PathBuf {
    let targets: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
    build_repo_modules(dir, &["attention.toml"], &targets)
}

/// One disassembled instruction: its offset in the function, mnemonic, operands, and for a
/// branch its target's offset.
struct Instruction<'a> {
    offset: u64,
    mnemonic: &'a str,
    operands: &'a str,
    target: Option<u64>,
}

/// The instructions of function `symbol`'s body from `llvm-objdump -d` (each line `\tmnemonic
/// operands // ADDRESS: encoding`, a branch's ending in `<symbol+0xOFFSET>`), offsets from its
/// first instruction.
fn instructions<'a>(body: &'a str, symbol: &str) -> Vec<Instruction<'a>> {
    let mut out = Vec::new();
    let mut start = None;
    for line in body.lines().skip(1) {
        let Some((text, comment)) = line.split_once("//") else {
            continue;
        };
        let Some((address, encoding)) = comment.trim().split_once(':') else {
            continue;
        };
        let address = u64::from_str_radix(address, 16).expect("objdump's addresses are hex");
        let start = *start.get_or_insert(address);
        let text = text.trim();
        let (mnemonic, operands) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
        let target = encoding
            .split_once(&format!("<{symbol}"))
            .and_then(|(_, rest)| match rest.strip_prefix("+0x") {
                Some(hex) => u64::from_str_radix(hex.trim_end_matches('>'), 16).ok(),
                None => (rest == ">").then_some(0),
            });
        out.push(Instruction {
            offset: address - start,
            mnemonic,
            operands: operands.trim(),
            target,
        });
    }
    out
}

/// Asserts that a backward branch after the last of `mfmas` goes to or before the first: the
/// MFMAs lie in one loop's body (per block of the walk), emitted once.
fn assert_in_one_loop(code: &[Instruction], mfmas: &[&Instruction], symbol: &str, target: &str) {
    let (first, last) = (mfmas[0].offset, mfmas[mfmas.len() - 1].offset);
    let branch =
        |i: &Instruction| i.mnemonic.starts_with("s_branch") || i.mnemonic.starts_with("s_cbranch");
    let in_one_loop = code
        .iter()
        .any(|i| branch(i) && i.offset > last && i.target.is_some_and(|t| t <= first));
    assert!(
        in_one_loop,
        "{symbol} on {target}: no back edge encloses its MFMAs ({first:#x}..{last:#x})"
    );
}

#[test]
fn attention_fits_every_amd_target_and_uses_its_mfma() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build_attention(scratch.path());

    let kernels = Bundle::open(&bundle).unwrap();
    let records = kernels.kernel_records().unwrap();
    assert_eq!(records.len(), KERNELS.len());
    let dims = |symbol: &str| {
        let &(_, d_qk, d_v) = KERNELS
            .iter()
            .find(|k| k.0 == symbol)
            .unwrap_or_else(|| panic!("{symbol} is not an attention kernel this test knows"));
        (d_qk, d_v)
    };
    for record in &records {
        let (d_qk, d_v) = dims(&record.symbol);
        let lds = lds_bytes(d_qk, d_v);
        let threads = 64 * waves(d_qk, d_v) as u32;
        for &(target, lds_limit, ..) in &TARGETS {
            let target: TargetId = target.parse().unwrap();
            let abi = record
                .targets
                .iter()
                .find(|abi| abi.target == target)
                .unwrap_or_else(|| panic!("{} has no code for {target}", record.symbol));
            assert_eq!(abi.spills, 0, "{} spills on {target}", record.symbol);
            assert_eq!(
                abi.private_segment_size, 0,
                "{} needs scratch on {target}",
                record.symbol
            );
            assert!(
                abi.group_segment_size > 0 && abi.group_segment_size <= lds_limit,
                "{} uses {} bytes of LDS on {target}, limit {lds_limit}",
                record.symbol,
                abi.group_segment_size
            );
            assert_eq!(
                abi.group_segment_size as usize, lds,
                "{} on {target}: LDS other than its program's tiles",
                record.symbol
            );
            // The block the contract launches, and the registers that allow it: a SIMD's 512 a
            // lane (VGPRs and AGPRs) shared by its waves (two of the ping-pong's).
            assert_eq!(
                abi.max_flat_workgroup_size, threads,
                "{} on {target}: a block other than its program's",
                record.symbol
            );
            let registers = abi.vgpr_count.expect("AMD code objects count their VGPRs")
                + abi.agpr_count.unwrap_or(0);
            assert!(
                registers as usize <= 512 / (threads as usize / 256),
                "{} on {target}: {registers} registers a lane, too many for {threads} threads",
                record.symbol
            );
        }
    }

    let manifest =
        BundleManifest::from_toml(&std::fs::read_to_string(bundle.join(MANIFEST_FILE)).unwrap())
            .unwrap();
    let module = &manifest.modules[0];
    for &(target, _, bf16_mfma, f16_mfma, k) in &TARGETS {
        let text = amd_disassembly(&bundle, &module.file, target, scratch.path());
        for record in &records {
            let symbol = record.symbol.as_str();
            let (d_qk, d_v) = dims(symbol);
            let body = function_body(&text, symbol)
                .unwrap_or_else(|| panic!("{symbol} not in the disassembly for {target}"));
            let (want, other) = if symbol.contains("_bf16") {
                (bf16_mfma, f16_mfma)
            } else {
                (f16_mfma, bf16_mfma)
            };
            assert!(
                !mnemonics(body).contains(&other),
                "{symbol} on {target} has {other}"
            );
            let code = instructions(body, symbol);
            let mfmas: Vec<&Instruction> = code.iter().filter(|i| i.mnemonic == want).collect();
            // What a wave issues per block of KEYS = 32 keys (hk::tile::FlashWave), with
            // query_tiles tiles of 16 queries and k the instruction's depth (16; 32 on gfx950):
            // the scores Sᵀ = K·Qᵀ, (KEYS / 16) x query_tiles accumulator tiles each d_qk / k
            // MFMAs deep (score()), and Oᵀ += Vᵀ·Pᵀ, KEYS / k steps of (d_v / 16) x query_tiles
            // MFMAs (accumulate()). The compiler unrolls both and emits the key loop once,
            // neither duplicated nor peeled: every MFMA lies between a backward branch and its
            // target (the loop is rotated, so in address order a block's P·V MFMAs come before
            // the scores, which a trip around it computes for the next block), and the counts
            // match the formula exactly on every kernel and target. Scores + P·V on
            // gfx90a/gfx942, then gfx950: d = 64, 16 + 16 and 8 + 8; d = 128, 32 + 32 and
            // 16 + 16; d = 256, 32 + 32 and 16 + 16; d = 192/128, 24 + 16 and 12 + 8. Each score
            // tile's chain starts from the inline constant 0 (s.zero()), which no P·V MFMA does
            // (o carries over the blocks): one such MFMA per score tile.
            let tiles = query_tiles(d_qk);
            let score = tiles * (KEYS / 16) * (d_qk / k);
            let pv = (d_v / 16) * tiles * (KEYS / k);
            assert_eq!(
                mfmas.len(),
                score + pv,
                "{symbol} on {target}: {} x {want}, expected {score} (scores) + {pv} (P·V)",
                mfmas.len()
            );
            let from_zero = mfmas
                .iter()
                .filter(|i| i.operands.rsplit(',').next().map(str::trim) == Some("0"))
                .count();
            assert_eq!(
                from_zero,
                tiles * (KEYS / 16),
                "{symbol} on {target}: {from_zero} MFMAs add to 0, expected one per score tile"
            );
            assert_in_one_loop(&code, &mfmas, symbol, target);
            if ping_pong(d_qk, d_v) {
                assert_ping_pong(&code, &mfmas, [score, pv], symbol, target);
            }
        }
    }
}

/// Asserts the ping-pong's schedule in the key loop (the back edge after the last of `mfmas`,
/// to its target): four clusters a trip, each ending at `s_barrier`; two of them matrix
/// clusters, `s_setprio 1` right after a barrier up to `s_setprio 0` right before the next, that
/// hold MFMAs and nothing else (their operands already in registers: no LDS or memory access, no
/// VALU), `counts` of them in some order (the scores', P·V's); and every MFMA in one of them.
/// Around the loop, the groups' offset: besides the prologue's barrier, one barrier before the
/// loop and one after it that a branch skips (taken by one group of waves each).
fn assert_ping_pong(
    code: &[Instruction],
    mfmas: &[&Instruction],
    counts: [usize; 2],
    symbol: &str,
    target: &str,
) {
    let last = mfmas[mfmas.len() - 1].offset;
    let (top, bottom) = code
        .iter()
        .filter(|i| i.mnemonic.contains("branch") && i.offset > last)
        .find_map(|i| {
            i.target
                .filter(|&t| t <= mfmas[0].offset)
                .map(|t| (t, i.offset))
        })
        .unwrap_or_else(|| panic!("{symbol} on {target}: no key loop around its MFMAs"));
    let body: Vec<&Instruction> = code
        .iter()
        .filter(|i| (top..=bottom).contains(&i.offset))
        .collect();
    let barriers = body.iter().filter(|i| i.mnemonic == "s_barrier").count();
    assert_eq!(
        barriers, 4,
        "{symbol} on {target}: {barriers} s_barrier in the key loop, expected one a cluster (4)"
    );
    let mut clusters = Vec::new();
    for (at, i) in body.iter().enumerate() {
        if !(i.mnemonic == "s_setprio" && i.operands == "1") {
            continue;
        }
        let len = body[at + 1..]
            .iter()
            .position(|i| i.mnemonic == "s_setprio")
            .unwrap_or_else(|| panic!("{symbol} on {target}: s_setprio 1 never lowered"));
        let end = at + 1 + len;
        assert_eq!(
            (
                body[at - 1].mnemonic,
                body[end].operands,
                body.get(end + 1).map(|i| i.mnemonic)
            ),
            ("s_barrier", "0", Some("s_barrier")),
            "{symbol} on {target}: a matrix cluster at {:#x} not between two barriers",
            i.offset
        );
        let inside = &body[at + 1..end];
        assert!(
            inside.iter().all(|i| i.mnemonic.starts_with("v_mfma")),
            "{symbol} on {target}: a matrix cluster at {:#x} holds other instructions than MFMAs",
            i.offset
        );
        clusters.push(inside.len());
    }
    let outside: Vec<usize> = (0..code.len())
        .filter(|&at| {
            code[at].mnemonic == "s_barrier" && !(top..=bottom).contains(&code[at].offset)
        })
        .collect();
    let skipped = |at: &usize| {
        let branch = &code[at - 1];
        branch.mnemonic.starts_with("s_cbranch")
            && code.get(at + 1).map(|next| next.offset) == branch.target
    };
    let (before, after) = (
        outside
            .iter()
            .filter(|&&at| code[at].offset < top && skipped(&at))
            .count(),
        outside
            .iter()
            .filter(|&&at| code[at].offset > bottom && skipped(&at))
            .count(),
    );
    assert_eq!(
        (outside.len(), before, after),
        (3, 1, 1),
        "{symbol} on {target}: barriers outside the key loop other than the prologue's and the \
         groups' offset (one skipped by a branch before the loop, one after)"
    );
    clusters.sort_unstable();
    let mut want = counts;
    want.sort_unstable();
    assert_eq!(
        clusters, want,
        "{symbol} on {target}: matrix clusters of {clusters:?} MFMAs, expected {want:?}"
    );
    assert_eq!(clusters.iter().sum::<usize>(), mfmas.len());
}

#[test]
fn attention_computes_on_the_cdna_emulator() {
    run_on_emulator("attention_emu.py", build_attention);
}

/// `(d_qk, d_v)` of the backward module's dQ and dK/dV kernels, each in bf16 and f16.
const BACKWARD_DIMS: [(usize, usize); 4] = [(64, 64), (128, 128), (256, 256), (192, 128)];

/// The symbol of a backward kernel: `attn_bwd_{which}_d{d_qk}[_dv{d_v}]_{ty}`.
fn backward_symbol(which: &str, (d_qk, d_v): (usize, usize), ty: &str) -> String {
    match d_qk == d_v {
        true => format!("attn_bwd_{which}_d{d_qk}_{ty}"),
        false => format!("attn_bwd_{which}_d{d_qk}_dv{d_v}_{ty}"),
    }
}

/// Other rows a backward block walks at a time (`kOthers`).
const OTHERS: usize = 32;

/// Own rows of a backward block on AMD (`16 waves(d)`): 64, but 32 (2 waves) at d_qk = 256,
/// whose tiles of 64 rows would not fit 64 KiB of LDS.
fn block_rows(d_qk: usize) -> usize {
    if d_qk == 256 { 32 } else { 64 }
}

/// Column parts of the gradients a block computes: dQ's halves for d_qk > 128 (`parts`); dK's
/// and dV's quarters at 256 and halves at 192 (`DkdvShapes::kParts`).
fn dq_parts(d_qk: usize) -> usize {
    if d_qk > 128 { 2 } else { 1 }
}
fn dkdv_parts(d_qk: usize) -> usize {
    match d_qk {
        256 => 4,
        d if d > 128 => 2,
        _ => 1,
    }
}

/// The backward module alone, built for the AMD targets into `dir`.
fn build_attention_backward(dir: &std::path::Path) -> std::path::PathBuf {
    let targets: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
    build_repo_modules(dir, &["attention_backward.toml"], &targets)
}

#[test]
fn attention_backward_fits_every_amd_target_and_uses_its_mfma() {
    let scratch = tempfile::tempdir().unwrap();
    let bundle = build_attention_backward(scratch.path());

    // symbol -> (d_qk, d_v, kind): "delta", "dq" or "dkdv".
    let mut kernels: Vec<(String, usize, usize, &str)> = Vec::new();
    for ty in ["bf16", "f16"] {
        kernels.push((format!("attn_bwd_delta_{ty}"), 0, 0, "delta"));
        for dims in BACKWARD_DIMS {
            for which in ["dq", "dkdv"] {
                kernels.push((backward_symbol(which, dims, ty), dims.0, dims.1, which));
            }
        }
    }
    let find = |symbol: &str| {
        kernels
            .iter()
            .find(|k| k.0 == symbol)
            .unwrap_or_else(|| panic!("{symbol} is not a backward kernel this test knows"))
    };

    let opened = Bundle::open(&bundle).unwrap();
    let records = opened.kernel_records().unwrap();
    assert_eq!(records.len(), kernels.len());
    for record in &records {
        let &(_, d_qk, d_v, kind) = find(&record.symbol);
        // A block's LDS (static on AMD): its own rows' two tiles (dQ: Q and dO; dK/dV: K and V)
        // of block_rows rows, and one stage of the 32 rows it walks (dQ: K and V; dK/dV: Q and
        // dO), 2-byte elements: the same sum for both. delta uses none.
        let lds = match kind {
            "delta" => 0,
            _ => 2 * (block_rows(d_qk) + OTHERS) * (d_qk + d_v),
        };
        for &(target, lds_limit, ..) in &TARGETS {
            let target: TargetId = target.parse().unwrap();
            let abi = record
                .targets
                .iter()
                .find(|abi| abi.target == target)
                .unwrap_or_else(|| panic!("{} has no code for {target}", record.symbol));
            assert_eq!(abi.spills, 0, "{} spills on {target}", record.symbol);
            assert_eq!(
                abi.private_segment_size, 0,
                "{} needs scratch on {target}",
                record.symbol
            );
            assert!(
                (abi.group_segment_size > 0 || kind == "delta")
                    && abi.group_segment_size <= lds_limit,
                "{} uses {} bytes of LDS on {target}, limit {lds_limit}",
                record.symbol,
                abi.group_segment_size
            );
            assert_eq!(
                abi.group_segment_size as usize, lds,
                "{} on {target}: LDS other than its own tiles and one stage",
                record.symbol
            );
        }
    }

    let manifest =
        BundleManifest::from_toml(&std::fs::read_to_string(bundle.join(MANIFEST_FILE)).unwrap())
            .unwrap();
    let module = &manifest.modules[0];
    for &(target, _, bf16_mfma, f16_mfma, k) in &TARGETS {
        let text = amd_disassembly(&bundle, &module.file, target, scratch.path());
        for (symbol, d_qk, d_v, kind) in &kernels {
            let (symbol, d_qk, d_v, kind) = (symbol.as_str(), *d_qk, *d_v, *kind);
            let body = function_body(&text, symbol)
                .unwrap_or_else(|| panic!("{symbol} not in the disassembly for {target}"));
            let want = if symbol.ends_with("_bf16") {
                bf16_mfma
            } else {
                f16_mfma
            };
            let all_mfmas: Vec<&str> = mnemonics(body)
                .into_iter()
                .filter(|m| m.starts_with("v_mfma"))
                .collect();
            if kind == "delta" {
                assert!(
                    all_mfmas.is_empty(),
                    "{symbol} on {target} has MFMAs: {all_mfmas:?}"
                );
                continue;
            }
            // Only its own element type's MFMA (nothing else, such as the other type's).
            assert!(
                all_mfmas.iter().all(|m| *m == want),
                "{symbol} on {target}: MFMAs other than {want}: {all_mfmas:?}"
            );
            let code = instructions(body, symbol);
            let mfmas: Vec<&Instruction> = code.iter().filter(|i| i.mnemonic == want).collect();
            // What a wave (16 own rows) issues per block of OTHERS = 32 other rows, k the
            // instruction's depth (16; 32 on gfx950), every product a RowScores (X = Own·Otherᵀ,
            // (32 / 16) accumulator tiles, each depth / k MFMAs deep) or a RowSums (Y += X·M,
            // 32 / k steps of cols / 16 MFMAs, over the block's part of the gradient columns):
            //   S = Q·Kᵀ (dK/dV: K·Qᵀ): (32 / 16) (d_qk / k);
            //   dP = dO·Vᵀ (dK/dV: V·dOᵀ): (32 / 16) (d_v / k);
            //   dQ += dS·K: (d_qk / parts / 16) (32 / k), parts = 2 for d_qk > 128;
            //   dV += Pᵀ·dO and dK += dSᵀ·Q: (d_v / parts / 16) (32 / k) + (d_qk / parts / 16)
            //   (32 / k), parts = 4 at d_qk = 256, 2 at 192.
            // The compiler unrolls every product and emits the walk's loop body once (neither
            // duplicated nor peeled), so the counts match exactly on every kernel and target
            // (read from the disassembly: gfx90a and gfx942, then gfx950, dQ / dK,dV: d = 64,
            // 24 / 32 and 12 / 16; d = 128, 48 / 64 and 24 / 32; d = 256, 80 / 80 and 40 / 40;
            // d = 192/128, 52 / 60 and 26 / 30). The MFMAs that start a chain from the inline
            // constant 0 are the two products' first steps: S's 2 tiles and dP's 2 (x.zero());
            // no gradient's, which carry over the blocks.
            let scores = (OTHERS / 16) * (d_qk / k) + (OTHERS / 16) * (d_v / k);
            let sums = match kind {
                "dq" => (d_qk / dq_parts(d_qk) / 16) * (OTHERS / k),
                _ => {
                    let parts = dkdv_parts(d_qk);
                    (d_v / parts / 16) * (OTHERS / k) + (d_qk / parts / 16) * (OTHERS / k)
                }
            };
            assert_eq!(
                mfmas.len(),
                scores + sums,
                "{symbol} on {target}: {} x {want}, expected {scores} (S and dP) + {sums} \
                 (gradients)",
                mfmas.len()
            );
            let from_zero = mfmas
                .iter()
                .filter(|i| i.operands.rsplit(',').next().map(str::trim) == Some("0"))
                .count();
            assert_eq!(
                from_zero,
                2 * (OTHERS / 16),
                "{symbol} on {target}: {from_zero} MFMAs add to 0, expected one per tile of S \
                 and of dP"
            );
            assert_in_one_loop(&code, &mfmas, symbol, target);
        }
    }
}

#[test]
fn attention_backward_computes_on_the_cdna_emulator() {
    run_on_emulator("attention_backward_emu.py", build_attention_backward);
}
