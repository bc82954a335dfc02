"""Options declared once (issue 55 §4): click's parser (``cli.py``) and the fast path
(``main.py``) both build from these, so an option's spelling, metavar and help cannot
differ between them, and a duration's value has one grammar (``durations.py``, read by
the verb through ``inputs.parse_seconds``; early.py's stop request reads it too).

No import at all: early.py parses the stop's command line with :func:`parse_fast` before
anything else is loaded, and main.py's fast path parses ``status NAME`` and ``stop NAME``
with it, neither paying for click.
"""

from __future__ import annotations


class Opt:
    """One option: its spellings, the verb's keyword it fills, its help, and its metavar
    (None: an on/off flag). A plain class: a dataclass would import ``dataclasses``."""

    __slots__ = ("dest", "flags", "help", "metavar")

    def __init__(
        self, flags: tuple[str, ...], dest: str, help: str, metavar: str | None = None
    ) -> None:
        self.flags, self.dest, self.help, self.metavar = flags, dest, help, metavar

    def __repr__(self) -> str:
        return f"Opt({self.flags[0]})"

    @property
    def takes_value(self) -> bool:
        """``--grace 30`` (True) or ``--json`` (False)."""
        return self.metavar is not None


JSON = Opt(("--json",), "as_json", "Print JSON for scripts.")
GRACE = Opt(
    ("--grace",),
    "grace",
    "Seconds (or 90s, 2m, 1h) between the stop signal and SIGKILL [default: the job's].",
    "DURATION",
)
ORDER = Opt(
    ("--order",),
    "order",
    "Who gets the stop signal when: tree (top of the process tree first, a child once "
    "its parent exited; launchers such as torchrun are skipped for their workers), all "
    "(everyone at once), main (main, then the rest once it exited) [default: the job's "
    "stop_order, else tree].",
    "ORDER",
)
MAIN_ONLY = Opt(("--main-only",), "main_only", "The same as --order main.")

# The command lines main.py serves without click, `[--home DIR] VERB NAME [OPTION...]`
# with each option at most once; click declares these same options for the verb (with
# more of its own), and anything else goes to click.
FAST: dict[str, tuple[Opt, ...]] = {
    "status": (JSON,),
    "stop": (GRACE, ORDER, MAIN_ONLY, JSON),
}


class FastLine:
    """A command line of a FAST shape: the verb, the job, ``--home``, and each option
    given by the verb's keyword (True for an on/off flag, else the value as typed)."""

    __slots__ = ("given", "home", "name", "verb")

    def __init__(self, verb: str, name: str, home: str | None, given: dict[str, str | bool]):
        self.verb, self.name, self.home, self.given = verb, name, home, given


def parse_fast(argv: list[str], verbs: tuple[str, ...] = tuple(FAST)) -> FastLine | None:
    """``[--home DIR] VERB NAME [OPTION...]`` for a VERB of ``verbs``, each option of its
    FAST row at most once; None for any other shape (click reads it, and says what is
    wrong). Values are not checked here: the verb reads them (one grammar)."""
    home = None
    if argv[:1] == ["--home"] and len(argv) >= 2:
        home, argv = argv[1], argv[2:]
        if not home:
            return None  # an empty --home is refused by click's one line
    if len(argv) < 2 or argv[0] not in verbs or argv[1].startswith("-"):
        return None
    verb, name, rest = argv[0], argv[1], argv[2:]
    by_flag = {f: o for o in FAST[verb] for f in o.flags}
    given: dict[str, str | bool] = {}
    while rest:
        o = by_flag.get(rest.pop(0))
        if o is None or o.dest in given or (o.takes_value and not rest):
            return None
        given[o.dest] = rest.pop(0) if o.takes_value else True
    return FastLine(verb, name, home, given)
