"""The settings (METAFLOW_TORCHRUN_*), read once at the step's start into one
record (knobs.py): each text read within its bounds, every bad one refused by
name with what it takes, instead of quietly becoming the default."""

import pytest

from metaflow_extensions.torchrun.plugins.torchrun.base import knobs
from metaflow_extensions.torchrun.plugins.torchrun.base.knobs import Knobs, read_knobs


@pytest.mark.parametrize("text,low,above,whole,expected", [
    (" 2.5 ", 0, False, False, 2.5),
    ("0", 0, False, False, 0.0),
    ("0.5", 0.5, False, False, 0.5),
    ("3", 0, False, True, 3),
])
def test_a_number_is_read_within_its_bounds(text, low, above, whole, expected):
    value = knobs.number("K", text, low=low, above=above, whole=whole)
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
def test_a_number_out_of_bounds_is_refused_by_name(text, low, above, whole, takes):
    with pytest.raises(knobs.KnobError) as e:
        knobs.number("METAFLOW_TORCHRUN_X", text, low=low, above=above, whole=whole)
    assert str(e.value) == "METAFLOW_TORCHRUN_X=%r: give %s" % (text, takes)


def test_a_long_value_is_cut_where_it_is_named():
    with pytest.raises(knobs.KnobError) as e:
        knobs.number("K", "x" * 5000)
    assert len(str(e.value)) < 120 and "..." in str(e.value)


@pytest.mark.parametrize("text,expected", [
    ("12", 12), ("0", 0), ("off", 0), (" OFF ", 0), ("no", 0), ("false", 0), ("none", 0)])
def test_a_count_or_off(text, expected):
    assert knobs.count_or_off("K", text) == expected


@pytest.mark.parametrize("text", ["of", "-3", "1.5", "many"])
def test_a_count_that_is_neither_is_refused_saying_off_is_taken(text):
    with pytest.raises(knobs.KnobError, match="give a whole number of at least 0, or off"):
        knobs.count_or_off("K", text)


@pytest.mark.parametrize("text,on", [
    ("0", False), ("off", False), ("no", False), ("1", True), ("TRUE", True), (" yes ", True), ("on", True)])
def test_a_switch(text, on):
    assert knobs.switch("K", text) is on


def test_a_switch_that_says_neither_is_refused():
    with pytest.raises(knobs.KnobError, match=r"K='enable': give 1 \(or true, yes, on\) or 0"):
        knobs.switch("K", "enable")


def test_unset_and_blank_settings_are_the_defaults():
    assert read_knobs({}) == (Knobs(), [])
    assert read_knobs({name: "  " for name in knobs.USER_KNOBS}) == (Knobs(), [])
    assert Knobs().node_history == (2, 5) and Knobs().flight_recorder == 2000 and Knobs().warm_start


def test_every_setting_is_read_into_its_field():
    read, problems = read_knobs({
        knobs.PORT_ENV: "23456", knobs.SECRET_ENV: "s" * 32, knobs.PROGRESS_ENV: "0.5",
        knobs.STRAGGLER_RATIO_ENV: "1.001", knobs.STRAGGLER_SECONDS_ENV: "0", knobs.KEEP_LOGS_HOURS_ENV: "0",
        knobs.KEEP_LOGS_ENV: "5", knobs.MAX_LOG_MB_ENV: "7.5", knobs.DEBUG_ENV: "yes",
        knobs.NODE_HISTORY_ENV: "3/7", knobs.NODE_HISTORY_RUNS_ENV: "0", knobs.FLIGHT_RECORDER_ENV: "off",
        knobs.WARM_START_ENV: "off", knobs.TRAINER_PROGRESS_ENV: "0",
    })
    assert problems == []
    assert read == Knobs(port=23456, secret=b"s" * 32, progress_seconds=0.5,
                         straggler_ratio=1.01,  # above 1, and at least 1.01
                         straggler_seconds=0.0, keep_logs_hours=0.0, keep_logs=5, max_log_mb=7.5, debug=True,
                         node_history=(3, 7), node_history_runs=0, flight_recorder=0, warm_start=False,
                         trainer_progress=False)
    assert read_knobs({knobs.NODE_HISTORY_ENV: "off", knobs.PORT_ENV: "None"})[0] == Knobs(node_history=None)
    assert "sss" not in repr(read)  # the secret never shown


