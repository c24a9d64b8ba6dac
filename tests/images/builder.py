"""Build the two images of ``docker/`` here: no Docker daemon, no registry.

The builder is Debian bookworm's own ``buildah`` (1.28.2): fetched as ``.deb``
files with a private APT configuration (:mod:`_debian`), unpacked with
``dpkg -x`` under the cache, run as root with the ``vfs`` storage driver and
chroot isolation, with its own ``storage.conf``, ``registries.conf``,
``policy.json`` and ``containers.conf`` under the cache (nothing of the system's
``/etc/containers`` is read, nothing is installed). Sid's buildah 1.43 cannot
run here: it needs ``libc6 (>= 2.38)`` and ``libgpgme45`` and bookworm has
glibc 2.36 (and running it under sid's own loader breaks buildah's re-exec of
``/proc/self/exe`` for chroot isolation).

No registry is reachable, so the FROM image ``python:3.11-slim`` is assembled
locally from bookworm packages (:data:`BASE_PACKAGES`, unpacked with ``dpkg
-x``; merged ``/usr``; ``/etc/passwd`` from base-passwd; the CA bundle; no
PEP 668 ``EXTERNALLY-MANAGED`` marker, as in the real image; docs, man pages
and locales trimmed; the standard library byte-compiled) and tagged
``docker.io/library/python:3.11-slim`` in the builder's storage. The
Dockerfiles then build unchanged with ``buildah bud --network host`` (their RUN
steps reach PyPI) and each image is written as a ``docker-archive`` that
``ctr -n k8s.io images import`` takes (containerd 1.7 and 2.x).

Cache (``$NRI_IMAGES_CACHE`` or ``~/.cache/nri-resource-policy/images``): the
base and each image are keyed by a hash of what goes in (the base recipe; the
Dockerfile, its ``.dockerignore`` and every context file it sends; the base's
key), so a warm run builds nothing (and needs neither root nor the network) and
a source change rebuilds that image.

Interface: :func:`cache_dir`, :func:`build_images`, :data:`PLUGIN_REF`,
:data:`HELPER_REF`. ``python tests/images/builder.py`` builds and prints the
archives. Stdlib only.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
ROOT = _HERE.parents[1]
for _p in (_HERE, ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from _debian import KEYRING, apt_config, apt_env, cache_lock, dpkg_extract, run  # noqa: E402
from _progress import Progress, Step  # noqa: E402
from dockerfile import IgnoreRules, copy_sources  # noqa: E402

CHART = ROOT / "charts" / "nri-resource-policy-balloons"
DOCKER = ROOT / "docker"


def _app_version() -> str:
    m = re.search(r'^appVersion:\s*"?([^"\s]+)"?', (CHART / "Chart.yaml").read_text(), re.M)
    if not m:
        raise RuntimeError(f"no appVersion in {CHART / 'Chart.yaml'}")
    return m.group(1)


APP_VERSION = _app_version()
PLUGIN_REF = f"localhost/nri-resource-policy:{APP_VERSION}"
HELPER_REF = f"localhost/nri-sst-helper:{APP_VERSION}"
BASE_REF = "docker.io/library/python:3.11-slim"


@dataclass(frozen=True)
class Image:
    """One image of ``docker/``: its ref and Dockerfile (+ ``.dockerignore``)."""

    name: str
    ref: str
    dockerfile: Path

    @property
    def ignorefile(self) -> Path:
        return self.dockerfile.with_name(self.dockerfile.name + ".dockerignore")


IMAGES = (
    Image("plugin", PLUGIN_REF, DOCKER / "Dockerfile.plugin"),
    Image("sst-helper", HELPER_REF, DOCKER / "Dockerfile.sst-helper"),
)

SUITE = "bookworm"
SOURCES = (
    f"deb [signed-by={KEYRING}] http://deb.debian.org/debian {SUITE} main\n"
    f"deb [signed-by={KEYRING}] http://deb.debian.org/debian {SUITE}-updates main\n"
    f"deb [signed-by={KEYRING}] http://security.debian.org/debian-security {SUITE}-security main\n"
)
BUILDER_PACKAGES = ("buildah", "patchelf")
# What of the builder's closure is unpacked: buildah, its configuration, its
# libraries and patchelf; the system's own libc6 is used (same release, or newer).
_BUILDER_UNPACK = re.compile(r"^(buildah|patchelf|golang-github-containers-.*|lib(?!c6_|perl).*)_")
# buildah re-executes itself (/proc/self/exe) with a fresh environment for chroot
# isolation, so LD_LIBRARY_PATH does not reach it: its DT_RPATH (searched for the
# libraries' own dependencies too) names the unpacked library directories, by
# absolute path ($ORIGIN is ignored there: the re-exec runs in secure-execution mode).
# The base: the interpreter, pip (with setuptools/wheel, as python:3.11-slim
# has them), ``python`` on PATH, a shell and coreutils for RUN steps, the C++
# runtime that manylinux wheels expect of the system.
BASE_PACKAGES = (
    "python3.11",
    "python3-pip",
    "python-is-python3",
    "base-files",
    "base-passwd",
    "dash",
    "coreutils",
    "ca-certificates",
    "libstdc++6",  # as in python:3.11-slim: binary wheels (pyzmq, grpcio) link it
)
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
BASE_CMD = ["python3"]
TRIM = (
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/bug",
    "usr/share/menu",
    "var/cache/debconf",
    "var/lib/apt/lists",
)
# Bump when the assembly below changes what the base holds.
BASE_REVISION = 1
LABEL = "org.nri-resource-policy.cache-key"
META = "meta.json"


class ImagesError(RuntimeError):
    """The images cannot be built here (the message says which step and why)."""


Say = Callable[[str], object]


def cache_dir() -> Path:
    """``$NRI_IMAGES_CACHE`` or ``~/.cache/nri-resource-policy/images``."""
    env = os.environ.get("NRI_IMAGES_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache/nri-resource-policy/images"


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "big") + b)
    return h.hexdigest()[:16]


def base_key() -> str:
    """The hash of the base recipe (sources, packages, config, trimming)."""
    recipe = [SOURCES, BASE_PACKAGES, BASE_ENV, BASE_CMD, TRIM, BASE_REVISION, BASE_REF]
    return _sha(json.dumps(recipe, sort_keys=True))


def image_key(image: Image, context: Path = ROOT) -> str:
    """The hash of what goes into ``image``: base, Dockerfile, ignore file, sent files.

    ``context``: the build context (the repository; its ``docker/`` is read).
    """
    dockerfile = context / image.dockerfile.relative_to(ROOT)
    ignorefile = context / image.ignorefile.relative_to(ROOT)
    rules = IgnoreRules(ignorefile.read_text())
    parts: list[bytes | str] = [base_key(), image.ref, dockerfile.read_bytes()]
    parts.append(ignorefile.read_bytes())
    for rel in rules.files(context, copy_sources(dockerfile)):
        path = context / rel
        parts += [rel, oct(path.stat().st_mode & 0o111), path.read_bytes()]
    return _sha(*parts)


def archive_path(cache: Path, name: str, key: str) -> Path:
    return cache / "archives" / f"{name}-{key}.tar"


def read_meta(archive: Path) -> dict[str, object]:
    """What the build recorded beside ``archive`` (sizes, build time, image id)."""
    data: dict[str, object] = json.loads(archive.with_suffix(".json").read_text())
    return data


def _cmd(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return run(cmd, error=ImagesError, **kw)  # type: ignore[arg-type]


# -- the builder -------------------------------------------------------------------------


def _apt(cache: Path, say: Say) -> dict[str, str]:
    env = apt_env(apt_config(cache / "apt", SOURCES, own_status=True))
    if not any((cache / "apt" / "lists").glob("*Packages*")):
        lists = cache / "apt" / "lists"
        with Progress("", write=say).step(f"apt-get update (private {SUITE} sources)",
                                          watch=lists) as st:  # fmt: skip
            _cmd(["apt-get", "update", "-q"], env=env, timeout=900, progress=st)
    return env


def _download(cache: Path, packages: tuple[str, ...], dest: Path, say: Say) -> list[Path]:
    """The ``.deb`` files of ``packages`` and their dependencies (no recommends)."""
    env = _apt(cache, say)
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "partial").mkdir(parents=True)
    cmd = ["apt-get", "install", "-q", "-y", "-d", "--no-install-recommends"]
    cmd += ["-o", f"Dir::Cache::archives={dest}", *packages]
    what = f"apt-get install --download-only {' '.join(packages)} (private {SUITE} sources)"
    with Progress("", write=say).step(what, watch=dest) as st:
        try:
            _cmd(cmd, env=env, timeout=1800, progress=st)
        except ImagesError:  # stale lists: refresh once
            _cmd(["apt-get", "update", "-q"], env=env, timeout=900, progress=st)
            _cmd(cmd, env=env, timeout=1800, progress=st)
    return sorted(dest.glob("*.deb"))


class Buildah:
    """bookworm's buildah unpacked under ``cache/buildah``, with its own config."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.root = cache / "buildah" / "root"
        self.conf = cache / "buildah" / "conf"
        self.storage = cache / "storage"
        self.policy = self.conf / "policy.json"

    @property
    def binary(self) -> Path:
        return self.root / "usr" / "bin" / "buildah"

    def _libs(self) -> str:
        dirs = [self.root / "usr/lib/x86_64-linux-gnu", self.root / "lib/x86_64-linux-gnu"]
        return ":".join(map(str, dirs))

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": str(self.conf / "home"),
            "BUILDAH_ISOLATION": "chroot",
            "CONTAINERS_CONF": str(self.conf / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.conf / "storage.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(self.conf / "registries.conf"),
            "REGISTRY_AUTH_FILE": str(self.conf / "auth.json"),
            "TMPDIR": str(self.cache / "tmp"),
            **{k: v for k, v in os.environ.items() if k.lower().endswith("_proxy")},
        }

    def __call__(self, *args: str, timeout: float = 600, progress: Step | None = None) -> str:
        cmd = [str(self.binary), "--storage-driver", "vfs", "--root", str(self.storage)]
        cmd += ["--runroot", str(self.cache / "runroot"), *args]
        return _cmd(cmd, env=self.env(), timeout=timeout, progress=progress).stdout

    def setup(self, say: Say) -> None:
        stamp = self.root.parent / "stamp"
        if not stamp.exists():
            debs = _download(self.cache, BUILDER_PACKAGES, self.cache / "debs" / "builder", say)
            shutil.rmtree(self.root, ignore_errors=True)
            dpkg_extract([d for d in debs if _BUILDER_UNPACK.match(d.name)], self.root)
            _cmd(
                [str(self.root / "usr/bin/patchelf"), "--force-rpath", "--set-rpath", self._libs(),
                 str(self.binary)],
                env=dict(os.environ, LD_LIBRARY_PATH=self._libs()),
            )  # fmt: skip
            stamp.write_text(" ".join(d.name for d in debs) + "\n")
        share = self.root / "usr/share/containers"
        self.conf.mkdir(parents=True, exist_ok=True)
        (self.conf / "home").mkdir(exist_ok=True)
        (self.cache / "tmp").mkdir(exist_ok=True)
        (self.conf / "auth.json").write_text('{"auths": {}}\n')
        self.policy.write_text('{"default": [{"type": "insecureAcceptAnything"}]}\n')
        (self.conf / "registries.conf").write_text(
            'unqualified-search-registries = ["docker.io"]\nshort-name-mode = "permissive"\n'
        )
        (self.conf / "storage.conf").write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{self.storage}"\n'
            f'runroot = "{self.cache / "runroot"}"\n'
        )
        (self.conf / "containers.conf").write_text(
            f'[containers]\nseccomp_profile = "{share / "seccomp.json"}"\n'
            f'[engine]\nimage_default_transport = "docker://"\n'
        )
        (self.conf / "home" / ".config" / "containers").mkdir(parents=True, exist_ok=True)
        shutil.copy(self.policy, self.conf / "home" / ".config" / "containers" / "policy.json")
        say(self("--version").strip())

    def image_label(self, ref: str) -> str | None:
        """The cache-key label of the local image ``ref`` (None: no such image)."""
        try:
            out = self("inspect", "--type", "image", ref)
        except ImagesError:
            return None
        labels = json.loads(out)["OCIv1"]["config"].get("Labels") or {}
        return labels.get(LABEL)  # type: ignore[no-any-return]

    def push_archive(self, ref: str, dest: Path) -> None:
        """``ref`` as a docker-archive at ``dest`` (atomically)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        self("push", "--signature-policy", str(self.policy), ref, f"docker-archive:{tmp}:{ref}")
        tmp.rename(dest)


# -- the base image -----------------------------------------------------------------------


def _merge_usr(root: Path) -> None:
    """Merged ``/usr`` (as bookworm's own images are): /bin, /sbin, /lib* -> usr/..."""
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = root / name
        if not top.exists() or top.is_symlink():
            continue
        for src in sorted(top.rglob("*"), key=lambda p: len(p.parts)):
            dst = root / "usr" / src.relative_to(root)
            if src.is_dir() and not src.is_symlink():
                dst.mkdir(parents=True, exist_ok=True)
            elif not dst.exists() and not dst.is_symlink():
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.rename(src, dst)
        shutil.rmtree(top)
        top.symlink_to(f"usr/{name}")


def _dpkg_status(debs: list[Path], root: Path) -> None:
    """``/var/lib/dpkg/status`` for what was unpacked (image scanners read it)."""
    entries = []
    for deb in debs:
        fields = _cmd(["dpkg-deb", "-f", str(deb)]).stdout.rstrip("\n").splitlines()
        fields.insert(1, "Status: install ok installed")
        entries.append("\n".join(fields))
    status = root / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("\n\n".join(entries) + "\n")


def _assemble_rootfs(debs: list[Path], root: Path, say: Say) -> None:
    with Progress("", write=say).step(f"dpkg -x {len(debs)} packages into the base root",
                                      watch=root) as st:  # fmt: skip
        dpkg_extract(debs, root, progress=st)
    _merge_usr(root)
    _dpkg_status(debs, root)
    for name in ("passwd", "group"):
        shutil.copy(root / f"usr/share/base-passwd/{name}.master", root / "etc" / name)
    certs = sorted((root / "usr/share/ca-certificates").rglob("*.crt"))
    bundle = root / "etc/ssl/certs/ca-certificates.crt"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_text("".join(c.read_text() for c in certs))
    # PEP 668: python:3.11-slim has no marker; pip installs into the image's interpreter.
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    (root / "usr/local/lib/python3.11/dist-packages").mkdir(parents=True, exist_ok=True)
    for d, mode in (("tmp", 0o1777), ("var/tmp", 0o1777), ("root", 0o700)):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d).chmod(mode)
    for d in ("proc", "sys", "dev", "run", "etc/ssl/private"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for rel in TRIM:
        shutil.rmtree(root / rel, ignore_errors=True)
    for doc in (root / "usr/share/doc").rglob("*"):
        if doc.is_file() and doc.name != "copyright":
            doc.unlink()
    what = "byte-compiling the standard library (in the base root, by its own python)"
    with Progress("", write=say).step(what) as st:
        _cmd(
            ["chroot", str(root), "/usr/bin/python3.11", "-m", "compileall", "-q",
             "/usr/lib/python3.11", "/usr/lib/python3/dist-packages"],
            env={"PATH": BASE_ENV["PATH"], "LANG": "C.UTF-8"},
            timeout=900, progress=st,
        )  # fmt: skip


def run_in(cache: Path, image: str, argv: list[str], timeout: float = 300) -> str:
    """``argv`` run in a container of ``image`` (a ref in the builder's storage, or
    ``docker-archive:PATH``) with chroot isolation, no network; its output."""
    bh = Buildah(cache)
    pull = ["--signature-policy", str(bh.policy)] if ":" in image.split("/")[0] else []
    args = ["from", "--quiet", *(pull or ["--pull=never"]), image]
    ctr = bh(*args, timeout=timeout).strip().splitlines()[-1]
    try:
        return bh("run", "--network", "none", ctr, "--", *argv, timeout=timeout)
    finally:
        with contextlib.suppress(ImagesError):
            bh("rm", ctr)


def _base(cache: Path, bh: Buildah, say: Say) -> str:
    """Have ``python:3.11-slim`` (this recipe's) in the builder's storage; its key."""
    key = base_key()
    if bh.image_label(BASE_REF) == key:
        return key
    archive = archive_path(cache, "base", key)
    if archive.exists():
        say(f"base {BASE_REF} from {archive}")
        bh("pull", "--signature-policy", str(bh.policy), f"docker-archive:{archive}")
        bh("tag", _archive_image_id(archive), BASE_REF)
        return key
    t0 = time.monotonic()
    debs = _download(cache, BASE_PACKAGES, cache / "debs" / "base", say)
    work = Path(tempfile.mkdtemp(prefix="base-", dir=cache / "tmp"))
    try:
        root = work / "root"
        _assemble_rootfs(debs, root, say)
        ctr = bh("from", "--pull=never", "scratch").strip()
        try:
            mnt = Path(bh("mount", ctr).strip())
            _cmd(["cp", "-a", f"{root}/.", f"{mnt}/"], timeout=900)
            bh("umount", ctr)
            cfg = ["config", "--cmd", json.dumps(BASE_CMD), "--label", f"{LABEL}={key}"]
            for k, v in BASE_ENV.items():
                cfg += ["--env", f"{k}={v}"]
            bh(*cfg, "--os", "linux", "--arch", "amd64", ctr)
            bh("commit", "--format", "docker", ctr, BASE_REF, timeout=900)
        finally:
            with contextlib.suppress(ImagesError):
                bh("rm", ctr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _write(bh, BASE_REF, archive, key, time.monotonic() - t0)
    say(f"base {BASE_REF} assembled in {time.monotonic() - t0:.0f}s")
    return key


def manifest(tar: tarfile.TarFile) -> dict[str, Any]:
    """The (only) entry of a docker-archive's ``manifest.json``."""
    member = tar.extractfile("manifest.json")
    if member is None:
        raise ImagesError(f"{tar.name}: no manifest.json")
    entries: list[dict[str, Any]] = json.load(member)
    if len(entries) != 1:
        raise ImagesError(f"{tar.name}: {len(entries)} images, expected one")
    return entries[0]


def _archive_image_id(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        config: str = manifest(tar)["Config"]
    return config.removesuffix(".json").removeprefix("sha256:")


# -- the images ---------------------------------------------------------------------------


def archive_sizes(archive: Path) -> dict[str, int]:
    """``archive`` bytes, its gzip-compressed size and the unpacked layer bytes."""
    compressed = 0

    class Count:
        def write(self, b: bytes) -> int:
            nonlocal compressed
            compressed += len(b)
            return len(b)

    with (
        open(archive, "rb") as src,
        gzip.GzipFile(fileobj=Count(), mode="wb", compresslevel=6) as gz,
    ):  # type: ignore[arg-type]
        shutil.copyfileobj(src, gz, 1 << 20)
    unpacked = 0
    with tarfile.open(archive) as tar:
        for layer_name in manifest(tar)["Layers"]:
            with tarfile.open(fileobj=tar.extractfile(layer_name)) as layer:
                unpacked += sum(x.size for x in layer.getmembers() if x.isfile())
    return {"archive": archive.stat().st_size, "gzip": compressed, "unpacked": unpacked}


def _write(bh: Buildah, ref: str, archive: Path, key: str, seconds: float) -> None:
    bh.push_archive(ref, archive)
    meta = {"ref": ref, "key": key, "build_seconds": round(seconds, 1), **archive_sizes(archive)}
    archive.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    name = archive.name.rsplit("-", 1)[0]
    for old in archive.parent.glob(f"{name}-*"):
        if old.stem != archive.stem:
            old.unlink()


def _trust_store() -> list[str]:
    """The host's CA bundle over the image's for the RUN steps (a TLS-inspecting proxy's
    CA reaches pip); a build-time mount, not part of the image."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    return ["--volume", f"{bundle}:{bundle}:ro"] if bundle.is_file() else []


def _build(cache: Path, bh: Buildah, image: Image, key: str, say: Say) -> Path:
    t0 = time.monotonic()
    what = f"buildah bud -f {image.dockerfile.relative_to(ROOT)} -t {image.ref}"
    with Progress("", write=say).step(what, watch=bh.storage) as st:
        bh(
            "bud", "--network", "host", "--pull=never", "--layers=false", "--format", "docker",
            "--signature-policy", str(bh.policy), "--label", f"{LABEL}={key}",
            *_trust_store(), "--ignorefile", str(image.ignorefile), "-f", str(image.dockerfile),
            "-t", image.ref, str(ROOT),
            timeout=1800, progress=st,
        )  # fmt: skip
    archive = archive_path(cache, image.name, key)
    _write(bh, image.ref, archive, key, time.monotonic() - t0)
    say(f"{image.ref}: built in {time.monotonic() - t0:.0f}s -> {archive}")
    return archive


def build_images(cache: Path | None = None, say: Say = print) -> dict[str, Path]:
    """``{"plugin": archive, "sst-helper": archive}``: docker-archives of both images.

    Built only when the cache has no archive for the current inputs. Raises
    :class:`ImagesError` when they cannot be built here (not root, no Debian
    tools, no network on a cold cache, a failing build step).
    """
    cache = (Path(cache) if cache else cache_dir()).expanduser().resolve()
    keys = {image.name: image_key(image) for image in IMAGES}
    wanted = {image.name: archive_path(cache, image.name, keys[image.name]) for image in IMAGES}
    if all(p.exists() for p in wanted.values()):
        Progress("", write=say).cached(", ".join(str(p) for p in wanted.values()))
        return wanted
    if os.geteuid() != 0:
        raise ImagesError(f"building the images needs root (uid {os.geteuid()})")
    for tool in ("apt-get", "dpkg", "dpkg-deb", "chroot", "cp"):
        if shutil.which(tool) is None:
            raise ImagesError(f"{tool} not found (a Debian machine is needed to build)")
    with cache_lock(cache):
        bh = Buildah(cache)
        bh.setup(say)
        base_built = False
        for image in IMAGES:
            if wanted[image.name].exists():
                continue
            if not base_built:
                _base(cache, bh, say)
                base_built = True
            _build(cache, bh, image, keys[image.name], say)
        with contextlib.suppress(ImagesError):
            bh("rmi", "--prune")
    return wanted


def main() -> int:
    t0 = time.monotonic()
    try:
        out = build_images()
    except ImagesError as e:
        print(f"images: {e}", file=sys.stderr)
        return 1
    for name, path in out.items():
        meta = read_meta(path)
        print(
            f"{name}: {meta['ref']} {path} (gzip {meta['gzip']} B, unpacked {meta['unpacked']} B)"
        )
    print(f"images ready in {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
