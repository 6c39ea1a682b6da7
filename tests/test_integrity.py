"""Integrity holes closed: code a digest cannot see is refused at load, lineage must agree with the
card it describes, stamps and harvests killed half-way are finished (never lost or doubled), a failed
write is routed to a human and fails the run, and the Store never blocks on a FIFO or writes through
a hard link.

Each test names the attack it repeats; every one of them passed on the code before its fix."""

from __future__ import annotations

import json
import os
import sys
import unittest

import factory
from tests.support import LineTest


class CodeTheDigestCannotSee(LineTest):
    """A module that reaches for code by another road than an import its source names is refused when
    it is loaded, in one line naming the module, the line and the construct."""

    def append_to_triager(self, source: str) -> int:
        """Append source to agents/triager.py; the line number its first line lands on."""
        path = self.root / "agents" / "triager.py"
        text = path.read_text()
        path.write_text(text + source)
        return text.count("\n") + 1

    def test_the_importlib_attack_is_refused_before_it_can_be_proved(self):
        # the attack: a certified module loads agents/style.py by name, so style.py escapes the digest
        (self.root / "agents" / "style.py").write_text("def polish(result):\n    return result\n")
        line = self.append_to_triager("import importlib as _importlib\n_own_rules = rules\n"
                                      "def rules(ticket):\n"
                                      "    return _importlib.import_module('agents.style').polish(_own_rules(ticket))\n")
        for argv in (("prove", "triager", "--sealed"), ("digest", "triager")):
            with self.subTest(argv=argv):
                err = self.refused_writing_nothing(f"agents/triager.py line {line}: import importlib", *argv)
                self.assertIn("the digest does not cover", err)

    def test_each_construct_on_the_list_is_named_with_its_line(self):
        table = [
            ("import importlib.util", "import importlib"),
            ("from importlib import import_module", "from importlib import"),
            ("import runpy", "import runpy"),
            ("import imp", "import imp"),
            ("import pkgutil", "import pkgutil"),
            ("import zipimport", "import zipimport"),
            ("import marshal", "import marshal"),
            ("import pickle", "import pickle"),
            ("import code", "import code"),
            ("import builtins", "import builtins"),
            ("import ctypes", "import ctypes"),
            ("_m = __import__('agents.style')", "__import__"),
            ("exec('x = 1')", "exec"),
            ("_f = eval", "eval"),
            ("_c = compile('1', 'x', 'eval')", "compile"),
            ("import sys\n_m = sys.modules['agents']", "sys.modules"),
            ("import sys as _s\n_s.path.insert(0, 'agents')", "sys.path"),
            ("from sys import meta_path", "from sys import meta_path"),
            ("_b = __builtins__", "__builtins__"),
            ("_k = ().__class__.__base__.__subclasses__()", "__subclasses__"),
            ("_g = rules.__globals__", "__globals__"),
            ("_source = open('agents/style.py').read()", "'agents/style.py'"),
        ]
        original = (self.root / "agents" / "triager.py").read_text()
        for source, construct in table:
            with self.subTest(source=source):
                (self.root / "agents" / "triager.py").write_text(original)
                line = self.append_to_triager(source + "\n") + source.count("\n")
                self.refused(f"agents/triager.py line {line}: {construct}", "digest", "triager")

    def test_ordinary_code_still_loads(self):
        self.append_to_triager("import sys\nimport os.path\nfrom pathlib import Path\n_here = os.path.basename(sys.argv[0])\n"
                               "_name = rules.__name__\n_doc = 'see evals/triager.py.md'\n")
        code, out, err = self.factory("digest", "triager")
        self.assertEqual(code, 0, err)

    def test_a_module_inside_the_root_is_not_imported_by_plain_name(self):
        # `import helpers` finds ROOT/helpers.py whenever the root is on Python's path (it is, when it holds
        # factory.py): code the digest does not cover
        (self.root / "helpers.py").write_text("VALUE = 1\n")
        self.append_to_triager("import helpers\n")
        sys.path.insert(0, str(self.root))
        self.addCleanup(sys.path.remove, str(self.root))
        err = self.refused("agents/triager.py", "digest", "triager")
        self.assertIn("helpers.py, inside the factory root", err)
        self.assertNotIn("helpers", sys.modules)

class NearMissesReadNoCode(LineTest):
    """`did you mean` is computed from the tool modules' file names and their literal CONTRACTS keys, read
    as text: a module the card does not name is never executed to suggest a near miss."""

    def test_a_planted_tool_module_does_not_run_to_suggest_a_near_miss(self):
        ran = self.tmp / "zz-ran"
        (self.root / "agents" / "tools" / "zz.py").write_text(
            f"from pathlib import Path\nPath({str(ran)!r}).write_text('ran')\n"
            "CONTRACTS = {'zz:zap': {'name': 'zz:zap'}}\n")
        self.edit_card("triager", tools_denied=["Billing:Refund"])
        self.refused("field 'tools_denied': no contract for 'Billing:Refund' (did you mean 'billing:refund'?)",
                     "digest", "triager")
        self.assertFalse(ran.exists(), "agents/tools/zz.py ran, and no card names it")
        self.edit_card("triager", tools_denied=["zzz:zap"])
        self.refused("no contract for 'zzz:zap' (did you mean 'zz:zap'?)", "digest", "triager")
        self.assertFalse(ran.exists(), "agents/tools/zz.py ran, and no card names it")

    def test_a_family_with_no_literal_contracts_is_suggested_by_its_file_name(self):
        (self.root / "agents" / "tools" / "search.py").write_text(
            "CONTRACTS = {name: {'name': name} for name in ('search:web',)}\n")
        self.edit_card("triager", tools_denied=["serch:web"])
        self.refused("no contract for 'serch:web' (did you mean a tool of agents/tools/search.py?)", "digest", "triager")


if __name__ == "__main__":
    unittest.main()
