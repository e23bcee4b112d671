"""The ``runner_patch`` rule (pytest hooks, ``_pytest`` internals, outcomes rewritten,
unittest / builtins / sys.modules patched) and ``test_config_code`` (``collect_ignore``,
``pytest_plugins``): code that changes how the tests run rather than what they test. One rule
family of tamper.py, in its own file."""

from __future__ import annotations

import ast
import re
from pathlib import PurePosixPath

from tidal.integrity.ast_helpers import call_name, const_str, const_value, qualname
from tidal.integrity.context import Context
from tidal.integrity.tamper_equal import EQ_METHODS
from tidal.integrity.code_units import Unit


REPORT_HOOKS = {"pytest_runtest_makereport", "pytest_report_teststatus", "pytest_runtest_logreport",
                "pytest_collection_modifyitems", "pytest_pyfunc_call", "pytest_runtest_call", "pytest_runtest_protocol",
                "pytest_sessionfinish", "pytest_ignore_collect", "pytest_collect_file", "pytest_itemcollected",
                "pytest_deselected", "pytest_runtest_logfinish", "pytest_collection", "pytest_terminal_summary",
                "pytest_runtest_setup", "pytest_runtest_teardown", "pytest_runtestloop", "pytest_exception_interact",
                "pytest_assertrepr_compare", "pytest_assertion_pass", "pytest_collection_finish", "pytest_make_collect_report",
                "pytest_pycollect_makeitem", "pytest_unconfigure", "pytest_sessionstart", "pytest_load_initial_conftests",
                "pytest_cmdline_main", "pytest_cmdline_parse", "pytest_warning_recorded", "pytest_collectreport"}
PATCHED_ROOTS = ("unittest.", "pytest.", "_pytest.", "builtins.", "__builtins__", "doctest.", "nose.", "sys.excepthook",
                 "TestCase.", "TestResult.", "TextTestResult.", "TextTestRunner.", "TestProgram.", "TestLoader.",
                 "TestSuite.")
OUTCOME_ATTRS = {"outcome", "exitstatus", "longrepr", "testsfailed", "wasxfail", "passed", "failed", "shouldfail",
                 "shouldstop", "testscollected", "_excinfo", "failures", "errors", "skipped", "wasSuccessful"}
TESTCASE_METHODS = re.compile(r"^(assert\w*|fail\w*|run|__call__|debug|defaultTestResult|_callTestMethod|"
                              r"_callSetUp|addFailure|addError|wasSuccessful|doCleanups|countTestCases)$")
RUNNER_MODULES = {"pytest", "_pytest", "unittest", "builtins", "doctest"}


def runner_patch(unit: Unit, ctx: Context):
    """Monkeypatching the test runner: pytest hooks that rewrite reports or drop tests
    (pytest_runtest_makereport, pytest_collection_modifyitems ...), imports of _pytest
    internals, ``report.outcome = "passed"``, reassigning unittest.TestCase.assert* /
    TestResult methods / builtins / pytest functions (by assignment, setattr, monkeypatch or
    mock.patch), TestCase subclasses overriding run / assert*, stubbing modules in sys.modules,
    sys.excepthook / settrace."""
    for node in unit.nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in REPORT_HOOKS or (node.name.startswith("pytest_") and node.name not in
                                             ("pytest_addoption", "pytest_generate_tests", "pytest_configure")):
                if unit.node_touched(node):
                    plugin = PurePosixPath(unit.where).name == "conftest.py" or not unit.where or "plugin" in unit.where
                    yield unit.finding("runner_patch", "runner_patch.report_hook" if plugin else "runner_patch.hook_elsewhere",
                                       node.lineno, node.body[0].lineno if node.body else node.lineno)
            elif node.name == "pytest_configure" and unit.node_touched(node):
                text = ast.unparse(node)
                if not re.fullmatch(r"(?s)def pytest_configure\([^)]*\):\s*(?:(?:config\.addinivalue_line\([^\n]*\)|'''.*?'''|\"\"\".*?\"\"\"|#[^\n]*)\s*)*", text.strip()):
                    yield unit.finding("runner_patch", "runner_patch.configure", node.lineno, node.body[0].lineno)
            elif unit.is_test and TESTCASE_METHODS.match(node.name) and unit.node_touched(node):
                cls = unit.parents.get(node)
                if isinstance(cls, ast.ClassDef) and any("TestCase" in ast.unparse(b) for b in cls.bases):
                    yield unit.at("runner_patch", "runner_patch.testcase_override", node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and unit.node_touched(node):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m == "_pytest" or m.startswith("_pytest.") for m in mods):
                yield unit.at("runner_patch", "runner_patch.private_pytest", node)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and unit.node_touched(node):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                yield from patched_target(unit, node, t)
        elif isinstance(node, ast.Delete) and unit.node_touched(node):
            if any("sys.modules" in (qualname(t, unit.aliases) or ast.unparse(t)) for t in node.targets):
                yield unit.at("runner_patch", "runner_patch.sys_modules_del", node)
        elif isinstance(node, ast.Call) and unit.node_touched(node):
            yield from patching_call(unit, node)


