"""zrl export: the TorchScript and ONNX files (ONNX run in onnxruntime) give what zrl.load(...).act
gives on random observations, for any batch size, for MLP and CNN torsos, Discrete and Box
actions (a Gaussian with normalised observations, SAC's tanh) and an LSTM with its state in
and out; they carry the spaces; without onnx, --format onnx says what to install."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import zrl
from zrl import export
from zrl.cli import main
from zrl.export import EXTRA_FILE, ExportError, agent_outputs, export_policy, random_inputs, run_file
from saved_policies import POLICIES

pytestmark = pytest.mark.timeout(90)

# The ONNX exporter takes seconds per policy: these cover MLP and CNN torsos, Discrete and Box
# actions (a Gaussian's and SAC's), normalised observations and an LSTM.
ONNX_POLICIES = ["impala_cnn", "impala_lstm_gaussian_normalized", "sac_tanh", "ppo_gaussian_per_element"]


def assert_parity(agent, path, fmt):
    """The file's outputs are the agent's, on random inputs of batch sizes other than the traced one."""
    names = export.io_names(agent)[1]
    for n, seed in ((1, 10), (7, 11)):
        inputs = random_inputs(agent, n, seed)
        got, want = run_file(path, fmt, inputs), agent_outputs(agent, inputs)
        assert len(got) == len(names)
        for name, g, w in zip(names, got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, name
            if w.dtype == np.int64:
                np.testing.assert_array_equal(g, w, err_msg=name)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)


def expected_io(agent):
    obs = {"type": "box", "shape": list(agent.obs_spec.shape)}
    return obs, (["obs", "h", "c"] if agent.recurrent else ["obs"])


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated")
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_torchscript_acts_as_the_agent_and_carries_the_spaces(saved, tmp_path, name):
    logdir = saved(name)
    exported = export_policy(logdir, "torchscript", tmp_path / "policy.pt")
    assert exported.checked
    agent = zrl.load(logdir)
    assert_parity(agent, exported.path, "torchscript")
    files = {EXTRA_FILE: ""}
    torch.jit.load(str(exported.path), _extra_files=files)
    meta = json.loads(files[EXTRA_FILE])
    assert meta["observation_space"] == agent.obs_spec.to_json() and meta["action_space"] == agent.action_spec.to_json()
    assert meta["inputs"] == expected_io(agent)[1] and meta["algo"] == agent.config.algo.name


@pytest.mark.parametrize("name", ONNX_POLICIES)
def test_onnx_in_onnxruntime_acts_as_the_agent_and_carries_the_spaces(saved, tmp_path, name):
    onnxruntime = pytest.importorskip("onnxruntime")
    logdir = saved(name)
    exported = export_policy(logdir, None, tmp_path / "policy.onnx")  # (the format from the suffix)
    assert exported.fmt == "onnx" and exported.checked
    agent = zrl.load(logdir)
    assert_parity(agent, exported.path, "onnx")
    session = onnxruntime.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    assert [i.name for i in inputs] == expected_io(agent)[1]
    assert inputs[0].type == f"tensor({'uint8' if agent.obs_spec.dtype == 'uint8' else 'float'})"
    assert isinstance(inputs[0].shape[0], str), "the batch size is dynamic"
    props = session.get_modelmeta().custom_metadata_map
    assert json.loads(props["action_space"]) == agent.action_spec.to_json()
    assert json.loads(props["observation_space"]) == agent.obs_spec.to_json()


def test_the_command_writes_a_file_and_says_what_it_takes(saved, tmp_path):
    out = tmp_path / "policy.pt"
    result = CliRunner().invoke(main, ["export", str(saved("impala_mlp")), "--format", "torchscript", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file() and "obs -> action" in result.output and "match zrl.load" in result.output
    result = CliRunner().invoke(main, ["export", str(saved("impala_mlp")), "--out", str(tmp_path / "policy.bin")])
    assert result.exit_code == 1 and "give --format torchscript or onnx" in result.output


def test_onnx_without_its_packages_says_what_to_install(saved, tmp_path, monkeypatch):
    real = export.importlib.util.find_spec
    monkeypatch.setattr(export.importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else real(name, *a))
    with pytest.raises(ExportError, match=r'needs onnx.*pip install "zrl\[export\]"'):
        export_policy(saved("impala_mlp"), "onnx", tmp_path / "policy.onnx")
    result = CliRunner().invoke(main, ["export", str(saved("impala_mlp")), "--format", "onnx", "--out", str(tmp_path / "p.onnx")])
    assert result.exit_code == 1 and 'pip install "zrl[export]"' in result.output
