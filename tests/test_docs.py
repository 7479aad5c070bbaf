"""The README and the manual (docs/) stay true to the command line: every ``archscan ...`` line they
show parses with today's CLI, and every relative link in them resolves.

Which lines: in ```bash (or sh/shell/console) blocks of README.md and docs/*.md, every command that
starts with ``archscan`` (also after ``$ ``, ``&&``, ``||`` or ``;``, as in the set-up line
``pip install ... && archscan zoo:...``); in ```text blocks, the ``$ archscan ...`` prompt lines
above example output. A trailing backslash continues a line. Comments, pipes (``| head``: what
follows a pipe is another program) and redirections (``> report.json``, ``2>&1``) are dropped;
``[--option value]`` marks an optional part of a synopsis and is checked as if given. Nothing is
skipped: a line the extractor cannot split fails the test.

How they are checked: the routing of ``archscan.cli.main`` (``archscan MODEL ...`` without a
sub-command runs ``scan``) is reproduced here, then the sub-command's click ``make_context``
parses and validates the arguments: unknown options, option values of the wrong type or out of
range, missing or extra arguments all raise click's usage errors (exit code 2), and the command
itself never runs. Appending ``--help`` and invoking through ``typer.testing.CliRunner`` would be
weaker: click's eager ``--help`` does still reject an unknown option wherever it stands (parsing
comes first), but it exits before any value is converted, so ``--depth -1`` or an extra argument
would pass (checked by hand with typer 0.28). Importing ``archscan.cli`` imports no torch, so this
file takes well under a second.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from dataclasses import dataclass

import pytest
import typer
import typer.main

from archscan.cli import app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))

SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*```\s*([\w+-]*)\s*$")
OPTIONAL = re.compile(r"\[(--[^\[\]]*)\]")        # `[--sort latency_ms]` in a synopsis: check it as given
FD_PREFIX = re.compile(r"(?<=\s)\d+(?=[<>])")       # the `2` of `2>&1`, glued to its operator as in bash
SEPARATORS = {"&&", "||", ";", "&", "|"}


@dataclass(frozen=True)
class Command:
    where: str          # file:line of the line the command starts on
    words: tuple        # the words after `archscan`

    def __str__(self) -> str:
        return f"{self.where}: archscan {shlex.join(self.words)}"


def blocks(text: str):
    """(language, [(line number, line)]) for every fenced block of a Markdown text."""
    lang, body = None, []
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if lang is None and m:
            lang, body = m.group(1).lower(), []
        elif lang is not None and line.strip() == "```":
            yield lang, body
            lang = None
        elif lang is not None:
            body.append((number, line))


def logical_lines(body):
    """Lines joined across trailing backslashes: (number of the first line, joined text)."""
    start, parts = None, []
    for number, line in body:
        start = number if start is None else start
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        yield start, " ".join(parts)
        start, parts = None, []
    if parts:
        yield start, " ".join(parts)


def commands_in_line(line: str, where: str) -> list[Command]:
    """The archscan commands of one shell line, without comments, pipes' readers and redirections."""
    line = OPTIONAL.sub(r"\1", FD_PREFIX.sub("", line))
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)  # a line shlex cannot split (an open quote) raises: the test fails, loudly
    found, segment, after_pipe, skip = [], [], False, False

    def close():
        words = list(segment)
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # `COLUMNS=100 archscan ...`
            words.pop(0)
        if words and words[0] == "archscan" and not after_pipe:
            found.append(Command(where, tuple(words[1:])))

    for tok in tokens:
        if skip:  # the target of a redirection
            skip = False
        elif tok in SEPARATORS:
            close()
            segment, after_pipe = [], tok == "|"
        elif set(tok) <= set("<>&|") and ("<" in tok or ">" in tok):
            skip = True
        else:
            segment.append(tok)
    close()
    return found


def commands_in(text: str, name: str) -> list[Command]:
    found = []
    for lang, body in blocks(text):
        if lang in SHELL_BLOCKS:
            for number, line in logical_lines(body):
                line = line.strip()
                line = line[2:] if line.startswith("$ ") else line
                found += commands_in_line(line, f"{name}:{number}")
        elif lang == "text":  # example output: only its prompt lines are commands
            prompts = [(n, l) for n, l in logical_lines(body) if l.startswith("$ ")]
            for number, line in prompts:
                found += commands_in_line(line[2:], f"{name}:{number}")
    return found


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return fh.read()


ALL = [c for name in DOCS for c in commands_in(read(name), name)]


@functools.lru_cache(maxsize=None)
def cli():
    return typer.main.get_command(app)


