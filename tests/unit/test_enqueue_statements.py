"""The enqueue's statements (jobs_engine/store/enqueue.py) read like the rest of the store's:
each function says what it does, then which index its statement uses (``Index:``, an index
or constraint of ``models``, the primary key, or none), and every text takes named
parameters."""

from __future__ import annotations

import inspect
import re

from django.apps import apps

from jobs_engine.store import enqueue


def test_every_function_says_what_it_does_then_the_index_it_uses() -> None:
    known: set[str] = set()
    for model in apps.get_app_config("jobs_engine").get_models():
        known |= {index.name for index in model._meta.indexes if index.name}
        known |= {constraint.name for constraint in model._meta.constraints}
    functions = [name for name in enqueue.__all__ if inspect.isfunction(getattr(enqueue, name))]
    assert "jobs_insert_many" in functions and "wakeups_wanted" in functions
    for name in functions:
        lines = (inspect.getdoc(getattr(enqueue, name)) or "").splitlines()
        assert lines and lines[0].strip() and not lines[0].startswith("Index:"), name
        index_lines = [line for line in lines if line.startswith("Index: ")]
        assert len(index_lines) == 1, f"{name}: no line 'Index: ...'"
        said = re.match(r"Index: (.*?)(?:\.\s|\.$)", index_lines[0])
        assert said is not None, name
        indexes = set(re.findall(r"``(\w+)``", said.group(1)))
        assert indexes <= known, f"{name}: {indexes - known} is no index of models"
        assert indexes or said.group(1).startswith(("the primary key", "none")), name


def test_no_statement_text_takes_positional_parameters() -> None:
    """A positional fragment (``in_``, ``values_``) is given names with ``named``: the
    module's own text holds no ``%s``."""
    source = inspect.getsource(enqueue)
    assert "%(" in source
    assert "%s" not in source
