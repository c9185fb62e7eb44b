"""Hub loads against a hub on loopback (``tests.support.hub_server``): the real
``huggingface_hub`` client and transformers, pointed at it with ``HF_ENDPOINT``.

The hub's size is read from its metadata (file list, safetensors headers) before any weight
is fetched: the tiny model loads and decodes, the "140 GB" one is refused without a single
weight byte requested.  The CLI, the operator's tool, loads hub ids without any switch.
HF_ENDPOINT is read when huggingface_hub is imported, so each check runs in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.hub_models import HUGE_GB, huge_repo, tiny_repo
from tests.support.hub_server import LoopbackHub, Repo
from tests.support.paths import FIXTURES, REPO


@pytest.fixture(scope="module")
def hub():
    names = ("config.json", "model.safetensors")
    dflash = {n: (FIXTURES / "dflash" / n).read_bytes() for n in names}
    repos = {"tiny/model": tiny_repo(), "huge/model": huge_repo(), "tiny/dflash": Repo(dflash)}
    with LoopbackHub(repos) as server:
        yield server


def _run(hub: LoopbackHub, tmp_path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": str(REPO),
    }
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("SPECUI_ALLOW_HUB", None)  # the library and the CLI need no switch
    return subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


LIBRARY = r"""
import json
from specui.errors import SpecUIError
from specui.verifier.hub import hub_weights
from specui.verifier.model import Verifier

out = {}
weights, download = hub_weights("huge/model")
out["huge"] = [weights.stored_bytes, download]
try:
    Verifier.load("huge/model")
except SpecUIError as e:
    out["huge_error"] = str(e)
v = Verifier.load("tiny/model")
out["tiny"] = [v.name, v.num_layers, v.encode("red green blue")]
try:
    Verifier.load("no/such-model")
except SpecUIError as e:
    out["missing_error"] = str(e)
print(json.dumps(out))
"""


def test_the_huge_model_is_refused_from_its_metadata_and_the_tiny_one_loads(hub, tmp_path):
    proc = _run(hub, tmp_path, ["-c", LIBRARY])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    stored, download = out["huge"]
    assert HUGE_GB * 1e9 <= stored < (HUGE_GB + 5) * 1e9  # the header's tensors, in bf16
    assert download >= stored  # the file list's sizes
    assert out["huge_error"].startswith("not enough memory to load verifier huge/model")
    assert "would fit" in out["huge_error"]
    # Metadata only: the file list and the first bytes of the one safetensors file.
    assert hub.weight_requests("huge/model") == []
    assert set(hub.fetched("huge/model")) <= {"/api/models/huge/model", "model.safetensors"}
    assert not list((tmp_path / "hf").rglob("*huge*/**/model.safetensors"))

    name, layers, ids = out["tiny"]
    assert (name, layers) == ("tiny/model", 6) and ids
    assert hub.weight_requests("tiny/model")  # it was downloaded
    assert "cannot read the size of hub model 'no/such-model'" in out["missing_error"]


def test_the_cli_decodes_with_a_hub_verifier_and_a_hub_speculator(hub, tmp_path):
    proc = _run(
        hub,
        tmp_path,
        [
            "-m", "specui", "decode", "--verifier", "tiny/model", "--drafter", "tiny/dflash",
            "--prompt", "red green blue", "--max-new-tokens", "6", "--json",
        ],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert hub.weight_requests("tiny/dflash")
    result = json.loads(proc.stdout.strip().splitlines()[-1])  # steps first, then the result
    assert result["num_output_tokens"] == 6, result
