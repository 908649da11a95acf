"""Opening the repository's bundle, its kernels' signatures, and explanations, with no GPU."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tomllib

import pytest

import hkload
import hkload.testing
from conftest import BUNDLE, ROOT


def declared_kernels() -> dict[str, str]:
    """Every kernel the manifests declare, with its signature as text (extents dropped)."""
    kernels = {}
    for path in sorted((ROOT / "manifests").glob("*.toml")):
        for kernel in tomllib.loads(path.read_text()).get("kernel", []):
            params = [arg.split("[")[0].strip() for arg in kernel["args"]]
            kernels[kernel["symbol"]] = f"{kernel['symbol']}({', '.join(params)})"
    return kernels


def test_lists_every_declared_kernel_with_its_signature(bundle):
    declared = declared_kernels()
    assert len(declared) > 50
    assert {name: str(sig) for name, sig in bundle.kernels.items()} == declared
    assert (bundle.name, bundle.version) == ("hk-kernels", "0.1.0")


def test_signature_parts(bundle):
    rmsnorm = bundle.kernels["rmsnorm_bf16"]
    assert [p.name for p in rmsnorm.params] == ["out", "x", "weight", "eps", "rows", "cols"]
    out, x, _, eps, rows, _ = rmsnorm.params
    assert (out.dtype, out.is_pointer, out.mutable) == ("bf16", True, True)
    assert (x.dtype, x.is_pointer, x.mutable) == ("bf16", True, False)
    assert (eps.dtype, eps.is_pointer, rows.dtype) == ("f32", False, "u32")
    assert dict(rmsnorm.extents) == {"out": "rows * cols", "x": "rows * cols", "weight": "cols"}
    assert ("k <= n", "k cannot exceed the row length n") in bundle.kernels["topk_f32"].requires


@pytest.mark.parametrize(
    ("target", "chosen"),
    [
        ("gfx942:sramecc+:xnack-", "hipv4-amdgcn-amd-amdhsa--gfx942"),
        ("sm_90", "cuda-nvptx64-nvidia-cuda-sm_90"),
    ],
)
def test_explains_every_module(bundle, target, chosen):
    text = bundle.explain(target)
    modules = [line for line in text.splitlines() if line.startswith("module ")]
    assert text.splitlines()[0] == f"device {target}"
    assert len(modules) == len(list((ROOT / "manifests").glob("*.toml"))) - 1  # package.toml
    # A module built on purpose for other targets only (one FP8 format per target) says so.
    processor = target.split(":")[0]
    absent = [line for line in modules if f" is not built for {processor}: " in line]
    assert all(line.startswith("module gemm_fp8_") for line in absent), absent
    assert len(absent) == 1, modules
    # Modules built for an architecture-specific target run that code on its one architecture
    # (sm_90a's on sm_90), the others the target's own.
    specific = {
        manifest["module"]["name"]
        for path in (ROOT / "manifests").glob("*.toml")
        if "module" in (manifest := tomllib.loads(path.read_text()))
        and f"{processor}a" in manifest["module"].get("arch_specific", [])
    }
    entries = chosen_entries(text)
    assert len(entries) == len(modules) - len(absent)
    for module, entry in entries:
        assert entry == (f"{chosen}a" if module in specific else chosen), (module, entry)


def chosen_entries(explanation):
    """(module, chosen entry ID) for each module of an explanation that has one."""
    entries, module = [], None
    for line in explanation.splitlines():
        if line.startswith("module "):
            module = line.removeprefix("module ").split(":")[0]
        elif line.startswith("  chosen    "):
            entries.append((module, line.split()[1]))
    return entries


@pytest.mark.parametrize("target", ["gfx942:sramecc+:xnack-", "sm_90", "gfx1100"])
def test_explanation_is_the_cli_text(bundle, target):
    hkpack = ROOT / "target" / "release" / "hkpack"
    if not hkpack.exists():
        pytest.skip(f"{hkpack} is not built (scripts/setup builds it)")
    cli = subprocess.run(
        [hkpack, "explain", BUNDLE, "--target", target], capture_output=True, text=True
    )
    assert cli.stdout == bundle.explain(target)


def test_trusted_keys_and_a_pinned_digest(tmp_path):
    hkpack = ROOT / "target" / "release" / "hkpack"
    if not hkpack.exists():
        pytest.skip(f"{hkpack} is not built (scripts/setup builds it)")
    signed = tmp_path / "bundle"
    shutil.copytree(BUNDLE, signed)
    for name in ("release", "other"):
        subprocess.run([hkpack, "keygen", tmp_path / name], check=True, capture_output=True)
    subprocess.run([hkpack, "sign", signed, "--key", tmp_path / "release.key"], check=True, capture_output=True)
    key, other = ((tmp_path / f"{name}.pub").read_text().strip() for name in ("release", "other"))
    assert hkload.Bundle(signed, trusted_keys=[other, key]).kernels
    with pytest.raises(hkload.BundleError, match="not among the trusted keys"):
        hkload.Bundle(signed, trusted_keys=[other])
    with pytest.raises(hkload.BundleError, match="the bundle is not signed"):
        hkload.Bundle(BUNDLE, trusted_keys=[key])
    with pytest.raises(ValueError, match="is not a key"):
        hkload.Bundle(signed, trusted_keys=["ed25519:12"])
    digest = hashlib.sha256((signed / "bundle.msgpack").read_bytes()).hexdigest()
    assert hkload.Bundle(signed, expect_digest=digest).kernels
    with pytest.raises(hkload.BundleError, match="but the bundle is pinned to"):
        hkload.Bundle(signed, expect_digest="0" * 64)


def test_a_bad_target_id_is_a_value_error(bundle):
    with pytest.raises(ValueError, match="gfx942:bogus"):
        bundle.explain("gfx942:bogus+")


def test_no_code_object_carries_the_explanation(bundle):
    device = hkload.testing.simulated_device("gfx1100")
    with pytest.raises(hkload.NoCodeObjectError) as refused:
        bundle.load(device)
    message = str(refused.value)
    assert message.startswith("no code object in module `activation` can run on gfx1100")
    assert "rejected  hipv4-amdgcn-amd-amdhsa--gfx942: processor gfx942 is not the device's gfx1100" in message


def test_a_missing_bundle_says_what_it_looked_for(tmp_path):
    with pytest.raises(hkload.BundleError, match="bundle.msgpack: no such file; is .* a bundle folder"):
        hkload.Bundle(tmp_path)


def test_a_damaged_bundle_is_refused(tmp_path):
    damaged = tmp_path / "bundle"
    shutil.copytree(BUNDLE, damaged)
    index = damaged / "bundle.msgpack"
    data = bytearray(index.read_bytes())
    data[len(data) // 2] ^= 0xFF
    index.write_bytes(bytes(data))
    with pytest.raises(hkload.BundleError, match="bundle.msgpack"):
        hkload.Bundle(damaged).kernels


def test_a_damaged_code_object_is_refused_at_load(tmp_path):
    damaged = tmp_path / "bundle"
    shutil.copytree(BUNDLE, damaged)
    module = damaged / "activation.hipfb"
    data = bytearray(module.read_bytes())
    for at in range(4096, len(data), 997):  # past the header: a byte in every code object
        data[at] ^= 0xFF
    module.write_bytes(bytes(data))
    kernels = hkload.Bundle(damaged).load(hkload.testing.simulated_device("sm_90"))
    with pytest.raises(hkload.BundleError, match=r"entry `cuda-nvptx64-nvidia-cuda-sm_90` of .* its BLAKE3 is"):
        kernels.preload()


def test_device_without_a_gpu_names_every_backend():
    try:
        device = hkload.device(0)
    except hkload.DriverError as error:
        assert str(error).startswith("hkload found no GPU: tried cuda, then hip:")
    else:
        assert device.api in ("cuda", "hip")


def test_the_stub_declares_every_kernel_typed(bundle):
    import ast

    from hkload.stubs import stub

    text = stub(bundle)
    methods = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef)]
    assert sorted(m.name for m in methods) == sorted(bundle.kernels)
    assert (
        "    def rmsnorm_bf16(self, out: Memory, x: Memory, weight: Memory, eps: float, "
        "rows: int, cols: int, *, stream: Any = None) -> None:\n"
    ) in text
