"""Bundles composed from per-target packages on a search path (`hkpack split`), as a fleet
installs them: the index package and only the targets its GPUs need."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import hkload
import hkload.testing

from conftest import BUNDLE, ROOT

HKPACK = ROOT / "target" / "release" / "hkpack"


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> Path:
    """Every package `hkpack split` writes from the bundle under test, in one folder."""
    if not HKPACK.exists():
        pytest.skip(f"{HKPACK} is not built (scripts/setup builds it)")
    out = tmp_path_factory.mktemp("packages")
    subprocess.run([HKPACK, "split", BUNDLE, "--out", out], check=True, capture_output=True)
    return out


@pytest.fixture
def name(bundle) -> str:
    return f"{bundle.name}-{bundle.version}"


def install(packages: Path, into: Path, name: str, *parts: str) -> Path:
    """Copies the packages `name`-`part` (`index`, `sm_90`, ...) into the folder `into`."""
    into.mkdir(parents=True, exist_ok=True)
    for part in parts:
        shutil.copytree(packages / f"{name}-{part}", into / f"{name}-{part}")
    return into


def test_the_index_and_one_target_serve_that_target(packages, tmp_path, bundle, name):
    # The index package in one folder, the sm_90 package in another, as two installs would.
    first = install(packages, tmp_path / "usr", name, "index")
    second = install(packages, tmp_path / "opt", name, "sm_90")
    split = hkload.Bundle.open_search_path(name, [first, second])
    assert split.index_digest == bundle.index_digest
    assert {k: str(s) for k, s in split.kernels.items()} == {
        k: str(s) for k, s in bundle.kernels.items()
    }
    explanation = split.explain("sm_90")
    assert f"from package {second / f'{name}-sm_90'}" in explanation, explanation

    device = hkload.testing.simulated_device("sm_90")
    kernels = split.load(device)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    out = np.empty_like(x)
    kernels.relu_f32(out, x, 8)
    assert device.launches()[-1]["kernel"] == "relu_f32"


def test_hkload_path_is_the_default_search_path(packages, tmp_path, monkeypatch, bundle, name):
    installed = install(packages, tmp_path / "opt", name, "index", "sm_90")
    monkeypatch.setenv("HKLOAD_PATH", os.pathsep.join([str(tmp_path / "empty"), str(installed)]))
    split = hkload.Bundle.open_search_path(name)
    assert split.index_digest == bundle.index_digest
    split.load(hkload.testing.simulated_device("sm_90")).preload()

    monkeypatch.delenv("HKLOAD_PATH")
    with pytest.raises(hkload.BundleError, match=name):
        hkload.Bundle.open_search_path(name)


def test_a_missing_target_says_what_to_install(packages, tmp_path, name):
    installed = install(packages, tmp_path / "opt", name, "index", "sm_90")
    split = hkload.Bundle.open_search_path(name, [installed])
    wanted = f"no package for gfx942: install {name}-gfx942"
    assert wanted in split.explain("gfx942:sramecc+:xnack-")
    with pytest.raises(hkload.NoCodeObjectError, match=wanted):
        split.load(hkload.testing.simulated_device("gfx942:sramecc+:xnack-"))


def test_a_package_of_another_build_is_refused_naming_both(packages, tmp_path, bundle, name):
    installed = install(packages, tmp_path / "opt", name, "index", "sm_90")
    description = installed / f"{name}-sm_90" / "target.toml"
    other = "0" * 64
    description.write_text(description.read_text().replace(bundle.index_digest, other))
    with pytest.raises(hkload.BundleError) as refused:
        hkload.Bundle.open_search_path(name, [installed])
    assert f"for sm_90, index {other}" in str(refused.value)
    assert f"for sm_90, index {bundle.index_digest}" in str(refused.value)


def test_a_damaged_image_in_a_package_is_refused_at_load(packages, tmp_path, name):
    installed = install(packages, tmp_path / "opt", name, "index", "sm_90")
    module = installed / f"{name}-sm_90" / "activation.hipfb"
    data = bytearray(module.read_bytes())
    for at in range(4096, len(data), 997):  # past the header: a byte in every code image
        data[at] ^= 0xFF
    module.write_bytes(bytes(data))
    kernels = hkload.Bundle.open_search_path(name, [installed]).load(
        hkload.testing.simulated_device("sm_90")
    )
    with pytest.raises(hkload.BundleError, match=r"its BLAKE3 is"):
        kernels.preload()


def test_a_path_must_be_a_list_of_folders(name):
    with pytest.raises(TypeError):
        hkload.Bundle.open_search_path(name, "/opt/hk-kernels")
