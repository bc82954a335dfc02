"""Job spec files: every key validated, errors name the file, key and line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainctl.launcher.inputs import parse_duration
from trainctl.launcher.specfile import KEYS, SpecDraft, load_spec_file, parse_sets
from trainctl.supervisor.errors import ConfigError

CONF = Path(__file__).parents[2] / "conf" / "jobs"


@pytest.mark.parametrize(
    ("raw", "secs"),
    [
        (90, 90.0),
        ("90", 90.0),
        ("90s", 90.0),
        ("20m", 1200.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("2m30s", 150.0),
        (0.5, 0.5),
    ],
)
def test_durations(raw: object, secs: float) -> None:
    assert parse_duration(raw, "x") == secs


@pytest.mark.parametrize("raw", ["", "soon", "-1", "5ms", True, [1], "1w", "nan"])
def test_bad_durations(raw: object) -> None:
    with pytest.raises(ConfigError, match="x"):
        parse_duration(raw, "x")


@pytest.mark.parametrize("name", ["demo.toml", "torchrun.toml", "datagen.toml"])
def test_shipped_examples_are_valid(name: str) -> None:
    spec = load_spec_file(str(CONF / name), check_cwd=False)  # their cwd is another machine's
    assert spec.name
    assert spec.argv
    assert spec.cwd is not None
    assert Path(spec.cwd).is_absolute()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('name = "x"\n\nargvv = ["a"]\n', ":3: argvv: unknown key"),
        ('grace = "soon"\n', ":1: grace: 'soon' is not a duration"),
        ('restart = "always"\n', ":1: restart: expected one of never, on-failure"),
        ('progress_regex = "step (\\\\d+)"\n', ":1: progress_regex: needs named groups"),
        ('progress_regex = "(?P<step>"\n', "invalid regular expression"),
        ("argv = []\n", ":1: argv: expected a non-empty list"),
        ("env = { A = 1 }\n", ":1: env: expected a table of string values"),
        ('checkpoint_signal = "BOGUS"\n', ":1: checkpoint_signal: unknown signal"),
        ("restart_exit_codes = [300]\n", ":1: restart_exit_codes"),
        ("max_restarts = -2\n", ":1: max_restarts"),
        ("name = \n", "invalid TOML"),
    ],
)
def test_errors_name_file_key_and_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_spec_file(str(path))
    assert str(path) in str(info.value)
    assert needle in str(info.value)


def test_relative_cwd_is_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "job.toml"
    path.write_text('argv = ["true"]\ncwd = ".."\n')
    assert load_spec_file(str(path)).cwd == str(tmp_path)


def test_sets() -> None:
    assert parse_sets(["grace=2m", "max_restarts=5", 'argv=["a", "b c"]', "name=x"]) == SpecDraft(
        grace=120.0,
        max_restarts=5,
        argv=["a", "b c"],
        name="x",
    )
    assert parse_sets(["argv=python train.py --lr 3e-4"]).argv == [
        "python",
        "train.py",
        "--lr",
        "3e-4",
    ]
    for bad in (["grace"], ["bogus=1"], ["max_restarts=many"]):
        with pytest.raises(ConfigError):
            parse_sets(bad)


def test_the_draft_has_a_field_for_every_spec_key() -> None:
    assert {f.name for f in dataclasses.fields(SpecDraft)} == set(KEYS)


def test_later_drafts_win_key_by_key_and_env_merges() -> None:
    file = SpecDraft(name="a", grace=5.0, env={"A": "1", "B": "1"})
    flags = SpecDraft(grace=9.0, env={"B": "2"})
    assert file.merged(flags) == SpecDraft(name="a", grace=9.0, env={"A": "1", "B": "2"})
