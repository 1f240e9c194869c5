"""The documentation: generated pages match the code, the site builds, the user docs read short.

The reference pages (docs/reference/) are regenerated and compared with the committed ones, as
the completion scripts are. The site is built with mkdocs --strict, which fails on a broken link
or anchor. The README's links are checked here, since the site does not include the README.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

from rstar2cli.docs_ref import PAGES, cell

REPO = Path(__file__).resolve().parents[2]
MAX_WORDS = 35  # CONTRIBUTING: user docs are written in sentences of at most this many words
USER_DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("name", sorted(PAGES))
def test_committed_reference_page_matches_the_code(name):
    committed = (REPO / "docs" / "reference" / name).read_text(encoding="utf-8")
    assert committed == PAGES[name](), (
        f"docs/reference/{name} is stale: run `make docs-ref` "
        "(python -m rstar2cli.docs_ref docs/reference)"
    )


def test_site_builds_in_strict_mode(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "reference" / "recipes" / "index.html").is_file()


def test_table_cells_escape_markup_outside_code_only():
    assert cell("a | b <x>") == "a \\| b &lt;x&gt;"
    assert cell("`ID|FILE` and\n<tag>") == "`ID|FILE` and &lt;tag&gt;"


def sentences(markdown_text: str) -> list[str]:
    """The prose sentences of a Markdown page: no code blocks, tables, headings or images."""
    text = re.sub(r"```.*?```", "", markdown_text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "X", text)  # a code span counts as one word
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link counts as its text
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        stripped = line.strip()
        if (
            not stripped
            or stripped.startswith(("|", "#", "!!!"))
            or re.match(r"[-*]|\d+\.", stripped)
        ):
            blocks.append([])  # a blank line, a table, a heading or a list item ends a paragraph
        if stripped and not stripped.startswith(("|", "#", "!!!")):
            blocks[-1].append(re.sub(r"^([-*]|\d+\.)\s+", "", stripped))
    found = []
    for block in blocks:
        paragraph = " ".join(block).replace("**", "")
        paragraph = re.sub(r"\b(e\.g|i\.e|vs)\.", r"\1", paragraph)
        found += [s for s in re.split(r"(?<=[.!?])\s+", paragraph) if s.strip()]
    return found


def test_sentence_splitting():
    page = "# Title\n\nOne two. Three, e.g. four\nfive.\n\n| a | b |\n\n- Item one. Item two\n"
    assert sentences(page) == ["One two.", "Three, e.g four five.", "Item one.", "Item two"]


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: p.name)
def test_user_docs_use_short_sentences(path):
    long = [
        f"{len(s.split())} words: {s[:90]}..."
        for s in sentences(path.read_text(encoding="utf-8"))
        if len([w for w in s.split() if re.search(r"\w", w)]) > MAX_WORDS
    ]
    assert not long, f"{path.name}: sentences over {MAX_WORDS} words:\n" + "\n".join(long)


def test_readme_is_short_and_its_links_resolve():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150, "the README is for users: keep it under 150 lines"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme):
        path, anchor = target
        if "://" in path:
            continue
        assert (REPO / path).exists(), f"README links to {path}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (REPO / path).read_text(encoding="utf-8"), re.M)
            assert anchor in {slugify(h, "-") for h in headings}, f"no #{anchor} in {path}"
