"""The docs site builds strictly (a broken link or anchor, or a page left out of mkdocs.yml's nav, fails) and
README.md's relative links point at files that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_site_builds_strictly(tmp_path):  # not --quiet: mkdocs then does not count warnings for --strict
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "index.html").is_file() and (tmp_path / "gpu.html").is_file()


def test_every_page_is_in_the_nav():
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        nav = yaml.safe_load(f)["nav"]
    listed = {page for entry in nav for page in entry.values()}
    pages = {name for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")}
    assert pages == listed, f"pages not in mkdocs.yml nav: {pages - listed}; nav without a page: {listed - pages}"


def relative_links(path: str) -> list[str]:
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.DOTALL)  # links inside code blocks are not links
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_readme_links_resolve():
    links = relative_links(os.path.join(ROOT, "README.md"))
    assert len(links) >= 10, links  # the front page links the guides
    missing = [t for t in links if not t.startswith("#") and not os.path.exists(os.path.join(ROOT, t.split("#")[0]))]
    assert not missing, f"README.md links to missing files: {missing}"


def test_readme_anchors_into_guides_exist():
    """A README link to docs/page.md#anchor names a heading of that page (mkdocs checks the pages' own links)."""
    from markdown.extensions.toc import slugify

    bad = []
    for target in relative_links(os.path.join(ROOT, "README.md")):
        page, _, anchor = target.partition("#")
        if anchor and page.endswith(".md"):
            with open(os.path.join(ROOT, page)) as f:
                slugs = {slugify(h.strip(), "-") for h in re.findall(r"^#+ (.*)$", f.read(), flags=re.MULTILINE)}
            if anchor not in slugs:
                bad.append(target)
    assert not bad, f"README.md anchors that name no heading: {bad}"
