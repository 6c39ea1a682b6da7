"""One name, one meaning: no top-level name is defined in two of the product's modules, unless one module
re-exports the other's object (`NAME = other.NAME`, checked to be the same object once both are imported)."""

import ast
import importlib
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = ("factory", "broker", "llm", "sage")


def defined(tree: ast.Module) -> dict[str, tuple[int, str | None]]:
    """name -> (line, the module it re-exports from or None) of each name a module's top level binds by def,
    class or assignment (also inside a top-level if, try or with, which run as the module is imported). An
    assignment `NAME = other.NAME` re-exports other's; an import is not a definition."""
    found: dict[str, tuple[int, str | None]] = {}
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, (node.lineno, None))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            for name in (n for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)):
                copied = (isinstance(value, ast.Attribute) and value.attr == name.id and isinstance(value.value, ast.Name)
                          and not isinstance(node, ast.AugAssign))
                found.setdefault(name.id, (node.lineno, value.value.id if copied else None))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                        *(part for handler in getattr(node, "handlers", []) for part in handler.body)]
    return found


def collisions(sources: dict[str, str], objects: dict[str, object]) -> list[str]:
    """'NAME: module.py:line, ...' for each name that two modules define, and for each re-export that is not
    the object it names (sources: module name -> its text; objects: module name -> the module imported)."""
    where: dict[str, list[tuple[str, int]]] = {}
    found = []
    for module, text in sources.items():
        for name, (line, origin) in defined(ast.parse(text)).items():
            if origin is None:
                where.setdefault(name, []).append((module, line))
            elif origin not in objects or getattr(objects[module], name) is not getattr(objects[origin], name, None):
                found.append(f"{name}: {module}.py:{line} is not {origin}.{name}")
    found += [f"{name}: " + ", ".join(f"{module}.py:{line}" for module, line in places)
              for name, places in sorted(where.items()) if len(places) > 1]
    return found


class OneMeaning(unittest.TestCase):
    def test_no_top_level_name_is_defined_in_two_modules(self):
        sources = {module: (REPO / f"{module}.py").read_text(encoding="utf-8") for module in MODULES}
        objects = {module: importlib.import_module(module) for module in MODULES}
        self.assertEqual(collisions(sources, objects), [],
                         "a name defined in two modules means two things: rename one, or import the other's")

    def test_the_check_finds_a_collision_and_allows_a_re_export(self):
        class Module:   # a stand-in for an imported module
            pass
        a, b, c = Module(), Module(), Module()
        a.Thing, b.Thing, a.LIMIT, b.LIMIT = object(), 2, 1, 1
        c.Thing = a.Thing
        sources = {"a": "class Thing:\n    pass\nLIMIT = 1\n", "b": "if True:\n    Thing = 2\nLIMIT = 1\n",
                   "c": "import a\nThing = a.Thing\n"}
        self.assertEqual(collisions(sources, {"a": a, "b": b, "c": c}),
                         ["LIMIT: a.py:3, b.py:3", "Thing: a.py:1, b.py:2"], "equal values are still two definitions")
        self.assertEqual(collisions({"a": sources["a"], "c": sources["c"]}, {"a": a, "c": c}), [])
        c.Thing = object()
        self.assertEqual(collisions({"a": sources["a"], "c": sources["c"]}, {"a": a, "c": c}),
                         ["Thing: c.py:2 is not a.Thing"])
        self.assertEqual(collisions({"a": "def f(): pass\n", "b": "from a import f\n"}, {"a": a, "b": b}), [],
                         "an import is not a definition")

if __name__ == "__main__":
    unittest.main()
