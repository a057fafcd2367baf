"""The lock (requirements/*.txt) is what a fresh machine installs: it must be compiled from
pyproject's extras as they are now, pin exact versions, leave torch's build to
quickstart.py, and give the lab the versions the tests ran with; and everything the tests
import is declared in pyproject, not left to arrive through another package."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from tests.support.extras import EXTRA_MODULES
from tests.support.quickstart import quickstart

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)( ; .+)?$")


QS = quickstart()


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(name: str) -> dict[str, str]:
    """{package: version} of requirements/<name>.txt; every line a comment or an exact pin."""
    found = {}
    for line in (ROOT / "requirements" / f"{name}.txt").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = PIN.match(line)
        assert m, f"requirements/{name}.txt: not an exact pin: {line!r}"
        found[norm(m[1])] = m[2]
    return found


@pytest.mark.parametrize("name", sorted(QS.INSTALL_SETS))
def test_each_lock_was_compiled_from_pyproject_s_extras_as_they_are_now(name: str) -> None:
    assert QS.lock_problem(name) is None


@pytest.mark.parametrize("name", sorted(QS.INSTALL_SETS))
def test_the_lock_pins_exact_versions_and_leaves_torch_and_cuda_to_quickstart(name: str) -> None:
    pinned = pins(name)
    assert len(pinned) > 10
    builds = [p for p in pinned if p in ("torch", "triton") or p.startswith(("cuda-", "nvidia-c"))]
    assert builds == [], f"a machine-specific build is pinned: {builds}"


def test_the_lab_installs_the_versions_the_tests_ran_with() -> None:
    test, lab = pins("test"), pins("lab")
    differ = {p: (v, test.get(p)) for p, v in lab.items() if test.get(p) != v}
    assert differ == {}


def declared() -> set[str]:
    reqs = PYPROJECT["dependencies"] + [
        r for extra in PYPROJECT["optional-dependencies"].values() for r in extra
    ]
    return {norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in reqs}


def imported_by_tests() -> dict[str, set[str]]:
    """{top-level module: test files} for every third-party import under tests/."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("crashdrill", "tests"):
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_library_the_tests_import_is_declared_in_pyproject() -> None:
    dists, names = packages_distributions(), declared()
    of_an_extra = {m.split(".")[0] for modules in EXTRA_MODULES.values() for m in modules}
    undeclared = {}
    for module, files in imported_by_tests().items():
        owners = dists.get(module)
        if not owners or module in of_an_extra:  # not installed here, or the extra's own
            continue
        if not any(norm(d) in names for d in owners):
            undeclared[module] = sorted(files)
    assert undeclared == {}, "add these to pyproject's test extra (or the extra they need)"


def test_every_extra_the_skip_rule_knows_is_an_extra_of_pyproject() -> None:
    assert set(EXTRA_MODULES) <= set(PYPROJECT["optional-dependencies"])
