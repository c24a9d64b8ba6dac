"""The containerd runtimes of the e2e tier and what ``fetch`` puts into their cache.

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

Stdlib only.

Its neighbours (the environment's other modules): see :mod:`containerd_env`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any, NamedTuple

# tests/ is on sys.path: containerd_env.py and conftest.py put it there
from _debian import apt_config, apt_env, debian_source, run
from _progress import Progress, write_line

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


class EnvError(RuntimeError):
    """Raised when the environment cannot be fetched or started."""


def _log(msg: str) -> None:
    write_line(f"[containerd-env] {msg}")  # live, also in pytest's session fixtures


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
    progress = Progress("", write=say)
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
        lists = cache / "apt" / "lists"
        if not any(lists.glob("*Packages*")):
            with progress.step(f"apt-get update (private {rt.suite} sources)", watch=lists) as st:
                _run(["apt-get", "update", "-q"], env=env, progress=st)
        what = f"apt-get download ({rt.suite}) {' '.join(missing)}"
        with progress.step(what, watch=debdir) as st:
            try:
                _run(["apt-get", "download", "-q", *missing], cwd=debdir, env=env, progress=st)
            except EnvError:
                say(f"download failed; refreshing the private {rt.suite} lists and retrying")
                _run(["apt-get", "update", "-q"], env=env, progress=st)
                _run(["apt-get", "download", "-q", *missing], cwd=debdir, env=env, progress=st)
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
        with progress.step(f"apt-get download (system sources) {' '.join(missing_sys)}",
                           watch=debdir) as st:  # fmt: skip
            if _run(cmd, cwd=debdir, env=env, check=False, progress=st).returncode != 0:
                say("download failed; apt-get update (system sources) and retrying")
                _run(["apt-get", "update", "-q"], env=env, progress=st)
                _run(cmd, cwd=debdir, env=env, progress=st)
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
        with progress.step(f"dpkg -x {len(debs)} packages", watch=root) as st:
            for name in debs:
                say(f"dpkg -x {name}")
                _run(["dpkg", "-x", str(debdir / name), str(root)], progress=st)
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
