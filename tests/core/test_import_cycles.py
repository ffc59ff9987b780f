"""No import cycle between the modules of llmgw and controllers: every arrow of the import graph
(grimp's, the one import-linter reads) runs one way, the imports made for type checking only counted."""
from __future__ import annotations

import grimp


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's circles: each set of modules that reach one another (Tarjan's strongly
    connected components of more than one module), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while (top := stack.pop()) != module:
                on_stack.discard(top)
                component.append(top)
            on_stack.discard(module)
            if component:
                found.append(sorted([module, *component]))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_of_llmgw_or_controllers_imports_one_that_imports_it_back():
    graph = grimp.build_graph("llmgw", "controllers", exclude_type_checking_imports=False, cache_dir=None)
    found = cycles(graph)
    circles = [[*(graph.find_shortest_chain(c[0], c[1]) or ()), *(graph.find_shortest_chain(c[1], c[0]) or ())[1:]]
               for c in found]
    assert not found, "import cycles (each through its first two modules):\n" + "\n".join(
        " -> ".join(circle) for circle in circles)
