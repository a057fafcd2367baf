"""Executors by name: what `crashdrill serve --executor NAME` may choose.

    kind = executor_kind("ray")          # ExecutorKind, or ExecutorConfigError naming the allowed
    executor = create_executor(settings)  # the one settings.executor names, ready to start runs
    KINDS                                 # {"local": …, "ray": …}: what --executor takes

Each executor is one module with a class that implements workers/executor.py's Executor
and a `from_settings(settings) -> Executor` that reads the options it needs (a Protocol
of its own) and raises ExecutorConfigError naming what cannot work. Its module is
imported only when it is chosen: the default lab needs none of Ray. Adding one (say
Kubernetes Jobs): write workers/NAME_executor.py (k8s_executor.py), add its ExecutorKind
to KINDS below, its options to server/settings.py beside `ray_address`, and run the
conformance suite (tests/integration/test_executor_conformance.py) against it. docs/cluster.md
"Writing an executor" says the same at more length.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from crashdrill.workers.executor import Executor


class ExecutorConfigError(ValueError):
    """The executor settings cannot work; the message names the setting and what is allowed."""


@dataclass(frozen=True)
class ExecutorKind:
    name: str
    factory: str  # "module:function" taking the settings, imported only when chosen
    about: str  # one line for --help and the docs
    extra: str | None = None  # the pip extra (pyproject) its module needs
    # Runs train on the nodes of a cluster, not on this machine. So a node and its disk can
    # vanish (checkpoints must reach a mirror every node reaches); runs wait for a node
    # with their resources (no run limit from this machine's cores); presets read their
    # cluster text (trainer/presets.py `for_lab`).
    cluster: bool = False


KINDS: dict[str, ExecutorKind] = {
    k.name: k
    for k in (
        ExecutorKind(
            "local",
            "crashdrill.workers.local_executor:from_settings",
            "subprocesses on this machine (the default)",
        ),
        ExecutorKind(
            "ray",
            "crashdrill.workers.ray_executor:from_settings",
            "each run on a node of a Ray cluster (--ray-address; needs --mirror)",
            extra="ray",
            cluster=True,
        ),
    )
}


def executor_kind(name: str) -> ExecutorKind:
    kind = KINDS.get(name)
    if kind is None:
        raise ExecutorConfigError(f"executor = {name!r}: one of {', '.join(KINDS)}")
    return kind


class ExecutorSettings(Protocol):
    """What the registry reads; each executor's `from_settings` reads its own options."""

    @property
    def executor(self) -> str: ...


def create_executor(settings: ExecutorSettings) -> Executor:
    """The executor `settings.executor` names; raises ExecutorConfigError naming what
    cannot work (not installed, unreachable, an option missing)."""
    kind = executor_kind(settings.executor)
    module_name, _, function = kind.factory.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        how = f"; install it with .venv/bin/pip install -e '.[{kind.extra}]'" if kind.extra else ""
        raise ExecutorConfigError(
            f"executor = {kind.name!r}: {kind.extra or module_name} is not installed ({e}){how}"
        ) from None
    factory: Callable[[Any], Executor] = getattr(module, function)
    return factory(settings)
