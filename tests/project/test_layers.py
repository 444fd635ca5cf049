"""The layer order of the packages: imports only go down. A module may import its own package and
anything on a lower layer, never a higher one (read from the source with ast, nothing is imported)."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/project/ -> the project

# Top to bottom. Packages on one line are one layer and must not import each other.
LAYERS = [
    ["gateway"],
    ["app"],
    ["portal"],
    ["handlers"],
    ["services"],
    ["billing"],
    ["streams"],
    ["alerts"],
    ["accounting"],
    ["payments"],
    ["webhooks"],
    ["social"],
    ["storage"],
    ["security"],
    ["runtime"],
    ["config"],
    ["metering"],
]
RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}
OWN = set(RANK) | {"sandbox", "bench", "tests", "gateway_testing"}


def project_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return [(line, name) for line, name in found if name in OWN]


def modules() -> list[pathlib.Path]:
    files = [ROOT / "gateway.py"]
    for package in RANK:
        files += sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else []
    return files


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_only_go_down(path):
    own = path.stem if path.parent == ROOT else path.relative_to(ROOT).parts[0]  # an area's folder: its package
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for line, name in project_imports(path)
        if name != own and (name not in RANK or RANK[name] <= RANK[own])
    ]
    # The sandbox stands in for the provider: only composition (app/) may start it.
    wrong = [w for w in wrong if not (own == "app" and w.endswith("imports sandbox"))]
    assert not wrong, "imports that run back up (or sideways) the layers:\n" + "\n".join(wrong)


def test_the_layer_check_sees_a_wrong_import(tmp_path):
    bad = tmp_path / "storage_bad.py"
    bad.write_text("from handlers.base import BaseHandler\nimport metering.ledger\n")
    assert [name for _, name in project_imports(bad)] == ["handlers", "metering"]


def test_every_package_is_placed():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages - OWN == set(), "a new package needs its place in LAYERS"


def code_map() -> str:
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    return architecture.split("## Code map", 1)[1].split("\n## ", 1)[0]


def test_the_readme_code_map_names_every_layer_and_only_files_that_exist():
    text = code_map()
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            folders, what = line.split("|")[1:3]
            for folder in re.findall(r"`([^`]+)`", folders):
                rows[folder.rstrip("/").removesuffix(".py")] = what
    assert set(RANK) <= set(rows), "a layer without its line in the code map (docs/architecture.md)"
    named = []
    for folder, what in rows.items():
        named += [f"{folder}/{name}" for name in re.findall(r"`([\w/]+\.py)`", what) if "/" not in name]
        named += [f"{folder}/{name}.py" for name in re.findall(r"`([a-z_]+)`", what) if (ROOT / folder).is_dir()]
    # Paths the data call's walk-through names, and its functions in the files it names.
    named += re.findall(r"`(\w+/[\w/]+\.py)`", text)
    missing = [path for path in named if not (ROOT / path).exists()]
    assert not missing, f"the code map (docs/architecture.md) names files that do not exist: {missing}"
    for cls, method in re.findall(r"`([A-Z]\w+)\.(\w+)`", text):
        source = "\n".join(p.read_text() for p in ROOT.glob("*/*.py") if f"class {cls}" in p.read_text())
        assert re.search(rf"def {method}\b", source), f"{cls}.{method}"
