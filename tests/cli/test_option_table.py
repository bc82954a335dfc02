"""One option table (issue 55 §4): click's declarations of the fast shapes' options and
the fast path's parser (main.py, and early.py's stop request) are built from
launcher/options.py, so they cannot drift apart; and the three parse alike."""

from __future__ import annotations

import click
import pytest

from trainctl.launcher import cli, durations, early, main, options


@pytest.mark.parametrize("verb", sorted(options.FAST))
def test_click_declares_each_fast_option_as_the_table_does(verb: str) -> None:
    cmd = cli.cli.commands[verb]
    params = {p.name: p for p in cmd.params if isinstance(p, click.Option)}
    for o in options.FAST[verb]:
        p = params[o.dest]
        assert tuple(p.opts) == o.flags
        assert p.help == o.help
        assert p.is_flag is not o.takes_value
        if o.takes_value:
            assert p.metavar == o.metavar


def test_the_grace_is_declared_once_for_every_verb_that_takes_it() -> None:
    for verb in ("start", "stop", "restart", "deploy"):
        [p] = [p for p in cli.cli.commands[verb].params if p.name == "grace"]
        assert p.opts == ["--grace"], verb
        assert p.metavar == "DURATION", verb


CASES = [
    ["stop", "j"],
    ["stop", "j", "--grace", "5"],
    ["stop", "j", "--grace", "90s", "--order", "all", "--json"],
    ["--home", "/tmp/h", "stop", "j", "--main-only"],
    ["stop", "j", "--main-only", "--order", "main"],
    ["stop", "j", "--json", "--json"],  # twice: click's to judge
    ["stop", "j", "--grace"],  # no value
    ["stop", "j", "--verbose"],  # not a fast option
    ["stop", "--all"],
    ["--home", "", "stop", "j"],
    ["status", "j", "--json"],
    ["status", "j", "--grace", "5"],
]


@pytest.mark.parametrize("argv", CASES, ids=" ".join)
def test_the_fast_path_and_the_early_stop_parse_alike(argv: list[str]) -> None:
    fast = main.parse(list(argv))
    sent = early._parse(list(argv))
    if fast is None or fast.verb != "stop":
        assert sent is None
        return
    assert sent is not None
    home, name, order, grace_s = sent
    assert (home, name) == (fast.home, fast.name)
    given = fast.given.get("grace")
    assert grace_s == (None if given is None else durations.seconds(str(given)))
    want = "main" if fast.given.get("main_only") else fast.given.get("order")
    assert order == want


def test_the_early_stop_leaves_a_value_it_would_not_take_to_the_verb() -> None:
    # the fast path hands these to the verb, which says what is wrong in its one line;
    # the early request is never sent for them
    for bad in (["--grace", "-1"], ["--grace", "soon"], ["--order", "sideways"]):
        argv = ["stop", "j", *bad]
        assert main.parse(argv) is not None
        assert early._parse(argv) is None
    assert early._parse(["stop", "j", "--main-only", "--order", "all"]) is None
