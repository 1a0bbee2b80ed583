"""The documentation a newcomer follows is true.

Every relative link in README.md, docs/*.md and bench/README.md leads to a file of the repository,
and to a heading of it when the link names one. Every command in their shell blocks names a
program, a subcommand and repository files that exist; the offline `admission-policy` commands
that name only repository files are run as written. And nothing cites a document outside the
repository: docs/design.md holds the reasons the code relies on.
"""
from __future__ import annotations

import importlib.util
import itertools
import pathlib
import re
import shlex
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from admission_policy.command import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.M | re.S)
SHELL = {"sh", "bash", "shell", "console"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ ]+(.+?)[ ]*#*[ ]*$", re.M)
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|"}
REDIRECTS = {">", ">>", "<"}

# What each program needs to exist; a command in the docs with another program fails the test,
# so that adding one means saying here what makes it true.
MODULE_PROGRAMS = {"admission-policy": "admission_policy.cli", "kopf": "kopf", "pytest": "pytest", "pip": "pip"}
EXTERNAL_PROGRAMS = {"kubectl", "helm", "kind", "docker"}   # not installed by the project: their file arguments
SHELL_BUILTINS = {".", "source", "cd"}

# The offline subcommands a doc's command is run with, and the exit codes that mean "as documented".
RUN_OFFLINE = {"test": {0}, "lint": {0}, "convert": {0}, "plugins": {0}, "review": {0}, "audit": {0, 1}}


def _text_outside_code(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _anchors(page: pathlib.Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)      # a link: its text
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links() -> Iterator[tuple[pathlib.Path, str]]:
    for page in PAGES:
        for target in LINK.findall(_text_outside_code(page.read_text())):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):     # http:, https:, mailto:
                yield page, target


@pytest.mark.parametrize(("page", "target"), list(_links()),
                         ids=lambda value: str(value.relative_to(ROOT)) if isinstance(value, pathlib.Path) else value)
def test_every_relative_link_leads_to_a_file_and_heading(page: pathlib.Path, target: str) -> None:
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    assert file.is_relative_to(ROOT), f"{target}: outside the repository"
    assert file.exists(), f"{target}: no such file"
    if anchor:
        assert file.suffix == ".md", f"{target}: an anchor into a file that is not Markdown"
        assert anchor in _anchors(file), f"{target}: no such heading in {file.relative_to(ROOT)}"


def _commands(page: pathlib.Path) -> Iterator[list[str]]:
    """Each simple command of the page's shell blocks, as words (environment assignments first)."""
    for block in FENCE.finditer(page.read_text()):
        if block["lang"] not in SHELL:
            continue
        lines = [line[len(block["indent"]):] for line in block["body"].splitlines()]
        for line in "\n".join(lines).replace("\\\n", " ").splitlines():
            if not line.strip() or line.lstrip().startswith(("#", "export ")):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split, lexer.commenters = True, "#"
            words: list[str] = []
            tokens = iter(lexer)
            for token in tokens:
                if token in SEPARATORS:
                    if words:
                        yield words
                    words = []
                elif token in REDIRECTS:
                    next(tokens, None)       # the file written or read, not an argument
                else:
                    words.append(token)
            if words:
                yield words


def _all_commands() -> Iterator[tuple[pathlib.Path, list[str]]]:
    for page in PAGES:
        for words in _commands(page):
            yield page, words


def _repository_paths(words: list[str]) -> list[str]:
    """The arguments that name a file of this repository: a relative path under a top-level entry."""
    paths = []
    for word in words:
        value = word.rpartition("=")[2] if "=" in word else word
        first = value.split("/", 1)[0]
        if "/" in value and first not in ("", ".", "..", "~") and not first.startswith("$") and (ROOT / first).exists():
            paths.append(value)
    return paths


def _looks_like_a_path(word: str) -> bool:
    value = word.rpartition("=")[2]
    return not word.startswith("-") and ("/" in value or re.search(r"\.[a-z]{2,4}$", value) is not None)


COMMANDS = list(_all_commands())


def test_the_docs_quote_commands() -> None:
    programs = {next(itertools.dropwhile(ASSIGNMENT.match, words)) for _, words in COMMANDS}
    assert {"admission-policy", "python", "kubectl", "helm"} <= programs


