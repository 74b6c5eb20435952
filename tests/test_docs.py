"""Every ```python block of README.md and docs/*.md runs, so the documentation cannot rot.

Each page's blocks run in order, in one namespace, in a fresh temporary
working directory of the page's own; one test per block, named
``page:line`` (the line of the block's opening fence). A test runs the
page's earlier blocks first when they have not run yet, so any block can be
selected alone (``-k 'README.md:42'``).

An HTML comment on the line just before a block's fence changes how it is
treated:

- ``<!-- skip: REASON -->``: not run; the test is skipped with REASON (for what
  cannot run on one machine without a GPU, used sparingly).
- ``<!-- file: NAME -->``: not run; written to NAME in the page's directory, for
  a later block to launch (a script for ``torchrun``).

Tracebacks point into the Markdown file: a block is compiled under the page's
path, its lines at their line numbers there. Each block's changes to
``os.environ`` are undone after it; ``PYTHONPATH`` names this checkout, so
processes a block starts import the package under test. ```sh and other
blocks are not run. Relative links between the pages must resolve, anchors
included.
"""

from __future__ import annotations

import gc
import os
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)")
_DIRECTIVE = re.compile(r"^\s*<!--\s*(skip|file)\s*:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    code: str
    directive: str = ""  # "", "skip" or "file"
    argument: str = ""  # the skip's reason or the file's name

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The ```python blocks of ``page``, in order, with the directive just above each."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip("`") == ""):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page.relative_to(ROOT)}:{start + 1}: the ``` fence is never closed")
        i += 1
        if lang != "python":
            continue
        directive = argument = ""
        above = start - 1
        while above >= 0 and not lines[above].strip():
            above -= 1
        d = _DIRECTIVE.match(lines[above]) if above >= 0 else None
        if d:
            directive, argument = d.group(1), d.group(2)
        out.append(Block(page, start + 1, "\n".join(body) + "\n", directive, argument))
    return out


ALL = [b for page in PAGES for b in blocks(page)]


@dataclass
class _Page:
    """One page's run: its namespace, its directory and how far it got."""

    directory: Path
    namespace: dict[str, Any] = field(default_factory=dict)
    done: int = 0
    failed: str = ""


_runs: dict[Path, _Page] = {}


def _run_block(block: Block, run: _Page) -> None:
    if block.directive == "skip":
        return
    if block.directive == "file":
        (run.directory / block.argument).write_text(block.code, encoding="utf-8")
        return
    code = compile("\n" * block.line + block.code, str(block.page), "exec")
    environ = dict(os.environ)
    try:
        exec(code, run.namespace)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        run.failed = block.where
        pytest.fail(f"the block at {block.where} failed:\n{tb}", pytrace=False)
    finally:
        os.environ.clear()
        os.environ.update(environ)


@pytest.mark.parametrize("block", ALL, ids=[b.where for b in ALL])
def test_block(block: Block, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    page_blocks = [b for b in ALL if b.page == block.page]
    run = _runs.get(block.page)
    if run is None:
        run = _runs[block.page] = _Page(tmp_path_factory.mktemp(block.page.stem))
        run.namespace["__name__"] = "__docs__"
    monkeypatch.chdir(run.directory)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    index = page_blocks.index(block)
    try:
        while run.done < index:  # the page's earlier blocks, when this one was selected alone
            if run.failed:
                pytest.fail(f"{block.where}: an earlier block of the page, at {run.failed}, failed", pytrace=False)
            _run_block(page_blocks[run.done], run)
            run.done += 1
        if run.failed:
            pytest.fail(f"{block.where}: an earlier block of the page, at {run.failed}, failed", pytrace=False)
        if block.directive == "skip":
            run.done += 1
            pytest.skip(f"{block.where}: {block.argument}")
        _run_block(block, run)
        run.done += 1
    finally:
        if run.done == len(page_blocks) or run.failed:  # the page is over: let its objects go
            run.namespace.clear()
            gc.collect()


def test_every_page_has_runnable_blocks() -> None:
    """README.md and each capability's page carry at least one block that runs."""
    run = {b.page.name for b in ALL if b.directive == ""}
    for name in ("README.md", "checkpoints.md", "offload.md", "planning.md", "data.md", "dcp.md"):
        assert name in run, f"{name} has no ```python block that runs"


def test_directives_are_known() -> None:
    """A misspelt directive would silently run or skip a block: only skip and file exist."""
    for page in PAGES:
        for n, text in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            m = re.match(r"^\s*<!--\s*(\w+)\s*:", text)
            if m and m.group(1) not in ("skip", "file"):
                raise AssertionError(f"{page.relative_to(ROOT)}:{n}: unknown directive {m.group(1)!r}")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of ``page``'s headings: lower case, punctuation dropped, spaces as hyphens."""
    out = set()
    fence = ""
    for text in page.read_text(encoding="utf-8").splitlines():
        m = _FENCE.match(text)
        if m and (not fence or (m.group(2).startswith(fence) and not m.group(3))):
            fence = "" if fence else m.group(2)  # a comment in a code block is no heading
            continue
        if not fence and text.startswith("#"):
            title = text.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_links_resolve() -> None:
    """Every relative link of the pages names a file that exists, and a heading of it when it has an anchor."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            line = text.count("\n", 0, m.start()) + 1
            assert dest.exists(), f"{page.relative_to(ROOT)}:{line}: {target} does not exist"
            if anchor:
                assert anchor in _anchors(dest), f"{page.relative_to(ROOT)}:{line}: no heading #{anchor} in {path or page.name}"


def test_directives_and_lines(tmp_path: Path) -> None:
    """The parser: python blocks only, the line of each fence, and the directive just above it."""
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\na = 1\n```\n\n<!-- skip: needs CUDA -->\n```python\nb = 2\n```\n"
                    "```sh\nls\n```\n<!-- file: run.py -->\n\n```python\nprint(1)\n```\n", encoding="utf-8")
    found = blocks(page)
    assert [(b.line, b.directive, b.argument, b.code) for b in found] == [
        (3, "", "", "a = 1\n"), (8, "skip", "needs CUDA", "b = 2\n"), (16, "file", "run.py", "print(1)\n")]
