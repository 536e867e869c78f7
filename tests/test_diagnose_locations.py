"""Which frames diagnose names where a finding's line is not the user's own (`via`)."""

from __future__ import annotations


def test_decorator_plumbing_is_not_named_as_the_library_a_sync_came_through():
    """`via typing_extensions.py:3140 in wrapper` named the `deprecated` decorator's wrapper, not
    a library that did anything (issue 30 item 10)."""
    from tpu_migrate.diagnose.recording import is_shown_library

    site = "/venv/lib/python3.11/site-packages/"
    assert is_shown_library(site + "transformers/generation/utils.py")
    assert not is_shown_library(site + "typing_extensions.py")
    assert not is_shown_library(site + "wrapt/wrappers.py")
    assert not is_shown_library(site + "decorator.py")
