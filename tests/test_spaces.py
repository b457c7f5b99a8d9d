"""Space specs from JSON: whatever a hello carries is a spec or a SpecError, nothing else."""
from __future__ import annotations

import json

import numpy as np
import pytest

from zrl import spaces, wire

pytestmark = pytest.mark.timeout(60)

BIG = "1" + "0" * 400  # a JSON integer no float or int64 holds
BOX = '{"type":"box","shape":[4],"dtype":"float32","low":null,"high":null}'


def test_good_specs_round_trip():
    for d in ({"type": "discrete", "n": 2}, {"type": "box", "shape": [84, 84, 4], "dtype": "uint8", "low": 0.0, "high": 255.0},
              {"type": "box", "shape": [], "dtype": "float32", "low": None, "high": None}):
        assert spaces.from_json(d).to_json() == d
    # Integral floats and numpy values (YAML, checkpoints) still read as before.
    assert spaces.from_json({"type": "box", "shape": [4.0], "low": np.float32(-1), "high": 1}).to_json()["shape"] == [4]
    assert spaces.from_json({"type": "discrete", "n": np.int64(3)}) == spaces.DiscreteSpec(3)


@pytest.mark.parametrize("text", [
    # Numbers JSON can spell that overflow a float or an int (OverflowError escaped before).
    '{"type":"box","shape":[4],"dtype":"float32","low":' + BIG + '}',
    '{"type":"box","shape":[4],"dtype":"float32","high":-1e400}',
    '{"type":"box","shape":[4],"dtype":"float32","low":NaN}',
    '{"type":"box","shape":[4],"dtype":"float32","low":Infinity}',  # an infinity on the wrong side
    '{"type":"box","shape":[1e400],"dtype":"float32"}',
    '{"type":"box","shape":[' + BIG + '],"dtype":"float32"}',
    '{"type":"box","shape":[NaN],"dtype":"float32"}',
    '{"type":"discrete","n":1e400}',
    '{"type":"discrete","n":-1e400}',
    '{"type":"discrete","n":' + BIG + '}',
    '{"type":"discrete","n":NaN}',
    # Values the wire cannot carry, or that int() used to bend into shape.
    '{"type":"discrete","n":2.5}',
    '{"type":"discrete","n":"2"}',
    '{"type":"discrete","n":true}',
    '{"type":"discrete","n":0}',
    '{"type":"box","shape":[4294967296],"dtype":"float32"}',
    '{"type":"box","shape":[1,1,1,1,1,1,1],"dtype":"float32"}',
    '{"type":"box","shape":[65536,65536,65536],"dtype":"float32"}',
    '{"type":"box","shape":"4","dtype":"float32"}',
    '{"type":"box","shape":[4],"dtype":["float32"]}',
    '{"type":"box","shape":[4],"dtype":"float32","low":"0"}',
    '{"type":"box","shape":[4],"dtype":"float32","low":[0]}',
])
def test_bad_numbers_are_a_spec_error(text):
    with pytest.raises(spaces.SpecError) as e:
        spaces.from_json(json.loads(text))
    assert len(str(e.value)) < 400  # a hostile 400-digit number is not echoed whole


def test_an_infinite_bound_on_its_own_side_is_no_bound():
    # As gymnasium writes an unbounded Box (and YAML's -.inf / .inf): the same as null.
    d = json.loads('{"type":"box","shape":[4],"dtype":"float32","low":-Infinity,"high":Infinity}')
    assert spaces.from_json(d) == spaces.BoxSpec(shape=(4,), dtype="float32")
    assert spaces.from_json({"type": "box", "shape": [4], "high": 10**400}).high is None  # (past a float: +inf)
    made = spaces.BoxSpec(shape=(4,), low=-np.inf, high=np.float32(2))  # made in Python, for a client say
    assert (made.low, made.high) == (None, 2.0) and json.dumps(made.to_json(), allow_nan=False)
    with pytest.raises(spaces.SpecError, match="low"):
        spaces.BoxSpec(shape=(4,), low=np.nan)


def test_read_hello_turns_an_overflowing_spec_into_hello_invalid():
    meta = ('{"role":"actor","protocol":1,"obs_space":{"type":"box","shape":[4],"dtype":"float32","low":' + BIG + '},'
            '"action_space":{"type":"discrete","n":2}}')
    for m in (meta, '{"role":"client","protocol":1,"obs_space":' + BOX + ',"action_space":{"type":"discrete","n":1e400}}'):
        msg = wire.decode(wire.encode(wire.Kind.HELLO, meta=m, seq=1))
        with pytest.raises(wire.HelloInvalid, match="bad space spec"):
            wire.read_hello(msg, "learner")


def test_per_element_bounds_round_trip_and_collapse_where_they_agree():
    d = {"type": "box", "shape": [3], "dtype": "float32", "low": [-1.0, 0.0, None], "high": [1.0, 1.0, 1.0]}
    spec = spaces.from_json(json.loads(json.dumps(d)))
    assert spec.low == (-1.0, 0.0, None) and spec.high == 1.0 and spec.per_element
    assert spec.to_json() == {**d, "high": 1.0}
    np.testing.assert_array_equal(spec.bound_array("low"), [-1.0, 0.0, -np.inf])
    np.testing.assert_array_equal(spaces.BoxSpec((2, 2)).bound_array("high"), np.full((2, 2), np.inf))
    assert spaces.from_json({**d, "low": [0.5, 0.5, 0.5]}).low == 0.5  # (all alike: one for every element)
    with pytest.raises(spaces.SpecError, match="a list of 3"):
        spaces.from_json({**d, "low": [0.0, 0.0]})
    with pytest.raises(spaces.SpecError, match="low must be finite"):
        spaces.from_json(json.loads('{"type":"box","shape":[2],"low":[0, Infinity]}'))


def test_a_gym_action_box_keeps_its_per_element_bounds_and_an_observation_box_does_not():
    import gymnasium as gym

    box = gym.spaces.Box(low=np.array([-1.0, 0.0, 0.0], np.float32), high=np.array([1.0, 1.0, 1.0], np.float32))
    assert spaces.from_gym(box, per_element_bounds=True) == spaces.BoxSpec((3,), "float32", low=(-1.0, 0.0, 0.0), high=1.0)
    assert spaces.from_gym(box) == spaces.BoxSpec((3,), "float32", low=None, high=1.0)
    uniform = gym.spaces.Box(-2.0, 2.0, (4,), np.float32)
    assert spaces.from_gym(uniform, per_element_bounds=True) == spaces.from_gym(uniform) == spaces.BoxSpec((4,), low=-2.0, high=2.0)
