"""The statements of the store's lane, lease, outcome and flow modules read alike: each
function says what it does, then which index its statement uses (``Index:``, an index or
constraint of ``models``, or the primary key), and every text takes named parameters."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest
from django.apps import apps

import jobs_engine
from jobs_engine.store import enqueue, fair, fast, flows, leases, long, outcomes

MODULES = [enqueue, fast, long, fair, leases, outcomes, flows]


# Exported beside the statements but running none: the wake-up payload's text.
NO_STATEMENT = {"wake_payload", "wake_targets"}


def index_names() -> set[str]:
    """The indexes and constraints of the engine's tables, by name."""
    names: set[str] = set()
    for model in apps.get_app_config("jobs_engine").get_models():
        names |= {index.name for index in model._meta.indexes if index.name}
        names |= {constraint.name for constraint in model._meta.constraints}
    return names


def statement_functions(module: ModuleType) -> list[tuple[str, str]]:
    """(name, docstring) of the functions the module exports, and of its classes' methods
    whose docstring names an index (``Guard.match``)."""
    found = []
    for name in module.__all__:
        if name in NO_STATEMENT:
            continue
        value = getattr(module, name)
        if inspect.isfunction(value):
            found.append((name, inspect.getdoc(value) or ""))
        elif inspect.isclass(value):
            found += [(f"{name}.{method}", inspect.getdoc(function) or "")
                      for method, function in vars(value).items()
                      if inspect.isfunction(function) and "Index:" in (function.__doc__ or "")]
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_statement_says_what_it_does_then_the_index_it_uses(module: ModuleType) -> None:
    known = index_names()
    functions = statement_functions(module)
    assert functions  # a module of statements
    for name, doc in functions:
        lines = doc.splitlines()
        assert lines and lines[0].strip() and not lines[0].startswith("Index:"), name
        named_line = [line for line in lines if line.startswith("Index: ")]
        assert len(named_line) == 1, f"{name}: no line 'Index: ...'"
        said = re.match(r"Index: (.*?)(?:\.\s|\.$)", named_line[0])
        assert said is not None, name
        indexes = set(re.findall(r"``(\w+)``", said.group(1)))
        assert indexes <= known, f"{name}: {indexes - known} is no index of models"
        assert indexes or said.group(1).startswith(("the primary key", "none")), name


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_no_statement_text_takes_positional_parameters(module: ModuleType) -> None:
    """A positional fragment of another module (``in_``, ``table``, ``values_``) is given
    names with ``named``: the module's own text holds no ``%s``."""
    source = "\n".join(line for line in inspect.getsource(module).splitlines()
                       if "logger." not in line)  # a log line's own ``%s``
    assert "%(" in source
    assert "%s" not in source


def test_nothing_above_the_store_asks_which_database_it_runs_on() -> None:
    """The lanes, enqueue, flows and the operators call the store's intents; the database's
    differences stay inside ``store/`` (and the migrations, which make the schema)."""
    package = Path(jobs_engine.__file__).parent
    asking = re.compile(r"\bis_postgres\b|\bwritable_ctes\b|\.vendor\b|connection\.features\b")
    found = [f"{path.relative_to(package)}:{number}"
             for path in sorted(package.rglob("*.py"))
             if path.parent.name not in ("store", "migrations")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if asking.search(line)]
    assert found == []
