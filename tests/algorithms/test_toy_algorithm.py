"""An algorithm added in one folder, outside the repository, appears everywhere with no other edit.

The toy ("toyflash") is a real package written into tmp: a DFlash-family model
renamed, with a registry entry of its own (one layer by default, served by vLLM
as ``dflash``), found through ``$SPECUI_ALGORITHMS``.  It must show up in the
``specui train --algorithm`` choices, the Train tab's dropdown and the vLLM
export of a checkpoint of it -- through the same code paths the built-in
algorithms take.  Also: the generic registry's own rules.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

import gradio as gr
import pytest
import torch

from specui.algorithms import ALGORITHMS, algorithm_names, create_drafter
from specui.algorithms.checkpoint import load_drafter, save_drafter, validate_checkpoint
from specui.cli import build_parser
from specui.commands.train import build_config
from specui.errors import SpecUIError
from specui.registry import Registry

TOY = "toyflash"
BUILT_INS = algorithm_names()  # read at import, before the toy fixture names its folder

TOY_INIT = '''
"""A toy algorithm: DFlash under another name, one layer by default."""

from specui.algorithms.spec import AlgorithmSpec, register_algorithm

SPEC = register_algorithm(AlgorithmSpec(
    name="toyflash", label="ToyFlash", rank=50, default_layers=1, vllm_method="dflash",
    drafter=f"{__name__}.parts:ToyDrafter", objective=f"{__name__}.parts:ToyObjective",
    train_options=f"{__name__}.options:ToyOptions",
))
'''

# The toy's own training knob, beside the DFlash ones it inherits: declared once, here.
TOY_OPTIONS = """
from dataclasses import dataclass

from specui.algorithms.dflash.options import DFlashOptions
from specui.algorithms.options import knob
from specui.errors import SpecUIError


@dataclass(kw_only=True)
class ToyOptions(DFlashOptions):
    toy_wobble: float = knob(0.5, "wobble of the toy's blocks", group="loss")

    def check(self) -> None:
        super().check()
        if not 0 <= self.toy_wobble <= 1:
            raise SpecUIError(f"toy-wobble must be in [0, 1], got {self.toy_wobble}")
"""

TOY_PARTS = """
from dataclasses import dataclass
from typing import ClassVar

from specui.algorithms.dflash.config import DFlashConfig
from specui.algorithms.dflash.drafter import DFlashDrafter
from specui.algorithms.dflash.model import DFlashModel
from specui.algorithms.dflash.objective import DFlashObjective


@dataclass(kw_only=True)
class ToyConfig(DFlashConfig):
    model_type: ClassVar[str] = "toyflash"
    architecture: ClassVar[str] = "ToyFlashDraftModel"
    config_class_name: ClassVar[str] = "ToyFlashSpeculatorConfig"


class ToyModel(DFlashModel):
    config_class = ToyConfig


class ToyDrafter(DFlashDrafter):
    model_class = ToyModel


