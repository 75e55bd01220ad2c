#!/usr/bin/env python3
"""Every link in the repository's markdown stays inside the repository and names a file that is there.

    check_links.py <repository root> [file.md ...]
    check_links.py --self-test      # the checker finds the bad links of a made-up repository

Checks the markdown files given, or every markdown file git would carry (tracked, or new and not
ignored; outside a git checkout, every *.md under the root except build folders). A link is an
inline link [text](target), an image ![alt](target), a reference definition [label]: target, an
HTML href= or src=, and a bracketed path written as a link with no target, [`path/file.md`].
http(s), mailto and pure #anchor links are not checked; a relative target must resolve inside the
root to a file or folder git would carry (anchors are not checked). Fenced code blocks are skipped.
Prints each bad link as file:line: target (why) and exits 1 if there is one.
"""
import os
import re
import subprocess
import sys

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\[\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HTML = re.compile(r"\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']")
# [`some/path.md`] not followed by ( [ or : — written as a link, but it has no target.
BARE_PATH = re.compile(r"\[`([^`\]]*(?:/|\.md)[^`\]]*)`\](?![(\[:])")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def carried_files(root):
    """Paths (relative, '/'-separated) of the files a clone carries, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {p for p in out.decode().split("\0") if p}


def markdown_files(root, carried):
    if carried is not None:
        return sorted(p for p in carried if p.endswith(".md") and os.path.isfile(os.path.join(root, p)))
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and not d.startswith("build")]
        found += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames if f.endswith(".md")]
    return sorted(p.replace(os.sep, "/") for p in found)


def links(text):
    """(line number, target) of every link outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * len(marker.group(1))
            elif stripped.startswith(fence):
                fence = None
            continue
        if fence is not None:
            continue
        for pattern in (INLINE, REFERENCE, HTML, BARE_PATH):
            for match in pattern.finditer(line):
                yield number, match.group(1)


def problem(root, carried, md_path, target):
    """Why target (a link in md_path) is bad, or None."""
    if SCHEME.match(target) or target.startswith("#"):
        return None
    path = target.split("#", 1)[0].split("?", 1)[0]
    if not path:
        return None
    if path.startswith("/"):
        return "an absolute path: outside the repository"
    resolved = os.path.normpath(os.path.join(os.path.dirname(md_path), path)).replace(os.sep, "/")
    if resolved == ".." or resolved.startswith("../"):
        return "outside the repository"
    if carried is None:
        return None if os.path.exists(os.path.join(root, resolved)) else "no such file"
    if resolved == "." or resolved in carried:
        return None
    prefix = resolved.rstrip("/") + "/"
    if any(p.startswith(prefix) for p in carried):
        return None
    if os.path.exists(os.path.join(root, resolved)):
        return "not in the repository (ignored or not a file a clone has)"
    return "no such file"


def check(root, files=()):
    """(bad links as 'file:line: target (why)', number of links) in the markdown under root."""
    root = os.path.abspath(root)
    carried = carried_files(root)
    files = [os.path.relpath(os.path.abspath(f), root).replace(os.sep, "/") for f in files] or \
        markdown_files(root, carried)
    bad = []
    count = 0
    for md in files:
        with open(os.path.join(root, md), encoding="utf-8") as f:
            text = f.read()
        for number, target in links(text):
            count += 1
            why = problem(root, carried, md, target)
            if why:
                bad.append(f"{md}:{number}: {target} ({why})")
    return files, bad, count


def self_test():
    """A made-up repository (a git checkout when git is there, else plain folders) with one link of
    each kind, good and bad: the checker must report exactly the bad ones."""
    import shutil
    import tempfile
    top = tempfile.mkdtemp(prefix="check_links_")
    try:
        root = os.path.join(top, "repo")
        os.makedirs(os.path.join(root, "docs"))
        os.makedirs(os.path.join(root, "src"))
        open(os.path.join(top, "outside.md"), "w").close()
        open(os.path.join(root, "src", "a.h"), "w").close()
        open(os.path.join(root, "docs", "other.md"), "w").close()
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("[ok](docs/other.md) [ok](src/a.h#L3) [ok](src/) [ok](https://example.com/x.md) [ok](#tests)\n"
                    "![bad](missing.png) [bad](../outside.md) [bad](/etc/passwd)\n"
                    "[`../outside.md`] and [`docs/other.md`] as bracketed paths\n"
                    "```\n[not a link](in/a/fence.md)\n```\n"
                    "[ref]: docs/nope.md\n"
                    '<a href="src/a.h">ok</a> <img src="docs/gone.svg">\n')
        with open(os.path.join(root, "docs", "guide.md"), "w") as f:
            f.write("[ok](../src/a.h) [bad](src/a.h) [bad](../../outside.md)\n")
        expected = {
            "README.md:2: missing.png (no such file)",
            "README.md:2: ../outside.md (outside the repository)",
            "README.md:2: /etc/passwd (an absolute path: outside the repository)",
            "README.md:3: ../outside.md (outside the repository)",
            "README.md:7: docs/nope.md (no such file)",
            "README.md:8: docs/gone.svg (no such file)",
            "docs/guide.md:1: src/a.h (no such file)",
            "docs/guide.md:1: ../../outside.md (outside the repository)",
        }
        modes = ["plain folders"]
        if shutil.which("git"):
            modes.append("git checkout")
        failed = False
        for mode in modes:
            if mode == "git checkout":
                subprocess.run(["git", "init", "-q", root], check=True)
                with open(os.path.join(root, ".gitignore"), "w") as f:
                    f.write("/build/\n")
                os.makedirs(os.path.join(root, "build"))
                open(os.path.join(root, "build", "out.md"), "w").close()
                with open(os.path.join(root, "docs", "other.md"), "w") as f:
                    f.write("[bad](../build/out.md)\n")
                expected.add("docs/other.md:1: ../build/out.md "
                             "(not in the repository (ignored or not a file a clone has))")
            _, bad, _ = check(root)
            if set(bad) != expected:
                failed = True
                print(f"self-test ({mode}) FAILED")
                print("  missed:   " + "; ".join(sorted(expected - set(bad))))
                print("  reported: " + "; ".join(sorted(set(bad) - expected)))
            else:
                print(f"self-test ({mode}): the {len(expected)} bad links found, nothing else")
        return 1 if failed else 0
    finally:
        shutil.rmtree(top)


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    files, bad, count = check(argv[1], argv[2:])
    for line in bad:
        print(line)
    print(f"{len(files)} markdown files, {count} links, {len(bad)} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
