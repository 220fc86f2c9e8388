"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

The pages under ``docs/`` link to files beside them in the repository (``../README.md``,
``../bench/README.md``, ``../bench/results/shapes.md``, ...) with relative links, so that they
work on GitHub. MkDocs serves ``docs/`` only, so those links would break in the site, and
``mkdocs build --strict`` fails on them. Rather than point them elsewhere in the sources, the
hook makes their targets part of the site: the README becomes the home page (``index.md``),
and every other repository file a page links to is added under its repository path,
following the links of the Markdown files it adds in turn. Each link that leaves ``docs/`` is
then rewritten to where its target lands, so MkDocs checks it (file and anchor) like any
other.

It also writes the API reference's entries, one per name of ``jobs_engine.__all__``, so a
public name added to the package cannot be left out of the reference. ``import jobs_engine``
needs no settings (the names load lazily) and mkdocstrings reads the source without
importing it, so the build needs no Django set-up.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

REPO = Path(__file__).resolve().parents[1]
DOCS = "docs"
HOME = "README.md"  # the repository's README: the site's home page
API_PAGE = "api.md"  # the page that gets an entry per public name
LINK = re.compile(r"\]\(([^)\s]+)\)")  # the target of an inline link or image
FENCE = re.compile(r"^(```.*?^```)", re.M | re.S)  # a fenced code block: no links in it

# repository path -> the file's path in the site, for every page and file of the site;
# remade by each build's on_files (``mkdocs serve`` rebuilds).
_site: dict[str, str] = {}


def _outside_code(markdown: str, change: Callable[[str], str]) -> str:
    """``markdown`` with ``change`` applied to the text between fenced code blocks."""
    parts = FENCE.split(markdown)
    return "".join(part if i % 2 else change(part) for i, part in enumerate(parts))


def _resolve(source: str, target: str) -> tuple[str, str] | None:
    """The repository path and fragment a relative link of ``source`` points at, or None for
    a URL, an anchor of the same page, or a path outside the repository."""
    if target.startswith(("#", "/")) or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
        return None
    path, _, fragment = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if resolved.startswith("../") or resolved == "..":
        return None
    return resolved, f"#{fragment}" if fragment else ""


def _linked_files(source: str) -> list[str]:
    """The repository files (not folders) that the Markdown file ``source`` links to."""
    found: list[str] = []

    def collect(text: str) -> str:
        for target in LINK.findall(text):
            resolved = _resolve(source, target)
            if resolved and (REPO / resolved[0]).is_file():
                found.append(resolved[0])
        return text

    _outside_code((REPO / source).read_text(encoding="utf-8"), collect)
    return found


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the README as ``index.md`` and every repository file the pages reach by links."""
    site = {f"{DOCS}/{file.src_uri}": file.src_uri for file in files}
    site[HOME] = "index.md"
    todo = [path for path in site if path.endswith(".md")]
    while todo:
        for path in _linked_files(todo.pop()):
            if path in site:
                continue
            if files.get_file_from_path(path) is not None:
                raise ValueError(f"docs/{path} and the repository's {path} would share a URL")
            site[path] = path
            if path.endswith(".md"):
                todo.append(path)
    if files.get_file_from_path("index.md") is not None:
        raise ValueError(f"docs/index.md would hide {HOME}, the site's home page")
    for path, uri in site.items():
        if not path.startswith(f"{DOCS}/"):
            files.append(File.generated(config, uri, abs_src_path=str(REPO / path)))
    _site.clear()
    _site.update(site)
    return files


def _api_entries() -> str:
    """One mkdocstrings entry per public name, under the module that defines it."""
    import jobs_engine

    modules = jobs_engine._PUBLIC  # name -> defining module, the table __getattr__ reads
    if sorted(modules) != sorted(jobs_engine.__all__):
        raise ValueError("jobs_engine.__all__ and its table of modules differ")
    return "".join(f"\n::: {modules[name]}.{name}\n" for name in modules)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Point the page's links that leave ``docs/`` at their targets' places in the site."""
    here = page.file.src_uri
    source = next(path for path, uri in _site.items() if uri == here)

    def relink(match: re.Match[str]) -> str:
        resolved = _resolve(source, match.group(1))
        if resolved is None or resolved[0] not in _site:
            return match.group(0)  # MkDocs judges it as it is
        path, fragment = resolved
        target = posixpath.relpath(_site[path], posixpath.dirname(here) or ".")
        return f"]({target}{fragment})"

    markdown = _outside_code(markdown, lambda text: LINK.sub(relink, text))
    if here == API_PAGE:
        markdown += _api_entries()
    return markdown
