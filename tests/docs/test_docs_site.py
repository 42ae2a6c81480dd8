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


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: its text as rendered (link text, code without backticks), lower case,
    every character but letters, digits, ``_``, ``-`` and spaces dropped, each space a hyphen (none collapsed)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_github_anchors_follow_githubs_rule():
    assert github_anchor("The plan before launch: `--dry-run`") == "the-plan-before-launch---dry-run"
    assert github_anchor("2 nodes x 8 GPUs") == "2-nodes-x-8-gpus"
    assert github_anchor("Run on GPUs: `scripts/gpu_check.sh`") == "run-on-gpus-scriptsgpu_checksh"


def test_every_anchor_link_works_on_github_and_in_the_site():
    """A link to page.md#anchor (or #anchor on the same page), in README.md, launch/README.md or a guide, names a
    heading by GitHub's id and by the site's (mkdocs: python-markdown's slugify), which differ on punctuation."""
    from markdown.extensions.toc import slugify

    pages = ["README.md", "launch/README.md"] + [f"docs/{name}" for name in sorted(os.listdir(f"{ROOT}/docs"))
                                                 if name.endswith(".md")]
    bad = []
    for page in pages:
        for target in relative_links(os.path.join(ROOT, page)):
            name, _, anchor = target.partition("#")
            if not anchor:
                continue
            linked = os.path.normpath(os.path.join(os.path.dirname(page), name)) if name else page
            with open(os.path.join(ROOT, linked)) as f:
                text = re.sub(r"```.*?```", "", f.read(), flags=re.DOTALL)
            headings = [h.strip() for h in re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)]
            if anchor not in {github_anchor(h) for h in headings} or anchor not in {slugify(h, "-") for h in headings}:
                bad.append(f"{page}: {target}")
    assert not bad, f"anchors that GitHub or the site does not have: {bad}"
