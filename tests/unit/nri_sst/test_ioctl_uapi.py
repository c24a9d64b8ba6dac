"""The ioctl ABI of :mod:`nri_sst.backends.ioctl` against the kernel's UAPI header.

``test_layouts_match_uapi_header`` fetches ``linux/isst_if.h`` from Debian
sid's ``linux-libc-dev`` (the system's bookworm 6.1 header has no TPMI
structs) with a private APT configuration (:mod:`_debian`), caches the
header under ``~/.cache/nri-resource-policy/uapi`` (``$NRI_UAPI_CACHE``),
writes a C program printing ``sizeof``/``offsetof``/field sizes of every
struct we pack and every ioctl number, compiles it with gcc, runs it and
compares every number with ours.

gcc: the one on ``PATH``; where there is none (a fresh CI machine), Debian
bookworm's ``gcc`` and ``libc6-dev`` with their whole closure (cpp, cc1,
binutils' ``as``/``ld``, the C library's headers and crt files), fetched the
same way, unpacked with ``dpkg -x`` under
``~/.cache/nri-resource-policy/uapi-gcc`` (``$NRI_UAPI_GCC_CACHE``) and run
in place: ``--sysroot`` at the unpacked tree (headers, crt files, the C
library to link), its ``usr/bin`` first on ``PATH`` (``as``, ``ld``) and its
libraries on ``LD_LIBRARY_PATH`` (cc1's isl/mpc/mpfr, binutils' own); gcc
finds cc1 and collect2 relative to itself. The built program runs on the
system's C library (bookworm's 2.36 or newer). ``NRI_UAPI_GCC=fetch`` uses
the fetched one even where ``PATH`` has a gcc;
``test_fetched_gcc_needs_no_compiler_of_the_system`` always does, with
nothing but its own ``usr/bin`` on ``PATH``.

When the header or gcc cannot be had, the check is unavailable
(:func:`_tier.unavailable`): a loud skip outside CI, a failure under CI or
with ``NRI_UAPI_REQUIRED=1`` (``test_under_ci_an_unavailable_check_fails``).

``test_constants_match_sst_md`` needs nothing: it pins our numbers to the
verification output of sst.md §1.2/§1.6 (linux-libc-dev 7.2.13).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from nri_sst.backends import ioctl as io

_TESTS = Path(__file__).resolve().parents[2]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

import _tier  # noqa: E402
from _debian import (  # noqa: E402
    CommandError,
    apt_config,
    apt_env,
    debian_source,
    dpkg_extract,
    run,
)
from _progress import Progress  # noqa: E402

_CACHE = Path.home() / ".cache" / "nri-resource-policy"
UAPI_CACHE = Path(os.environ.get("NRI_UAPI_CACHE") or _CACHE / "uapi")
GCC_CACHE = Path(os.environ.get("NRI_UAPI_GCC_CACHE") or _CACHE / "uapi-gcc")
PROGRESS = Progress("[uapi]")
PACKAGE = "linux-libc-dev"
HEADER = Path("usr/include/linux/isst_if.h")
#: the compiler's packages (apt adds the closure), from this suite
GCC_SUITE = "bookworm"
GCC_PACKAGES = ("gcc", "libc6-dev")
#: what the closure brings that compiling one small C file never runs (half its size)
GCC_UNUSED = (
    "usr/lib/gcc/*/*/lto1",
    "usr/bin/*lto-dump*",
    "usr/lib/*/lib*san.so*",
    "usr/lib/gcc/*/*/lib*san*",
    "usr/lib/*/libgprofng*",
    "usr/lib/*/lib*crypto.so*",
    "usr/lib/*/libssl.so*",
    "usr/lib/*/libc.a",
    "usr/lib/*/libm*.a",
)


def fetch_uapi_header(cache: Path = UAPI_CACHE) -> tuple[Path, str]:
    """``(include dir, package version)``; raises ``CommandError``/``OSError``
    when it cannot be fetched."""
    cache = cache.expanduser().resolve()
    include = cache / "include"
    stamp = cache / "version"
    if (include / "linux" / "isst_if.h").is_file() and stamp.is_file():
        PROGRESS.cached(f"{PACKAGE} header {include / 'linux' / 'isst_if.h'}")
        return include, stamp.read_text().strip()
    _need_apt()
    # private lists/cache/sources (sid, not trixie: 6.12 lacks ioctl 17)
    env = apt_env(apt_config(cache / "apt", debian_source("sid")))
    lists = cache / "apt" / "lists"
    if not any(lists.glob("*Packages*")):
        with PROGRESS.step("apt-get update (private sid sources)", watch=lists) as st:
            run(["apt-get", "update", "-q"], env=env, progress=st)
    debdir = cache / "debs"
    debdir.mkdir(parents=True, exist_ok=True)
    for old in debdir.glob(f"{PACKAGE}_*.deb"):
        old.unlink()
    with PROGRESS.step(f"apt-get download {PACKAGE}/sid", watch=debdir) as st:
        try:
            run(["apt-get", "download", "-q", f"{PACKAGE}/sid"], cwd=debdir, env=env, progress=st)
        except CommandError:
            run(["apt-get", "update", "-q"], env=env, progress=st)
            run(["apt-get", "download", "-q", f"{PACKAGE}/sid"], cwd=debdir, env=env, progress=st)
    debs = sorted(debdir.glob(f"{PACKAGE}_*.deb"))
    if not debs:
        raise CommandError(f"apt-get download {PACKAGE} produced no .deb")
    version = run(["dpkg-deb", "-f", str(debs[-1]), "Version"]).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        run(["dpkg", "-x", str(debs[-1]), tmp])
        (include / "linux").mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(tmp) / HEADER, include / "linux" / "isst_if.h")
    stamp.write_text(version + "\n")
    return include, version


def _need_apt() -> None:
    missing = [t for t in ("apt-get", "dpkg", "dpkg-deb") if shutil.which(t) is None]
    if missing:
        raise CommandError(f"{', '.join(missing)} not found (a Debian machine is needed)")


@dataclass(frozen=True)
class Compiler:
    """How to run a C compiler: its argv prefix, its environment, where it came from."""

    argv: list[str]
    env: dict[str, str]
    origin: str


def fetch_gcc(cache: Path = GCC_CACHE) -> Compiler:
    """Debian's gcc unpacked under ``cache`` (once), ready to run in place."""
    cache = cache.expanduser().resolve()
    root = cache / "root"
    stamp = cache / "packages"
    if stamp.is_file() and (root / "usr" / "bin" / "gcc").exists():
        PROGRESS.cached(f"Debian {GCC_SUITE} gcc under {root}")
    else:
        _need_apt()
        # an empty dpkg status of its own: the whole closure, whatever this machine has
        env = apt_env(apt_config(cache / "apt", debian_source(GCC_SUITE), own_status=True))
        debdir = cache / "debs"
        (debdir / "partial").mkdir(parents=True, exist_ok=True)
        download = [
            "apt-get", "install", "--download-only", "-y", "-q", "--no-install-recommends",
            "-o", f"Dir::Cache::archives={debdir}", *GCC_PACKAGES,
        ]  # fmt: skip
        lists = cache / "apt" / "lists"
        if not any(lists.glob("*Packages*")):
            with PROGRESS.step(f"apt-get update (private {GCC_SUITE} sources)", watch=lists) as st:
                run(["apt-get", "update", "-q"], env=env, progress=st)
        with PROGRESS.step(f"apt-get download {' '.join(GCC_PACKAGES)}", watch=debdir) as st:
            try:
                run(download, env=env, progress=st)
            except CommandError:  # stale lists: the archive moved on
                run(["apt-get", "update", "-q"], env=env, progress=st)
                run(download, env=env, progress=st)
        debs = sorted(debdir.glob("*.deb"))
        if not debs:
            raise CommandError(f"apt-get install --download-only {GCC_PACKAGES} got no .deb")
        tmp = cache / "root.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        with PROGRESS.step(f"dpkg -x {len(debs)} packages", watch=tmp) as st:
            dpkg_extract(debs, tmp, progress=st)
        shutil.rmtree(tmp / "usr" / "share", ignore_errors=True)  # docs, man pages, locales
        for pattern in GCC_UNUSED:
            for path in tmp.glob(pattern):
                path.unlink()
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
        stamp.write_text("".join(f"{d.name}\n" for d in debs))
        for deb in debs:
            deb.unlink()
    libs = [str(d) for d in sorted((root / "usr" / "lib").glob("*-linux-gnu")) if d.is_dir()]
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(root / "usr" / "bin"), env.get("PATH", "")])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    return Compiler([str(root / "usr" / "bin" / "gcc"), f"--sysroot={root}"], env,
                    f"Debian {GCC_SUITE} gcc under {root}")  # fmt: skip


