"""The knobs (METAFLOW_TORCHRUN_*): each reader parses its knob with knob_text,
leniently where it runs; the step's start runs every reader strictly
(runtime/knob_check.py), so a value a reader could only misread is refused,
named, instead of quietly becoming the default."""

import pytest

from metaflow_extensions.torchrun.plugins.torchrun import knob_text
from metaflow_extensions.torchrun.plugins.torchrun.procs import names
from metaflow_extensions.torchrun.plugins.torchrun.runtime.knob_check import knob_problems
from metaflow_extensions.torchrun.plugins.torchrun.runtime.node_history import history_runs
from metaflow_extensions.torchrun.plugins.torchrun.runtime.session import (progress_interval, straggler_ratio,
                                                                           straggler_seconds)


@pytest.mark.parametrize("text,low,above,whole,expected", [
    (None, 0, False, False, 7.0),
    ("  ", 0, False, False, 7.0),
    (" 2.5 ", 0, False, False, 2.5),
    ("0", 0, False, False, 0.0),
    ("0.5", 0.5, False, False, 0.5),
    ("3", 0, False, True, 3),
])
def test_a_number_is_read_within_its_bounds(text, low, above, whole, expected):
    value = knob_text.number("K", text, 7.0, low=low, above=above, whole=whole, strict=True)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("text,low,above,whole,takes", [
    ("lots", 0, False, False, "a number of at least 0"),
    ("nan", 0, False, False, "a number of at least 0"),
    ("inf", 0, False, False, "a number of at least 0"),
    ("-1", 0, False, False, "a number of at least 0"),
    ("0.4", 0.5, False, False, "a number of at least 0.5"),
    ("1", 1, True, False, "a number above 1"),
    ("2.5", 0, False, True, "a whole number of at least 0"),
    ("1e400", 0, False, True, "a whole number of at least 0"),
])
def test_a_number_out_of_bounds_is_refused_by_name_or_read_as_the_default(text, low, above, whole, takes):
    with pytest.raises(knob_text.KnobError) as e:
        knob_text.number("METAFLOW_TORCHRUN_X", text, 7.0, low=low, above=above, whole=whole, strict=True)
    assert str(e.value) == "METAFLOW_TORCHRUN_X=%r: give %s" % (text, takes)
    assert knob_text.number("METAFLOW_TORCHRUN_X", text, 7.0, low=low, above=above, whole=whole) == 7.0


def test_a_long_value_is_cut_where_it_is_named():
    with pytest.raises(knob_text.KnobError) as e:
        knob_text.number("K", "x" * 5000, 1.0, strict=True)
    assert len(str(e.value)) < 120 and "..." in str(e.value)


@pytest.mark.parametrize("text,expected", [
    (None, 9), ("", 9), ("12", 12), ("0", 0), ("off", 0), (" OFF ", 0), ("no", 0), ("false", 0), ("none", 0)])
def test_a_count_or_off(text, expected):
    assert knob_text.count_or_off("K", text, 9, strict=True) == expected


@pytest.mark.parametrize("text", ["of", "-3", "1.5", "many"])
def test_a_count_that_is_neither_is_refused_saying_off_is_taken(text):
    with pytest.raises(knob_text.KnobError, match="give a whole number of at least 0, or off"):
        knob_text.count_or_off("K", text, 9, strict=True)
    assert knob_text.count_or_off("K", text, 9) == 9


@pytest.mark.parametrize("text,on", [
    (None, False), ("", False), ("0", False), ("off", False), ("no", False),
    ("1", True), ("TRUE", True), (" yes ", True), ("on", True)])
def test_a_switch(text, on):
    assert knob_text.switch("K", text, strict=True) is on


def test_a_switch_that_says_neither_is_refused():
    with pytest.raises(knob_text.KnobError, match=r"K='enable': give 1 \(or true, yes, on\) or 0"):
        knob_text.switch("K", "enable", strict=True)
    assert knob_text.switch("K", "enable") is False


def test_the_readers_take_the_environment_they_are_given():
    env = {names.PROGRESS_ENV: "3", names.STRAGGLER_RATIO_ENV: "1.001", names.STRAGGLER_SECONDS_ENV: "4",
           names.NODE_HISTORY_RUNS_ENV: "6"}
    assert progress_interval(env, strict=True) == 3.0
    assert straggler_ratio(env, strict=True) == 1.01  # above 1, and at least 1.01
    assert straggler_seconds(env, strict=True) == 4.0
    assert history_runs(env, strict=True) == 6


def test_good_and_unset_knobs_have_no_problem():
    assert knob_problems({}) == []
    assert knob_problems({
        names.PORT_ENV: "23456", names.SECRET_ENV: "s" * 32, names.PROGRESS_ENV: "0.5",
        names.STRAGGLER_RATIO_ENV: "1.8", names.STRAGGLER_SECONDS_ENV: "0", names.KEEP_LOGS_HOURS_ENV: "0",
        names.KEEP_LOGS_ENV: "5", names.MAX_LOG_MB_ENV: "7.5", names.DEBUG_ENV: "yes",
        names.NODE_HISTORY_ENV: "off", names.NODE_HISTORY_RUNS_ENV: "0", names.FLIGHT_RECORDER_ENV: "off",
        names.WARM_START_ENV: "off",
    }) == []


def test_every_knob_with_a_bad_value_is_named_with_what_it_takes():
    bad = {
        names.PORT_ENV: "http", names.SECRET_ENV: "short", names.PROGRESS_ENV: "0.1",
        names.STRAGGLER_RATIO_ENV: "1", names.STRAGGLER_SECONDS_ENV: "-5", names.KEEP_LOGS_HOURS_ENV: "3 days",
        names.KEEP_LOGS_ENV: "2.5", names.MAX_LOG_MB_ENV: "inf", names.DEBUG_ENV: "verbose",
        names.NODE_HISTORY_ENV: "3 of 5", names.NODE_HISTORY_RUNS_ENV: "-1", names.FLIGHT_RECORDER_ENV: "2k",
        names.WARM_START_ENV: "fast",
    }
    problems = knob_problems(bad)
    # One message a knob, the secret's value never shown.
    assert len(problems) == len(names.USER_KNOBS) == len(bad), problems
    for name in names.USER_KNOBS:
        assert [p for p in problems if p.startswith(name)], (name, problems)
    assert not [p for p in problems if "'short'" in p]
    assert "METAFLOW_TORCHRUN_PROGRESS_SECONDS='0.1': give a number of at least 0.5" in problems
    assert "METAFLOW_TORCHRUN_FLIGHT_RECORDER='2k': give a whole number of at least 0, or off" in problems
    # Only the bad one of two.
    assert knob_problems({names.KEEP_LOGS_ENV: "3", names.MAX_LOG_MB_ENV: "-1"}) == [
        "METAFLOW_TORCHRUN_MAX_LOG_MB='-1': give a number of at least 0"]