@pytest.mark.parametrize(("page", "words"), COMMANDS,
                         ids=lambda value: str(value.relative_to(ROOT)) if isinstance(value, pathlib.Path)
                         else " ".join(value)[:80])
def test_every_quoted_command_names_what_exists(page: pathlib.Path, words: list[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    environment = list(itertools.takewhile(ASSIGNMENT.match, words))
    words = words[len(environment):]
    assert words, "an assignment alone"
    program, args = words[0], words[1:]
    missing = [path for path in _repository_paths(args) if not (ROOT / path).exists()]
    assert missing == [], f"{' '.join(words)}: no such file in the repository"
    if program in SHELL_BUILTINS:
        return
    if program in ("python", "python3"):
        if args[:1] == ["-m"]:
            assert importlib.util.find_spec(args[1]) is not None, f"no module {args[1]}"
        else:
            assert (ROOT / args[0]).is_file(), f"no script {args[0]}"
        return
    if program == "bash":
        assert (ROOT / args[0]).is_file(), f"no script {args[0]}"
        return
    if program in EXTERNAL_PROGRAMS:
        return
    assert program in MODULE_PROGRAMS, f"{program}: a program this test does not know"
    assert importlib.util.find_spec(MODULE_PROGRAMS[program]) is not None
    if program == "kopf" and "-m" in args:
        module = args[args.index("-m") + 1]
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
    if program != "admission-policy":
        return

    subcommand = next((arg for arg in args if not arg.startswith("-")), None)
    if subcommand is not None:
        assert subcommand in main.commands, f"no subcommand {subcommand}"   # type: ignore[attr-defined]
        result = CliRunner().invoke(main, [subcommand, "--help"])
        assert result.exit_code == 0, result.output
    # Run it as written when it works offline on files of this repository alone.
    if environment or "-" in args or (subcommand is not None and subcommand not in RUN_OFFLINE):
        return                                     # it needs a setting, or standard input
    paths = [arg for arg in args if _looks_like_a_path(arg)]
    if any(not (ROOT / path.rpartition("=")[2]).exists() for path in paths):
        return                                     # a placeholder: policy.yaml, manifests/
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, args)
    expected = RUN_OFFLINE.get(subcommand or "", {0})
    assert result.exit_code in expected, result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception


def _quoted_paths() -> Iterator[tuple[pathlib.Path, str]]:
    for page in PAGES:
        for path in sorted(set(re.findall(r"`([\w./-]+\.py|[\w.-]+/)`", FENCE.sub("", page.read_text())))):
            yield page, path


@pytest.mark.parametrize(("page", "path"), list(_quoted_paths()),
                         ids=lambda value: str(value.relative_to(ROOT)) if isinstance(value, pathlib.Path) else value)
def test_every_module_the_docs_name_exists(page: pathlib.Path, path: str) -> None:
    """`engine/background.py`, `operator/sources.py`, `cel/lib/`: where the package's modules move, the docs follow."""
    places = [ROOT, ROOT / "operator", ROOT / "operator" / "admission_policy", page.parent, ROOT / "bench"]
    assert any((place / path).exists() for place in places), f"{path}: no such file or directory"


# Documents that live outside this repository, and how they were cited. The harness that starts the
# shared control plane and node (.ci/run, tests/e2e/envtest.py, tests/node) may locate them; the
# tests' own files are checked by their owners, so this walks the product, its docs and its tools.
OUTSIDE = re.compile(r"DESIGN\s*§|DESIGN\.md|KOPF-NOTES|\.\./shared\b")
CHECKED = ["README.md", "Dockerfile", "pyproject.toml", "docs", "bench", "reliability", "operator/admission_policy",
           "charts", "crds", "examples"]
TEXT = {".py", ".md", ".yaml", ".yml", ".tpl", ".txt", ".toml", ".json", ""}


def test_nothing_cites_a_document_outside_the_repository() -> None:
    files = [path for entry in CHECKED for path in ([ROOT / entry] if (ROOT / entry).is_file()
                                                    else sorted((ROOT / entry).rglob("*")))
             if path.is_file() and path.suffix in TEXT and "__pycache__" not in path.parts]
    assert len(files) > 100
    cited = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in files for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if OUTSIDE.search(line)]
    assert cited == []
