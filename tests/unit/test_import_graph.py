"""No import circles anywhere in the production packages, at module level: import-linter's
contracts (pyproject.toml, run by scripts/test) check layers and sibling packages; this
checks every single import, function-local and type-checking ones included."""

from __future__ import annotations

import grimp

PACKAGES = ("broker", "backends", "policies")


def import_circles() -> list[tuple[str, ...]]:
    graph = grimp.build_graph(*PACKAGES)
    circles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                circles.append((module, *back))
    return circles


def test_no_module_imports_itself_through_others() -> None:
    assert import_circles() == []
