"""The shape of the code: no import circle, modules a reader can hold, one package per paper."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import condor_sched
from condor_sched.modes import registry
from condor_sched.modes.planning import PolicyError

PACKAGE = Path(condor_sched.__file__).parent
MAX_MODULE_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Each module of condor_sched and the modules of condor_sched its code names in an import
    statement anywhere (module level, inside functions, under TYPE_CHECKING): ``import a.b`` and
    ``from a import b`` name a.b when it is a module, ``from a.b import c`` names a.b otherwise."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                named = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            graph[name].update(n for n in named if n in modules and n != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_anywhere_counting_imports_inside_functions():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle_through_a_function_level_import():
    graph = import_graph()
    graph["condor_sched.model"] = graph["condor_sched.model"] | {"condor_sched.cycle"}
    assert any("condor_sched.model" in c and "condor_sched.cycle" in c for c in circles(graph))


def test_every_module_is_under_600_lines():
    node_side = sorted((PACKAGE.parent / "node_hooks").rglob("*.py"))
    assert node_side  # the execute node's programs, root-run ones among them, are held to it too
    long = {str(p.relative_to(PACKAGE.parent)): n for p in [*_modules().values(), *node_side]
            if (n := len(p.read_text().splitlines())) >= MAX_MODULE_LINES}
    assert long == {}


@pytest.mark.parametrize("mode", registry.modes(), ids=lambda m: m.name)
def test_each_mode_is_one_package_that_names_its_paper(mode):
    package = PACKAGE / "modes" / mode.name
    assert (package / "__init__.py").exists()
    assert "paper" in (package / "__init__.py").read_text().split('"""')[1].lower()
    assert "paper" in mode.paper
    for planner in mode.planners.values():
        assert planner.__module__.startswith(f"condor_sched.modes.{mode.name}.")


def test_modes_use_each_other_only_through_the_registry():
    graph = import_graph()
    for name, imported in graph.items():
        if name.startswith("condor_sched.modes.") and name.count(".") >= 3:
            own = name.split(".")[2]
            others = {i for i in imported if i.startswith("condor_sched.modes.") and i.count(".") >= 3
                      and i.split(".")[2] != own}
            assert others == set(), name


def test_every_planner_has_one_name_in_one_mode():
    names = [n for m in registry.modes() for n in m.planners]
    assert len(names) == len(set(names))
    assert set(registry.policy_names()) | set(registry.gpu_policy_names(device_policies=False)) == set(names)
    for name in registry.policy_names():
        assert registry.get_policy(name).name == name
    for name in registry.gpu_policy_names():
        assert registry.gpu_policy(name).name == name
    with pytest.raises(PolicyError, match="unknown policy 'fgd'"):
        registry.get_policy("fgd")


def test_decide_cycle_reads_in_one_screen():
    import inspect

    from condor_sched.cycle import decide_cycle

    assert len(inspect.getsource(decide_cycle).splitlines()) <= 60
