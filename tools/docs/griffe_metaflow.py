"""A griffe extension for the API page (mkdocs.yml): a docstring's Metaflow-only
part is cut before mkdocstrings renders it.

Metaflow reads a decorator's docstring for its stubs, from a section headed
``MF Add To Current`` (and ``@@ Returns`` inside it) to the end. Those markers
are Metaflow's machinery, not prose: rendered, they showed as a heading in the
page and its table of contents, and as a raw ``@@`` in a code box. The same
text is in the page anyway, from ``TorchrunHandle``'s own docstring.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

# Metaflow's marker: a numpydoc-style section title, underlined.
MARKER = re.compile(r"^\s*MF Add To Current\s*\n\s*-+\s*$", re.M | re.I)


def without_metaflow_sections(text: str) -> str:
    match = MARKER.search(text)
    return text if match is None else text[:match.start()].rstrip() + "\n"


class MetaflowSections(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = without_metaflow_sections(obj.docstring.value)
