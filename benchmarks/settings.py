"""Settings of jax_cgtp's CUDA lowering on a command line: ``name=VALUE;...``, the names fields of
:class:`jax_cgtp.Settings` and the values Python literals."""

from __future__ import annotations

import ast
import dataclasses

import jax_cgtp


def parse_settings(text: str) -> dict[str, object]:
    """``name=VALUE;...`` -> ``{name: value}``; a ValueError for a malformed item or a name that is
    not a field of :class:`jax_cgtp.Settings` (it would otherwise set nothing that is read).

    >>> parse_settings("ahead_depth=0;lockstep_warps=((800, 4),)")
    {'ahead_depth': 0, 'lockstep_warps': ((800, 4),)}
    """
    fields = {f.name for f in dataclasses.fields(jax_cgtp.Settings)}
    parsed = {}
    for assignment in filter(None, (a.strip() for a in text.split(";"))):
        name, equals, value = assignment.partition("=")
        name = name.strip()
        if not equals or not value.strip():
            raise ValueError(f"{assignment!r} is not name=VALUE")
        if name not in fields:
            raise ValueError(f"{name!r} is not a setting; see jax_cgtp.Settings")
        parsed[name] = ast.literal_eval(value.strip())
    return parsed


def settings_option(parser, option: str, text: str) -> dict[str, object]:
    """The settings of command-line ``option`` (``name=VALUE;...``), for the command to run under
    (``with jax_cgtp.config(**settings)``); ``parser.error`` on one that does not parse."""
    try:
        return parse_settings(text)
    except (ValueError, SyntaxError) as error:
        parser.error(f"{option}: {error}")
