"""Built-in attention plugins (imported as ``pyllama.plugins``)."""
