"""Where a :class:`~containerd_env.ContainerdEnv` keeps its files, and its ``config.toml``.

The config is the one of the binary found (``containerd --version``): version 2 with
the 1.x plugin ids for 1.x, version 3 with the split CRI plugins for 2.x.  The daemon
keeps root/state/sockets under ``work_dir``; runc's state is moved under ``work_dir``
too (runc option ``Root``).

Its neighbours (the environment's other modules): see :mod:`containerd_env`.
"""

from __future__ import annotations

import re
from pathlib import Path

from containerd_packages import DEFAULT_CACHE, PAUSE_IMAGE, EnvError, _binaries, _run, runtime_info

#: goresctrl's block I/O classes for containerd (``blockio_config_file``): one class, a
#: weight for every device (no device list: nothing of this machine's is named)
BLOCKIO_CLASSES = """\
Classes:
  slowreader:
  - Weight: 80
"""


class ContainerdConfig:
    """The work dir's layout (sockets, NRI paths, logs) and the config of the binary found.

    :class:`~containerd_env.ContainerdEnv` adds the daemon's lifecycle.
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
    def blockio_config_path(self) -> Path:
        """containerd's ``blockio_config_file``, the classes of :data:`BLOCKIO_CLASSES`."""
        return self.work_dir / "blockio.yaml"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

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

    def write_config(self) -> None:
        """``config.toml`` and the files it names (the block I/O classes)."""
        self.blockio_config_path.write_text(BLOCKIO_CLASSES)
        self.config_path.write_text(self.config_toml())

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

  [plugins."io.containerd.service.v1.tasks-service"]
    blockio_config_file = "{self.blockio_config_path}"

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