def find_gcc(cache: Path = GCC_CACHE) -> Compiler:
    """The gcc on ``PATH``, else (or with ``NRI_UAPI_GCC=fetch``) :func:`fetch_gcc`."""
    gcc = shutil.which("gcc")
    if gcc is not None and os.environ.get("NRI_UAPI_GCC") != "fetch":
        return Compiler([gcc], dict(os.environ), gcc)
    return fetch_gcc(cache)


def _unavailable(why: str) -> NoReturn:
    _tier.unavailable("uapi check", why, "NRI_UAPI_REQUIRED")


def _fsize(code: str, count: int) -> int:
    return struct.calcsize(f"<{count}{code}")


def expected() -> dict[str, int]:
    """Our numbers, keyed like the C program's output lines."""
    out: dict[str, int] = {}
    for lay in io.LAYOUTS:
        out[f"sizeof {lay.c_name}"] = lay.size
        for f in lay.named():
            out[f"offsetof {lay.c_name}.{f.name}"] = lay.offsets[f.name]
            out[f"fieldsize {lay.c_name}.{f.name}"] = _fsize(f.code, f.count)
    for mc in io.MULTIS:
        out[f"sizeof {mc.c_name}"] = mc.size(1)
        for f in mc.header.named():
            out[f"offsetof {mc.c_name}.{f.name}"] = mc.header.offsets[f.name]
            out[f"fieldsize {mc.c_name}.{f.name}"] = _fsize(f.code, f.count)
        out[f"offsetof {mc.c_name}.{mc.array}"] = mc.header.size
        for f in mc.element.named():
            name = f"{mc.array}[0].{f.name}"
            out[f"offsetof {mc.c_name}.{name}"] = mc.header.size + mc.element.offsets[f.name]
            out[f"fieldsize {mc.c_name}.{name}"] = _fsize(f.code, f.count)
    for name, value in io.IOCTLS.items():
        out[f"ioctl {name}"] = value
    return out


