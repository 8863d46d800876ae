"""Stop strings are matched by onelane, across token boundaries, and never shown in part."""

from __future__ import annotations

from worker.stops import StopMatcher


def feed_all(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    shown = ""
    for piece in pieces:
        text, hit = matcher.feed(piece)
        shown += text
        if hit:
            return shown, True
    return shown + matcher.flush(), False


def test_stop_split_across_tokens_cuts_the_output_before_it():
    assert feed_all(StopMatcher(["END"]), ["hello E", "N", "D more"]) == ("hello ", True)


def test_partial_match_that_fails_is_released():
    m = StopMatcher(["END"])
    assert m.feed("abc EN") == ("abc ", False)
    assert m.feed("x") == ("ENx", False)


def test_earliest_of_several_stops_wins():
    assert feed_all(StopMatcher(["zz", "b"]), ["aazzb"]) == ("aa", True)
    assert feed_all(StopMatcher(["zz", "b"]), ["abzz"]) == ("a", True)


def test_no_stops_passes_text_through():
    assert feed_all(StopMatcher([]), ["a", "b"]) == ("ab", False)


def test_held_text_is_flushed_at_the_end():
    assert feed_all(StopMatcher(["xyz"]), ["ab", "xy"]) == ("abxy", False)
