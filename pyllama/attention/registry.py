"""Find attention plugins by name and build them from spec strings such as ``causal:positions=2048``."""

from __future__ import annotations

from pyllama.attention.base import Attention
from pyllama.errors import PluginError


def create_plugin(spec: str | Attention | None) -> Attention:
    """An Attention instance from a spec string (``None``: exact ``causal``), or the instance itself."""
    if spec is None:
        spec = "causal"
    if isinstance(spec, Attention):
        return spec
    if not isinstance(spec, str):
        raise PluginError(f"attention must be a spec string or an Attention instance, not {type(spec).__name__}")
    name, _, args = spec.partition(":")
    if name != "causal":
        raise PluginError(f"unknown attention plugin {name!r}; available: causal")
    from pyllama.plugins.causal import Causal

    kwargs = {}
    for item in filter(None, args.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key != "positions" or not value.isdigit():
            raise PluginError(f"causal: bad argument {item!r}; causal takes positions=N")
        kwargs[key] = int(value)
    return Causal(**kwargs)