def patched_target(unit: Unit, node, t):
    qn = qualname(t, unit.aliases) or ""
    if isinstance(t, ast.Subscript):
        base = qualname(t.value, unit.aliases) or ""
        key = const_str(t.slice) or ""
        if base == "sys.modules":
            strong = key.split(".")[0] in RUNNER_MODULES
            yield unit.at("runner_patch", "runner_patch.sys_modules_runner" if strong else "runner_patch.sys_modules", node)
            return
        if base in ("__builtins__", "builtins.__dict__", "vars(builtins)"):
            yield unit.at("runner_patch", "runner_patch.builtins", node)
            return
        if base in ("os.environ",) and key in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONOPTIMIZE", "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
            yield unit.at("test_config", "test_config.env", node)
            return
    if isinstance(t, ast.Attribute):
        if t.attr in OUTCOME_ATTRS and getattr(node, "value", None) is not None and \
                not (qn.startswith("self.") and t.attr not in ("outcome", "exitstatus", "longrepr", "wasxfail")):
            v = const_value(node.value)
            if (t.attr == "outcome" and v in ("passed", "skipped")) or (t.attr in ("exitstatus", "testsfailed", "failures", "errors") and (v == 0 or v == [])) \
                    or (t.attr == "longrepr" and v is None and isinstance(node.value, ast.Constant)) \
                    or (t.attr in ("failed", "shouldfail", "shouldstop") and v is False) or (t.attr == "passed" and v is True) \
                    or t.attr in ("wasSuccessful", "wasxfail"):
                yield unit.at("runner_patch", "runner_patch.outcome", node)
                return
        if t.attr == "excepthook" or qn in ("sys.excepthook", "threading.excepthook"):
            yield unit.at("runner_patch", "runner_patch.excepthook", node)
            return
        if qn.startswith("sys.modules[]"):
            yield unit.at("runner_patch", "runner_patch.sys_modules", node)
            return
        if qn.startswith("builtins.") or qn.startswith("__builtins__."):
            yield unit.at("runner_patch", "runner_patch.builtins", node)
            return
        if any(qn.startswith(r) for r in PATCHED_ROOTS) or any(f".{r}" in qn for r in ("TestCase.", "TestResult.", "TextTestResult.")):
            yield unit.at("runner_patch", "runner_patch.assign", node)
            return
        if qn.startswith("self.") and (t.attr.startswith("assert") or t.attr in ("fail", "run", "skipTest", "_outcome")):
            yield unit.at("runner_patch", "runner_patch.assign", node)
    elif isinstance(t, ast.Name) and t.id == "__builtins__":
        yield unit.at("runner_patch", "runner_patch.builtins", node)


PATCH_FUNCS = ("setattr", "builtins.setattr", "monkeypatch.setattr", "mock.patch", "unittest.mock.patch",
               "mock.patch.object", "unittest.mock.patch.object", "patch", "patch.object", "unittest.mock.patch.dict",
               "mock.patch.dict", "patch.dict")


def patching_call(unit: Unit, node):
    qn = call_name(unit, node)
    if qn.endswith("monkeypatch.setattr") or qn in PATCH_FUNCS or qn.endswith(".setattr"):
        if not node.args:
            return
        first = node.args[0]
        target = const_str(first) or qualname(first, unit.aliases) or ""
        attr = const_str(node.args[1]) if len(node.args) > 1 else ""
        full = f"{target}.{attr}" if attr else target
        if full.startswith(("unittest.", "pytest.", "_pytest.", "builtins.", "__builtins__", "doctest.")) or \
                ".TestCase." in f".{full}" or full.startswith(("TestCase.", "TestResult.")) or \
                (attr in EQ_METHODS) is False and (attr or "").startswith("assert") and "TestCase" in target:
            yield unit.at("runner_patch", "runner_patch.assign", node)
        elif target == "sys.modules" or full.startswith("sys.modules"):
            yield unit.at("runner_patch", "runner_patch.sys_modules", node)
        elif target == "sys" and attr in ("exit", "excepthook"):
            yield unit.at("runner_patch", "runner_patch.excepthook", node)
    elif qn in ("sys.modules.update", "sys.modules.setdefault", "sys.modules.__setitem__"):
        yield unit.at("runner_patch", "runner_patch.sys_modules", node)
    elif qn in ("sys.modules.pop", "sys.modules.clear", "sys.modules.__delitem__"):
        yield unit.at("runner_patch", "runner_patch.sys_modules_del", node)
    elif qn in ("sys.settrace", "sys.setprofile", "threading.settrace"):
        yield unit.at("runner_patch", "runner_patch.settrace", node)
    elif qn in ("os.environ.update", "os.environ.setdefault", "os.putenv") and re.search(
            r"PYTEST_ADDOPTS|PYTEST_PLUGINS|PYTHONOPTIMIZE", ast.unparse(node)):
        yield unit.at("test_config", "test_config.env", node)


def test_config_code(unit: Unit, ctx: Context):
    """In Python: ``collect_ignore`` / ``collect_ignore_glob`` (tests dropped from
    collection), ``pytest_plugins = ...`` (a plugin loaded into the run)."""
    for node in unit.nodes:
        if isinstance(node, (ast.Assign, ast.AugAssign)) and unit.node_touched(node):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                name = t.id if isinstance(t, ast.Name) else ""
                if name in ("collect_ignore", "collect_ignore_glob"):
                    yield unit.at("test_config", "test_config.collect_ignore", node)
                elif name == "pytest_plugins":
                    yield unit.at("test_config", "test_config.plugins_var", node)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("append", "extend") and unit.node_touched(node):
            if isinstance(node.func.value, ast.Name) and node.func.value.id.startswith("collect_ignore"):
                yield unit.at("test_config", "test_config.collect_ignore", node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "pytest11" in node.value and unit.node_touched(node):
            yield unit.at("test_config", "test_config.plugin_entry", node)
