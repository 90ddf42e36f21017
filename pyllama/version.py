"""pyllama's version, in a module of its own: the modules that stamp it on what they write (record
keys, compiled plugins, result rows) import it from here, not from the package, which imports them."""

__version__ = "0.1.0"  # the same as pyproject.toml's
