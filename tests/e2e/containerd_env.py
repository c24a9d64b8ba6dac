#!/usr/bin/env python3
"""A private, throw-away containerd (1.7 or 2.1, with NRI enabled) for end-to-end tests.

Stdlib only.  Usable both as a module (``ContainerdEnv``) and as a tool::

    python tests/e2e/containerd_env.py fetch [--cache DIR] [--runtime containerd-2.1]
    python tests/e2e/containerd_env.py up    [--cache DIR] [--runtime ...] --work DIR
    python tests/e2e/containerd_env.py down  --work DIR

The runtimes (:data:`RUNTIMES`), each unpacked in its own cache directory
(:func:`runtime_cache`):

* ``containerd-1.7``: containerd 1.7 (NRI 0.6.1) from Debian **trixie**, in ``CACHE``
  itself (the layout of before the matrix);
* ``containerd-2.1``: containerd 2.1 (NRI 0.8.0) from Debian **sid**, in
  ``CACHE/containerd-2.1``.

Where the pieces come from (nothing is installed into the system):

* ``containerd`` and ``busybox-static`` from the runtime's Debian suite, fetched with a
  private ``APT_CONFIG`` so the system's APT sources and lists stay untouched;
* ``runc`` from the system's own (bookworm) sources, for both: trixie's and sid's runc
  need a newer glibc than bookworm has (and both containerds' runc shims drive it);
* every ``.deb`` is unpacked with ``dpkg -x`` into ``<runtime cache>/root``;
* two images are built locally as OCI-layout tarballs from the static busybox
  (no registry is reachable): ``BUSYBOX_IMAGE`` (cmd ``sh``) and ``PAUSE_IMAGE``
  (``registry.k8s.io/pause:3.8``, cmd ``/bin/sleep inf``), imported with
  ``ctr -n k8s.io images import`` at start.

The config is the one of the binary found (``containerd --version``): version 2 with
the 1.x plugin ids for 1.x, version 3 with the split CRI plugins for 2.x.

The daemon keeps root/state/sockets under ``work_dir``.  Runc's state is moved under
``work_dir`` too (runc option ``Root``).  A few things containerd puts outside
anyway (``/run/containerd/{s,fifo,runc}``, cgroups ``kubepods``/``k8s.io`` in every
hierarchy) are recorded before start and removed again by ``stop()``.

Needs root.  Machine facts this was made for (see the NRI reference note, part B):
root without CAP_SYS_RESOURCE (hence ``restrict_oom_score_adj = true``), no CNI
(pods must use the host network and must not set a hostname).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, NamedTuple

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from _debian import apt_config, apt_env, debian_source, run  # noqa: E402

PAUSE_IMAGE = "registry.k8s.io/pause:3.8"
BUSYBOX_IMAGE = "docker.io/library/busybox:local"
K8S_NAMESPACE = "k8s.io"

DEFAULT_CACHE = Path(
    os.environ.get("NRI_E2E_CACHE") or Path.home() / ".cache" / "nri-resource-policy" / "e2e"
)

TRIXIE_SOURCE = debian_source("trixie")
SYSTEM_PACKAGES = ("runc",)


class Runtime(NamedTuple):
    """One containerd of the matrix: where it comes from, where it is cached."""

    id: str
    #: the Debian suite its packages come from
    suite: str
    #: its cache directory under the e2e cache ("": the cache itself)
    subdir: str
    #: ``major.minor`` its containerd package must have (a moved suite fails loudly)
    series: str
    packages: tuple[str, ...] = ("containerd", "busybox-static")


RUNTIMES = {
    rt.id: rt
    for rt in (
        Runtime("containerd-1.7", "trixie", "", "1.7"),
        Runtime("containerd-2.1", "sid", "containerd-2.1", "2.1"),
    )
}
DEFAULT_RUNTIME = "containerd-1.7"
RUNTIME_FILE = "runtime.json"

# cgroup directory names (top level of each hierarchy) that containerd/CRI/runc create
CGROUP_NAMES = ("kubepods", "k8s.io")
RUN_CONTAINERD = Path("/run/containerd")
RUN_SUBDIRS = ("s", "fifo", "runc")

STATE_FILE = "env-state.json"
#: the end of containerd's log line when the CRI plugin did not load (1.7 and 2.x)
CRI_LOAD_FAILED = re.compile(r'msg="failed to load plugin".* id=io\.containerd\.grpc\.v1\.cri ')


class EnvError(RuntimeError):
    """Raised when the environment cannot be fetched or started."""


def _log(msg: str) -> None:
    print(f"[containerd-env] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """:func:`_debian.run` raising :class:`EnvError`."""
    return run(cmd, error=EnvError, **kw)


# --------------------------------------------------------------------------- fetch


def _apt_config(cache: Path, suite: str = "trixie") -> Path:
    """The private APT configuration of ``suite`` under ``cache/apt`` (see :mod:`_debian`)."""
    return apt_config(cache / "apt", debian_source(suite))


def runtime_cache(cache: Path | str, runtime: str = DEFAULT_RUNTIME) -> Path:
    """The cache directory of ``runtime`` under the e2e cache ``cache``."""
    rt = _runtime(runtime)
    base = Path(cache).expanduser().resolve()
    return base / rt.subdir if rt.subdir else base


def _runtime(runtime: str) -> Runtime:
    try:
        return RUNTIMES[runtime]
    except KeyError:
        raise EnvError(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIMES)}") from None


def cached_runtime(cache: Path) -> Runtime:
    """The runtime ``fetch`` put into ``cache`` (a cache of before the matrix: 1.7)."""
    try:
        return _runtime(json.loads((cache / RUNTIME_FILE).read_text())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return RUNTIMES[DEFAULT_RUNTIME]


def _find_file(
    root: Path, name: str, dirs: tuple[str, ...] = ("usr/bin", "usr/sbin", "bin", "sbin")
) -> Path | None:
    for d in dirs:
        p = root / d / name
        if p.is_file():
            return p
    return None


def _binaries(cache: Path) -> dict[str, Path | None]:
    root = cache / "root"
    return {
        name: _find_file(root, name)
        for name in ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "busybox")
    }


def _debs(cache: Path, pkg: str) -> list[Path]:
    return sorted((cache / "debs").glob(f"{pkg}_*.deb"))


def _save_runtime(cache: Path, rt: Runtime, deb: Path | None = None) -> None:
    """``cache/runtime.json``: which runtime, and what its package says it embeds."""
    info: dict[str, str] = {"id": rt.id, "suite": rt.suite}
    if deb is not None:
        fields = _run(["dpkg-deb", "-f", str(deb), "Version", "Built-Using", "Static-Built-Using"])
        info["package_version"] = fields.stdout.split("\n")[0].partition(": ")[2].strip()
        m = re.search(r"golang-github-containerd-nri \(= ([\d.]+)", fields.stdout)
        info["nri_version"] = m.group(1) if m else ""
    (cache / RUNTIME_FILE).write_text(json.dumps(info) + "\n")


def runtime_info(cache: Path) -> dict[str, str]:
    """What :func:`fetch` recorded about the runtime in ``cache`` (``id``, ``suite``,
    ``package_version``, ``nri_version``: the NRI its Debian package was built with)."""
    try:
        info: dict[str, str] = json.loads((cache / RUNTIME_FILE).read_text())
        return info
    except (OSError, ValueError):
        return {}


def fetch(
    cache: Path | str = DEFAULT_CACHE, *, runtime: str | None = None, quiet: bool = False
) -> dict[str, Path]:
    """Download and unpack ``runtime`` into ``cache`` (that runtime's own cache
    directory, see :func:`runtime_cache`); build the images.  Idempotent.

    ``runtime`` None: the one fetched into ``cache`` before (default 1.7)."""
    cache = Path(cache).expanduser().resolve()
    rt = _runtime(runtime) if runtime else cached_runtime(cache)
    say = (lambda m: None) if quiet else _log
    debdir = cache / "debs"
    debdir.mkdir(parents=True, exist_ok=True)
    _save_runtime(cache, rt)
    if os.geteuid() != 0:
        # apt-get download works as a user, but nothing else here does
        say("warning: not root; containerd will not be usable")

    missing = [p for p in rt.packages if not _debs(cache, p)]
    if missing:
        conf = _apt_config(cache, rt.suite)
        env = apt_env(conf)
        if not any((cache / "apt" / "lists").glob("*Packages*")):
            say(f"apt-get update (private {rt.suite} sources)")
            _run(["apt-get", "update", "-q"], env=env)
        say(f"apt-get download ({rt.suite}) {' '.join(missing)}")
        try:
            _run(["apt-get", "download", "-q", *missing], cwd=debdir, env=env)
        except EnvError:
            say(f"download failed; refreshing the private {rt.suite} lists and retrying")
            _run(["apt-get", "update", "-q"], env=env)
            _run(["apt-get", "download", "-q", *missing], cwd=debdir, env=env)
    else:
        say(f"cached: {', '.join(p.name for t in rt.packages for p in _debs(cache, t))}")
    ctd = _debs(cache, "containerd")
    # containerd_2.1.9~ds1-1_amd64.deb: the suite moved on when this is not rt.series
    got = ctd[-1].name.split("_")[1].split(":")[-1] if ctd else ""
    if not got.startswith(rt.series + "."):
        raise EnvError(
            f"{rt.id}: Debian {rt.suite} has containerd {got or '(none)'}, not {rt.series}.x; "
            f"update RUNTIMES in {Path(__file__).name}"
        )

    missing_sys = [p for p in SYSTEM_PACKAGES if not _debs(cache, p)]
    if missing_sys:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        env.pop("APT_CONFIG", None)
        cmd = ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *missing_sys]
        say(f"apt-get download (system sources) {' '.join(missing_sys)}")
        if _run(cmd, cwd=debdir, env=env, check=False).returncode != 0:
            say("download failed; apt-get update (system sources) and retrying")
            _run(["apt-get", "update", "-q"], env=env)
            _run(cmd, cwd=debdir, env=env)
    else:
        say(f"cached: {', '.join(p.name for t in SYSTEM_PACKAGES for p in _debs(cache, t))}")

    # unpack: redo it when the set of .debs differs from what was unpacked
    root = cache / "root"
    stamp = cache / "root.stamp"
    debs = sorted(p.name for pkg in (*rt.packages, *SYSTEM_PACKAGES) for p in _debs(cache, pkg))
    if not (
        stamp.is_file() and stamp.read_text().split() == debs and all(_binaries(cache).values())
    ):
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        for name in debs:
            say(f"dpkg -x {name}")
            _run(["dpkg", "-x", str(debdir / name), str(root)])
        stamp.write_text("\n".join(debs) + "\n")
    else:
        say(f"cached: {root}")
    bins = _binaries(cache)
    absent = [k for k, v in bins.items() if v is None]
    if absent:
        raise EnvError(f"unpacked packages lack {absent} under {root}")
    out = _run([str(bins["runc"]), "--version"], check=False)
    if out.returncode != 0:
        raise EnvError(f"runc does not run here: {out.stderr.strip()}")

    _save_runtime(cache, rt, ctd[-1])
    images = build_images(cache, Path(bins["busybox"]), say=say)  # type: ignore[arg-type]
    result: dict[str, Path] = {k: v for k, v in bins.items() if v is not None}
    result.update(images)
    return result


# --------------------------------------------------------------------------- images


def _go_arch() -> str:
    m = os.uname().machine
    return {
        "x86_64": "amd64",
        "aarch64": "arm64",
        "armv7l": "arm",
        "ppc64le": "ppc64le",
        "s390x": "s390x",
        "riscv64": "riscv64",
    }.get(m, m)


def _tar_add(
    tar: tarfile.TarFile,
    name: str,
    *,
    data: bytes | None = None,
    mode: int = 0o644,
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
) -> None:
    ti = tarfile.TarInfo(name)
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    ti.mode = mode
    ti.type = kind
    ti.linkname = link
    ti.size = len(data) if data is not None else 0
    tar.addfile(ti, io.BytesIO(data) if data is not None else None)


def _busybox_layer(busybox: Path) -> bytes:
    applets = _run([str(busybox), "--list"]).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d, mode in (
            ("bin", 0o755),
            ("dev", 0o755),
            ("etc", 0o755),
            ("proc", 0o555),
            ("root", 0o700),
            ("sys", 0o555),
            ("tmp", 0o1777),
            ("var", 0o755),
        ):
            _tar_add(tar, d, mode=mode, kind=tarfile.DIRTYPE)
        _tar_add(tar, "bin/busybox", data=busybox.read_bytes(), mode=0o755)
        for a in sorted(set(applets) - {"busybox"}):
            _tar_add(tar, f"bin/{a}", kind=tarfile.SYMTYPE, link="busybox", mode=0o777)
        _tar_add(
            tar,
            "etc/passwd",
            data=b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        )
        _tar_add(tar, "etc/group", data=b"root:x:0:\nnogroup:x:65534:\n")
    return buf.getvalue()


def _oci_archive(ref: str, layer: bytes, cmd: list[str]) -> bytes:
    def blob(data: bytes) -> tuple[str, bytes]:
        return "sha256:" + hashlib.sha256(data).hexdigest(), data

    def dumps(obj: object) -> bytes:
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    arch = _go_arch()
    layer_digest, _ = blob(layer)
    config = dumps(
        {
            "created": "1970-01-01T00:00:00Z",
            "architecture": arch,
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Cmd": cmd,
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "containerd_env.py"}],
        }
    )
    config_digest, _ = blob(config)
    manifest = dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": len(layer),
                }
            ],
        }
    )
    manifest_digest, _ = blob(manifest)
    index = dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_add(tar, "oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}')
        _tar_add(tar, "index.json", data=index)
        _tar_add(tar, "blobs", mode=0o755, kind=tarfile.DIRTYPE)
        _tar_add(tar, "blobs/sha256", mode=0o755, kind=tarfile.DIRTYPE)
        for data in (layer, config, manifest):
            _tar_add(tar, "blobs/sha256/" + hashlib.sha256(data).hexdigest(), data=data)
    return buf.getvalue()


IMAGE_SPECS = {
    # file name: (reference, command)
    "busybox.tar": (BUSYBOX_IMAGE, ["sh"]),
    "pause.tar": (PAUSE_IMAGE, ["/bin/sleep", "inf"]),
}


def build_images(cache: Path, busybox: Path, say=_log) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    imgdir = cache / "images"
    imgdir.mkdir(parents=True, exist_ok=True)
    stamp_key = hashlib.sha256(
        busybox.read_bytes() + json.dumps(IMAGE_SPECS, sort_keys=True).encode()
    ).hexdigest()
    stamp = imgdir / "images.stamp"
    out = {name: imgdir / name for name in IMAGE_SPECS}
    if (
        stamp.is_file()
        and stamp.read_text().strip() == stamp_key
        and all(p.is_file() for p in out.values())
    ):
        say(f"cached: {', '.join(str(p) for p in out.values())}")
        return out
    layer = _busybox_layer(busybox)
    for name, (ref, cmd) in IMAGE_SPECS.items():
        tmp = out[name].with_suffix(".tmp")
        tmp.write_bytes(_oci_archive(ref, layer, cmd))
        tmp.replace(out[name])
        say(f"built {out[name]} ({ref}, cmd {cmd})")
    stamp.write_text(stamp_key + "\n")
    return out


# --------------------------------------------------------------------------- CRI probe


def _h2_frame(ftype: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([ftype, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _hpack_literal(name: str, value: str) -> bytes:
    def s(x: str) -> bytes:
        b = x.encode()
        assert len(b) < 127
        return bytes([len(b)]) + b

    return b"\x00" + s(name) + s(value)


def cri_version_probe(sock_path: str | Path, timeout: float = 2.0) -> bool:
    """One raw gRPC call ``runtime.v1.RuntimeService/Version`` over HTTP/2 (stdlib only).

    True when the server answered with a response message, i.e. the CRI service
    is up and serving (an unready CRI plugin answers with an error status only).
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(sock_path))
            headers = b"".join(
                _hpack_literal(k, v)
                for k, v in (
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/runtime.v1.RuntimeService/Version"),
                    (":authority", "localhost"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                )
            )
            s.sendall(
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                + _h2_frame(4, 0, 0, b"")
                + _h2_frame(1, 0x4, 1, headers)
                + _h2_frame(0, 0x1, 1, b"\x00" * 5)
            )
            buf = b""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    return False
                buf += chunk
                while len(buf) >= 9:
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    ftype, flags = buf[3], buf[4]
                    stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    buf = buf[9 + length :]
                    if ftype == 4 and not flags & 1:  # SETTINGS -> ACK
                        s.sendall(_h2_frame(4, 1, 0, b""))
                    elif ftype == 0 and stream == 1 and length > 5:  # DATA: a reply message
                        return True
                    elif (ftype == 1 and stream == 1 and flags & 1) or ftype in (3, 7):
                        # trailers-only (an error status), RST_STREAM, GOAWAY
                        return False
    except OSError:
        return False
    return False


# --------------------------------------------------------------------------- system helpers


def _cgroup_mounts() -> list[Path]:
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype = right.split()[0] if right else ""
            if fstype in ("cgroup", "cgroup2"):
                mounts.append(Path(_unescape(left.split()[4])))
    return mounts


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape") if "\\" in path else path


def _cgroup_dirs() -> list[str]:
    """All cgroup directories under the names containerd/CRI create, in every hierarchy."""
    found = []
    for mnt in _cgroup_mounts():
        for name in CGROUP_NAMES:
            top = mnt / name
            if top.is_dir():
                for dirpath, _dirs, _files in os.walk(top):
                    found.append(dirpath)
    return found


def _run_entries() -> list[str]:
    out = []
    if RUN_CONTAINERD.is_dir():
        out.append(str(RUN_CONTAINERD))
        for sub in RUN_SUBDIRS:
            d = RUN_CONTAINERD / sub
            if d.is_dir():
                out.append(str(d))
                for e in d.iterdir():
                    out.append(str(e))
                    if sub == "runc" and e.is_dir():
                        out.extend(str(x) for x in e.iterdir())
    return out


def _mounts_under(prefix: Path) -> list[str]:
    pre = str(prefix).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = _unescape(line.split()[4])
            if mp.startswith(pre) or mp == pre.rstrip("/"):
                found.append(mp)
    return found


_libc = None


def _umount(path: str) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if _libc.umount2(path.encode(), 2) != 0:  # MNT_DETACH
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            _log(f"umount {path}: {os.strerror(err)}")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _pid_alive(p)]
    return left


