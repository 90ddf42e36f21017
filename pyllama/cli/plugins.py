"""``pyllama plugins``: every attention plugin, with its knobs."""

from __future__ import annotations

import json

import click

from pyllama.attention.registry import plugin_infos, plugins_markdown

__all__ = ["plugins"]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, origin, description, knobs, error}.")
@click.option("--markdown", is_flag=True, help="Print the table of plugins and knobs (docs/plugins.md).")
def plugins(as_json, markdown):
    """List every attention plugin: built-ins, installed (entry point group pyllama.attention), registered.

    \b
    Use one with --attention NAME[:ARGS]: positional values fill the knobs in order, key=value sets
    one, a bare bool knob name sets it true (sliding:256, sink:4,252,shift, causal:positions=2048).
    A class in a local file is path/to/file.py:ClassName[:ARGS] (a .pyx file is compiled on first use).
    """
    infos = plugin_infos()
    if as_json:
        click.echo(json.dumps([i.to_json() for i in infos]))
        return
    if markdown:
        click.echo(plugins_markdown())
        return
    width = max([len(i.name) for i in infos] + [6])
    for info in infos:
        if info.error:
            click.echo(f"{info.name:<{width}}  [{info.origin}] cannot be used: {info.error}")
            continue
        origin = "" if info.origin == "built-in" else f"  [{info.origin}]"
        click.echo(f"{info.name:<{width}}  {info.description}{origin}")
        for k in info.knobs:
            click.echo(
                f"{'':<{width}}    {k.name:<10} {k.describe_range():<14} default {k.describe_default():<8} {k.help}"
            )
    click.echo(
        "\nUse: --attention NAME[:ARGS], e.g. sink:4,252,shift; "
        "a local class: path/to/file.py:ClassName[:ARGS] (or .pyx)"
    )
