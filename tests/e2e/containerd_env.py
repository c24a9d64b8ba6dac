#!/usr/bin/env python3
"""A private, throw-away containerd (1.7 or 2.1, with NRI enabled) for end-to-end tests.

Stdlib only.  Usable both as a module (``ContainerdEnv``) and as a tool::

    python tests/e2e/containerd_env.py fetch [--cache DIR] [--runtime containerd-2.1]
    python tests/e2e/containerd_env.py up    [--cache DIR] [--runtime ...] --work DIR
    python tests/e2e/containerd_env.py down  --work DIR

The runtimes (``containerd-1.7`` from Debian trixie, ``containerd-2.1`` from sid) and
their fetch are in :mod:`containerd_packages`; the config of each version in
:mod:`containerd_config`.  This module is the daemon's lifecycle: start, wait for CRI
(:func:`cri_version_probe`), import the two images, stop and clean up.

The daemon keeps root/state/sockets under ``work_dir``.  Runc's state is moved under
``work_dir`` too (runc option ``Root``).  A few things containerd puts outside
anyway (``/run/containerd/{s,fifo,runc}``, cgroups ``kubepods``/``k8s.io`` in every
hierarchy) are recorded before start and removed again by ``stop()``.

Needs root.  Machine facts this was made for (see the NRI reference note, part B):
root without CAP_SYS_RESOURCE (hence ``restrict_oom_score_adj = true``), no CNI
(pods must use the host network and must not set a hostname).

Neighbours: :mod:`containerd_packages` (the runtimes, the Debian fetch, the images),
:mod:`containerd_config` (the work dir and the config of the binary found),
:mod:`containerd_host` (what containerd leaves on the host, processes by PID).
"""

from __future__ import annotations

import argparse
import contextlib
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
import time
from pathlib import Path
from typing import Any

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from containerd_config import ContainerdConfig  # noqa: E402
from containerd_host import (  # noqa: E402
    CGROUP_NAMES,
    RUN_CONTAINERD,
    RUN_SUBDIRS,
    _cgroup_dirs,
    _cgroup_mounts,
    _cmdline,
    _kill,
    _mounts_under,
    _pid_alive,
    _run_entries,
    _umount,
    _wait_gone,
)
from containerd_packages import (  # noqa: E402
    DEFAULT_CACHE,
    DEFAULT_RUNTIME,
    K8S_NAMESPACE,
    RUNTIMES,
    EnvError,
    _binaries,
    _log,
    _run,
    fetch,
    runtime_cache,
)

STATE_FILE = "env-state.json"
#: the end of containerd's log line when the CRI plugin did not load (1.7 and 2.x)
CRI_LOAD_FAILED = re.compile(r'msg="failed to load plugin".* id=io\.containerd\.grpc\.v1\.cri ')


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


class ContainerdEnv(ContainerdConfig):
    """A containerd daemon (1.7 or 2.x) with NRI enabled, everything under ``work_dir``.

    >>> env = ContainerdEnv(cache_dir, work_dir); env.start()
    >>> env.cri_socket, env.nri_socket, env.log_path, env.log_text()
    >>> env.stop()
    """

    _proc: subprocess.Popen[bytes] | None = None
    _log_fh: io.BufferedWriter | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else self._state().get("pid")

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
        self.write_config()
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
