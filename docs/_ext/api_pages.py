"""Sphinx extension: the API reference, one page a public name, from each package's ``__all__``.

At ``config-inited`` (before Sphinx lists the source files and autosummary writes its stubs) it writes ``api/index.md`` and one
``api/<package>.rst`` for every package of ``mixle_nb`` that defines ``__all__``, each an
``autosummary`` table with ``:toctree:``, so autosummary writes a page for every name. A name
added to an ``__all__`` later gets its page with no edit here. The files are build outputs
(ignored by git).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import types
from pathlib import Path
from types import ModuleType

from docutils.nodes import Element, Node
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.environment import BuildEnvironment

ROOT_PACKAGE = "mixle_nb"
BUILTIN_KINDS = (
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)
API_FOLDER = "api"
STUBS_FOLDER = "generated"


def public_packages() -> list[ModuleType]:
    """Every package under ``mixle_nb`` that declares ``__all__``, sorted by name."""
    root = importlib.import_module(ROOT_PACKAGE)
    found = []
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{ROOT_PACKAGE}."):
        if info.ispkg:
            package = importlib.import_module(info.name)
            if hasattr(package, "__all__"):
                found.append(package)
    return sorted(found, key=lambda package: package.__name__)


def public_names() -> dict[str, list[str]]:
    """Each public package's name mapped to its ``__all__``, in declaration order."""
    return {package.__name__: list(package.__all__) for package in public_packages()}


def stub_page(package: str, name: str) -> str:
    """The reference page of ``package.name``, relative to the docs folder, without suffix."""
    return f"{API_FOLDER}/{STUBS_FOLDER}/{package}.{name}"


def package_page(package: str, names: list[str]) -> str:
    """reST of one package's page: its docstring's summary and a table of its public names."""
    title = package
    lines = [
        title,
        "=" * len(title),
        "",
        f".. automodule:: {package}",
        "   :no-members:",
        "",
        f".. currentmodule:: {package}",
        "",
        ".. autosummary::",
        f"   :toctree: {STUBS_FOLDER}",
        "",
        *(f"   {name}" for name in names),
        "",
    ]
    return "\n".join(lines)


def index_page(packages: list[str]) -> str:
    """MyST of the API reference's front page, linking every package page."""
    lines = [
        "# API reference",
        "",
        "One page for every public name: everything in a package's `__all__`. The pages are",
        "generated from the docstrings at each build.",
        "",
        "```{toctree}",
        ":maxdepth: 1",
        "",
        *packages,
        "```",
        "",
    ]
    return "\n".join(lines)


def write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds it (so Sphinx's incremental build holds)."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def write_api_pages(app: Sphinx, config: Config) -> None:
    """Write the API index and the package pages into ``<srcdir>/api``."""
    folder = Path(app.srcdir) / API_FOLDER
    folder.mkdir(exist_ok=True)
    names = public_names()
    for package, package_names in names.items():
        write_if_changed(folder / f"{package}.rst", package_page(package, package_names))
    write_if_changed(folder / "index.md", index_page(list(names)))


def skip_foreign_member(app: Sphinx, what: str, name: str, obj: object, skip: bool, options: object) -> bool | None:
    """Leave out the members a class gets from another package or the standard library
    (scikit-learn's ``set_*_request``, ``torch.nn.Module``'s methods, ``Exception.add_note``)."""
    if isinstance(obj, BUILTIN_KINDS):  # implemented in C (str.maketrans of a str Enum): not ours
        return True
    if isinstance(obj, property) and obj.fget is not None:
        obj = obj.fget
    owner = getattr(obj, "__objclass__", None)
    module = getattr(owner, "__module__", None) or getattr(obj, "__module__", None)
    if isinstance(module, str) and not module.startswith(ROOT_PACKAGE):
        return True
    return None


def private_module_as_text(app: Sphinx, env: BuildEnvironment, node: Element, contnode: Node) -> Node | None:
    """Show a ``:mod:`` reference to one of mixle_nb's private modules as text.

    ``mixle_nb.cluster.lifeline``, or ``fitting`` written inside ``mixle_nb.inference``: the
    reference documents the public packages only. A module that does not exist still fails."""
    if node.get("refdomain") != "py" or node.get("reftype") != "mod":
        return None
    target = node["reftarget"]
    context = (node.get("py:module") or "").split(".")
    names = [target] + [".".join([*context[:i], target]) for i in range(len(context), 0, -1)]
    return contnode if any(is_private_module(name) for name in names) else None


def is_private_module(name: str) -> bool:
    """Whether ``name`` is an importable module of mixle_nb."""
    if not name.startswith(f"{ROOT_PACKAGE}."):
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def setup(app: Sphinx) -> dict[str, object]:
    """Register the page writer, the member filter and the private-module references."""
    app.connect("config-inited", write_api_pages)
    app.connect("autodoc-skip-member", skip_foreign_member)
    app.connect("missing-reference", private_module_as_text)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
