"""The handlers of every area (each in its own folder) talk to services, not to stores (docs/architecture.md, code map):
none imports storage, reaches a store through the context, or reaches through the Meter or Payments to their parts.
Read from the source with ast, nothing is imported."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/project/ -> the project
AREAS = sorted(p.name for p in (ROOT / "handlers").iterdir() if (p / "__init__.py").is_file())
# Services whose parts a handler must not reach: each offers what the handlers need as its own methods.
WRAPPED = ("meter", "payments.orders")


def store_fields() -> set[str]:
    """The Context fields whose type is a store (a class imported from storage/)."""
    tree = ast.parse((ROOT / "handlers" / "context.py").read_text())
    stores = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("storage.")
        for alias in node.names
    }
    context = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Context")
    return {
        n.target.id
        for n in context.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.annotation, ast.Name) and n.annotation.id in stores
    }


def dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def reaches(path: pathlib.Path, stores: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "storage":
            found.append(f"{node.lineno}: imports {node.module}")
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "storage" for a in node.names):
            found.append(f"{node.lineno}: imports storage")
        elif isinstance(node, ast.Attribute):
            chain = dotted(node).split(".")
            after = chain[chain.index("ctx") + 1 :] if "ctx" in chain else []
            if after and after[0] in stores:
                found.append(f"{node.lineno}: ctx.{after[0]}")
            found += [f"{node.lineno}: ctx.{w}" for w in WRAPPED if after[: w.count(".") + 1] == w.split(".")]
    return sorted(set(found))


def test_the_context_has_stores_to_look_for():
    assert {"keys", "accounts", "usage", "admin", "audit", "stream_store", "webhook_store"} <= store_fields()
    assert {"keys", "account", "billing", "admin", "audit", "ops", "auth", "alerts", "streams", "members"} <= set(AREAS)


@pytest.mark.parametrize("area", AREAS)
def test_an_areas_handlers_call_services_not_stores(area):
    folder = ROOT / "handlers" / area
    assert folder.is_dir(), f"handlers/{area}/ holds the area"
    stores = store_fields()
    wrong = [f"{p.relative_to(ROOT)}:{hit}" for p in sorted(folder.glob("*.py")) for hit in reaches(p, stores)]
    assert not wrong, "handlers reaching past their services:\n" + "\n".join(wrong)


def test_the_check_sees_a_store_reached(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from storage.keys import PROPERTIES\n"
        "async def f(self):\n"
        "    await self.ctx.keys.get(1, 2)\n"
        "    self.ctx.meter.buffer.for_account('a')\n"
        "    await self.ctx.payments.orders.owned('a', 'b')\n"
        "    await self.ctx.payments.checkout('a', None, 1.0)\n"
    )
    assert reaches(bad, store_fields()) == [
        "1: imports storage.keys",
        "3: ctx.keys",
        "4: ctx.meter",
        "5: ctx.payments.orders",
    ]


@pytest.mark.parametrize("path", sorted((ROOT / "handlers").glob("*.py")), ids=lambda p: p.name)
def test_no_handler_imports_a_store(path):
    """Outside the area folders too (the base handler, the data call): the stores are reached through services.
    The context's type (handlers/context.py) names the stores it is built with, for the services and the
    background tasks: the one module allowed."""
    hits = [hit for hit in reaches(path, set()) if "imports" in hit]
    assert path.name == "context.py" or not hits, f"{path.relative_to(ROOT)}: {hits}"