def _click_error() -> type:
    """click's ClickException (typer 0.28 and later ship their own click; older ones use click)."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def parse_error(words) -> str | None:
    """None when ``archscan WORDS`` parses; else click's message. Nothing runs: the command's
    function is never called, only its parameters are parsed and converted."""
    group = cli()
    args = [w for w in words if w != "--debug"]  # main() takes --debug out before typer sees it
    if not args:
        return "no arguments: `archscan` alone is an error"
    if args == ["--version"] or args[0] in ("--help", "-h"):
        return None
    # archscan.cli.main: `archscan MODEL ...` (first word not a command) runs `scan`
    first = next((a for a in args if not a.startswith("-")), None)
    if first is not None and first not in group.commands:
        args = ["scan", *args]
    name, rest = args[0], args[1:]
    if name not in group.commands:
        return f"no sub-command {name!r}"
    try:
        with group.make_context("archscan", [name], resilient_parsing=True) as parent:
            command = group.get_command(parent, name)
            with command.make_context(name, list(rest), parent=parent):
                pass
    except _click_error() as exc:
        return f"{type(exc).__name__}: {exc.format_message()}"
    except typer.Exit as exc:  # an eager option such as --help ends the parse early
        return None if exc.exit_code == 0 else f"exit {exc.exit_code}"
    return None


# --- the documented lines -----------------------------------------------------------------------

def test_the_docs_show_enough_command_lines():
    """Guards against an extractor that silently finds nothing."""
    assert len(ALL) >= 30, [str(c) for c in ALL]
    assert {c.where.split(":")[0] for c in ALL} >= {"README.md", "docs/scanning.md", "docs/measuring.md",
                                                     "docs/compare-and-reports.md"}
    commands = {c.words[0] for c in ALL if c.words}
    assert commands >= {"fuse", "prune", "distill", "compare", "zoo", "calibrate", "guidelines"}


@pytest.mark.parametrize("command", ALL, ids=str)
def test_documented_command_parses(command):
    error = parse_error(command.words)
    assert error is None, f"{command}\n  -> {error}"


def test_the_setup_block_is_the_readmes_first_bash_block():
    """.ci/run runs the README's test command verbatim; keep both lines byte-identical."""
    first = next(body for lang, body in blocks(read("README.md")) if lang == "bash")
    lines = [line for _, line in first]
    assert lines[:2] == ['pip install torch==2.13.0 -e ".[test]" && archscan zoo:shufflenet_v2_x1_0 --input 1,3,224,224',
                         'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q']
    assert lines[1] in read(os.path.join(".ci", "run")).splitlines()


# --- the checker itself -------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "archscan zoo:resnet18 --inptu 1,3,224,224",                 # a misspelled option
    "archscan zoo:resnet18 --inptu 1,3,224,224 --help",          # ... before an eager --help too
    "archscan zoo:resnet18 --depth -1",                          # a value out of range
    "archscan zoo:resnet18 --threads two",                       # a value of the wrong type
    "archscan zoo:resnet18 zoo:resnet50",                        # an extra argument
    "archscan fuse zoo:resnet18 --ratio 0.3",                    # another command's option
    "archscan comapre zoo:resnet18 zoo:resnet50",                # a misspelled command: scan, 2 models
    "archscan prune",                                            # a missing argument
])
def test_the_checker_rejects_a_bad_line(line):
    (command,) = commands_in_line(line, "made-up")
    assert parse_error(command.words) is not None, line


@pytest.mark.parametrize("line, words", [
    ("archscan zoo:resnet18 --input 1,3,224,224 --json > out.json", ("zoo:resnet18", "--input", "1,3,224,224", "--json")),
    ("archscan zoo:resnet18 --depth 0 2>&1 | head -5   # a comment", ("zoo:resnet18", "--depth", "0")),
    ('pip install torch==2.13.0 -e ".[test]" && archscan zoo', ("zoo",)),
    ("archscan compare a.py:Net 'zoo:shufflenet_v2_*' [--sort latency_ms] [--json]",
     ("compare", "a.py:Net", "zoo:shufflenet_v2_*", "--sort", "latency_ms", "--json")),
    ("COLUMNS=100 archscan zoo:resnet18 --kwargs 'act=relu'", ("zoo:resnet18", "--kwargs", "act=relu")),
])
def test_the_extractor(line, words):
    (command,) = commands_in_line(line, "made-up")
    assert command.words == words
    assert parse_error(command.words) is None


def test_continued_lines_and_prompts():
    text = ("```bash\narchscan compare zoo:resnet18 zoo:resnet50 \\\n    --input 1,3,224,224 \\\n    [--measure]\n"
            "python -m pytest -q\n```\n\n```text\n$ archscan zoo   # the list\nname  family\n"
            "archscan zoo:resnet18 in output is not a command\n```\n")
    found = commands_in(text, "made-up")
    assert [(c.where, c.words) for c in found] == [
        ("made-up:2", ("compare", "zoo:resnet18", "zoo:resnet50", "--input", "1,3,224,224", "--measure")),
        ("made-up:9", ("zoo",)),
    ]


# --- links ----------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation (backticks, dots, slashes...) dropped,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(name: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_block = False
    for line in read(name).splitlines():
        if FENCE.match(line) or (in_block and line.strip() == "```"):
            in_block = not in_block
            continue
        if not in_block and (m := re.match(r"#{1,6}\s+(.*)", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(name: str) -> list[str]:
    text = read(name)
    text = re.sub(r"^\s*```.*?^\s*```\s*$", "", text, flags=re.S | re.M)  # no links in code blocks
    text = re.sub(r"`[^`]*`", "code", text)                             # nor in code spans
    return LINK.findall(text)


@pytest.mark.parametrize("name", DOCS)
def test_relative_links_resolve(name):
    broken = []
    for target in links(name):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(ROOT, os.path.dirname(name), path)) if path else os.path.join(ROOT, name)
        if not os.path.exists(file):
            broken.append(f"{target}: no {os.path.relpath(file, ROOT)}")
        elif anchor and file.endswith(".md") and anchor not in anchors(os.path.relpath(file, ROOT)):
            broken.append(f"{target}: no heading #{anchor} in {os.path.relpath(file, ROOT)}")
    assert not broken, f"{name}: " + "; ".join(broken)


def test_every_page_is_in_the_index():
    pages = {os.path.basename(n) for n in DOCS if n.startswith("docs") and not n.endswith("README.md")}
    indexed = {t.partition("#")[0] for t in links(os.path.join("docs", "README.md"))}
    readme = {os.path.basename(t.partition("#")[0]) for t in links("README.md") if t.startswith("docs/")}
    assert pages <= indexed, pages - indexed
    assert pages <= readme, pages - readme
