"""The README and docs/ stay true to the CLI: every verb has its reference entry, every
command the README shows parses, and every link between the files lands on a heading."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from trainctl.launcher import cli as cli_module
from trainctl.launcher import verbs
from trainctl.launcher.cli import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _sh_commands(text: str) -> list[str]:
    """The `trainctl ...` lines of every ```sh block (comments and `$ ` prompts dropped)."""
    out: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "trainctl":
                out.append(line)
    return out


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_readme_is_short_enough_to_read_in_five_minutes() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_every_verb_has_its_reference_entry() -> None:
    entries = {
        name.strip()
        for head in re.findall(r"^### (.+)$", (ROOT / "docs/cli.md").read_text(), re.M)
        for name in head.split(",")
    }
    missing = sorted(set(verbs.VERBS) - entries)
    assert not missing, f"docs/cli.md has no entry for {missing}"
    assert set(cli.commands) == set(verbs.VERBS)  # the table and click agree


def _parse(args: list[str]) -> str:
    """Parse a command line as the CLI would (global options, the verb, its options and
    arguments) without running it; return the verb. click.UsageError when it does not."""
    with cli.make_context("trainctl", list(args)) as ctx:
        name, command, sub = cli.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        assert command is not None
        with command.make_context(str(name), sub, parent=ctx) as sub_ctx:
            if name == "start":  # start passes unknown options on: its own check refuses them
                cli_module._refuse_unknown_option(tuple(sub_ctx.params["argv"]))
    return str(name)


@pytest.mark.parametrize("line", _sh_commands(README.read_text()))
def test_every_command_the_readme_shows_parses(line: str) -> None:
    """...and its verb answers --help."""
    name = _parse(shlex.split(line, comments=True)[1:])
    assert name in verbs.VERBS
    assert cli_module.main([name, "--help"]) == 0


@pytest.mark.parametrize(
    "bad", [["stop", "r1", "--gracee", "5"], ["strat", "r1"], ["start", "--gracee", "5", "x"]]
)
def test_a_command_that_does_not_parse_is_caught(bad: list[str]) -> None:
    """The check above can fail: a misspelt option or an unknown verb does not parse."""
    with pytest.raises(click.UsageError):
        _parse(bad)


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_every_link_lands_on_a_file_and_a_heading(doc: Path) -> None:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.name}: {target} names no file"
        if anchor and dest.suffix == ".md":
            assert anchor in _headings(dest), f"{doc.name}: {target} names no heading"