def c_program() -> str:
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        "#include <sys/ioctl.h>",
        "#include <linux/isst_if.h>",
        '#define SZ(s) printf("sizeof %s %zu\\n", #s, sizeof(struct s))',
        '#define OFF(s, f) printf("offsetof %s.%s %zu\\n", #s, #f, offsetof(struct s, f))',
        '#define FSZ(s, f) printf("fieldsize %s.%s %zu\\n", #s, #f, sizeof(((struct s *)0)->f))',
        '#define IOC(n) printf("ioctl %s %lu\\n", #n, (unsigned long)(n))',
        "int main(void) {",
    ]
    for lay in io.LAYOUTS:
        lines.append(f"  SZ({lay.c_name});")
        for f in lay.named():
            lines += [f"  OFF({lay.c_name}, {f.name});", f"  FSZ({lay.c_name}, {f.name});"]
    for mc in io.MULTIS:
        lines += [f"  SZ({mc.c_name});", f"  OFF({mc.c_name}, {mc.array});"]
        for f in mc.header.named():
            lines += [f"  OFF({mc.c_name}, {f.name});", f"  FSZ({mc.c_name}, {f.name});"]
        for f in mc.element.named():
            name = f"{mc.array}[0].{f.name}"
            lines += [f"  OFF({mc.c_name}, {name});", f"  FSZ({mc.c_name}, {name});"]
    lines += [f"  IOC({name});" for name in io.IOCTLS]
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


def _header() -> tuple[Path, str]:
    try:
        return fetch_uapi_header()
    except (CommandError, OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"cannot fetch {PACKAGE} from Debian sid: {exc}")


