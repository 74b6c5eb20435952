"""The GPU suite (see conftest.py); a package, so its conftest is not the conftest module of tests/."""
