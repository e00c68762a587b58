"""Sphinx configuration of the mixle_nb documentation site (``make docs``).

Built from this repository only: no intersphinx and no notebook execution (the tutorials are
the executed copies in ``docs/tutorials/``), so the build needs no network. The API reference is
generated from each public package's ``__all__`` (``_ext/api_pages.py``) and the benchmark page
from the JSON results in ``benchmarks/results/`` (``_ext/benchmark_page.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))
sys.path.insert(0, str(DOCS / "_ext"))

import mixle_nb  # noqa: E402

project = "mixle_nb"
author = "the mixle_nb developers"
copyright = "2026, the mixle_nb developers"
release = getattr(mixle_nb, "__version__", "")
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_nb",
    "api_pages",
    "benchmark_page",
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "_templates"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_theme = "pydata_sphinx_theme"
html_title = f"mixle_nb {release}".strip()
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "header_links_before_dropdown": 7,
}

# The public API's cross-references must resolve (warnings are errors in `make docs`).
nitpicky = True
# Third-party and standard-library types, which cannot be resolved without network inventories
# (intersphinx is off): annotations and numpydoc type fields naming them are left as text.
THIRD_PARTY = (
    "torch",
    "numpy",
    "np",
    "ipyparallel",
    "ipywidgets",
    "matplotlib",
    "IPython",
    "sklearn",
    "mixle",
    "hmmlearn",
    "psutil",
    "nbformat",
    "pathlib",
    "collections",
    "typing",
    "concurrent",
    "threading",
    "datetime",
    "os",
    "io",
    "enum",
    "types",
    "subprocess",
    "sys",
)
nitpick_ignore_regex = [
    (r"py:.*", rf"({'|'.join(THIRD_PARTY)})\..*"),
]

# autodoc and autosummary: one page a public name, generated at build time.
autosummary_generate = True
# A class's page (_templates/autosummary/class.rst) shows its members and those it inherits from
# mixle_nb's private bases (MixleCluster's from RankCalls); the members a class gets from other
# packages are left out (api_pages.skip_foreign_member).
autodoc_typehints = "none"  # the numpydoc Parameters sections carry the types
autoclass_content = "class"
add_module_names = False

# numpydoc: the class pages list their members through the autosummary template.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# myst and myst-nb: Markdown pages and notebooks with their stored outputs, never executed here.
nb_execution_mode = "off"
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "dollarmath"]