def check_layouts(gcc: Compiler, include: Path, version: str, work: Path) -> None:
    """Compile and run the C program with ``gcc``; its numbers must equal ours."""
    text = (include / "linux" / "isst_if.h").read_text()
    assert "struct isst_tpmi_instance_count" in text, f"{PACKAGE} {version} has no TPMI structs"
    assert "ISST_IF_GET_PERF_LEVEL_FABRIC_INFO" in text, (
        f"{PACKAGE} {version} has no ioctl 17 (GET_PERF_LEVEL_FABRIC_INFO)"
    )
    src = work / "uapi.c"
    src.write_text(c_program())
    exe = work / "uapi"
    cc = subprocess.run(
        [*gcc.argv, "-std=gnu11", "-Wall", "-Werror", f"-I{include}", str(src), "-o", str(exe)],
        capture_output=True,
        text=True,
        check=False,
        env=gcc.env,
    )
    assert cc.returncode == 0, f"{gcc.origin} failed against {PACKAGE} {version}:\n{cc.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    got: dict[str, int] = {}
    for line in out.stdout.splitlines():
        key, _, value = line.rpartition(" ")
        got[key] = int(value)
    want = expected()
    assert set(got) == set(want)
    diffs = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
    assert not diffs, f"ours vs {PACKAGE} {version} (ours, header): {diffs}"
    print(
        f"UAPI check: {len(want)} numbers equal to {PACKAGE} {version} ({gcc.origin})",
        file=sys.stderr,
    )


def test_layouts_match_uapi_header(tmp_path: Path) -> None:
    include, version = _header()
    try:
        gcc = find_gcc()
    except (CommandError, OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"no gcc on PATH and cannot fetch Debian {GCC_SUITE}'s: {exc}")
    check_layouts(gcc, include, version, tmp_path)


def test_fetched_gcc_needs_no_compiler_of_the_system(tmp_path: Path) -> None:
    """Debian's gcc as a fresh CI machine gets it, with nothing of this
    machine's toolchain in reach: ``PATH`` is only its own ``usr/bin``."""
    include, version = _header()
    try:
        gcc = fetch_gcc()
    except (CommandError, OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"cannot fetch Debian {GCC_SUITE}'s gcc: {exc}")
    own = gcc.env["PATH"].split(os.pathsep)[0]
    alone = Compiler(gcc.argv, {**gcc.env, "PATH": own}, gcc.origin)
    check_layouts(alone, include, version, tmp_path)


def test_under_ci_an_unavailable_check_fails(tmp_path: Path) -> None:
    """No apt, no gcc, nothing cached, ``CI=true``: the check fails, loudly."""
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {
        **os.environ,
        "CI": "true",
        "PATH": str(bare),
        "NRI_UAPI_GCC": "fetch",
        "NRI_UAPI_CACHE": str(tmp_path / "uapi"),
        "NRI_UAPI_GCC_CACHE": str(tmp_path / "gcc"),
    }
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         f"{__file__}::test_layouts_match_uapi_header"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "UAPI CHECK FAILED (CI=true): cannot fetch linux-libc-dev" in out.stdout + out.stderr


