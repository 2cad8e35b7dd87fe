"""The package's layers (docs/design.md, "Source layout"): each imports only from the layers below it."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jax_cgtp"
# What each layer may import of jax_cgtp ("" is the top: the user API and lowerings.py).
ALLOWED = {"core": {"core"}, "sharding": {"core", "sharding"}, "gpu": {"core", "sharding", "gpu", "_ffi"}}
USER_API = ["tensor_product", "conv", "e3nn", "e3nn_switch", "flax", "cueq", "backend"]


def imports_of(path: pathlib.Path) -> set[str]:
    """The jax_cgtp modules ``path`` imports, as dotted names below jax_cgtp (``core.call``, ``gpu``)."""
    layer = path.relative_to(PACKAGE).parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(layer[: len(layer) - node.level + 1])
            module = base + (node.module.split(".") if node.module else [])
            found |= {".".join(module + [alias.name]) if not node.module else ".".join(module)
                      for alias in node.names}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found |= {n.removeprefix("jax_cgtp.") for n in names if n and n.startswith("jax_cgtp.")}
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(layer):
    for path in (PACKAGE / layer).glob("*.py"):
        imported = {name.split(".")[0] for name in imports_of(path)}
        assert imported <= ALLOWED[layer], (path.name, imported - ALLOWED[layer])


def test_the_user_api_plans_no_launch():
    for name in USER_API:
        imported = imports_of(PACKAGE / f"{name}.py")
        assert not {n for n in imported if n.split(".")[0] in ("gpu", "sharding")}, (name, imported)
