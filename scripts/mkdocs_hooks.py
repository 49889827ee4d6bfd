"""mkdocs hooks of the docs site (mkdocs.yml): README.md is the home page, and the repository files the pages link
to outside docs/ (benchmark pages and results, tests/README.md, CONTRIBUTING.md, ...) are published under ``repo/``,
so that every relative link of the pages resolves in the site and ``mkdocs build --strict`` checks it."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
_LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def _site_path(path: Path) -> str | None:
    """Where the repository file ``path`` lives in the site (a path relative to docs/), or None outside the repo."""
    try:
        rel = path.relative_to(REPO).as_posix()
    except ValueError:
        return None
    if rel == "README.md":
        return "index.md"
    if rel.startswith("docs/"):
        return rel[len("docs/"):]
    return "repo/" + rel


def _targets(source: Path) -> list[tuple[str, Path]]:
    """``(link text, repository file)`` of each relative link of the Markdown file ``source`` to an existing file."""
    out = []
    for _, target, _ in _LINK.findall(source.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (source.parent / target.split("#", 1)[0]).resolve()
        if path.is_file():
            out.append((target, path))
    return out


def on_files(files, config):
    """Add README.md as index.md and, transitively, every repository file outside docs/ that a page links to."""
    pending = [REPO / "README.md"]
    pending += [path for f in list(files) if f.abs_src_path and f.abs_src_path.endswith(".md")
                for _, path in _targets(Path(f.abs_src_path))]
    while pending:
        path = pending.pop()
        uri = _site_path(path)
        if uri is None or files.get_file_from_path(uri):
            continue
        files.append(_file(uri, path, config))
        if path.suffix == ".md":
            pending += [target for _, target in _targets(path)]
    return files


def _file(uri: str, path: Path, config) -> File:
    return File.generated(config, uri, abs_src_path=str(path))


def on_page_markdown(markdown, page, config, files):
    """Rewrite each relative link of a page from its place in the repository to its place in the site."""
    source = Path(page.file.abs_src_path)
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match):
        target = match.group(2)
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        site = _site_path((source.parent / path).resolve()) if path else None
        if site is None:
            return match.group(0)
        new = posixpath.relpath(site, here or ".") + (f"#{anchor}" if anchor else "")
        return f"{match.group(1)}{new}{match.group(3)}"

    return _LINK.sub(rewrite, markdown)