# sst.md §1.2 (ioctl values) and §1.3/§1.4/§1.6 (sizes and offsets), linux-libc-dev 7.2.13.
SST_MD_IOCTLS = {
    "ISST_IF_GET_PLATFORM_INFO": 0x8008FE00,
    "ISST_IF_GET_PHY_ID": 0xC008FE01,
    "ISST_IF_IO_CMD": 0x4008FE02,
    "ISST_IF_MBOX_COMMAND": 0xC008FE03,
    "ISST_IF_MSR_COMMAND": 0xC008FE04,
    "ISST_IF_COUNT_TPMI_INSTANCES": 0x8008FE05,
    "ISST_IF_CORE_POWER_STATE": 0xC008FE06,
    "ISST_IF_CLOS_PARAM": 0xC008FE07,
    "ISST_IF_CLOS_ASSOC": 0xC008FE08,
    "ISST_IF_PERF_LEVELS": 0xC008FE09,
    "ISST_IF_PERF_SET_LEVEL": 0x4008FE0A,
    "ISST_IF_PERF_SET_FEATURE": 0x4008FE0B,
    "ISST_IF_GET_PERF_LEVEL_INFO": 0x8008FE0C,
    "ISST_IF_GET_PERF_LEVEL_CPU_MASK": 0x8008FE0D,
    "ISST_IF_GET_BASE_FREQ_INFO": 0x8008FE0E,
    "ISST_IF_GET_BASE_FREQ_CPU_MASK": 0x8008FE0F,
    "ISST_IF_GET_TURBO_FREQ_INFO": 0x8008FE10,
    "ISST_IF_GET_PERF_LEVEL_FABRIC_INFO": 0x8008FE11,
}
SST_MD_SIZES = {
    "isst_if_platform_info": 8,
    "isst_if_cpu_map": 8,
    "isst_if_io_reg": 16,
    "isst_if_mbox_cmd": 24,
    "isst_if_msr_cmd": 24,
    "isst_if_cpu_maps": 12,
    "isst_if_io_regs": 20,
    "isst_if_mbox_cmds": 28,
    "isst_if_msr_cmds": 32,
    "isst_core_power": 6,
    "isst_clos_param": 10,
    "isst_if_clos_assoc": 6,
    "isst_if_clos_assoc_cmds": 12,
    "isst_tpmi_instance_count": 4,
    "isst_perf_level_info": 11,
    "isst_perf_level_control": 3,
    "isst_perf_feature_control": 3,
    "isst_perf_level_data_info": 154,
    "isst_perf_level_cpu_mask": 24,
    "isst_base_freq_info": 12,
    "isst_turbo_freq_info": 134,
    "isst_perf_level_fabric_info": 54,
}
SST_MD_OFFSETS = {
    "isst_if_msr_cmds.msr_cmd": 8,
    "isst_clos_param.prop_prio": 8,
    "isst_if_clos_assoc_cmds.assoc_info": 6,
    "isst_perf_level_data_info.bucket_core_counts": 42,
    "isst_perf_level_data_info.trl_freq_mhz": 58,
    "isst_perf_level_cpu_mask.mask": 8,
    "isst_perf_level_cpu_mask.cpu_buffer_size": 16,
    "isst_perf_level_cpu_mask.cpu_buffer": 18,
    "isst_turbo_freq_info.lp_clip_freq_mhz": 10,
    "isst_turbo_freq_info.bucket_core_counts": 22,
    "isst_turbo_freq_info.trl_freq_mhz": 38,
    "isst_perf_level_fabric_info.max_fabrics": 4,
    "isst_perf_level_fabric_info.p0_fabric_freq_mhz": 6,
    "isst_perf_level_fabric_info.p1_fabric_freq_mhz": 22,
    "isst_perf_level_fabric_info.pm_fabric_freq_mhz": 38,
    "isst_if_mbox_cmd.command": 16,
    "isst_if_mbox_cmd.sub_command": 18,
    "isst_if_msr_cmd.msr": 8,
    "isst_if_clos_assoc.logical_cpu": 2,
    "isst_if_clos_assoc.clos": 4,
    "isst_base_freq_info.thermal_design_power_w": 10,
}
SST_MD_FORMATS = {  # §1.5, sizes only (our formats spell the same layout field by field)
    "<HHHBB": 8,
    "<I" + "II": 12,
    "<I" + "IIII": 20,
    "<I" + "IIIIHHI": 28,
    "<I4x" + "IIQQ": 32,
    "<6B": 6,
    "<4BHHBx": 10,
    "<HHH" + "BBHH": 12,
    "<BBH": 4,
    "<11B": 11,
    "<3B": 3,
    "<BBH19H8H48H": 154,
    "<4B4xQHb5x": 24,
    "<BBH4H": 12,
    "<BBH3H6H8H48H": 134,
    "<BBHH8H8H8H": 54,
}


def test_constants_match_sst_md() -> None:
    assert io.IOCTLS == SST_MD_IOCTLS
    ours = expected()
    for name, size in SST_MD_SIZES.items():
        assert ours[f"sizeof {name}"] == size, name
    for name, off in SST_MD_OFFSETS.items():
        assert ours[f"offsetof {name}"] == off, name
    for fmt, size in SST_MD_FORMATS.items():
        assert struct.calcsize(fmt) == size, fmt
    # The same bytes as the doc's formats (a full-size buffer of distinct values).
    for lay, doc in (
        (io.PERF_LEVEL_DATA_INFO, "<BBH19H8H48H"),
        (io.TURBO_FREQ_INFO, "<BBH3H6H8H48H"),
        (io.PERF_LEVEL_CPU_MASK, "<4B4xQHb5x"),
        (io.CLOS_PARAM, "<4BHHBx"),
        (io.PERF_LEVEL_FABRIC_INFO, "<BBHH8H8H8H"),
    ):
        n = len(struct.unpack(doc, bytes(struct.calcsize(doc))))
        values = tuple(i % 100 for i in range(n))
        assert lay.struct.pack(*values) == struct.pack(doc, *values), lay.c_name
