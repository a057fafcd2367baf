"""The README and docs/ against the code: what a newcomer copies from them must work.

docs/server.md's routes and settings are checked in test_server_routes.py, and
docs/verify.md's options and report fields in test_drill_cli.py and test_drill_report.py;
this file checks the README, the links between pages, and the pages that took over the
README's preset format (presets.md), production parts (production.md) and benchmarks
(benchmarks.md).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from crashdrill.doctor import PARTS
from crashdrill.trainer.presets import PresetError, parse_preset_text
from tests.support.quickstart import quickstart

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
SOURCE_DIRS = ("crashdrill", "trainer", "drill", "workers", "server", "scripts")
CODE_DIRS = (*SOURCE_DIRS, "web", "tests", "benchmarks")


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def fenced_blocks(page: str, lang: str = "") -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page, flags=re.M | re.S)


def anchors(page: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but '-' and '_' dropped, spaces '-'."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_the_readme_opens_with_the_two_quick_start_commands() -> None:
    first = fenced_blocks(text(README))[0]
    assert first == (
        "python3 quickstart.py lab     # set up ./.venv, then the lab at http://127.0.0.1:8000\n"
        "python3 quickstart.py test    # set up ./.venv with test tools, then the whole test"
        " suite\n"
    )
    assert text(README).index("```") < text(README).index("\n## ")  # before any section


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(text(dest)):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: {broken}"


# What counts as a path of the repo: a top-level folder of it, then at least one more part,
# ending in a file name with one of these extensions — whether backticked, linked or plain,
# but not the tail of a longer path (python/ray/cluster_utils.py, a URL). A placeholder is
# written in capitals (server/storage/migrations/NNNN_name.sql, workers/NAME_executor.py) or with
# a glob (tests/unit/test_*.py) and is not a path.
TOP_DIRS = sorted(
    p.name
    for p in ROOT.iterdir()
    if p.is_dir() and not p.name.startswith(".") and p.name != "node_modules"
)
PATH_EXTENSIONS = "py|js|mjs|md|toml|sql|html|css|json|ya?ml|txt|sh|cfg|lock"
NAMED_PATH = re.compile(
    rf"(?<![\w./-])(?:{'|'.join(TOP_DIRS)})/[\w./-]*\w\.(?:{PATH_EXTENSIONS})(?![\w/])"
)
PLACEHOLDER = re.compile(r"[A-Z*]")


def named_paths(words: str) -> set[str]:
    """The repo paths `words` names (see NAMED_PATH), placeholders left out."""
    return {p for p in NAMED_PATH.findall(words) if not PLACEHOLDER.search(p)}


def docstrings(path: Path) -> str:
    """Every docstring of a Python file (its module's, its classes' and functions')."""
    tree = ast.parse(text(path))
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = (ast.get_docstring(n, clean=False) for n in ast.walk(tree) if isinstance(n, kinds))
    return "\n".join(d for d in found if d)


def python_files() -> list[Path]:
    files = [ROOT / "quickstart.py"]
    for top in TOP_DIRS:
        files += [f for f in sorted((ROOT / top).rglob("*.py")) if "vendor" not in f.parts]
    return files


def test_a_path_is_a_top_level_folder_s_file_and_not_a_placeholder_or_another_repo_s() -> None:
    words = (
        "see `server/door/front_door.py`, [x](docs/server.md#the-front-door) and trainer/loop.py;"
        " not python/ray/cluster_utils.py, https://example.org/docs/x.md, the folder"
        " web/static/, server/storage/migrations/NNNN_name.sql, tests/unit/test_*.py, loop.py"
    )
    assert named_paths(words) == {"server/door/front_door.py", "docs/server.md", "trainer/loop.py"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_of_the_repo_a_page_names_exists(page: Path) -> None:
    """A module that moved (the old runs module of server/, split by job) leaves no stale
    path behind."""
    missing = sorted(p for p in named_paths(text(page)) if not (ROOT / p).exists())
    assert not missing, f"{page.name} names files that do not exist: {missing}"


def test_every_file_of_the_repo_a_docstring_names_exists() -> None:
    """Docstrings name the modules they work with: one that moved (the fork server, from
    workers/ to crashdrill/processes/) is named where it is now."""
    missing = sorted(
        f"{path.relative_to(ROOT)}: {p}"
        for path in python_files()
        for p in named_paths(docstrings(path))
        if not (ROOT / p).exists()
    )
    assert not missing, f"docstrings name files that do not exist: {missing}"


def test_the_readme_links_every_page_in_docs() -> None:
    readme = text(README)
    missing = [p.name for p in DOCS.glob("*.md") if f"(docs/{p.name})" not in readme]
    assert not missing, f"pages in docs/ the README does not link: {missing}"


def test_the_preset_format_in_the_docs_is_a_preset_the_parser_accepts() -> None:
    (example,) = fenced_blocks(text(DOCS / "presets.md"), "toml")
    preset = parse_preset_text(example, "docs/presets.md")
    assert preset.id == "lesson-1.10" and preset.crash.mode == "during_save"


def allowed_in(preset_text: str, table: str) -> list[str]:
    """The keys the parser lists as allowed for `table`, from its error for a wrong one."""
    with pytest.raises(PresetError) as e:
        parse_preset_text(preset_text)
    found = re.search(rf"{re.escape(table)}unknown key 'zz'; allowed: ([^;]+)", str(e.value))
    assert found, str(e.value)
    return [k.strip() for k in found.group(1).split(",")]


def test_every_key_the_preset_parser_allows_is_in_the_documented_format() -> None:
    example = fenced_blocks(text(DOCS / "presets.md"), "toml")[0]
    written = set(re.findall(r"^(\w+) =", example, flags=re.M))
    written |= set(re.findall(r"^\[(\w+)", example, flags=re.M))
    base = 'id = "x"\ntitle = "t"\n'
    keys = allowed_in(base + "zz = 1\n", "")
    keys += allowed_in(base + '[knob]\nname = "seed"\na = 1\nb = 2\nzz = 1\n', "[knob] ")
    keys += allowed_in(base + "[crash]\nzz = 1\n", "[crash] ")
    assert not [k for k in keys if k not in written], f"undocumented preset keys: {keys}"


def test_every_crash_mode_the_parser_allows_is_documented() -> None:
    with pytest.raises(PresetError) as e:
        parse_preset_text('id = "x"\ntitle = "t"\n[crash]\nmode = "zz"\n')
    modes = re.findall(r"'(\w+)'", str(e.value).split("one of", 1)[1])
    page = text(DOCS / "presets.md")
    assert modes and all(f"`{m}`" in page for m in modes)
    assert all(f"`{m}`" in text(README) for m in modes)


def test_every_doctor_part_has_its_command_in_the_production_page() -> None:
    page = text(DOCS / "production.md")
    missing = [part for part in PARTS if f"crashdrill doctor {part}" not in page]
    assert not missing, f"doctor parts missing from docs/production.md: {missing}"


def test_every_extra_the_docs_install_exists_in_pyproject() -> None:
    extras = tomllib.loads(text(ROOT / "pyproject.toml"))["project"]["optional-dependencies"]
    named = {
        (page.name, extra)
        for page in PAGES
        for extra in re.findall(r"(?:crashdrill|-e '\.)\[([a-z]\w*)\]", text(page))
    }
    assert named, "no extra is named anywhere"
    unknown = sorted((page, extra) for page, extra in named if extra not in extras)
    assert not unknown, f"extras the docs name but pyproject.toml lacks: {unknown}"


def test_the_supabase_extra_installs_supabase_s_python_client() -> None:
    extras = tomllib.loads(text(ROOT / "pyproject.toml"))["project"]["optional-dependencies"]
    assert any(re.match(r"supabase\b", dep) for dep in extras["supabase"])
    assert "supabase" in quickstart().INSTALL_SETS["test"]  # the tests install it


def test_every_environment_variable_the_docs_name_is_read_by_the_code() -> None:
    source = "\n".join(text(f) for d in SOURCE_DIRS for f in (ROOT / d).rglob("*.py"))
    source += text(ROOT / "quickstart.py")
    # docker/: the compose files, test.sh and the images' scripts read variables too
    source += "\n".join(text(f) for f in sorted((ROOT / "docker").glob("*.*")))
    unknown = sorted(
        {
            (page.name, name)
            for page in PAGES
            for name in re.findall(r"\b((?:CRASHDRILL|SUPABASE)_[A-Z0-9_]+)", text(page))
            if name not in source
        }
    )
    assert not unknown, f"variables the docs name but no code reads: {unknown}"


def benchmark_scripts() -> list[str]:
    """The scripts in benchmarks/ (not the helpers they import)."""
    scripts = (ROOT / "benchmarks").glob("*.py")
    return sorted(f.name for f in scripts if '__name__ == "__main__"' in text(f))


def test_every_benchmark_script_is_on_the_benchmarks_page() -> None:
    page = text(DOCS / "benchmarks.md")
    assert benchmark_scripts()
    missing = [name for name in benchmark_scripts() if f"benchmarks/{name}" not in page]
    assert not missing, f"benchmarks missing from docs/benchmarks.md: {missing}"


def test_every_benchmark_command_on_the_benchmarks_page_names_a_script_that_exists() -> None:
    commands = "".join(fenced_blocks(text(DOCS / "benchmarks.md")))
    named = re.findall(r"^\.venv/bin/python benchmarks/(\w+\.py)", commands, flags=re.M)
    assert named and all((ROOT / "benchmarks" / name).is_file() for name in named)
