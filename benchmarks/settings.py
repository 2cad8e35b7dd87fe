"""Settings of jax_cgtp's code generator or scheduler, given on a command line as ``module.ATTR=VALUE;...``."""

from __future__ import annotations

import ast
import importlib


def parse_assignments(text: str) -> list[tuple[str, str, object]]:
    """``module.ATTR=VALUE;...`` -> ``[(module, ATTR, value)]``; VALUE is a Python literal.

    >>> parse_assignments("jax_cgtp.schedule.AHEAD_DEPTH=0")
    [('jax_cgtp.schedule', 'AHEAD_DEPTH', 0)]
    """
    parsed = []
    for assignment in filter(None, (a.strip() for a in text.split(";"))):
        target, _, value = assignment.partition("=")
        module, _, attribute = target.strip().rpartition(".")
        if not module or not value:
            raise ValueError(f"{assignment!r} is not module.ATTR=VALUE")
        parsed.append((module, attribute, ast.literal_eval(value.strip())))
    return parsed


def check_assignments(assignments) -> None:
    """A ValueError unless every module of ``assignments`` imports and already has its attribute
    (a misspelt name would otherwise set a new attribute that nothing reads)."""
    for module, attribute, _ in assignments:
        if not hasattr(importlib.import_module(module), attribute):
            raise ValueError(f"{module} has no attribute {attribute}")


def apply_option(parser, option: str, text: str) -> None:
    """Assign the settings of command-line ``option`` (``module.ATTR=VALUE;...``) for this process;
    ``parser.error`` on one that does not parse or names no existing attribute. jax_cgtp's kernel
    caches are cleared, since they hold launches planned under the settings before."""
    from jax_cgtp.cuda_lowering import clear_kernel_caches

    try:
        assignments = parse_assignments(text)
        check_assignments(assignments)
    except (ValueError, SyntaxError, ImportError) as error:
        parser.error(f"{option}: {error}")
    for module, attribute, value in assignments:
        setattr(importlib.import_module(module), attribute, value)
    if assignments:
        clear_kernel_caches()
