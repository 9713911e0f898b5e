"""The MLPerf results layout and the system description that goes with it.

A submission tree, as the MLPerf checkers and result summarizer read it::

    <root>/systems/<system>.json
    <root>/results/<system>/<benchmark>/result_0.txt … result_<N-1>.txt

Each codec run by the MLPerf runner is its own "system" (the software stack
differs), so one tree holds ``none`` and ``dedup`` side by side.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc

from dlrmtrain.mlperf.compliance import USAGE, checker_logging_silenced

AVAILABILITY_RESEARCH = "Research, Development, or Internal (RDI)"


@dataclass(frozen=True)
class SubmissionLayout:
    root: Path
    system: str
    benchmark: str

    @property
    def system_json(self) -> Path:
        return self.root / "systems" / f"{self.system}.json"

    @property
    def result_dir(self) -> Path:
        return self.root / "results" / self.system / self.benchmark

    def result_file(self, index: int) -> Path:
        return self.result_dir / f"result_{index}.txt"


def describe_system(system: str, *, submitter: str, division: str, nodes: int,
                    processes_per_node: int, backend: str, codec: str, notes: str) -> dict[str, str]:
    """Every field the system_desc_checker requires, filled from this machine."""
    cpu = _cpu_model()
    return {
        "submitter": submitter,
        "division": division,
        "status": AVAILABILITY_RESEARCH,
        "system_name": system,
        "number_of_nodes": str(nodes),
        "host_processors_per_node": "1",
        "host_processor_model_name": cpu,
        "host_processor_core_count": str(os.cpu_count() or 0),
        "host_processor_vcpu_count": str(os.cpu_count() or 0),
        "host_processor_frequency": "",
        "host_processor_caches": "",
        "host_processor_interconnect": "",
        "host_memory_capacity": _memory_gib(),
        "host_storage_type": "",
        "host_storage_capacity": "",
        "host_networking": "loopback" if nodes == 1 else "",
        "host_networking_topology": "",
        "host_memory_configuration": "",
        "accelerators_per_node": "0",
        "accelerator_model_name": f"none ({processes_per_node} CPU processes, {backend})",
        "accelerator_host_interconnect": "",
        "accelerator_frequency": "",
        "accelerator_on-chip_memories": "",
        "accelerator_memory_configuration": "",
        "accelerator_memory_capacity": "",
        "accelerator_interconnect": "",
        "accelerator_interconnect_topology": "",
        "cooling": "",
        "hw_notes": "",
        "framework": f"dlrmtrain, PyTorch {version('torch')}, TorchRec {version('torchrec')}",
        "other_software_stack": f"Python {platform.python_version()}, fbgemm-gpu "
                                f"{_version_or_none('fbgemm-gpu-cpu', 'fbgemm-gpu')}, "
                                f"mlperf-logging {version('mlperf-logging')}",
        "operating_system": f"{platform.system()} {platform.release()}",
        "sw_notes": f"embedding all-to-all codec: {codec}. {notes}",
    }


def write_system_description(layout: SubmissionLayout, description: dict[str, str],
                             ruleset: str) -> Path:
    """Write the JSON and confirm the package's system_desc_checker accepts it."""
    path = layout.system_json
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(description, indent=2) + "\n")
    with checker_logging_silenced():
        valid, *_ = check_system_desc(str(path), USAGE, ruleset)
    if not valid:
        raise ValueError(f"{path} is rejected by mlperf_logging's system_desc_checker")
    return path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> str:
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])  # first line: MemTotal
        return f"{kib / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        return ""


def _version_or_none(*packages: str) -> str:
    for name in packages:
        try:
            return version(name)
        except Exception:  # PackageNotFoundError: try the next distribution name
            continue
    return "not installed"
