#!/usr/bin/env python3
"""Checks the manual's links: check_links.py REPO_ROOT

For README.md and every docs/*.md, each relative Markdown link [text](target)
must name an existing file or directory (relative to the file holding the link),
and each #anchor (alone, or after a .md target) must match a heading of the
target file under GitHub's slug rules. Links with a scheme (http:, https:,
mailto:) are not fetched. Also fails when README.md has 150 lines or more, and
when a docs/*.md page is linked from neither README.md nor docs/index.md.

Prints one line per problem (file:line: target: why) and exits 1, or a summary
line and exits 0. Standard library only.
"""
import os
import re
import sys
import unicodedata

MAX_README_LINES = 150

# [text](target) or [text](target "title"); not images' own targets alone, but
# those are links to files too and are checked the same way.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s>]*(?:\([^()\s]*\)[^()\s>]*)*)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")


def github_slug(heading):
    """GitHub's anchor for a heading: lowercase, spaces to '-', punctuation
    except '-' and '_' removed (letters and digits of any script stay)."""
    text = heading.strip().lower()
    out = []
    for ch in text:
        if ch == " ":
            out.append("-")
        elif ch in "-_":
            out.append(ch)
        elif unicodedata.category(ch)[0] in ("L", "N", "M"):
            out.append(ch)
        # everything else (punctuation, symbols) is dropped
    return "".join(out)


def heading_text(raw):
    """What GitHub slugs: the heading's text with Markdown markup removed."""
    text = INLINE_CODE.sub(lambda m: m.group(2), raw)          # `code` -> code
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)      # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text)                         # inline HTML
    return text


def markdown_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    fence = None
    for number, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
                continue
            if line.strip().startswith(fence):
                fence = None
                continue
        if fence is None:
            yield number, line


def anchors_of(path, cache={}):
    if path not in cache:
        slugs, seen = set(), {}
        for _, line in markdown_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            slug = github_slug(heading_text(m.group(2)))
            # GitHub numbers repeated headings: x, x-1, x-2 ...
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            slugs.add(slug if n == 0 else f"{slug}-{n}")
        # Explicit anchors: <a name="x"> or <a id="x">.
        with open(path, encoding="utf-8") as f:
            for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", f.read()):
                slugs.add(m.group(1))
        cache[path] = slugs
    return cache[path]


def links_of(path):
    """(line number, target) of every inline link and reference definition,
    outside code blocks and inline code."""
    for number, line in markdown_lines(path):
        m = REFERENCE_DEF.match(line)
        if m:
            yield number, m.group(1)
            continue
        prose = INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line)
        for m in LINK.finditer(prose):
            yield number, m.group(1)


def check_link(repo, source, target):
    """None when target resolves from source, else why not."""
    if not target:
        return "empty link"
    if SCHEME.match(target) or target.startswith("//"):
        return None  # http:, https:, mailto: ... are not fetched
    path_part, _, anchor = target.partition("#")
    path_part = path_part.split("?", 1)[0]
    if path_part:
        if path_part.startswith("/"):
            resolved = os.path.normpath(os.path.join(repo, path_part.lstrip("/")))
        else:
            resolved = os.path.normpath(os.path.join(os.path.dirname(source), path_part))
        if not os.path.exists(resolved):
            return "no such file or directory"
        real_repo = os.path.realpath(repo)
        if os.path.commonpath([os.path.realpath(resolved), real_repo]) != real_repo:
            return "points outside the repository"
    else:
        resolved = source
    if anchor:
        if not (os.path.isfile(resolved) and resolved.endswith(".md")):
            return f"anchor #{anchor} on a file that is not Markdown"
        if anchor not in anchors_of(resolved):
            return f"no heading with anchor #{anchor} in {os.path.relpath(resolved, repo)}"
    return None


def main(argv):
    if len(argv) != 2:
        print("usage: check_links.py REPO_ROOT", file=sys.stderr)
        return 2
    repo = os.path.abspath(argv[1])
    readme = os.path.join(repo, "README.md")
    docs_dir = os.path.join(repo, "docs")
    index = os.path.join(docs_dir, "index.md")
    problems = []

    if not os.path.isfile(readme):
        print(f"{readme}: missing")
        return 1
    pages = sorted(os.path.join(docs_dir, n) for n in os.listdir(docs_dir)
                   if n.endswith(".md")) if os.path.isdir(docs_dir) else []
    files = [readme] + pages

    with open(readme, encoding="utf-8") as f:
        readme_lines = f.read().count("\n")
    if readme_lines >= MAX_README_LINES:
        problems.append(f"README.md:{readme_lines}: README.md has {readme_lines} lines; "
                        f"it must stay under {MAX_README_LINES} (move the rest into docs/)")

    count = 0
    linked = set()  # docs pages linked from README.md or docs/index.md
    for source in files:
        rel = os.path.relpath(source, repo)
        for number, target in links_of(source):
            count += 1
            why = check_link(repo, source, target)
            if why:
                problems.append(f"{rel}:{number}: {target}: {why}")
            elif source in (readme, index):
                path_part = target.partition("#")[0]
                if path_part and not SCHEME.match(target):
                    linked.add(os.path.normpath(os.path.join(os.path.dirname(source), path_part)))

    for page in pages:
        if page not in linked and page != index:
            problems.append(f"{os.path.relpath(page, repo)}:1: (page): linked from neither README.md "
                            f"nor docs/index.md")
    if pages and index not in linked:
        problems.append("docs/index.md:1: (page): not linked from README.md")

    for p in problems:
        print(p)
    if problems:
        print(f"check_links: {len(problems)} problem(s) in {len(files)} file(s)")
        return 1
    print(f"check_links: {count} links in {len(files)} files resolve; "
          f"README.md has {readme_lines} lines (limit {MAX_README_LINES - 1})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