def test_every_setting_with_a_bad_value_is_named_with_what_it_takes():
    bad = {
        knobs.PORT_ENV: "http", knobs.SECRET_ENV: "short", knobs.PROGRESS_ENV: "0.1",
        knobs.STRAGGLER_RATIO_ENV: "1", knobs.STRAGGLER_SECONDS_ENV: "-5", knobs.KEEP_LOGS_HOURS_ENV: "3 days",
        knobs.KEEP_LOGS_ENV: "2.5", knobs.MAX_LOG_MB_ENV: "inf", knobs.DEBUG_ENV: "verbose",
        knobs.NODE_HISTORY_ENV: "3 of 5", knobs.NODE_HISTORY_RUNS_ENV: "-1", knobs.FLIGHT_RECORDER_ENV: "2k",
        knobs.WARM_START_ENV: "fast", knobs.TRAINER_PROGRESS_ENV: "hf", knobs.ARRIVALS_ENV: "sometimes",
    }
    read, problems = read_knobs(bad)
    # One message a setting, the secret's value never shown; the record holds the defaults.
    assert len(problems) == len(knobs.USER_KNOBS) == len(bad), problems
    for name in knobs.USER_KNOBS:
        assert [p for p in problems if p.startswith(name)], (name, problems)
    assert not [p for p in problems if "'short'" in p]
    assert read == Knobs()
    assert "METAFLOW_TORCHRUN_PROGRESS_SECONDS='0.1': give a number of at least 0.5" in problems
    assert "METAFLOW_TORCHRUN_FLIGHT_RECORDER='2k': give a whole number of at least 0, or off" in problems
    # Only the bad one of two.
    assert read_knobs({knobs.KEEP_LOGS_ENV: "3", knobs.MAX_LOG_MB_ENV: "-1"}) == (
        Knobs(keep_logs=3), ["METAFLOW_TORCHRUN_MAX_LOG_MB='-1': give a number of at least 0"])


@pytest.mark.parametrize("text", ["0/5", "6/5", "3/2", "2/101", "1/1000", "x", "two of five", "2/"])
def test_a_node_history_threshold_out_of_bounds_is_refused(text):
    with pytest.raises(knobs.KnobError, match=r"^METAFLOW_TORCHRUN_NODE_HISTORY=.*give K/M .* 1 <= K <= M <= 100\), "
                       r"or off"):
        knobs.threshold(knobs.NODE_HISTORY_ENV, text)


@pytest.mark.parametrize("text,expected", [("2/3", (2, 3)), (" 1 / 100 ", (1, 100)), ("off", None), ("0", None)])
def test_a_node_history_threshold_or_off(text, expected):
    assert knobs.threshold(knobs.NODE_HISTORY_ENV, text) == expected
    # Off: the preflight reads no history at all (runtime/preflight.py takes None as no threshold).
    assert read_knobs({knobs.NODE_HISTORY_ENV: text})[0].node_history == expected


def test_the_node_history_unset_is_two_of_five_over_the_default_runs():
    assert (Knobs().node_history, Knobs().node_history_runs) == ((2, 5), knobs.DEFAULTS.NODE_HISTORY_RUNS)
    assert read_knobs({knobs.NODE_HISTORY_RUNS_ENV: "7"})[0].node_history_runs == 7


@pytest.mark.parametrize("text", ["0", "65536", "-1", "80.5"])
def test_a_port_out_of_range_is_refused(text):
    with pytest.raises(knobs.KnobError, match="give a port number, 1-65535"):
        knobs.port(knobs.PORT_ENV, text)
