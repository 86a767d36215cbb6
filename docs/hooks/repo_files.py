"""MkDocs hook: repository folders the pages link to, copied into the site.

A page links to `../benchmarks/h100/bench.md` so that the link also works where the Markdown is
read in the repository (GitHub). MkDocs only knows files under docs/, so the folders named in
SHARED are added to the site under `repo/`, and links that leave docs/ for them are pointed there.
A link that leaves docs/ for anything else is left alone, and the strict build fails on it."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

SHARED = ("benchmarks",)
SITE_FOLDER = "repo"
ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s#]+)")


def on_files(files: Files, config, **_) -> Files:
    for folder in SHARED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file():
                uri = f"{SITE_FOLDER}/{path.relative_to(ROOT).as_posix()}"
                # in the site for the pages' links, not in the navigation
                files.append(File.generated(config, uri, abs_src_path=str(path), inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def on_page_markdown(markdown: str, page, **_) -> str:
    if page.file.src_uri.startswith(f"{SITE_FOLDER}/"):
        return markdown
    folder = posixpath.dirname(page.file.src_uri)
    up = "../" * (folder.count("/") + 1 if folder else 0)

    def point(match: re.Match) -> str:
        target = match.group(1)
        in_repo = posixpath.normpath(posixpath.join("docs", folder, target))
        if in_repo.split("/")[0] not in SHARED:
            return match.group(0)
        return f"]({up}{SITE_FOLDER}/{in_repo}"

    return LINK.sub(point, markdown)
