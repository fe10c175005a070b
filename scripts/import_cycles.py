#!/usr/bin/env python3
"""Print every import cycle between modules of gateway/ and protocols/; exit 1 if any.

    .venv/bin/python scripts/import_cycles.py [ROOT]     # ROOT: the tree (default: ours)

An import is an import wherever it is written: inside a function and under
``TYPE_CHECKING`` too (grimp's graph). A cycle is a strongly connected component of the
module graph with more than one module; each is printed as one line naming its modules.
The package-level rules (no cycle between sibling sub-packages, protocols/ never imports
gateway/, no I/O in the core) are import-linter contracts in pyproject.toml
(``lint-imports``).
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGES = ("gateway", "protocols")


def cycles(packages: tuple[str, ...] = PACKAGES) -> list[list[str]]:
    import grimp

    graph = grimp.build_graph(*packages)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        # iterative Tarjan: (module, iterator over what it imports)
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def main(argv: list[str]) -> int:
    root = Path(argv[1]).resolve() if len(argv) > 1 else Path(__file__).resolve().parents[1]
    if not all((root / p / "__init__.py").is_file() for p in PACKAGES):
        print(f"import_cycles: {root} has no gateway/ and protocols/ packages", file=sys.stderr)
        return 2
    sys.path.insert(0, str(root))
    found = cycles()
    for component in found:
        print("import cycle: " + " <-> ".join(component))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