def _kill(pids: list[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


# --------------------------------------------------------------------------- the env


class ContainerdEnv:
    """A containerd daemon (1.7 or 2.x) with NRI enabled, everything under ``work_dir``.

    >>> env = ContainerdEnv(cache_dir, work_dir); env.start()
    >>> env.cri_socket, env.nri_socket, env.log_path, env.log_text()
    >>> env.stop()
    """

    def __init__(
        self,
        cache_dir: Path | str | None = None,
        work_dir: Path | str = "",
        *,
        log_level: str = "info",
        request_timeout: str = "2s",
        registration_timeout: str = "5s",
    ) -> None:
        """``request_timeout``/``registration_timeout``: containerd's
        ``plugin_request_timeout``/``plugin_registration_timeout`` (Go durations)."""
        if not work_dir:
            raise ValueError("work_dir is required")
        self.cache_dir = Path(cache_dir or DEFAULT_CACHE).expanduser().resolve()
        self.work_dir = Path(work_dir).expanduser().resolve()
        self.log_level = log_level
        self.request_timeout = request_timeout
        self.registration_timeout = registration_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: io.BufferedWriter | None = None
        self.bins: dict[str, Path] = {}

    @property
    def runtime(self) -> dict[str, str]:
        """What :func:`fetch` recorded about this cache's runtime (see :func:`runtime_info`)."""
        return runtime_info(self.cache_dir)

    @property
    def nri_version(self) -> tuple[int, ...]:
        """The NRI its Debian package was built with (``(0, 8, 0)``); () when unknown."""
        m = re.match(r"\d+(?:\.\d+)*", self.runtime.get("nri_version", ""))
        return tuple(int(x) for x in m.group(0).split(".")) if m else ()

    # ---- paths
    @property
    def cri_socket(self) -> Path:
        """containerd's gRPC socket; the CRI services are served on it."""
        return self.work_dir / "containerd.sock"

    @property
    def address(self) -> Path:
        return self.cri_socket

    @property
    def ttrpc_socket(self) -> Path:
        return self.work_dir / "containerd.sock.ttrpc"

    @property
    def nri_socket(self) -> Path:
        return self.work_dir / "nri" / "nri.sock"

    @property
    def nri_plugin_path(self) -> Path:
        """Pre-launched plugins go here (executables named ``NN-name``)."""
        return self.work_dir / "nri" / "plugins"

    @property
    def nri_plugin_config_path(self) -> Path:
        return self.work_dir / "nri" / "conf.d"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "containerd.log"

    @property
    def config_path(self) -> Path:
        return self.work_dir / "config.toml"

    @property
    def pod_log_dir(self) -> Path:
        """A directory for pod sandboxes' ``log_directory`` (cleaned by ``stop()``)."""
        return self.work_dir / "pod-logs"

    @property
    def runc_root(self) -> Path:
        return self.work_dir / "runc"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else self._state().get("pid")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ---- state shared with `down` in another process
    def _state(self) -> dict[str, Any]:
        try:
            st: dict[str, Any] = json.loads((self.work_dir / STATE_FILE).read_text())
            return st
        except (OSError, ValueError):
            return {}

    def _save_state(self, **kw: object) -> None:
        st = self._state()
        st.update(kw)
        (self.work_dir / STATE_FILE).write_text(json.dumps(st, indent=1))

    # ---- config
    def containerd_version(self) -> str:
        """What the binary says it is (``containerd --version``: ``2.1.9+unknown``)."""
        if not self.bins:
            self.bins = {k: v for k, v in _binaries(self.cache_dir).items() if v}
        out = _run([str(self.bins["containerd"]), "--version"]).stdout.split()
        if len(out) < 3:
            raise EnvError(f"unexpected `containerd --version` output: {out}")
        return out[2]

    def _nri_section(self, q: str) -> str:
        return f"""\
  [plugins.{q}io.containerd.nri.v1.nri{q}]
    disable = false
    disable_connections = false
    socket_path = "{self.nri_socket}"
    plugin_path = "{self.nri_plugin_path}"
    plugin_config_path = "{self.nri_plugin_config_path}"
    plugin_registration_timeout = "{self.registration_timeout}"
    plugin_request_timeout = "{self.request_timeout}"
"""

    def _runc_section(self, runtimes: str) -> str:
        return f"""\
      [{runtimes}.runc]
        runtime_type = "io.containerd.runc.v2"
        [{runtimes}.runc.options]
          SystemdCgroup = false
          Root = "{self.runc_root}"
          BinaryName = "{self.bins.get("runc", "runc")}"
"""

    def config_toml(self) -> str:
        """The config of the binary found: version 3 for containerd 2.x, else version 2."""
        major = int(self.containerd_version().split(".")[0])
        return self._config_v3() if major >= 2 else self._config_v2()

    def _head(self, version: int, disabled: tuple[str, ...]) -> str:
        w = self.work_dir
        plugins = "".join(f'  "{p}",\n' for p in disabled)
        return f"""\
version = {version}
root = "{w}/root"
state = "{w}/state"
oom_score = 0
disabled_plugins = [
{plugins}]

[grpc]
  address = "{self.cri_socket}"

[ttrpc]
  address = "{self.ttrpc_socket}"

[debug]
  level = "{self.log_level}"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{w}/opt"

"""

    def _config_v3(self) -> str:
        """containerd 2.x: CRI split into ``io.containerd.cri.v1.runtime`` (the runtimes,
        CNI, ``restrict_oom_score_adj``), ``io.containerd.cri.v1.images`` (snapshotter,
        the sandbox image as ``pinned_images.sandbox``, registry) and
        ``io.containerd.grpc.v1.cri`` (the server: streaming, TCP service)."""
        w = self.work_dir
        empty_cni = w / "cni"
        rt = '[plugins."io.containerd.cri.v1.runtime"'
        head = self._head(
            3,
            (
                "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.devmapper",
                "io.containerd.snapshotter.v1.zfs",
                "io.containerd.snapshotter.v1.erofs",
                "io.containerd.snapshotter.v1.blockfile",
                "io.containerd.differ.v1.erofs",
                "io.containerd.tracing.processor.v1.otlp",
                "io.containerd.internal.v1.tracing",
            ),
        )
        return (
            head.replace("version = 3\n", f'version = 3\ntemp = "{w}/tmp"\n', 1)
            + self._nri_section('"')
            + f"""
  [plugins."io.containerd.cri.v1.runtime"]
    restrict_oom_score_adj = true
    disable_apparmor = true
    enable_selinux = false
    enable_cdi = false

    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["{empty_cni}/bin"]
      conf_dir = "{empty_cni}/net.d"
      max_conf_num = 1

    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
"""
            + self._runc_section(rt[1:] + ".containerd.runtimes")
            + f"""
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "{PAUSE_IMAGE}"
    [plugins."io.containerd.cri.v1.images".registry]
      config_path = ""

  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [plugins."io.containerd.transfer.v1.local"]
    config_path = ""

  [plugins."io.containerd.image-verifier.v1.bindir"]
    bin_dir = "{w}/image-verifier/bin"
"""
        )

    def _config_v2(self) -> str:
        """containerd 1.x: one ``io.containerd.grpc.v1.cri`` plugin."""
        w = self.work_dir
        empty_cni = w / "cni"
        head = self._head(
            2,
            (
                "io.containerd.snapshotter.v1.aufs",
                "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.devmapper",
                "io.containerd.snapshotter.v1.zfs",
                "io.containerd.tracing.processor.v1.otlp",
                "io.containerd.internal.v1.tracing",
            ),
        )
        return (
            head
            + self._nri_section('"')
            + f"""
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{PAUSE_IMAGE}"
    restrict_oom_score_adj = true
    disable_apparmor = true
    enable_selinux = false
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_cdi = false

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{empty_cni}/bin"
      conf_dir = "{empty_cni}/net.d"
      max_conf_num = 1

    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
"""
            + self._runc_section('plugins."io.containerd.grpc.v1.cri".containerd.runtimes')
            + """
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = ""
"""
        )

    def _env(self) -> dict[str, str]:
        dirs = []
        for name in ("runc", "containerd-shim-runc-v2", "containerd"):
            d = str(self.bins[name].parent)
            if d not in dirs:
                dirs.append(d)
        env = dict(os.environ)
        env["PATH"] = ":".join([*dirs, env.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")])
        # don't let a caller's proxy settings or a stray config leak in
        for k in ("CONTAINERD_ADDRESS", "CONTAINERD_NAMESPACE", "NOTIFY_SOCKET"):
            env.pop(k, None)
        return env

    def ctr(
        self, *args: str, namespace: str = K8S_NAMESPACE, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this daemon."""
        return _run(
            [str(self.bins["ctr"]), "--address", str(self.cri_socket), "-n", namespace, *args],
            env=self._env(),
            check=check,
            timeout=timeout,
        )

    # ---- lifecycle
    def start(
        self, *, fetch_missing: bool = True, fresh: bool = True, timeout: float = 60
    ) -> ContainerdEnv:
        """Write the config, start containerd, wait for CRI, import the two images.

        ``fresh``: wipe containerd's root/state/runc dirs left in ``work_dir`` by an
        earlier run (otherwise containerd restores that run's dead pods).
        """
        if os.geteuid() != 0:
            raise EnvError("containerd needs root")
        if fetch_missing:
            self.bins = {k: v for k, v in fetch(self.cache_dir, quiet=True).items()}
        else:
            self.bins = {k: v for k, v in _binaries(self.cache_dir).items() if v}
        if self._proc is not None and self._proc.poll() is None:
            raise EnvError("already started")
        w = self.work_dir
        st = self._state()
        if st and not st.get("stopped_clean", False):
            # an earlier run in this work dir was not stopped (or not cleanly): clean up
            # with that run's snapshot first
            _log(f"cleaning up an earlier run in {w}")
            self.stop()
        if fresh:
            if _mounts_under(w):
                raise EnvError(f"mounts left under {w}; run stop()/`down` first")
            for d in (w / "root", w / "state", self.runc_root, self.pod_log_dir):
                shutil.rmtree(d, ignore_errors=True)
        for d in (
            w,
            self.nri_plugin_path,
            self.nri_plugin_config_path,
            w / "cni" / "bin",
            w / "cni" / "net.d",
            self.pod_log_dir,
            self.runc_root,
        ):
            d.mkdir(parents=True, exist_ok=True)
        # what exists before this start: stop() and leftovers() leave these alone
        with contextlib.suppress(OSError):
            (w / STATE_FILE).unlink()
        self._save_state(
            cgroups_before=_cgroup_dirs(),
            run_before=_run_entries(),
            run_containerd_existed=RUN_CONTAINERD.exists(),
            stopped_clean=False,
        )
        self._save_state(
            runc=str(self.bins["runc"]),
            shim=str(self.bins["containerd-shim-runc-v2"]),
            config=str(self.config_path),
            address=str(self.cri_socket),
        )
        self.config_path.write_text(self.config_toml())
        self._start_daemon(timeout)
        for name in ("pause.tar", "busybox.tar"):
            self.ctr("images", "import", str(self.cache_dir / "images" / name))
        return self

    def _start_daemon(self, timeout: float) -> None:
        for sock in (self.cri_socket, self.ttrpc_socket):
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()
        self._log_fh = open(self.log_path, "ab")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [str(self.bins["containerd"]), "--config", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            env=self._env(),
            cwd=self.work_dir,
            start_new_session=True,
        )  # = setsid
        (self.work_dir / "containerd.pid").write_text(f"{self._proc.pid}\n")
        self._save_state(pid=self._proc.pid)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise EnvError(
                    f"containerd exited with {self._proc.returncode}:\n" + self.log_text()[-4000:]
                )
            if self.cri_socket.exists() and cri_version_probe(self.cri_socket):
                return
            if CRI_LOAD_FAILED.search(self.log_text()):
                # containerd serves on without CRI: no use waiting for it
                raise EnvError("containerd did not load CRI:\n" + self.log_text()[-4000:])
            if time.monotonic() > deadline:
                raise EnvError(f"CRI did not answer within {timeout}s:\n" + self.log_text()[-4000:])
            time.sleep(0.1)

    def restart_daemon(self, timeout: float = 60) -> None:
        """Stop only the containerd process (containers keep running) and start it again."""
        self._stop_daemon()
        self._start_daemon(timeout)

    def _stop_daemon(self) -> None:
        pid = self.pid
        if pid and _pid_alive(pid) and str(self.config_path) in _cmdline(pid):
            _kill([pid], signal.SIGTERM)
            if _wait_gone([pid], 10):
                _kill([pid], signal.SIGKILL)
                _wait_gone([pid], 5)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1)
            self._proc = None
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def _shim_pids(self) -> list[int]:
        addr = str(self.cri_socket)
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                cmd = _cmdline(int(d.name))
                if cmd and cmd[0].endswith("containerd-shim-runc-v2") and "-address" in cmd:
                    i = cmd.index("-address")
                    if i + 1 < len(cmd) and cmd[i + 1] == addr:
                        pids.append(int(d.name))
        return pids

    def stop(self) -> None:
        """Kill containerd, its shims and containers; unmount and remove what it left.

        Only what this daemon made is touched: its runc containers (runc state is under
        ``work_dir``), its shims (matched by ``-address``), its shim sockets in
        ``/run/containerd/s`` (named sha256(address/ns/id)), mounts under ``work_dir``, and
        the cgroups of its containers plus their parents when empty.  Directories
        (``/run/containerd``, cgroups ``kubepods``/``k8s.io``) that did not exist before
        ``start()`` are removed when empty, so several envs may run side by side.
        """
        st = self._state()
        addr = st.get("address") or str(self.cri_socket)
        self._stop_daemon()
        runc = st.get("runc") or (str(self.bins["runc"]) if "runc" in self.bins else None)

        # tasks (ns, id) this daemon knows: bundles in its state dir + live shims
        tasks: set[tuple[str, str]] = set()
        task_dir = self.work_dir / "state" / "io.containerd.runtime.v2.task"
        if task_dir.is_dir():
            for nsdir in task_dir.iterdir():
                if nsdir.is_dir():
                    tasks.update((nsdir.name, b.name) for b in nsdir.iterdir())
        shims = self._shim_pids()
        for pid in shims:
            cmd = _cmdline(pid)
            with contextlib.suppress(ValueError, IndexError):
                tasks.add((cmd[cmd.index("-namespace") + 1], cmd[cmd.index("-id") + 1]))

        # containers: runc's state is under work_dir/runc/<namespace>; note their cgroups
        cgroups: set[str] = set()
        if self.runc_root.is_dir():
            for root in sorted(p for p in self.runc_root.iterdir() if p.is_dir()):
                for cdir in sorted(p for p in root.iterdir() if p.is_dir()):
                    with contextlib.suppress(OSError, ValueError, AttributeError):
                        state = json.loads((cdir / "state.json").read_text())
                        cgroups.update(state.get("cgroup_paths", {}).values())
                    if runc:
                        _run(
                            [runc, "--root", str(root), "delete", "--force", cdir.name],
                            check=False,
                            timeout=30,
                        )
        _kill(shims, signal.SIGKILL)
        _wait_gone(shims, 5)
        pids: set[int] = set()
        for d in cgroups:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in Path(d, "cgroup.procs").read_text().split())
        if pids:
            _log(f"killing leftover container processes {sorted(pids)}")
            _kill(sorted(pids), signal.SIGKILL)
            _wait_gone(sorted(pids), 5)

        # mounts (rootfs overlays, sandbox shm) under work_dir, deepest first
        for mp in sorted(_mounts_under(self.work_dir), key=lambda p: p.count("/"), reverse=True):
            _umount(mp)

        # /run/containerd: our shim sockets, then the directories if we made them and empty
        for ns, tid in tasks:
            sock = RUN_CONTAINERD / "s" / hashlib.sha256(f"{addr}/{ns}/{tid}".encode()).hexdigest()
            with contextlib.suppress(OSError):
                sock.unlink()
        run_before = set(st.get("run_before") or [])
        for rd in [*(RUN_CONTAINERD / s for s in RUN_SUBDIRS), RUN_CONTAINERD]:
            if str(rd) not in run_before:
                with contextlib.suppress(OSError):
                    rd.rmdir()

        # cgroups: our containers', then their parents and new empty ones, leaves first
        before = set(st.get("cgroups_before") or [])
        cand = set(cgroups)
        tops = {str(m / n) for m in _cgroup_mounts() for n in CGROUP_NAMES}
        for d in cgroups:
            # parents up to <hierarchy>/kubepods or <hierarchy>/k8s.io, nothing else
            if not any(d.startswith(t + "/") for t in tops):
                continue
            p = Path(d).parent
            while str(p) not in before:
                cand.add(str(p))
                if str(p) in tops:
                    break
                p = p.parent
        cand.update(d for d in _cgroup_dirs() if d not in before)
        left: list[str] = []
        for _attempt in range(30):
            left = []
            for d in sorted(cand, key=lambda p: p.count("/"), reverse=True):
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
            # a populated cgroup that is not one of our containers' is someone else's
            cand = {d for d in left if any(c.startswith(d) for c in cgroups)}
            if not cand:
                break
            time.sleep(0.1)
        else:
            _log(f"could not remove cgroups: {sorted(cand)}")

        for sock in (self.cri_socket, self.ttrpc_socket, self.nri_socket):
            with contextlib.suppress(OSError):
                sock.unlink()
        left_over = self.leftovers()
        clean = not any(left_over.values())
        if self.work_dir.is_dir():
            self._save_state(pid=None, stopped_clean=clean)
        if not clean:
            _log(f"left behind: {left_over}")

    def leftovers(self) -> dict[str, list[str]]:
        """What ``stop()`` should have removed but is still there (for assertions)."""
        st = self._state()
        before_cg = set(st.get("cgroups_before") or [])
        before_run = set(st.get("run_before") or [])
        return {
            "mounts": _mounts_under(self.work_dir),
            "cgroups": [d for d in _cgroup_dirs() if d not in before_cg],
            "run": [e for e in _run_entries() if e not in before_run],
            "shims": [str(p) for p in self._shim_pids()],
            "daemon": [str(self.pid)] if self.pid and _pid_alive(self.pid) else [],
        }

    def __enter__(self) -> ContainerdEnv:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download + unpack packages, build images")
    f.add_argument("--cache", default=str(DEFAULT_CACHE))
    f.add_argument("--runtime", choices=list(RUNTIMES), default=DEFAULT_RUNTIME)
    u = sub.add_parser("up", help="start containerd (stays running)")
    u.add_argument("--cache", default=str(DEFAULT_CACHE))
    u.add_argument("--runtime", choices=list(RUNTIMES), default=DEFAULT_RUNTIME)
    u.add_argument("--work", required=True)
    u.add_argument("--log-level", default="info")
    d = sub.add_parser("down", help="stop containerd started by `up` and clean up")
    d.add_argument("--work", required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "fetch":
            t0 = time.monotonic()
            for k, v in fetch(runtime_cache(a.cache, a.runtime), runtime=a.runtime).items():
                print(f"{k}: {v}")
            print(f"fetch done in {time.monotonic() - t0:.1f}s")
        elif a.cmd == "up":
            t0 = time.monotonic()
            cache = runtime_cache(a.cache, a.runtime)
            fetch(cache, runtime=a.runtime, quiet=True)
            env = ContainerdEnv(cache, a.work, log_level=a.log_level).start()
            # keep the daemon alive after we exit: detach from the Popen object
            env._proc = None
            if env._log_fh:
                env._log_fh.close()
            print(f"containerd pid {env.pid} up in {time.monotonic() - t0:.1f}s")
            print(f"CRI socket:  {env.cri_socket}")
            print(f"NRI socket:  {env.nri_socket}")
            print(f"log:         {env.log_path}")
            print(f"ctr:         {env.bins['ctr']} --address {env.cri_socket} -n k8s.io ...")
        elif a.cmd == "down":
            env = ContainerdEnv(None, a.work)
            env.stop()
            left = {k: v for k, v in env.leftovers().items() if v}
            print("down; leftovers: " + (json.dumps(left) if left else "none"))
            return 1 if left else 0
    except EnvError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
