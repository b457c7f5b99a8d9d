"""`zrl bench pong`'s reading of its curve: the minute the return rises, or that it has not."""
from __future__ import annotations

from zrl.bench.pong import rise_minute, rise_note


def rows(*returns):
    return [{"minute": i + 1, "mean_return": r} for i, r in enumerate(returns)]


def test_the_rise_is_the_first_minute_a_point_above_the_first():
    curve = rows(-20.5, -20.3, -19.6, -19.4, -17.0)
    assert rise_minute(curve) == 4  # -19.6 is 0.9 above; -19.4 is the first 1.0 or more
    note = rise_note(curve)
    assert "at minute 4" in note and "(-20.50)" in note and "-17.00 at minute 5" in note


def test_a_flat_curve_says_so_and_how_to_give_it_longer():
    curve = rows(-20.56, -20.63, -20.3, -20.23)
    assert rise_minute(curve) is None
    note = rise_note(curve)
    assert "no rise yet" in note and "-20.56 -> -20.23" in note and "--seconds" in note
    assert rise_minute([]) is None
