"""Fixtures for the router tests. They live in router_support.py, which tests import by that unique
name: `from conftest import ...` resolves to whichever conftest pytest imported first."""

from router_support import *  # noqa: F403 (pytest collects the fixtures from this namespace)
