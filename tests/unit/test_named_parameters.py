"""The store's named parameters (``%(name)s``): one text for PostgreSQL's prepared session
cursor (``$n``, a name used twice is one number) and one for Django's cursors (``%s``)."""

from __future__ import annotations

import pytest

from jobs_engine.store.connection import _positional_names, named, native_placeholders, positional


def test_a_name_used_twice_is_one_number_and_percent_signs_stay_literal() -> None:
    text, names = native_placeholders(
        "SELECT %(now)s, %(token)s WHERE x LIKE 'a%%' AND t < %(now)s")
    assert text == "SELECT $1, $2 WHERE x LIKE 'a%' AND t < $1"
    assert names == ("now", "token")


def test_a_positional_text_keeps_its_order_and_has_no_names() -> None:
    assert native_placeholders("SELECT %s, %s, '%%'") == ("SELECT $1, $2, '%'", ())


def test_django_cursors_get_each_use_of_a_name_in_the_texts_order() -> None:
    text, params = positional("SELECT %(b)s, %(a)s, %(b)s, '%%'", {"a": 1, "b": 2})
    assert text == "SELECT %s, %s, %s, '%%'"
    assert params == [2, 1, 2]
    assert positional("SELECT %s", [7]) == ("SELECT %s", [7])


def test_a_missing_name_is_refused_by_its_name() -> None:
    _positional_names.cache_clear()
    with pytest.raises(KeyError, match="token"):
        positional("SELECT %(token)s", {"other": 1})


def test_a_fragment_of_positional_parameters_takes_names() -> None:
    assert named(("id IN (%s, %s)", [4, 5]), "ids") == (
        "id IN (%(ids_0)s, %(ids_1)s)", {"ids_0": 4, "ids_1": 5})
    assert named(("id = ANY(%s)", ["{4,5}"]), "ids") == ("id = ANY(%(ids)s)", {"ids": "{4,5}"})
    assert named(("1 = 0", []), "ids") == ("1 = 0", {})