class ToyObjective(DFlashObjective):
    model_class = ToyModel
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy package in a folder of its own, named in $SPECUI_ALGORITHMS; removed afterwards."""
    root = tmp_path_factory.mktemp("plugins")
    pkg = root / "toy_algo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(TOY_INIT))
    (pkg / "parts.py").write_text(textwrap.dedent(TOY_PARTS))
    (pkg / "options.py").write_text(textwrap.dedent(TOY_OPTIONS))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        mp.setenv("SPECUI_ALGORITHMS", "toy_algo")
        yield TOY
        ALGORITHMS.unregister(TOY)
        for name in [m for m in sys.modules if m == "toy_algo" or m.startswith("toy_algo.")]:
            del sys.modules[name]


# The train tab's verifier, prompts and numbers, as its start button passes them.
TRAIN_TAB_INPUTS = ("embedded", "gsm-symbolic", 1, 8, 64, 0, 6e-4)


def _train_tab_widget(store, elem_id: str) -> gr.blocks.Block:
    """The train tab built on ``store``: its block ``elem_id``."""
    from specui.ui import train as train_tab

    with gr.Blocks() as demo:
        train_tab.build(store)
    return next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id)


def _train_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def test_the_toy_is_registered_from_its_folder(toy) -> None:
    assert toy in algorithm_names() and toy in algorithm_names(trainable=True)
    assert algorithm_names() == [
        *BUILT_INS,
        toy,
    ]  # appended: the built-ins keep their order (the UI's, the CLI's)
    assert ALGORITHMS[toy].model_class.__name__ == "ToyModel"


def test_the_toy_is_a_train_cli_choice(toy, tmp_path: Path) -> None:
    help_text = " ".join(_train_parser().format_help().split())
    assert f"| {toy}" in help_text  # --algorithm's list
    assert f"{toy} 1" in help_text  # --layers' defaults
    for flag in ("--algorithm", "--speculator-type"):  # SpecUI's name and speculators'
        cfg = build_config(
            build_parser().parse_args(["train", flag, toy, "--out", str(tmp_path / "out")])
        )
        assert cfg.algorithm == toy and cfg.num_layers == 1


def test_the_toy_is_a_train_tab_choice(toy, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path / "data"))
    from specui.store import Store
    from specui.ui import train as train_tab

    store = Store(tmp_path / "specui.db")
    dropdown = _train_tab_widget(store, "train-algorithm")
    assert toy in [value for _, value in dropdown.choices]
    # The tab's start button takes it: a queued train job with the toy's name.
    job_id = train_tab.start_training(store, toy, *TRAIN_TAB_INPUTS, "toy-run", None)
    assert store.get_job(job_id).params["algorithm"] == toy


def test_the_toys_own_knob_reaches_the_cli_the_train_tab_and_the_saved_config(
    toy, tmp_path: Path, monkeypatch
) -> None:
    from specui.training.config import TrainConfig

    help_text = " ".join(_train_parser().format_help().split())
    assert "--toy-wobble TOY_WOBBLE ToyFlash wobble of the toy's blocks" in help_text
    argv = ["train", "--algorithm", toy, "--out", str(tmp_path / "out"), "--toy-wobble", "0.25"]
    cfg = build_config(build_parser().parse_args(argv))
    assert cfg.options.toy_wobble == 0.25
    assert build_config(build_parser().parse_args(argv[:5])).options.toy_wobble == 0.5  # default
    with pytest.raises(SpecUIError, match=r"toy-wobble must be in \[0, 1\], got 2.0"):
        build_config(build_parser().parse_args([*argv[:5], "--toy-wobble", "2"]))

    # The saved config (a job's params, train_run.json: to_dict) holds it flat, and reads it back.
    saved = json.loads(json.dumps(cfg.to_dict()))
    assert saved["toy_wobble"] == 0.25 and TrainConfig.from_dict(saved) == cfg

    monkeypatch.setenv("SPECUI_DATA_DIR", str(tmp_path / "data"))
    from specui.store import Store
    from specui.ui import train as train_tab

    store = Store(tmp_path / "specui.db")
    widget = _train_tab_widget(store, "train-option-toy_wobble")
    assert widget.value == 0.5 and widget.label == "Wobble of the toy's blocks (ToyFlash)"
    job_id = train_tab.start_training(
        store, toy, *TRAIN_TAB_INPUTS, "wobbly", None, options={"toy_wobble": 0.25}
    )
    assert TrainConfig.from_dict(store.get_job(job_id).params).options.toy_wobble == 0.25
    store.close()


def test_a_toy_checkpoint_loads_trains_and_exports_to_vllm(
    toy, fixture_verifier, tmp_path: Path
) -> None:
    from specui.algorithms.objective import objective_for
    from specui.export import speculative_config, vllm_serve_command
    from specui.training.config import TrainConfig
    from specui.vllm.launch_plan import speculator_algorithm

    drafter = create_drafter(toy, fixture_verifier, num_layers=1, seed=0)
    folder = save_drafter(drafter, tmp_path / "toy")
    assert json.loads((folder / "config.json").read_text())["speculators_model_type"] == toy
    assert validate_checkpoint(folder, fixture_verifier) == []
    loaded = load_drafter(folder, fixture_verifier)
    assert type(loaded).__name__ == "ToyDrafter" and loaded.algorithm == toy
    assert torch.equal(loaded.model.fc.weight, drafter.model.fc.weight)

    cfg = TrainConfig.from_dict({"algorithm": toy, "out": str(tmp_path / "run"), "block_size": 4})
    model = objective_for(cfg, fixture_verifier).build()
    assert type(model).__name__ == "ToyModel" and len(model.layers) == 1  # the spec's default depth

    assert speculative_config(folder)["method"] == "dflash"
    assert '"method": "dflash"' in vllm_serve_command(folder, "embedded")
    assert speculator_algorithm(str(folder)) == toy


def test_every_algorithm_package_agrees_with_its_checkpoint_type() -> None:
    for spec in ALGORITHMS.values():
        assert spec.config_class.model_type == spec.name
        assert spec.drafter_class.model_class is spec.model_class


# --- the registry itself ---------------------------------------------------------------


def test_registry_refuses_a_name_twice_and_names_the_known_ones() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("a", 1)

    @reg.register("b")
    def b() -> None: ...

    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and "a" in reg and reg["b"] is b
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a", 2)
    reg.register("a", 1)  # the same entry again (a module imported twice) is no clash
    with pytest.raises(SpecUIError, match="unknown widget 'c'; known: a, b"):
        reg["c"]
    assert reg.get("c") is None


def test_registry_imports_its_modules_lazily_and_from_the_environment(
    tmp_path: Path, monkeypatch
) -> None:
    (tmp_path / "widget_mod.py").write_text(
        "from tests.algorithms.test_toy_algorithm import WIDGETS\nWIDGETS.register('w', 7)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "widget_mod", raising=False)
    WIDGETS.unregister("w")
    monkeypatch.setenv("SPECUI_TEST_WIDGETS", "widget_mod")
    assert WIDGETS["w"] == 7
    monkeypatch.setenv("SPECUI_TEST_WIDGETS", "no_such_widget_module")
    with pytest.raises(SpecUIError, match=r"no_such_widget_module.*SPECUI_TEST_WIDGETS"):
        WIDGETS.names()


WIDGETS: Registry[int] = Registry("widget", env="SPECUI_TEST_WIDGETS")
