"""The version of orchestrate (one place; the package and bundles read it)."""

__version__ = "0.1.0"
