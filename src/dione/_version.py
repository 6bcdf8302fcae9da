"""dione's version, in a module of its own: parts that record it (the catalog's
fingerprints) read it here instead of importing the package root above them."""

__all__ = ["__version__"]

__version__ = "0.1.0"  # keep equal to pyproject.toml's
