"""The spec's operator commands (``spec/*.sh``, verbatim) run as the operator runs
them: through ``bash``, with Debian's ``kubectl`` and ``jq`` (``tests/_tools.py``)
against a :class:`stack.Stack`'s proxy. Stdlib only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from _tools import Tools  # noqa: E402

#: the k8s tier's own "required" switch (tests/_tier.py)
REQUIRED = "NRI_K8S_REQUIRED"
SPEC = Path(__file__).resolve().parent / "spec"


def command(name: str) -> str:
    """The spec's command block ``spec/NAME.sh``, as the spec prints it."""
    return (SPEC / f"{name}.sh").read_text()


def tsv(out: str) -> list[list[str]]:
    """The rows of ``jq -r '... | @tsv'`` output, header included."""
    return [line.split("\t") for line in out.splitlines()]


class Kubectl:
    """An operator's shell on one cluster: ``kubectl`` and ``jq`` on ``PATH``,
    ``KUBECONFIG`` set, a ``HOME`` of its own (kubectl's discovery cache)."""

    def __init__(self, tools: Tools, kubeconfig: Path, home: Path) -> None:
        self.tools = tools
        self.kubeconfig = kubeconfig
        self.home = home

    @classmethod
    def on(cls, st: Any, tools: Tools) -> Kubectl:
        """An operator's kubectl on the started :class:`stack.Stack` ``st``; its HOME
        in the stack's work dir (no discovery cached for another stack on the port)."""
        home = st.work_dir / "kubectl-home" if st.work_dir else None
        assert home is not None, "the stack is not started"
        home.mkdir(exist_ok=True)
        return cls(tools, st.kubeconfig, home)

    def attempt(self, script: str, *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``script`` run, not checked (``set -o pipefail``: see ``Tools.shell``)."""
        return self.tools.shell(script, kubeconfig=self.kubeconfig, home=self.home, cwd=cwd)

    def run(self, script: str, *, cwd: Path | None = None) -> str:
        """``script``'s stdout; AssertionError (with its stderr) when it fails."""
        proc = self.attempt(script, cwd=cwd)
        if proc.returncode != 0:
            raise AssertionError(
                f"exit {proc.returncode}: {script}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc.stdout

    def spec(self, name: str, *, cwd: Path | None = None) -> str:
        """The spec's command ``name`` (see :func:`command`), verbatim."""
        return self.run(command(name), cwd=cwd)
