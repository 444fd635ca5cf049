"""The handlers of every area (each in its own folder) talk to services, not to stores (docs/architecture.md, code map):
none imports storage, reaches a store through the context, or reaches through the Meter or Payments to their parts;
and no module under handlers/ imports a store at all (their context, handlers/context.py, holds none). Read from the
source with ast, nothing is imported."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/project/ -> the project
AREAS = sorted(p.name for p in (ROOT / "handlers").iterdir() if (p / "__init__.py").is_file())
# Services whose parts a handler must not reach, wherever it finds them (`self.ctx.data.meter.buffer`,
# `self.services.payments.orders`): each offers what the handlers need as its own methods.
WRAPPED = ("meter", "payments.orders")


def store_fields() -> set[str]:
    """The fields of the process's whole composition (app/context.py's Context) whose type is a store (a class
    imported from storage/): names a handler must not reach through its context either."""
    tree = ast.parse((ROOT / "app" / "context.py").read_text())
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
            found += [f"{node.lineno}: {w}" for w in WRAPPED if f".{w}." in f".{'.'.join(chain)}."]
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
        "    self.ctx.data.meter.buffer.for_account('a')\n"
        "    await self.services.payments.orders.owned('a', 'b')\n"
        "    await self.services.payments.checkout('a', None, 1.0)\n"
        "    await self.services.keys.get(1, 2)\n"
        "    self.ctx.meter.account_view('a')\n"
    )
    assert reaches(bad, store_fields()) == [
        "1: imports storage.keys",
        "3: ctx.keys",
        "4: meter",
        "5: payments.orders",
        "8: meter",
    ]


@pytest.mark.parametrize(
    "path", sorted((ROOT / "handlers").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT / "handlers"))
)
def test_no_handler_imports_a_store(path):
    """Outside the area folders too (the base handler, the data call, the handlers' context): the stores are
    reached through services. The composition that holds them is app/context.py's."""
    hits = [hit for hit in reaches(path, set()) if "imports" in hit]
    assert not hits, f"{path.relative_to(ROOT)}: {hits}"
